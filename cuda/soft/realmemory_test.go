package soft_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"

	"go.uber.org/goleak"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
)

// allocatedBy returns the bytes the Go heap allocated while f ran (the
// whole process: other goroutines' small allocations count too).
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRealMemoryPromise checks the package doc's promise on real memory,
// measured with the Go heap's own figures: a refused Allocate makes
// nothing; a granted one makes nothing until its buffer is written; a write
// makes exactly the buffer's size once; a copy of a buffer never written
// makes nothing; Free releases the bytes. RealBytes follows every step.
// The buffers are small ones (one Go slice each, under the size from which
// bytes are kept in chunks): TestRegionMemory checks the large ones.
func TestRealMemoryPromise(t *testing.T) {
	defer goleak.VerifyNone(t)
	const big = 16 << 20
	const slack = 4 << 20 // the process's other allocations meanwhile
	b := newBackend(t, soft.Config{Capacity: map[string]int64{"cuda:0": big}})
	defer mustClose(t, b)
	ctx := context.Background()

	// Refused: capacity, a bad size.
	n := allocatedBy(func() {
		_, err := b.Allocate(ctx, "cuda:0", big+1)
		if !errors.Is(err, cuda.ErrOutOfMemory) {
			t.Errorf("over capacity: %v", err)
		}
		if _, err := b.Allocate(ctx, "cuda:0", -big); !errors.Is(err, cuda.ErrInvalid) {
			t.Errorf("negative size: %v", err)
		}
	})
	if n > slack {
		t.Errorf("refused allocations allocated %d bytes", n)
	}

	// Granted, never written: nothing.
	var dev, host cuda.Buffer
	n = allocatedBy(func() {
		dev = mustAlloc(t, b, "cuda:0", big)
		host = mustAlloc(t, b, "pinned-host", big)
	})
	if n > slack || b.RealBytes() != 0 {
		t.Fatalf("two granted %d-byte allocations made %d bytes (RealBytes %d)", big, n, b.RealBytes())
	}
	if mi := mustMemInfo(t, b, "cuda:0"); mi.UsedBytes != big {
		t.Fatalf("the capacity is charged whole: %+v", mi)
	}

	// A copy of a buffer never written is zeros: nothing either.
	s := mustStream(t, b, "cuda:0")
	defer mustClose(t, s)
	n = allocatedBy(func() {
		mustCopy(t, s, dev, host)
		if err := mustRecord(t, s).Wait(ctx); err != nil {
			t.Errorf("copy: %v", err)
		}
	})
	if n > slack || b.RealBytes() != 0 {
		t.Fatalf("a copy of zeros made %d bytes (RealBytes %d)", n, b.RealBytes())
	}

	// Written: exactly its size, once; a copy from it: the destination's.
	data := bytes.Repeat([]byte{7}, big)
	n = allocatedBy(func() { mustWrite(t, b, host, data) })
	if n < big || n > big+slack || b.RealBytes() != big {
		t.Fatalf("writing %d bytes made %d (RealBytes %d)", big, n, b.RealBytes())
	}
	mustCopy(t, s, dev, host)
	if err := mustRecord(t, s).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if b.RealBytes() != 2*big {
		t.Fatalf("RealBytes %d after the copy, want %d", b.RealBytes(), 2*big)
	}
	if got := mustRead(t, b, dev); !bytes.Equal(got, data) {
		t.Fatal("the copy did not carry the bytes")
	}
	if err := b.Free(host); err != nil {
		t.Fatal(err)
	}
	if b.RealBytes() != big {
		t.Fatalf("RealBytes %d after Free, want %d", b.RealBytes(), big)
	}

	// A Load makes the bytes for its loader; Close releases everything.
	small := mustAlloc(t, b, "pageable-host", 1000)
	if err := b.Load(ctx, small, "", func(_ context.Context, dst []byte) error {
		if len(dst) != 1000 || dst[0] != 0 {
			t.Errorf("the loader got %d bytes, first %d", len(dst), dst[0])
		}
		dst[0] = 1
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if b.RealBytes() != big+1000 {
		t.Fatalf("RealBytes %d after a load, want %d", b.RealBytes(), big+1000)
	}
	if got := mustRead(t, b, small); got[0] != 1 || got[999] != 0 {
		t.Fatal("the loaded bytes were not kept")
	}
	mustClose(t, b)
	if b.RealBytes() != 0 {
		t.Fatalf("RealBytes %d after Close", b.RealBytes())
	}
}

// TestZerosReadBack: a buffer never written reads as zeros of its size,
// and a copy of it zeroes a written destination (releasing its bytes).
func TestZerosReadBack(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	ctx := context.Background()
	zero := mustAlloc(t, b, "cuda:0", 64)
	if got := mustRead(t, b, zero); !bytes.Equal(got, make([]byte, 64)) {
		t.Fatalf("a buffer never written reads %v", got)
	}
	dst := mustAlloc(t, b, "cuda:1", 64)
	mustWrite(t, b, dst, pattern(3, 64))
	s := mustStream(t, b, "cuda:1")
	defer mustClose(t, s)
	mustCopy(t, s, dst, zero)
	if err := mustRecord(t, s).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, b, dst); !bytes.Equal(got, make([]byte, 64)) {
		t.Fatalf("after a copy of zeros: %v", got)
	}
	if b.RealBytes() != 0 {
		t.Fatalf("RealBytes %d: the copy of zeros kept the old bytes", b.RealBytes())
	}
}
