package soft_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"go.uber.org/goleak"
)

// newFaulty returns the soft backend over cfg (allLocations when cfg has
// none) behind the fault-injecting decorator. The caller closes it.
func newFaulty(t *testing.T, cfg soft.Config) *faulty.Backend {
	t.Helper()
	return faulty.Wrap(newBackend(t, cfg), soft.ErrorPrefix)
}

func wantInjected(t *testing.T, err error, kind cuda.FaultKind, loc string) {
	t.Helper()
	var inj *cuda.InjectedFaultError
	if !errors.As(err, &inj) || !errors.Is(err, cuda.ErrInjectedFault) {
		t.Fatalf("error = %v, want an injected %v fault at %s", err, kind, loc)
	}
	if inj.Kind != kind || inj.Location != loc {
		t.Fatalf("injected fault = %+v, want %v at %s", *inj, kind, loc)
	}
}

func TestAllocFaultConsumedOnceAtItsLocation(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newFaulty(t, soft.Config{Capacity: map[string]int64{"cuda:1": 100}})
	defer mustClose(t, b)
	ctx := context.Background()
	f := b.Faults()
	f.Arm(cuda.FaultAlloc, "cuda:1")
	f.Arm(cuda.FaultAlloc, "cuda:1")

	// Other locations, and calls that fail their input checks, leave it armed.
	mustAlloc(t, b, "cuda:0", 10)
	if _, err := b.Allocate(ctx, "cuda:1", 0); !errors.Is(err, cuda.ErrInvalid) {
		t.Fatalf("Allocate of 0 bytes = %v", err)
	}
	if _, err := b.Allocate(ctx, "cuda:2", 10); !errors.Is(err, cuda.ErrUnknownLocation) {
		t.Fatalf("Allocate at an unconfigured location = %v", err)
	}
	if n := f.Armed(cuda.FaultAlloc, "cuda:1"); n != 2 {
		t.Fatalf("Armed = %d, want 2", n)
	}

	for i := range 2 {
		_, err := b.Allocate(ctx, "cuda:1", 10)
		wantInjected(t, err, cuda.FaultAlloc, "cuda:1")
		if err.Error() != "soft backend: injected alloc fault at cuda:1" {
			t.Fatalf("message %q", err)
		}
		if n := f.Armed(cuda.FaultAlloc, "cuda:1"); n != 1-i {
			t.Fatalf("Armed after %d failures = %d", i+1, n)
		}
	}
	if mi := mustMemInfo(t, b, "cuda:1"); mi.UsedBytes != 0 {
		t.Fatalf("an injected alloc failure charged %d bytes", mi.UsedBytes)
	}
	mustAlloc(t, b, "cuda:1", 10) // disarmed now
}

func TestCopyFaultConsumedOnceAtItsDestination(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newFaulty(t, soft.Config{})
	defer mustClose(t, b)
	ctx := context.Background()
	s := mustStream(t, b, "cuda:0")
	defer mustClose(t, s)
	const n = 256
	host := mustAlloc(t, b, "pinned-host", n)
	dev := mustAlloc(t, b, "cuda:0", n)
	mustWrite(t, b, host, pattern(10, n))
	old := pattern(11, n)
	mustWrite(t, b, dev, old)

	b.Faults().Arm(cuda.FaultCopy, "cuda:0")
	// A copy out of cuda:0 is not a copy into it; bad input consumes nothing.
	other := mustAlloc(t, b, "pageable-host", n)
	mustCopy(t, s, other, dev)
	if err := s.CopyAsync(dev, mustAlloc(t, b, "pinned-host", n+1)); !errors.Is(err, cuda.ErrInvalid) {
		t.Fatalf("size mismatch = %v", err)
	}
	if err := mustRecord(t, s).Wait(ctx); err != nil {
		t.Fatalf("copy out of cuda:0 failed: %v", err)
	}
	if got := b.Faults().Armed(cuda.FaultCopy, "cuda:0"); got != 1 {
		t.Fatalf("Armed = %d, want 1", got)
	}

	if err := s.CopyAsync(dev, host); err != nil { // consumes the fault now
		t.Fatalf("CopyAsync with an armed fault returned at once: %v", err)
	}
	if got := b.Faults().Armed(cuda.FaultCopy, "cuda:0"); got != 0 {
		t.Fatalf("fault not consumed at enqueue: Armed = %d", got)
	}
	wantInjected(t, mustRecord(t, s).Wait(ctx), cuda.FaultCopy, "cuda:0")
	assertBytes(t, "destination of a failed copy", mustRead(t, b, dev), old)

	// The stream keeps working, and the failure was reported once only.
	if err := mustRecord(t, s).Wait(ctx); err != nil {
		t.Fatalf("an event after the failed one = %v, want nil", err)
	}
	mustCopy(t, s, dev, host)
	if err := mustRecord(t, s).Wait(ctx); err != nil {
		t.Fatalf("retry failed: %v", err)
	}
	assertBytes(t, "destination of the retry", mustRead(t, b, dev), pattern(10, n))
}

