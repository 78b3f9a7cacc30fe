package faulty_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/conformance"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
)

var locs = []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}

func newSoft(t *testing.T, capacity map[string]int64) *soft.Backend {
	t.Helper()
	b, err := soft.New(soft.Config{Locations: locs, Capacity: capacity})
	require.NoError(t, err)
	return b
}

// The decorator is a backend like any other: with no fault armed it passes
// the whole suite, and the suite's fault subtests use its injector.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, capacity map[string]int64) cuda.Backend {
		return faulty.Wrap(newSoft(t, capacity), soft.ErrorPrefix)
	}, locs...)
}

func TestForwardsIdentityAndOwnsInner(t *testing.T) {
	defer goleak.VerifyNone(t)
	inner := newSoft(t, nil)
	b := faulty.Wrap(inner, soft.ErrorPrefix)
	assert.Equal(t, inner.Name(), b.Name())
	assert.True(t, cuda.IsSimulated(b), "the decorator hides that the soft backend simulates")
	assert.Same(t, b.Faults(), faulty.Of(b))
	assert.Nil(t, faulty.Of(inner))
	assert.Same(t, inner, b.Inner())

	require.NoError(t, b.Close())
	_, err := inner.Allocate(context.Background(), "cuda:0", 1)
	require.ErrorIs(t, err, cuda.ErrClosed, "closing the decorator closes the backend it wraps")

	b.Faults().Arm(cuda.FaultAlloc, "cuda:0") // the injector outlives the backend
	require.True(t, b.Faults().Take(cuda.FaultAlloc, "cuda:0"))
	_, err = b.Allocate(context.Background(), "cuda:0", 1)
	require.ErrorIs(t, err, cuda.ErrClosed)
}

func TestInjectedFailuresCarryTheLabel(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	b := faulty.Wrap(newSoft(t, nil), soft.ErrorPrefix)
	defer func() { require.NoError(t, b.Close()) }()
	b.Faults().Arm(cuda.FaultAlloc, "cuda:1")
	_, err := b.Allocate(ctx, "cuda:1", 8)
	require.EqualError(t, err, "soft backend: injected alloc fault at cuda:1")

	unnamed := faulty.Wrap(newSoft(t, nil), "")
	defer func() { require.NoError(t, unnamed.Close()) }()
	unnamed.Faults().Arm(cuda.FaultAlloc, "cuda:1")
	_, err = unnamed.Allocate(ctx, "cuda:1", 8)
	require.EqualError(t, err, "cuda: injected alloc fault at cuda:1")
}

// Buffers the decorator did not hand out, and freed ones, are refused by
// the wrapped backend with its own error, and consume no fault.
func TestForeignAndFreedBuffersConsumeNothing(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	b := faulty.Wrap(newSoft(t, nil), soft.ErrorPrefix)
	defer func() { require.NoError(t, b.Close()) }()
	other := newSoft(t, nil)
	defer func() { require.NoError(t, other.Close()) }()
	st, err := b.NewStream("cuda:0")
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()) }()

	src, err := b.Allocate(ctx, "pinned-host", 8)
	require.NoError(t, err)
	freed, err := b.Allocate(ctx, "cuda:0", 8)
	require.NoError(t, err)
	require.NoError(t, b.Free(freed))
	foreign, err := other.Allocate(ctx, "cuda:0", 8)
	require.NoError(t, err)
	fill := func(context.Context, []byte) error { return nil }

	b.Faults().Arm(cuda.FaultCopy, "cuda:0")
	b.Faults().Arm(cuda.FaultReconstruct, "cuda:0")
	require.ErrorIs(t, st.CopyAsync(freed, src), cuda.ErrFreed)
	require.ErrorIs(t, st.CopyAsync(foreign, src), cuda.ErrInvalid)
	require.ErrorIs(t, b.Load(ctx, freed, "", fill), cuda.ErrFreed)
	require.ErrorIs(t, b.Load(ctx, foreign, "", fill), cuda.ErrInvalid)
	assert.Equal(t, 1, b.Faults().Armed(cuda.FaultCopy, "cuda:0"))
	assert.Equal(t, 1, b.Faults().Armed(cuda.FaultReconstruct, "cuda:0"))
}

// An injected copy failure and a failure of the wrapped stream are each
// reported once, to the first marker after them, in stream order.
func TestInjectedAndRealFailuresInStreamOrder(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	b := faulty.Wrap(newSoft(t, nil), soft.ErrorPrefix)
	defer func() { require.NoError(t, b.Close()) }()
	st, err := b.NewStream("cuda:0")
	require.NoError(t, err)
	src, err := b.Allocate(ctx, "pinned-host", 8)
	require.NoError(t, err)
	dst, err := b.Allocate(ctx, "cuda:0", 8)
	require.NoError(t, err)
	gone, err := b.Allocate(ctx, "pinned-host", 8)
	require.NoError(t, err)

	// A real failure (a buffer freed after enqueue), then an injected one:
	// the real one is reported first, the injected one to the next marker.
	block := make(chan struct{})
	require.NoError(t, st.WaitEvent(closedOn(block)))
	require.NoError(t, st.CopyAsync(dst, gone))
	require.NoError(t, b.Free(gone))
	b.Faults().Arm(cuda.FaultCopy, "cuda:0")
	require.NoError(t, st.CopyAsync(dst, src))
	first, err := st.Record()
	require.NoError(t, err)
	close(block)
	require.ErrorIs(t, first.Wait(ctx), cuda.ErrFreed)
	require.NoError(t, st.Synchronize(ctx), "the second failure before the same marker is dropped, as on the wrapped stream")

	b.Faults().Arm(cuda.FaultCopy, "cuda:0")
	require.NoError(t, st.CopyAsync(dst, src))
	require.ErrorIs(t, st.Close(), cuda.ErrInjectedFault, "a failure nobody collected comes back from Close")
}

// closedOn is an event that completes when ch is closed.
type closedOn chan struct{}

func (c closedOn) Done() <-chan struct{} { return c }
func (c closedOn) Err() error            { return nil }
func (c closedOn) Query() bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
func (c closedOn) Wait(ctx context.Context) error {
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
