package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// effectLog records the transfer effects value actors carry out, through
// Hooks.PanicOnTransfer (which then never panics).
type effectLog struct {
	mu      sync.Mutex
	effects []budget.Effect
}

func (l *effectLog) hook(e budget.Effect) bool {
	l.mu.Lock()
	l.effects = append(l.effects, e)
	l.mu.Unlock()
	return false
}

func (l *effectLog) all() []budget.Effect {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]budget.Effect(nil), l.effects...)
}

func TestValueInitializesWithTheRegistrationBytesOrZeros(t *testing.T) {
	h := startEngine(t)
	data := testPattern(3, 777)
	a := h.mustRegister(budget.ValueSpec{Name: "a", Bytes: 777, At: locGPU0}, data)
	assert.Equal(t, data, h.read(a, locGPU0))
	z := h.mustRegister(budget.ValueSpec{Name: "z", Bytes: 100, At: locGPU1}, nil)
	assert.Equal(t, make([]byte, 100), h.read(z, locGPU1), "no data: the fresh buffer's zero bytes")

	bad := h.register(budget.ValueSpec{Name: "bad", Bytes: 100, At: locGPU1}, testPattern(1, 99), 0)
	require.ErrorIs(t, bad.Err, budget.ErrInvalidInput, "data of the wrong size is refused before anything is allocated")
	h.drain(locGPU1)
	assert.EqualValues(t, 100, h.used(locGPU1), "only z's buffer")
	assert.EqualValues(t, 100, h.locRecord(locGPU1).UsedBytes)
}

func TestValueCopyIsByteExactBetweenLocations(t *testing.T) {
	h := startEngine(t)
	const size = 64<<10 + 13
	data := testPattern(7, size)
	r := h.mustRegister(budget.ValueSpec{Name: "r", Bytes: size, Mode: budget.Replicable, At: locHost}, data)

	require.NoError(t, h.transition(messages.Copy, r, locHost, locGPU0).Err)
	require.NoError(t, h.transition(messages.Copy, r, locGPU0, locGPU1).Err)
	for _, loc := range []string{locHost, locGPU0, locGPU1} {
		assert.Equal(t, data, h.read(r, loc), "bytes at %s", loc)
	}

	// An exclusive value moves: its bytes arrive, its source is freed.
	xdata := testPattern(8, size)
	x := h.mustRegister(budget.ValueSpec{Name: "x", Bytes: size, Mode: budget.Exclusive, At: locHost}, xdata)
	require.NoError(t, h.transition(messages.Move, x, locHost, locGPU0).Err)
	assert.Equal(t, xdata, h.read(x, locGPU0))
	h.drain(locHost)
	_, ok := h.eng.Buffers.Get(messages.BufferKey{Value: x.ID, Location: locHost})
	assert.False(t, ok, "the move's source buffer is freed")
	assert.EqualValues(t, size, h.used(locHost), "only r remains at the host")
	assert.Equal(t, h.locRecord(locGPU0).UsedBytes, h.used(locGPU0), "device and ledger agree")
}

// Copies of many values into one location share its stream; an injected
// copy failure fails exactly the transfer whose copy failed.
func TestValueConcurrentCopiesAttributeAFailureToItsOwnTransfer(t *testing.T) {
	h := startEngine(t)
	const rounds, perRound, size = 20, 16, 512
	for round := range rounds {
		hs := make([]budget.Handle, perRound)
		boxes := make([]*replyBox, perRound)
		for i := range hs {
			hs[i] = h.mustRegister(budget.ValueSpec{Name: fmt.Sprintf("r%d-%d", round, i), Bytes: size, Mode: budget.Replicable, At: locHost}, testPattern(byte(round*perRound+i), size))
			boxes[i] = h.box()
		}
		h.be.Faults().Arm(cuda.FaultCopy, locGPU0)
		var wg sync.WaitGroup
		for i := range hs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.send(&messages.Transition{Kind: messages.Place, Handle: hs[i], To: locGPU0, ReplyTo: boxes[i].pid})
			}()
		}
		wg.Wait()
		failed := 0
		placed := make([]bool, perRound)
		for i, b := range boxes {
			rep := b.next(t).(*messages.RunReply)
			if rep.Err != nil {
				failed++
				require.ErrorIs(t, rep.Err, cuda.ErrInjectedFault, "round %d value %d", round, i)
				continue
			}
			require.Equal(t, testPattern(byte(round*perRound+i), size), h.read(hs[i], locGPU0), "round %d value %d: success reported, bytes differ", round, i)
			placed[i] = true
		}
		require.Equal(t, 1, failed, "round %d: exactly the transfer that met the fault fails", round)
		for i, hd := range hs {
			if placed[i] {
				require.NoError(t, h.transition(messages.Evict, hd, locGPU0, "").Err)
			}
		}
		h.drain(locGPU0)
		require.Zero(t, h.used(locGPU0))
		require.Zero(t, h.locRecord(locGPU0).UsedBytes)
	}
}

