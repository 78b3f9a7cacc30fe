package actors

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// A value actor whose value has no transfer left waits idle for the next
// value with one: values transferred one after another share one actor
// instead of spawning and stopping one each. Awaiting quiet (as
// Engine.Stop does) stops the idle ones.
func TestIdleValueActorServesTheNextValue(t *testing.T) {
	h := startEngine(t)
	for i := range 20 {
		hd := h.mustRegister(budget.ValueSpec{Name: fmt.Sprint("v", i), Bytes: 64, At: locHost}, testPattern(byte(i), 64))
		require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
		assert.Equal(t, 1, valueActors(h), "value %d: the idle actor carried out its transfers", i)
		assert.Equal(t, testPattern(byte(i), 64), h.read(hd, locGPU0))
	}
	h.quiet()
	assert.Zero(t, valueActors(h), "quiet stops the idle actor")
	// A new one carries out the next transfer.
	h.mustRegister(budget.ValueSpec{Name: "after", Bytes: 64, At: locHost}, testPattern(9, 64))
	assert.Equal(t, 1, valueActors(h))
}

// At most idleActors value actors wait idle: the others stop once their
// values' transfers settle.
func TestIdleValueActorsAreBounded(t *testing.T) {
	started, release := make(chan struct{}, 2*idleActors), make(chan struct{})
	h := startEngine(t)
	var handles []budget.Handle
	for i := range 2 * idleActors {
		k := nextTestKey()
		h.eng.StoreLoader(k, gatedLoader(byte(i), started, release))
		rep := h.register(budget.ValueSpec{Name: fmt.Sprint("s", i), Bytes: 64, Source: locHost}, nil, k)
		require.NoError(t, rep.Err)
		handles = append(handles, rep.Handle)
	}
	boxes := make([]*replyBox, len(handles))
	for i, hd := range handles {
		boxes[i] = h.box()
		h.send(&messages.Transition{Kind: messages.Place, Handle: hd, To: locGPU0, ReplyTo: boxes[i].pid})
	}
	for range handles {
		<-started
	}
	assert.Equal(t, 2*idleActors, valueActors(h), "one actor per value with a transfer in flight")
	close(release)
	for _, b := range boxes {
		require.NoError(t, b.next(t).(*messages.RunReply).Err)
	}
	h.version()
	// The ones beyond the bound were stopped: wait for them without
	// stopping the idle ones (quiet would).
	require.Eventually(t, func() bool { return valueActors(h) == idleActors }, waitFor, time.Millisecond, "idle actors kept")
}

// A value actor that crashed with nothing else queued is stopped, never
// kept idle: the next value's transfer, right after, is carried out by a
// working actor.
func TestCrashedValueActorIsNotKeptIdle(t *testing.T) {
	var armed atomic.Bool
	armed.Store(true)
	h := startEngine(t, withHooks(Hooks{PanicOnTransfer: func(e budget.Effect) bool {
		return e.Location == locGPU0 && armed.CompareAndSwap(true, false)
	}}))
	a := h.mustRegister(budget.ValueSpec{Name: "a", Bytes: 64, Mode: budget.Replicable, At: locHost}, testPattern(1, 64))
	var crash *ActorCrashError
	require.ErrorAs(t, h.transition(messages.Place, a, "", locGPU0).Err, &crash)
	b := h.mustRegister(budget.ValueSpec{Name: "b", Bytes: 64, At: locHost}, testPattern(2, 64))
	require.NoError(t, h.transition(messages.Place, b, "", locGPU0).Err)
	require.NoError(t, h.transition(messages.Place, a, "", locGPU0).Err)
	assert.Equal(t, testPattern(2, 64), h.read(b, locGPU0))
	assert.Equal(t, testPattern(1, 64), h.read(a, locGPU0))
}
