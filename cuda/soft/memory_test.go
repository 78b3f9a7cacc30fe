package soft_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"go.uber.org/goleak"
)

func TestCapacityExhaustionAndRecovery(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{Capacity: map[string]int64{"cuda:0": 1000}})
	defer mustClose(t, b)
	ctx := context.Background()

	want := func(free, total, used int64) {
		t.Helper()
		if mi := mustMemInfo(t, b, "cuda:0"); mi != (cuda.MemInfo{FreeBytes: free, TotalBytes: total, UsedBytes: used}) {
			t.Fatalf("MemInfo(cuda:0) = %+v, want free %d total %d used %d", mi, free, total, used)
		}
	}
	want(1000, 1000, 0)
	big := mustAlloc(t, b, "cuda:0", 600)
	want(400, 1000, 600)

	_, err := b.Allocate(ctx, "cuda:0", 401)
	var oom *cuda.OutOfMemoryError
	if !errors.As(err, &oom) || !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("Allocate beyond capacity = %v, want *OutOfMemoryError", err)
	}
	if *oom != (cuda.OutOfMemoryError{Location: "cuda:0", Requested: 401, Free: 400}) {
		t.Fatalf("OutOfMemoryError = %+v", *oom)
	}
	want(400, 1000, 600) // a refusal charges nothing

	rest := mustAlloc(t, b, "cuda:0", 400) // exactly fills it
	want(0, 1000, 1000)
	if _, err := b.Allocate(ctx, "cuda:0", 1); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Fatalf("Allocate of 1 byte when full = %v", err)
	}
	if err := b.Free(big); err != nil {
		t.Fatal(err)
	}
	want(600, 1000, 400)
	again := mustAlloc(t, b, "cuda:0", 600)
	want(0, 1000, 1000)
	for _, buf := range []cuda.Buffer{rest, again} {
		if err := b.Free(buf); err != nil {
			t.Fatal(err)
		}
	}
	want(1000, 1000, 0)

	// Other locations are unlimited and independent.
	host := mustAlloc(t, b, "pinned-host", 5000)
	mi := mustMemInfo(t, b, "pinned-host")
	if !mi.Unlimited() || mi.UsedBytes != 5000 || mi.FreeBytes != math.MaxInt64-5000 {
		t.Fatalf("MemInfo(pinned-host) = %+v", mi)
	}
	if mi := mustMemInfo(t, b, "cuda:0"); mi.UsedBytes != 0 {
		t.Fatalf("an allocation at pinned-host charged cuda:0: %+v", mi)
	}
	if got := host.Size(); got != 5000 || host.Location() != "pinned-host" {
		t.Fatalf("buffer reports %d B at %s", got, host.Location())
	}
	if got := mustRead(t, b, host); len(got) != 5000 || got[0] != 0 || got[4999] != 0 {
		t.Fatal("a new buffer is not 5000 zero bytes")
	}
}

func TestDoubleFree(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{Capacity: map[string]int64{"cuda:1": 100}})
	defer mustClose(t, b)
	ctx := context.Background()
	buf := mustAlloc(t, b, "cuda:1", 60)
	other := mustAlloc(t, b, "cuda:1", 40)
	if err := b.Free(buf); err != nil {
		t.Fatalf("first Free: %v", err)
	}
	if err := b.Free(buf); !errors.Is(err, cuda.ErrFreed) {
		t.Fatalf("second Free = %v, want ErrFreed", err)
	}
	// The second Free returned nothing: only the first 60 bytes came back.
	if mi := mustMemInfo(t, b, "cuda:1"); mi.UsedBytes != 40 || mi.FreeBytes != 60 {
		t.Fatalf("MemInfo after double free = %+v, want used 40", mi)
	}
	if buf.Size() != 60 || buf.Location() != "cuda:1" {
		t.Fatal("a freed buffer forgot its size or location")
	}
	if _, err := b.Read(ctx, buf); !errors.Is(err, cuda.ErrFreed) {
		t.Fatalf("Read of a freed buffer = %v", err)
	}
	if err := b.Write(ctx, buf, make([]byte, 60)); !errors.Is(err, cuda.ErrFreed) {
		t.Fatalf("Write to a freed buffer = %v", err)
	}
	if err := b.Load(ctx, buf, "", func(context.Context, []byte) error { return nil }); !errors.Is(err, cuda.ErrFreed) {
		t.Fatalf("Load into a freed buffer = %v", err)
	}
	s := mustStream(t, b, "cuda:1")
	defer mustClose(t, s)
	src := mustAlloc(t, b, "pinned-host", 60)
	if err := s.CopyAsync(buf, src); !errors.Is(err, cuda.ErrFreed) {
		t.Fatalf("CopyAsync into a freed buffer = %v", err)
	}
	if err := s.CopyAsync(src, buf); !errors.Is(err, cuda.ErrFreed) {
		t.Fatalf("CopyAsync from a freed buffer = %v", err)
	}
	if err := b.Free(other); err != nil {
		t.Fatal(err)
	}
}