func TestValueReconstructsThroughATemporaryBufferAtTheSource(t *testing.T) {
	var log effectLog
	h := startEngine(t, withHooks(Hooks{PanicOnTransfer: log.hook}))
	const size = 3000
	var calls atomic.Int32
	k := nextTestKey()
	h.eng.StoreLoader(k, patternLoader(42, &calls))
	rep := h.register(budget.ValueSpec{Name: "s", Bytes: size, Mode: budget.Replicable, Source: locHost}, nil, k)
	require.NoError(t, rep.Err)

	require.NoError(t, h.transition(messages.Place, rep.Handle, "", locGPU0).Err)
	effects := log.all()
	require.Len(t, effects, 1)
	e := effects[0]
	assert.Equal(t, budget.EffectReconstruct, e.Kind)
	assert.Equal(t, locGPU0, e.Location)
	assert.Equal(t, locHost, e.TempAt, "loaded at the source location, then copied")
	assert.EqualValues(t, 1, calls.Load())
	assert.Equal(t, testPattern(42, size), h.read(rep.Handle, locGPU0))

	h.drain(locHost)
	assert.Equal(t, 1, h.eng.Buffers.Len(), "the temporary buffer is gone")
	assert.Zero(t, h.used(locHost), "the temporary buffer was freed at the source")
	hr := h.locRecord(locHost)
	assert.Zero(t, hr.UsedBytes)
	assert.Zero(t, hr.TemporaryBytes)

	// Reconstructing at the source itself loads in place.
	require.NoError(t, h.transition(messages.Place, rep.Handle, "", locHost).Err)
	effects = log.all()
	require.Len(t, effects, 2)
	assert.Empty(t, effects[1].TempAt)
	assert.Equal(t, testPattern(42, size), h.read(rep.Handle, locHost))
	assert.EqualValues(t, size, h.used(locHost))
}

func TestValueFailedReconstructionFreesBothBuffers(t *testing.T) {
	h := startEngine(t)
	loadErr := errors.New("source unreachable")
	var fail atomic.Bool
	k := nextTestKey()
	h.eng.StoreLoader(k, func(_ context.Context, dst []byte) error {
		if fail.Load() {
			return loadErr
		}
		copy(dst, testPattern(1, len(dst)))
		return nil
	})
	rep := h.register(budget.ValueSpec{Name: "s", Bytes: 2000, Mode: budget.Replicable, Source: locHost}, nil, k)
	require.NoError(t, rep.Err)

	check := func(what string) {
		t.Helper()
		h.drain(locHost, locGPU0)
		assert.Zero(t, h.eng.Buffers.Len(), "%s: every buffer of the transfer is freed", what)
		assert.Zero(t, h.used(locHost), what)
		assert.Zero(t, h.used(locGPU0), what)
		hr, gr := h.locRecord(locHost), h.locRecord(locGPU0)
		assert.Zero(t, hr.UsedBytes+hr.TemporaryBytes+gr.UsedBytes, what)
	}

	fail.Store(true)
	pr := h.transition(messages.Place, rep.Handle, "", locGPU0)
	require.ErrorIs(t, pr.Err, loadErr)
	check("loader error")

	fail.Store(false)
	h.be.Faults().Arm(cuda.FaultCopy, locGPU0)
	pr = h.transition(messages.Place, rep.Handle, "", locGPU0)
	require.ErrorIs(t, pr.Err, cuda.ErrInjectedFault, "the copy from the temporary buffer failed")
	check("copy error")

	require.NoError(t, h.transition(messages.Place, rep.Handle, "", locGPU0).Err)
	assert.Equal(t, testPattern(1, 2000), h.read(rep.Handle, locGPU0))
}

