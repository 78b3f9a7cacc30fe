package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
)

// The fault subtests: faults are injected by the decorator of package
// cuda/faulty over the backend under test (or by the Factory's own
// decorator when it returns one), and must be consumed once, reported once
// and in stream order with the backend's own failures.

// faulty returns a backend (closed when the subtest ends) behind the
// fault-injecting decorator, and its injector. A Factory that returns a
// decorated backend already gets it back as it is.
func (s *suite) faulty(t *testing.T, capacity map[string]int64) (cuda.Backend, *cuda.Faults) {
	t.Helper()
	b := s.backend(t, capacity)
	if f := faulty.Of(b); f != nil {
		return b, f
	}
	fb := faulty.Wrap(b, "")
	return fb, fb.Faults()
}

func wantInjected(t *testing.T, err error, kind cuda.FaultKind, loc string) {
	t.Helper()
	var inj *cuda.InjectedFaultError
	require.ErrorAs(t, err, &inj, "want an injected %v fault at %s", kind, loc)
	require.ErrorIs(t, err, cuda.ErrInjectedFault)
	require.Equal(t, kind, inj.Kind)
	require.Equal(t, loc, inj.Location)
}

func (s *suite) allocFault(t *testing.T) {
	target := s.locs[len(s.locs)-1]
	b, f := s.faulty(t, map[string]int64{target: 100})
	f.Arm(cuda.FaultAlloc, target)
	f.Arm(cuda.FaultAlloc, target)
	// Other locations, and calls that fail their input checks, leave it armed.
	if len(s.locs) > 1 {
		require.NoError(t, b.Free(alloc(t, b, s.locs[0], 10)))
	}
	_, err := b.Allocate(bg, target, 0)
	require.ErrorIs(t, err, cuda.ErrInvalid)
	require.Equal(t, 2, f.Armed(cuda.FaultAlloc, target))
	for i := range 2 {
		_, err := b.Allocate(bg, target, 10)
		wantInjected(t, err, cuda.FaultAlloc, target)
		require.Equal(t, 1-i, f.Armed(cuda.FaultAlloc, target))
	}
	require.Zero(t, memInfo(t, b, target).UsedBytes, "an injected alloc failure charged bytes")
	require.NoError(t, b.Free(alloc(t, b, target, 10))) // disarmed now
}

func (s *suite) copyFault(t *testing.T) {
	b, f := s.faulty(t, nil)
	dev := s.deviceLocs()[0]
	host := s.hostLoc()
	st := stream(t, b, dev)
	const n = 4096
	src := alloc(t, b, host, n)
	dst := alloc(t, b, dev, n)
	write(t, b, src, pattern(10, n))
	old := pattern(11, n)
	write(t, b, dst, old)

	f.Arm(cuda.FaultCopy, dev)
	if host != dev { // a copy out of dev is not a copy into it
		out := alloc(t, b, host, n)
		copyAsync(t, st, out, dst)
		wait(t, record(t, st))
	}
	require.ErrorIs(t, st.CopyAsync(dst, alloc(t, b, host, n+1)), cuda.ErrInvalid) // bad input consumes nothing
	require.Equal(t, 1, f.Armed(cuda.FaultCopy, dev))

	require.NoError(t, st.CopyAsync(dst, src), "a copy with an armed fault is refused only later")
	require.Zero(t, f.Armed(cuda.FaultCopy, dev), "the fault is consumed at enqueue")
	ev := record(t, st)
	wantInjected(t, ev.Wait(bg), cuda.FaultCopy, dev)
	wantInjected(t, ev.Err(), cuda.FaultCopy, dev)
	sameBytes(t, "destination of a failed copy", read(t, b, dst), old)

	wait(t, record(t, st)) // reported once; the stream keeps working
	copyAsync(t, st, dst, src)
	wait(t, record(t, st))
	sameBytes(t, "destination of the retry", read(t, b, dst), pattern(10, n))
}

// A failure is reported to the first event or Synchronize after it, once;
// one nobody collected comes back from Stream.Close.
func (s *suite) failureOnce(t *testing.T) {
	b, f := s.faulty(t, nil)
	dev := s.deviceLocs()[0]
	st, err := b.NewStream(dev)
	require.NoError(t, err)
	src, dst := alloc(t, b, s.hostLoc(), 64), alloc(t, b, dev, 64)
	f.Arm(cuda.FaultCopy, dev)
	f.Arm(cuda.FaultCopy, dev)
	copyAsync(t, st, dst, src) // fails
	copyAsync(t, st, dst, src) // fails too; the first failure is the one reported
	copyAsync(t, st, dst, src) // succeeds
	wantInjected(t, st.Synchronize(bg), cuda.FaultCopy, dev)
	require.NoError(t, st.Synchronize(bg), "second Synchronize")
	wait(t, record(t, st))

	f.Arm(cuda.FaultCopy, dev)
	copyAsync(t, st, dst, src)
	wantInjected(t, st.Close(), cuda.FaultCopy, dev)
	require.NoError(t, st.Close(), "second Close")
}

func (s *suite) reconstructFault(t *testing.T) {
	b, f := s.faulty(t, nil)
	dev := s.deviceLocs()[0]
	tmp := alloc(t, b, s.hostLoc(), 64) // a temporary buffer for dev
	old := pattern(20, 64)
	write(t, b, tmp, old)
	calls := 0
	fill := func(_ context.Context, dst []byte) error {
		calls++
		copy(dst, pattern(21, int64(len(dst))))
		return nil
	}
	other := "cuda:999999"
	if other == dev {
		other = "cuda:999998"
	}
	f.Arm(cuda.FaultReconstruct, dev)
	if tmp.Location() != dev {
		require.NoError(t, b.Load(bg, tmp, "", fill)) // target = the buffer's own location
	}
	require.NoError(t, b.Load(bg, tmp, other, fill)) // any well-formed target keys the fault
	require.ErrorIs(t, b.Load(bg, tmp, dev, nil), cuda.ErrInvalid)
	require.ErrorIs(t, b.Load(bg, tmp, "gpu:0", fill), cuda.ErrInvalid)
	require.Equal(t, 1, f.Armed(cuda.FaultReconstruct, dev))

	before := calls
	write(t, b, tmp, old)
	wantInjected(t, b.Load(bg, tmp, dev, fill), cuda.FaultReconstruct, dev)
	require.Equal(t, before, calls, "the loader ran despite the injected fault")
	sameBytes(t, "buffer after an injected reconstruct fault", read(t, b, tmp), old)
	require.NoError(t, b.Load(bg, tmp, dev, fill))
	sameBytes(t, "buffer after the load", read(t, b, tmp), pattern(21, 64))
}
