package cuda_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/residency-go/residency/cuda"
)

func TestFaultKindStringAndParse(t *testing.T) {
	for k, s := range map[cuda.FaultKind]string{
		cuda.FaultAlloc:       "alloc",
		cuda.FaultCopy:        "copy",
		cuda.FaultReconstruct: "reconstruct",
	} {
		if got := k.String(); got != s {
			t.Errorf("%d.String() = %q, want %q", int(k), got, s)
		}
		back, err := cuda.ParseFaultKind(s)
		if err != nil || back != k {
			t.Errorf("ParseFaultKind(%q) = %v, %v; want %v", s, back, err, k)
		}
	}
	for _, bad := range []string{"", "Alloc", "copy ", "reconstruction", "free"} {
		_, err := cuda.ParseFaultKind(bad)
		if !errors.Is(err, cuda.ErrInvalid) {
			t.Errorf("ParseFaultKind(%q) error = %v, want ErrInvalid", bad, err)
		}
	}
	if got := cuda.FaultKind(7).String(); got != "FaultKind(7)" {
		t.Errorf("FaultKind(7).String() = %q", got)
	}
}

func TestFaultsCountPerKindAndLocation(t *testing.T) {
	var f cuda.Faults // the zero value is ready to use
	if f.Take(cuda.FaultAlloc, "cuda:0") {
		t.Fatal("Take on an empty injector reported a fault")
	}
	f.Arm(cuda.FaultAlloc, "cuda:0")
	f.Arm(cuda.FaultAlloc, "cuda:0")
	f.Arm(cuda.FaultCopy, "cuda:1")

	if n := f.Armed(cuda.FaultAlloc, "cuda:0"); n != 2 {
		t.Fatalf("Armed(alloc, cuda:0) = %d, want 2", n)
	}
	// Other kinds, other locations and node-qualified spellings are distinct.
	for _, miss := range []struct {
		k   cuda.FaultKind
		loc string
	}{
		{cuda.FaultCopy, "cuda:0"}, {cuda.FaultReconstruct, "cuda:0"},
		{cuda.FaultAlloc, "cuda:1"}, {cuda.FaultAlloc, "cuda:0@node-b"},
	} {
		if f.Take(miss.k, miss.loc) {
			t.Errorf("Take(%v, %q) consumed a fault armed elsewhere", miss.k, miss.loc)
		}
	}
	for i := 1; i <= 2; i++ {
		if !f.Take(cuda.FaultAlloc, "cuda:0") {
			t.Fatalf("armed fault %d of 2 was not taken", i)
		}
	}
	if f.Take(cuda.FaultAlloc, "cuda:0") {
		t.Fatal("a third Take consumed a fault that was armed twice")
	}
	if n := f.Armed(cuda.FaultCopy, "cuda:1"); n != 1 {
		t.Fatalf("Armed(copy, cuda:1) = %d, want 1", n)
	}
	f.Reset()
	if n := f.Armed(cuda.FaultCopy, "cuda:1"); n != 0 {
		t.Fatalf("after Reset, Armed(copy, cuda:1) = %d", n)
	}
}

func TestFaultsConcurrentArmAndTake(t *testing.T) {
	f := cuda.NewFaults()
	const workers, per = 16, 200
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range per {
				f.Arm(cuda.FaultCopy, "pinned-host")
			}
		})
	}
	wg.Wait()
	if n := f.Armed(cuda.FaultCopy, "pinned-host"); n != workers*per {
		t.Fatalf("Armed = %d, want %d", n, workers*per)
	}
	var taken atomic.Int64
	for range workers {
		wg.Go(func() {
			for range per + 50 { // more attempts than faults
				if f.Take(cuda.FaultCopy, "pinned-host") {
					taken.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := taken.Load(); got != workers*per {
		t.Fatalf("taken %d faults, want exactly %d", got, workers*per)
	}
	if n := f.Armed(cuda.FaultCopy, "pinned-host"); n != 0 {
		t.Fatalf("Armed after draining = %d", n)
	}
}