// A failure is reported to the first marker after it: an event or a
// Synchronize, whichever comes first; a failure nobody collected comes
// back from Stream.Close.
func TestFailureReportedExactlyOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newFaulty(t, soft.Config{})
	defer mustClose(t, b)
	ctx := context.Background()
	s := mustStream(t, b, "cuda:1")
	src, dst := mustAlloc(t, b, "cuda:0", 8), mustAlloc(t, b, "cuda:1", 8)

	b.Faults().Arm(cuda.FaultCopy, "cuda:1")
	b.Faults().Arm(cuda.FaultCopy, "cuda:1")
	mustCopy(t, s, dst, src) // fails
	mustCopy(t, s, dst, src) // fails too; the first failure is the one reported
	mustCopy(t, s, dst, src) // succeeds
	wantInjected(t, s.Synchronize(ctx), cuda.FaultCopy, "cuda:1")
	if err := s.Synchronize(ctx); err != nil {
		t.Fatalf("second Synchronize = %v, want nil", err)
	}
	ev := mustRecord(t, s)
	if err := ev.Wait(ctx); err != nil {
		t.Fatalf("event after Synchronize = %v, want nil", err)
	}

	b.Faults().Arm(cuda.FaultCopy, "cuda:1")
	mustCopy(t, s, dst, src)
	wantInjected(t, s.Close(), cuda.FaultCopy, "cuda:1")
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
}

// A Synchronize abandoned by its context does not swallow the failure: the
// next event still reports it.
func TestAbandonedSynchronizeLeavesFailurePending(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		b := newFaulty(t, soft.Config{BandwidthBytesPerSec: 1, Sleep: g.sleep})
		defer mustClose(t, b)
		s := mustStream(t, b, "cuda:0")
		a, c := mustAlloc(t, b, "cuda:1", 8), mustAlloc(t, b, "cuda:0", 8)
		mustCopy(t, s, c, a) // held in flight by the gate
		b.Faults().Arm(cuda.FaultCopy, "cuda:0")
		mustCopy(t, s, c, a) // will fail

		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 1)
		go func() { got <- s.Synchronize(ctx) }()
		g.await(t)
		synctest.Wait() // Synchronize has enqueued its marker and is waiting
		cancel()
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Fatalf("abandoned Synchronize = %v", err)
		}
		g.release <- struct{}{}
		wantInjected(t, mustRecord(t, s).Wait(context.Background()), cuda.FaultCopy, "cuda:0")
	})
}

func TestReconstructFaultKeyedOnTarget(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newFaulty(t, soft.Config{})
	defer mustClose(t, b)
	ctx := context.Background()
	const n = 64
	tmp := mustAlloc(t, b, "pinned-host", n) // a temporary buffer for cuda:0
	old := pattern(20, n)
	mustWrite(t, b, tmp, old)
	calls := 0
	fill := func(_ context.Context, dst []byte) error {
		calls++
		copy(dst, pattern(21, len(dst)))
		return nil
	}
	b.Faults().Arm(cuda.FaultReconstruct, "cuda:0")

	// Neither the buffer's own location nor another target fires it.
	if err := b.Load(ctx, tmp, "", fill); err != nil { // target = pinned-host
		t.Fatal(err)
	}
	if err := b.Load(ctx, tmp, "cuda:1", fill); err != nil {
		t.Fatal(err)
	}
	if err := b.Load(ctx, tmp, "cuda:0", nil); !errors.Is(err, cuda.ErrInvalid) {
		t.Fatalf("nil loader = %v", err)
	}
	if err := b.Load(ctx, tmp, "gpu:0", fill); !errors.Is(err, cuda.ErrInvalid) {
		t.Fatalf("malformed target = %v", err)
	}
	if calls != 2 || b.Faults().Armed(cuda.FaultReconstruct, "cuda:0") != 1 {
		t.Fatalf("calls %d, armed %d", calls, b.Faults().Armed(cuda.FaultReconstruct, "cuda:0"))
	}

	mustWrite(t, b, tmp, old)
	wantInjected(t, b.Load(ctx, tmp, "cuda:0", fill), cuda.FaultReconstruct, "cuda:0")
	if calls != 2 {
		t.Fatal("the loader ran despite the injected fault")
	}
	assertBytes(t, "buffer after an injected reconstruct fault", mustRead(t, b, tmp), old)
	if err := b.Load(ctx, tmp, "cuda:0", fill); err != nil {
		t.Fatalf("second load for cuda:0 = %v, want success", err)
	}
	assertBytes(t, "buffer after the load", mustRead(t, b, tmp), pattern(21, n))
}