// A value with a source but no loader could never be reconstructed: its
// registration is refused, so no transfer can meet a missing loader.
func TestValueWithASourceButNoLoaderIsRefused(t *testing.T) {
	h := startEngine(t)
	before := h.version()
	rep := h.register(budget.ValueSpec{Name: "s", Bytes: 10, Source: locHost}, nil, 0)
	require.ErrorIs(t, rep.Err, budget.ErrInvalidInput)
	assert.Contains(t, rep.Err.Error(), "a source needs a loader")
	assert.Equal(t, before, h.version())
	h.drain(locHost, locGPU0)
	assert.Zero(t, h.eng.Buffers.Len())
	assert.Zero(t, h.locRecord(locGPU0).UsedBytes)
}

func TestValueActorCrashFailsTheTransfer(t *testing.T) {
	var armed atomic.Bool
	h := startEngine(t, withHooks(Hooks{PanicOnTransfer: func(e budget.Effect) bool {
		return e.Location == locGPU0 && armed.CompareAndSwap(true, false)
	}}))
	data := testPattern(5, 4096)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 4096, Mode: budget.Replicable, At: locHost}, data)

	armed.Store(true)
	pr := h.transition(messages.Place, hd, "", locGPU0)
	var crash *ActorCrashError
	require.ErrorAs(t, pr.Err, &crash)
	assert.Contains(t, crash.Reason, "injected value actor panic")
	var pe *budget.PlanExecutionError
	require.ErrorAs(t, pr.Err, &pe)
	assert.Equal(t, budget.PhaseExecute, pe.Phase)

	snap := h.snapshot()
	vr, _ := snap.Value("w")
	require.Len(t, vr.Materializations, 1, "the failed destination is gone from the ledger")
	assert.Equal(t, locHost, vr.Materializations[0].Location)
	gr, _ := snap.Location(locGPU0)
	assert.Zero(t, gr.UsedBytes)
	h.drain(locGPU0)
	_, ok := h.eng.Buffers.Get(messages.BufferKey{Value: hd.ID, Location: locGPU0})
	assert.False(t, ok)
	assert.Zero(t, h.used(locGPU0))
	h.quiet()
	assert.Zero(t, valueActors(h), "nothing else queued: the crashed actor is stopped, not restarted")

	// A new actor carries out the next transfer.
	require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
	assert.Equal(t, data, h.read(hd, locGPU0))
}

func TestValueActorCrashDuringRegistrationRetiresTheHandle(t *testing.T) {
	var armed atomic.Bool
	armed.Store(true)
	h := startEngine(t, withHooks(Hooks{PanicOnTransfer: func(e budget.Effect) bool {
		return e.Kind == budget.EffectInitialize && armed.CompareAndSwap(true, false)
	}}))
	rep := h.register(budget.ValueSpec{Name: "w", Bytes: 64, At: locGPU0}, testPattern(1, 64), 0)
	var crash *ActorCrashError
	require.ErrorAs(t, rep.Err, &crash)
	assert.True(t, rep.Handle.IsZero())
	assert.Zero(t, h.locRecord(locGPU0).UsedBytes)

	again := h.register(budget.ValueSpec{Name: "w", Bytes: 64, At: locGPU0}, testPattern(1, 64), 0)
	require.NoError(t, again.Err, "the name is free again")
	assert.Equal(t, testPattern(1, 64), h.read(again.Handle, locGPU0))
}

func TestValueActorCrashDuringAPlanReleasesTheTemporaryCharge(t *testing.T) {
	var armed atomic.Bool
	armed.Store(true)
	h := startEngine(t, withHooks(Hooks{PanicOnTransfer: func(e budget.Effect) bool {
		return e.Kind == budget.EffectReconstruct && armed.CompareAndSwap(true, false)
	}}))
	k := nextTestKey()
	h.eng.StoreLoader(k, patternLoader(3, nil))
	rep := h.register(budget.ValueSpec{Name: "s", Bytes: 100, Mode: budget.Replicable, Source: locHost}, nil, k)
	require.NoError(t, rep.Err)
	plan := budget.Plan{Enter: []budget.Action{{Handle: rep.Handle, Location: locGPU0}}}

	r, _ := h.ask(func(to *actor.PID) any { return &messages.Execute{Plan: plan, ReplyTo: to} })
	rr := r.(*messages.RunReply)
	var crash *ActorCrashError
	require.ErrorAs(t, rr.Err, &crash)
	hr, gr := h.locRecord(locHost), h.locRecord(locGPU0)
	assert.Zero(t, hr.UsedBytes)
	assert.Zero(t, hr.TemporaryBytes)
	assert.Zero(t, gr.UsedBytes)

	r, _ = h.ask(func(to *actor.PID) any { return &messages.Execute{Plan: plan, ReplyTo: to} })
	require.NoError(t, r.(*messages.RunReply).Err)
	assert.Equal(t, testPattern(3, 100), h.read(rep.Handle, locGPU0))
}