// A buffer freed while a copy into it is still queued makes that copy fail
// on the stream; the failure reaches the next event.
func TestFreeWhileCopyQueued(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGate()
	b := newBackend(t, soft.Config{BandwidthBytesPerSec: 1, Sleep: g.sleep})
	defer mustClose(t, b)
	s := mustStream(t, b, "cuda:0")
	defer mustClose(t, s)
	a, c := mustAlloc(t, b, "cuda:0", 8), mustAlloc(t, b, "pinned-host", 8)
	d := mustAlloc(t, b, "cuda:1", 8)
	mustCopy(t, s, c, a) // held in flight
	mustCopy(t, s, d, a) // queued behind it
	ev := mustRecord(t, s)
	g.await(t)
	if err := b.Free(d); err != nil {
		t.Fatal(err)
	}
	g.release <- struct{}{}
	if err := ev.Wait(context.Background()); !errors.Is(err, cuda.ErrFreed) {
		t.Fatalf("event after a copy into a freed buffer = %v, want ErrFreed", err)
	}
}

// Many goroutines allocating and freeing concurrently never overshoot the
// capacity, and MemInfo is exact whenever they are quiescent.
func TestConcurrentAllocateFreeKeepsMemInfoExact(t *testing.T) {
	defer goleak.VerifyNone(t)
	const capacity = 1 << 20
	b := newBackend(t, soft.Config{Capacity: map[string]int64{"cuda:0": capacity}})
	defer mustClose(t, b)
	ctx := context.Background()

	const workers, iterations = 16, 300
	var held atomic.Int64 // bytes this test believes are allocated
	var ooms atomic.Int64
	kept := make([][]cuda.Buffer, workers)
	stop := make(chan struct{})
	var monitor sync.WaitGroup
	monitor.Go(func() { // the invariant holds at every instant
		for {
			select {
			case <-stop:
				return
			default:
			}
			mi, err := b.MemInfo("cuda:0")
			if err != nil || mi.UsedBytes < 0 || mi.UsedBytes > capacity || mi.FreeBytes+mi.UsedBytes != capacity {
				t.Errorf("MemInfo broke the invariant: %+v (%v)", mi, err)
				return
			}
		}
	})

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 42))
			var mine []cuda.Buffer
			for range iterations {
				if len(mine) > 0 && r.IntN(3) == 0 {
					i := r.IntN(len(mine))
					buf := mine[i]
					mine = append(mine[:i], mine[i+1:]...)
					if err := b.Free(buf); err != nil {
						t.Errorf("Free: %v", err)
						return
					}
					held.Add(-buf.Size())
					continue
				}
				n := 1 + r.Int64N(32<<10)
				buf, err := b.Allocate(ctx, "cuda:0", n)
				var oom *cuda.OutOfMemoryError
				switch {
				case errors.As(err, &oom):
					if oom.Free >= n || oom.Requested != n {
						t.Errorf("inconsistent OutOfMemoryError %+v for %d bytes", oom, n)
					}
					ooms.Add(1)
				case err != nil:
					t.Errorf("Allocate: %v", err)
					return
				default:
					held.Add(n)
					mine = append(mine, buf)
				}
			}
			kept[w] = mine
		})
	}
	wg.Wait()
	close(stop)
	monitor.Wait()
	if t.Failed() {
		return
	}
	if ooms.Load() == 0 {
		t.Fatal("the workload never hit the capacity; the test is too weak")
	}
	if mi := mustMemInfo(t, b, "cuda:0"); mi.UsedBytes != held.Load() || mi.FreeBytes != capacity-held.Load() {
		t.Fatalf("MemInfo %+v, but %d bytes are held", mi, held.Load())
	}
	for _, mine := range kept {
		for _, buf := range mine {
			wg.Go(func() {
				if err := b.Free(buf); err != nil {
					t.Errorf("Free: %v", err)
				}
			})
		}
	}
	wg.Wait()
	if mi := mustMemInfo(t, b, "cuda:0"); mi.UsedBytes != 0 || mi.FreeBytes != capacity {
		t.Fatalf("MemInfo after freeing everything = %+v", mi)
	}
}
