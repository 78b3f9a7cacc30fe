package actors

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

func TestLocationAllocateAndFreeThroughBackend(t *testing.T) {
	h := startEngine(t)
	key := messages.BufferKey{Value: 7, Location: locGPU0}

	require.NoError(t, h.allocate(key, 4096))
	buf, ok := h.eng.Buffers.Get(key)
	require.True(t, ok, "the allocated buffer is in the table")
	assert.Equal(t, locGPU0, buf.Location())
	assert.EqualValues(t, 4096, buf.Size())
	assert.EqualValues(t, 4096, h.used(locGPU0))
	assert.Zero(t, h.used(locHost), "only the asked location is charged")

	h.eng.Root().Send(h.eng.locations[locGPU0], &messages.Free{Key: key})
	h.drain(locGPU0)
	_, ok = h.eng.Buffers.Get(key)
	assert.False(t, ok, "a freed buffer leaves the table")
	assert.Zero(t, h.used(locGPU0))
	assert.ErrorIs(t, h.be.Free(buf), cuda.ErrFreed, "the backend buffer was freed")

	// Freeing a key that has no buffer (a failed transfer's destination,
	// a second free) does nothing.
	h.eng.Root().Send(h.eng.locations[locGPU0], &messages.Free{Key: key})
	h.drain(locGPU0)
	assert.Zero(t, h.eng.Buffers.Len())
}

func TestLocationKeysAreDistinctPerTemporaryAdmission(t *testing.T) {
	h := startEngine(t)
	k := messages.BufferKey{Value: 1, Location: locHost}
	tmp := messages.BufferKey{Value: 1, Location: locHost, Temporary: 9}
	require.NoError(t, h.allocate(k, 100))
	require.NoError(t, h.allocate(tmp, 100), "a temporary buffer of the same value is another key")
	assert.Equal(t, 2, h.eng.Buffers.Len())
	assert.EqualValues(t, 200, h.used(locHost))
}

func TestLocationRefusesAKeyAlreadyAllocated(t *testing.T) {
	h := startEngine(t)
	key := messages.BufferKey{Value: 3, Location: locGPU0}
	require.NoError(t, h.allocate(key, 512))
	first, _ := h.eng.Buffers.Get(key)

	err := h.allocate(key, 512)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already allocated")
	again, ok := h.eng.Buffers.Get(key)
	require.True(t, ok)
	assert.Same(t, first, again, "the refusal keeps the first buffer")
	assert.EqualValues(t, 512, h.used(locGPU0), "the refusal allocated nothing")
}

func TestLocationBackendErrorLeavesNothing(t *testing.T) {
	h := startEngine(t)
	key := messages.BufferKey{Value: 4, Location: locGPU0}
	h.be.Faults().Arm(cuda.FaultAlloc, locGPU0)
	err := h.allocate(key, 64)
	var inj *cuda.InjectedFaultError
	require.ErrorAs(t, err, &inj)
	_, ok := h.eng.Buffers.Get(key)
	assert.False(t, ok)
	assert.Zero(t, h.used(locGPU0))
	require.NoError(t, h.allocate(key, 64), "the actor serves the next allocation")
}

// lateBackend makes allocations at one location return only after their
// deadline has passed, with a real buffer (a backend that ignores the
// context, or a driver call that came back late).
type lateBackend struct {
	cuda.Backend
	loc  string
	late atomic.Bool

	mu   sync.Mutex
	made []cuda.Buffer
}

func (b *lateBackend) Allocate(ctx context.Context, loc string, n int64) (cuda.Buffer, error) {
	if loc != b.loc || !b.late.Load() {
		return b.Backend.Allocate(ctx, loc, n)
	}
	<-ctx.Done()
	buf, err := b.Backend.Allocate(context.Background(), loc, n)
	if err == nil {
		b.mu.Lock()
		b.made = append(b.made, buf)
		b.mu.Unlock()
	}
	return buf, err
}

func (b *lateBackend) madeBuffers() []cuda.Buffer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]cuda.Buffer(nil), b.made...)
}