// valueActors counts the value actors alive: the supervisor's children in
// the process registry.
func valueActors(h *harness) int {
	n := 0
	for _, m := range h.eng.System.ProcessRegistry.LocalPIDs.LocalPIDs {
		for _, id := range m.Keys() {
			if strings.HasPrefix(id, "supervisor/") {
				n++
			}
		}
	}
	return n
}

// quiet waits until every value actor the supervisor stopped is gone.
func (h *harness) quiet() {
	h.t.Helper()
	_, err := h.eng.root.RequestFuture(h.eng.Supervisor, &awaitQuiet{}, waitFor).Result()
	require.NoError(h.t, err)
}

// A value has a value actor only while it has transfers in flight, and
// all its transfers go to that one actor, one at a time: a transfer
// queued behind a running one starts only after it; a crash restarts the
// actor for the transfer still queued; once the last settles the actor is
// gone.
func TestValueActorLivesWhileItsValueHasTransfersInFlight(t *testing.T) {
	var log effectLog
	h := startEngine(t, withHooks(Hooks{PanicOnTransfer: func(e budget.Effect) bool {
		log.hook(e)
		return e.Location == locGPU1 // the second transfer below crashes its actor
	}}))
	a := h.mustRegister(budget.ValueSpec{Name: "a", Bytes: 64, At: locHost}, testPattern(1, 64))
	started, release := make(chan struct{}, 3), make(chan struct{})
	k := nextTestKey()
	h.eng.StoreLoader(k, gatedLoader(2, started, release))
	rep := h.register(budget.ValueSpec{Name: "s", Bytes: 64, Mode: budget.Replicable, Source: locHost}, nil, k)
	require.NoError(t, rep.Err)
	s := rep.Handle
	h.quiet()
	assert.Zero(t, valueActors(h), "idle values (one initialized, one with a source) have no actor")
	assert.Equal(t, testPattern(1, 64), h.read(a, locHost))

	// Three transfers of s: to cuda:0 (its loader waits), to cuda:1 (its
	// actor panics as it starts), to the host.
	toGPU0, toGPU1, toHost := h.box(), h.box(), h.box()
	h.send(&messages.Transition{Kind: messages.Place, Handle: s, To: locGPU0, ReplyTo: toGPU0.pid})
	<-started
	h.send(&messages.Transition{Kind: messages.Place, Handle: s, To: locGPU1, ReplyTo: toGPU1.pid})
	h.send(&messages.Transition{Kind: messages.Place, Handle: s, To: locHost, ReplyTo: toHost.pid})
	h.version() // the supervisor has admitted all three
	assert.Equal(t, 1, valueActors(h), "one actor for the value's three transfers")
	assert.Len(t, log.all(), 2, "the transfers queued behind the running one have not started") // a's and the first

	close(release)
	require.NoError(t, toGPU0.next(t).(*messages.RunReply).Err)
	var crash *ActorCrashError
	require.ErrorAs(t, toGPU1.next(t).(*messages.RunReply).Err, &crash)
	require.NoError(t, toHost.next(t).(*messages.RunReply).Err, "the restarted actor carried out the transfer queued behind the crash")
	effects := log.all()
	require.Len(t, effects, 4)
	for i, loc := range []string{locHost, locGPU0, locGPU1, locHost} {
		assert.Equal(t, loc, effects[i].Location, "transfer %d, in admission order", i)
	}
	assert.Equal(t, testPattern(2, 64), h.read(s, locGPU0))
	assert.Equal(t, testPattern(2, 64), h.read(s, locHost))
	h.quiet()
	assert.Zero(t, valueActors(h), "no transfer in flight: no value actor")
}
