package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/messages"
)

// locationActor carries out the physical allocations and frees of one
// location, one message at a time. Because the supervisor sends a free to
// this actor when it commits a removal — before it admits anything that
// could reuse those bytes — the free is always processed before any later
// allocation here: the device never holds more than the ledger admitted.
type locationActor struct {
	eng *Engine
	loc string
}

func (a *locationActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.Allocate:
		ctx.Respond(&messages.Allocated{Key: m.Key, Err: a.allocate(m)})
	case *messages.Free:
		a.free(m.Key)
	case *messages.Drain:
		ctx.Respond(&messages.Drained{})
	default:
		a.owned(m) // buffers owned outside the engine (external_alloc.go)
	}
}

func (a *locationActor) allocate(m *messages.Allocate) error {
	if _, exists := a.eng.Buffers.Get(m.Key); exists {
		return fmt.Errorf("location actor %s: buffer %v already allocated", a.loc, m.Key)
	}
	// From here on the key is ours: a crash past this point (the strategy
	// frees whatever the table holds under the key) can only free a buffer
	// this allocation made, never one that was there before.
	if a.eng.hooks.PanicOnAllocate != nil && a.eng.hooks.PanicOnAllocate(m.Key) {
		panic(fmt.Sprintf("injected location actor panic while allocating %v (test hook)", m.Key))
	}
	// The deadline is enforced here, where the buffer is made, never by the
	// waiting value actor: a value actor that gave up while the backend
	// still allocated would let the ledger release a charge for bytes the
	// device then holds (physical above admitted). An allocation that
	// returns after its deadline is freed before this actor answers.
	ctx, release := withDeadline(a.eng.opsCtx, time.Now().Add(a.eng.allocTimeout))
	defer release()
	buf, err := a.eng.backend.Allocate(ctx, a.loc, m.Bytes)
	if err != nil {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		_ = a.eng.backend.Free(buf)
		if cerr == context.Canceled {
			return fmt.Errorf("allocation of %d bytes at %s abandoned: the runtime is stopping", m.Bytes, a.loc)
		}
		return &AllocTimeoutError{Location: a.loc, Bytes: m.Bytes, Timeout: a.eng.allocTimeout}
	}
	a.eng.Buffers.put(m.Key, buf)
	return nil
}

// locationStrategy supervises the location actors. A location actor that
// crashed while allocating answers the waiting value actor with an
// allocation error (so the transfer fails and the supervisor commits the
// failure in the ledger) and frees a buffer it may have put in the table;
// one that crashed while freeing retries the free. Then it is restarted:
// it keeps no state of its own.
type locationStrategy struct{ eng *Engine }

func (st *locationStrategy) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason any, message any) {
	_, msg, sender := actor.UnwrapEnvelope(message)
	st.eng.log.Error().Str("actor", child.String()).Interface("reason", reason).Msg("location actor crashed; restarting it")
	switch m := msg.(type) {
	case *messages.Allocate:
		if buf, ok := st.eng.Buffers.take(m.Key); ok {
			_ = st.eng.backend.Free(buf)
		}
		if sender != nil {
			st.eng.root.Send(sender, &messages.Allocated{Key: m.Key, Err: &ActorCrashError{Actor: child.String(), Reason: fmt.Sprint(reason)}})
		}
	case *messages.Free:
		if buf, ok := st.eng.Buffers.take(m.Key); ok {
			_ = st.eng.backend.Free(buf)
		}
	}
	sup.RestartChildren(child)
}

// AllocTimeoutError: a physical allocation took longer than the runtime's
// allocation timeout. The buffer, if the backend made one late, was freed
// again; the transfer fails and its charge is released.
type AllocTimeoutError struct {
	Location string
	Bytes    int64
	Timeout  time.Duration
}

func (e *AllocTimeoutError) Error() string {
	return fmt.Sprintf("allocation of %d bytes at %s took longer than the allocation timeout (%s); nothing is left allocated", e.Bytes, e.Location, e.Timeout)
}

// Is matches context.DeadlineExceeded.
func (e *AllocTimeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

func (a *locationActor) free(key messages.BufferKey) {
	if a.eng.ops.holds(key) {
		return // quarantined: the operation abandoned at close frees it when it returns
	}
	buf, ok := a.eng.Buffers.take(key)
	if !ok {
		return // never allocated (a failed transfer) or already freed
	}
	if err := a.eng.backend.Free(buf); err != nil {
		a.eng.log.Error().Err(err).Str("location", a.loc).Uint64("value", key.Value).Msg("free failed")
	}
}