func TestLocationAllocationDeadlineFreesALateBuffer(t *testing.T) {
	const timeout = 50 * time.Millisecond
	var lb *lateBackend
	h := startEngine(t, withAllocTimeout(timeout), withBackend(func(b cuda.Backend) cuda.Backend {
		lb = &lateBackend{Backend: b, loc: locGPU0}
		return lb
	}))
	lb.late.Store(true)
	key := messages.BufferKey{Value: 5, Location: locGPU0}

	err := h.allocate(key, 1000)
	var te *AllocTimeoutError
	require.ErrorAs(t, err, &te)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "an allocation timeout matches context.DeadlineExceeded")
	assert.Equal(t, locGPU0, te.Location)
	assert.EqualValues(t, 1000, te.Bytes)
	assert.Equal(t, timeout, te.Timeout)

	made := lb.madeBuffers()
	require.Len(t, made, 1, "the backend did make the buffer, late")
	assert.ErrorIs(t, h.be.Free(made[0]), cuda.ErrFreed, "the late buffer was freed before the actor answered")
	_, ok := h.eng.Buffers.Get(key)
	assert.False(t, ok, "the table has no buffer for the timed-out key")
	assert.Zero(t, h.used(locGPU0))

	lb.late.Store(false)
	require.NoError(t, h.allocate(key, 1000), "the location actor keeps serving after a timeout")
}

func TestLocationAllocationDeadlineFailsTheTransferInTheLedger(t *testing.T) {
	var lb *lateBackend
	h := startEngine(t, withAllocTimeout(50*time.Millisecond), withBackend(func(b cuda.Backend) cuda.Backend {
		lb = &lateBackend{Backend: b, loc: locGPU0}
		return lb
	}))
	data := testPattern(1, 300)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 300, Mode: budget.Replicable, At: locHost}, data)

	lb.late.Store(true)
	rep := h.transition(messages.Place, hd, "", locGPU0)
	var pe *budget.PlanExecutionError
	require.ErrorAs(t, rep.Err, &pe)
	var te *AllocTimeoutError
	require.ErrorAs(t, rep.Err, &te, "the cause is the allocation timeout")
	assert.ErrorIs(t, rep.Err, context.DeadlineExceeded)

	assert.Zero(t, h.locRecord(locGPU0).UsedBytes, "the failed transfer's charge is released")
	h.drain(locGPU0)
	assert.Zero(t, h.used(locGPU0), "no device bytes above the admitted bytes")
	assert.Equal(t, 1, h.eng.Buffers.Len(), "only the host buffer is left")

	lb.late.Store(false)
	require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
	assert.Equal(t, data, h.read(hd, locGPU0))
}

func TestLocationCrashAnswersTheRequesterAndKeepsServing(t *testing.T) {
	crashKey := messages.BufferKey{Value: 11, Location: locGPU0}
	var armed atomic.Bool
	armed.Store(true)
	h := startEngine(t, withHooks(Hooks{PanicOnAllocate: func(k messages.BufferKey) bool {
		return k == crashKey && armed.CompareAndSwap(true, false)
	}}))
	pid := h.eng.locations[locGPU0]

	err := h.allocate(crashKey, 256)
	var crash *ActorCrashError
	require.ErrorAs(t, err, &crash, "the strategy answers the waiting requester")
	assert.Contains(t, crash.Actor, "location/"+locGPU0)
	assert.Contains(t, crash.Reason, "injected location actor panic")
	_, ok := h.eng.Buffers.Get(crashKey)
	assert.False(t, ok)
	assert.Zero(t, h.used(locGPU0))

	// Restarted under the same PID: it serves the next allocations, the
	// crashed key included.
	assert.Same(t, pid, h.eng.locations[locGPU0])
	require.NoError(t, h.allocate(messages.BufferKey{Value: 12, Location: locGPU0}, 256))
	require.NoError(t, h.allocate(crashKey, 256))
	assert.EqualValues(t, 512, h.used(locGPU0))
}

func TestLocationCrashFailsTheTransferInTheLedger(t *testing.T) {
	var armed atomic.Bool
	h := startEngine(t, withHooks(Hooks{PanicOnAllocate: func(k messages.BufferKey) bool {
		return k.Location == locGPU0 && armed.CompareAndSwap(true, false)
	}}))
	data := testPattern(2, 128)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 128, Mode: budget.Replicable, At: locHost}, data)

	armed.Store(true)
	rep := h.transition(messages.Place, hd, "", locGPU0)
	var crash *ActorCrashError
	require.ErrorAs(t, rep.Err, &crash)
	var pe *budget.PlanExecutionError
	require.ErrorAs(t, rep.Err, &pe)
	assert.Equal(t, budget.PhaseExecute, pe.Phase)
	assert.Zero(t, h.locRecord(locGPU0).UsedBytes)

	require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
	assert.Equal(t, data, h.read(hd, locGPU0))
}

func TestAllocTimeoutErrorMatchesOnlyDeadlineExceeded(t *testing.T) {
	err := error(&AllocTimeoutError{Location: locGPU0, Bytes: 1, Timeout: time.Second})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, errors.Is(err, context.Canceled))
	assert.Contains(t, err.Error(), "nothing is left allocated")
}
