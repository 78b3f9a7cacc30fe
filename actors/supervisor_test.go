package actors

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// ---- replies and versions ------------------------------------------------------

func TestSupervisorRegisterPlaceEvictRoundTrip(t *testing.T) {
	h := startEngine(t)
	v0 := h.version()
	data := testPattern(9, 4096)

	rep, v1 := h.ask(func(to *actor.PID) any {
		return &messages.Register{Spec: budget.ValueSpec{Name: "w", Bytes: 4096, Mode: budget.Replicable, At: locHost}, Data: data, ReplyTo: to}
	})
	hr := rep.(*messages.HandleReply)
	require.NoError(t, hr.Err)
	assert.Equal(t, "w", hr.Handle.Name)
	assert.Equal(t, "actors-test", hr.Handle.Manager)
	assert.Equal(t, v1, hr.Version, "the reply carries the version after the registration")
	assert.Equal(t, v0+2, v1, "registration at a location: admit and complete")
	assert.Equal(t, data, h.read(hr.Handle, locHost), "initialized with the registration's bytes")

	rep, _ = h.ask(func(to *actor.PID) any { return &messages.Lookup{Name: "w", ReplyTo: to} })
	assert.Equal(t, hr.Handle, rep.(*messages.HandleReply).Handle)

	pr := h.transition(messages.Place, hr.Handle, "", locGPU0)
	require.NoError(t, pr.Err)
	v2 := h.version()
	assert.Equal(t, v2, pr.Version)
	assert.Equal(t, v1+2, v2, "a place: admit and complete")
	assert.Equal(t, data, h.read(hr.Handle, locGPU0))
	assert.EqualValues(t, 4096, h.locRecord(locGPU0).UsedBytes)
	assert.EqualValues(t, 4096, h.used(locGPU0))

	// Placing a resident endpoint again is a no-op: no version.
	pr = h.transition(messages.Place, hr.Handle, "", locGPU0)
	require.NoError(t, pr.Err)
	assert.Equal(t, v2, pr.Version)

	er := h.transition(messages.Evict, hr.Handle, locGPU0, "")
	require.NoError(t, er.Err)
	assert.Equal(t, v2+1, er.Version, "an evict: one removal")
	h.drain(locGPU0)
	_, ok := h.eng.Buffers.Get(messages.BufferKey{Value: hr.Handle.ID, Location: locGPU0})
	assert.False(t, ok, "the evicted buffer is freed")
	assert.Zero(t, h.used(locGPU0))
	assert.Zero(t, h.locRecord(locGPU0).UsedBytes)
	assert.Equal(t, data, h.read(hr.Handle, locHost), "the other materialization is untouched")

	tr, _ := h.ask(func(to *actor.PID) any { return &messages.Trace{ReplyTo: to} })
	var kinds []string
	for _, x := range tr.(*messages.TraceReply).Trace {
		kinds = append(kinds, x.Kind)
	}
	assert.Equal(t, []string{"admit", "complete", "admit", "complete", "remove"}, kinds)
}

func TestSupervisorRefusalsAnswerOnceWithTheLedgerError(t *testing.T) {
	h := startEngine(t)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 100, At: locHost}, nil)
	v := h.version()

	dup := h.register(budget.ValueSpec{Name: "w", Bytes: 100, At: locHost}, nil, 0)
	assert.ErrorIs(t, dup.Err, budget.ErrInvalidInput)
	assert.Equal(t, v, dup.Version, "a refusal changes nothing")

	rep, _ := h.ask(func(to *actor.PID) any { return &messages.Acquire{Handle: hd, Location: locGPU0, ReplyTo: to} })
	var un *budget.UnavailableError
	assert.ErrorAs(t, rep.(*messages.LeaseReply).Err, &un)

	ev := h.transition(messages.Evict, hd, locHost, "")
	assert.ErrorIs(t, ev.Err, budget.ErrPlan, "evicting the last materialization of a value without a source")

	big := h.register(budget.ValueSpec{Name: "big", Bytes: gpuBudget + 1, At: locGPU0}, nil, 0)
	var be *budget.BudgetError
	assert.ErrorAs(t, big.Err, &be)

	rep, _ = h.ask(func(to *actor.PID) any { return &messages.Lookup{Name: "nope", ReplyTo: to} })
	assert.ErrorIs(t, rep.(*messages.HandleReply).Err, budget.ErrInvalidInput)
	assert.Equal(t, v, h.version())
	assert.Equal(t, 1, h.eng.Buffers.Len())
}

// Every kind of request is answered exactly once, with its reply type.
func TestSupervisorEveryRequestKindGetsExactlyOneReply(t *testing.T) {
	h := startEngine(t)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 1000, Mode: budget.Replicable, At: locHost}, testPattern(1, 1000))
	plan := budget.Plan{Enter: []budget.Action{{Handle: hd, Location: locGPU0}}}

	var lease budget.LeaseID
	var hold budget.HoldID
	var scopeLeases []budget.LeaseID
	steps := []struct {
		name  string
		build func(to *actor.PID) any
		check func(t *testing.T, rep any)
	}{
		{"Acquire", func(to *actor.PID) any { return &messages.Acquire{Handle: hd, Location: locHost, ReplyTo: to} },
			func(t *testing.T, rep any) {
				r := rep.(*messages.LeaseReply)
				require.NoError(t, r.Err)
				lease = r.Lease
			}},
		{"Release", func(to *actor.PID) any { return &messages.Release{Lease: lease, ReplyTo: to} },
			func(t *testing.T, rep any) { require.NoError(t, rep.(*messages.Reply).Err) }},
		{"Release again", func(to *actor.PID) any { return &messages.Release{Lease: lease, ReplyTo: to} },
			func(t *testing.T, rep any) { require.ErrorIs(t, rep.(*messages.Reply).Err, budget.ErrInvalidInput) }},
		{"Hold", func(to *actor.PID) any { return &messages.Hold{Handle: hd, Location: locHost, ReplyTo: to} },
			func(t *testing.T, rep any) {
				r := rep.(*messages.HoldReply)
				require.NoError(t, r.Err)
				hold = r.Hold
			}},
		{"Unhold", func(to *actor.PID) any { return &messages.Unhold{Hold: hold, ReplyTo: to} },
			func(t *testing.T, rep any) { require.NoError(t, rep.(*messages.Reply).Err) }},
		{"Reserve", func(to *actor.PID) any {
			return &messages.Reserve{Location: locGPU1, Name: "ws", Bytes: 10, ReplyTo: to}
		},
			func(t *testing.T, rep any) { require.NoError(t, rep.(*messages.Reply).Err) }},
		{"Unreserve", func(to *actor.PID) any { return &messages.Unreserve{Name: "ws", ReplyTo: to} },
			func(t *testing.T, rep any) { require.NoError(t, rep.(*messages.Reply).Err) }},
		{"Explain", func(to *actor.PID) any { return &messages.Explain{Plan: plan, ReplyTo: to} },
			func(t *testing.T, rep any) { assert.True(t, rep.(*messages.ExplainReply).Explanation.Feasible) }},
		{"Decide", func(to *actor.PID) any {
			return &messages.Decide{Request: budget.Request{Name: "r", Requirements: []budget.Requirement{{Handle: hd, Tiers: [][]string{{locGPU0}}}}}, ReplyTo: to}
		}, func(t *testing.T, rep any) {
			r := rep.(*messages.DecideReply)
			require.NoError(t, r.Err)
			assert.Equal(t, "r", r.Decision.RequestName)
		}},
		{"Execute", func(to *actor.PID) any { return &messages.Execute{Plan: plan, ReplyTo: to} },
			func(t *testing.T, rep any) {
				r := rep.(*messages.RunReply)
				require.NoError(t, r.Err)
				assert.Nil(t, r.Decision)
				assert.NotEmpty(t, r.Report.Transitions)
			}},
		{"EnterScope", func(to *actor.PID) any {
			return &messages.EnterScope{Scope: "s", Plan: budget.Plan{Enter: []budget.Action{{Handle: hd, Location: locGPU1}}}, ReplyTo: to}
		}, func(t *testing.T, rep any) {
			r := rep.(*messages.RunReply)
			require.NoError(t, r.Err)
			require.Len(t, r.Leases, 1)
			scopeLeases = r.Leases
		}},
		{"ExitScope", func(to *actor.PID) any { return &messages.ExitScope{Scope: "s", Leases: scopeLeases, ReplyTo: to} },
			func(t *testing.T, rep any) { require.NoError(t, rep.(*messages.RunReply).Err) }},
		{"ExitScope again", func(to *actor.PID) any { return &messages.ExitScope{Scope: "s", Leases: scopeLeases, ReplyTo: to} },
			func(t *testing.T, rep any) {
				var pe *budget.PlanExecutionError
				require.ErrorAs(t, rep.(*messages.RunReply).Err, &pe)
				assert.Equal(t, budget.PhaseExit, pe.Phase)
			}},
		{"EnterScope stale", func(to *actor.PID) any {
			return &messages.EnterScope{Scope: "s2", Plan: plan, CheckVersion: true, ExpectedVersion: 1, ReplyTo: to}
		}, func(t *testing.T, rep any) {
			var st *budget.StaleStateError
			require.ErrorAs(t, rep.(*messages.RunReply).Err, &st)
		}},
		{"AwaitReap of no event", func(to *actor.PID) any { return &messages.AwaitReap{Event: 99, ReplyTo: to} },
			func(t *testing.T, rep any) { require.NoError(t, rep.(*messages.Reply).Err) }},
		{"EventDone of no event", func(to *actor.PID) any { return &messages.EventDone{Event: 99, ReplyTo: to} },
			func(t *testing.T, rep any) { require.ErrorIs(t, rep.(*messages.Reply).Err, budget.ErrInvalidInput) }},
		{"Snapshot", func(to *actor.PID) any { return &messages.Snapshot{ReplyTo: to} },
			func(t *testing.T, rep any) {
				s := rep.(*messages.SnapshotReply).Frozen.Snapshot()
				v, ok := s.Value("w")
				require.True(t, ok)
				assert.Len(t, v.Materializations, 3)
			}},
		{"Trace", func(to *actor.PID) any { return &messages.Trace{ReplyTo: to} },
			func(t *testing.T, rep any) { assert.NotEmpty(t, rep.(*messages.TraceReply).Trace) }},
		{"Transition discard", func(to *actor.PID) any { return &messages.Transition{Kind: messages.Discard, Handle: hd, ReplyTo: to} },
			func(t *testing.T, rep any) { require.NoError(t, rep.(*messages.RunReply).Err) }},
	}
	for _, st := range steps {
		rep, _ := h.ask(st.build)
		t.Run(st.name, func(t *testing.T) { st.check(t, rep) })
	}
	h.drain(locHost, locGPU0, locGPU1)
	assert.Zero(t, h.eng.Buffers.Len(), "discard freed every materialization")
}

// ---- loader hand-over ----------------------------------------------------------

func TestSupervisorBindsAParkedLoaderOnSuccess(t *testing.T) {
	h := startEngine(t)
	var calls atomic.Int32
	k := nextTestKey()
	h.eng.StoreLoader(k, patternLoader(5, &calls))
	loaders, _ := h.eng.Parked()
	require.Equal(t, 1, loaders)

	rep := h.register(budget.ValueSpec{Name: "src", Bytes: 2048, Mode: budget.Replicable, Source: locHost}, nil, k)
	require.NoError(t, rep.Err)
	loaders, events := h.eng.Parked()
	assert.Zero(t, loaders, "the supervisor took the parked loader")
	assert.Zero(t, events)
	assert.Equal(t, 1, h.eng.Bound(), "bound to the new handle")

	require.NoError(t, h.transition(messages.Place, rep.Handle, "", locGPU0).Err)
	assert.EqualValues(t, 1, calls.Load())
	assert.Equal(t, testPattern(5, 2048), h.read(rep.Handle, locGPU0))
}

func TestSupervisorDropsTheLoaderOfARefusedRegistration(t *testing.T) {
	h := startEngine(t)
	k1 := nextTestKey()
	h.eng.StoreLoader(k1, patternLoader(1, nil))
	require.NoError(t, h.register(budget.ValueSpec{Name: "v", Bytes: 10, Source: locHost}, nil, k1).Err)

	var calls atomic.Int32
	k2 := nextTestKey()
	h.eng.StoreLoader(k2, patternLoader(2, &calls))
	rep := h.register(budget.ValueSpec{Name: "v", Bytes: 10, Source: locHost}, nil, k2)
	require.ErrorIs(t, rep.Err, budget.ErrInvalidInput, "duplicate name")
	loaders, _ := h.eng.Parked()
	assert.Zero(t, loaders, "a refused registration leaves no parked loader")
	assert.Equal(t, 1, h.eng.Bound(), "the first value keeps its own loader")

	k3 := nextTestKey()
	h.eng.StoreLoader(k3, patternLoader(3, nil))
	rep = h.register(budget.ValueSpec{Name: "", Bytes: 10, Source: locHost}, nil, k3)
	require.ErrorIs(t, rep.Err, budget.ErrInvalidInput, "empty name")
	loaders, _ = h.eng.Parked()
	assert.Zero(t, loaders)
	assert.Zero(t, calls.Load())
}

func TestSupervisorDropsTheLoaderOfAFailedRegistration(t *testing.T) {
	h := startEngine(t)
	k := nextTestKey()
	h.eng.StoreLoader(k, patternLoader(4, nil))
	h.be.Faults().Arm(cuda.FaultAlloc, locGPU0)

	// A loader for a value without a source is refused before anything
	// is admitted (field checks), and the parked loader is dropped.
	before := h.version()
	refused := h.register(budget.ValueSpec{Name: "v", Bytes: 64, At: locGPU0}, testPattern(4, 64), k)
	require.ErrorIs(t, refused.Err, budget.ErrInvalidInput)
	assert.Contains(t, refused.Err.Error(), "a loader needs a source location")
	assert.Equal(t, before, h.version(), "refused: nothing changed")
	loaders, _ := h.eng.Parked()
	assert.Zero(t, loaders)

	// The initialization fails (the fault is still armed).
	rep := h.register(budget.ValueSpec{Name: "v", Bytes: 64, At: locGPU0}, testPattern(4, 64), 0)
	var pe *budget.PlanExecutionError
	require.ErrorAs(t, rep.Err, &pe, "the initialization failed")
	var inj *cuda.InjectedFaultError
	require.ErrorAs(t, rep.Err, &inj)
	assert.Equal(t, rep.Version, h.version())
	loaders, _ = h.eng.Parked()
	assert.Zero(t, loaders)
	assert.Zero(t, h.eng.Bound(), "a failed registration keeps no loader")
	assert.Zero(t, h.locRecord(locGPU0).UsedBytes)
	h.drain(locGPU0)
	assert.Zero(t, h.used(locGPU0))

	again := h.register(budget.ValueSpec{Name: "v", Bytes: 64, At: locGPU0}, testPattern(4, 64), 0)
	require.NoError(t, again.Err, "the name is free again")
	assert.Equal(t, testPattern(4, 64), h.read(again.Handle, locGPU0))
}

func TestSupervisorDropsTheLoaderOnDiscard(t *testing.T) {
	h := startEngine(t)
	k := nextTestKey()
	h.eng.StoreLoader(k, patternLoader(6, nil))
	rep := h.register(budget.ValueSpec{Name: "v", Bytes: 64, Source: locHost}, nil, k)
	require.NoError(t, rep.Err)
	require.NoError(t, h.transition(messages.Place, rep.Handle, "", locGPU0).Err)
	require.Equal(t, 1, h.eng.Bound())

	require.NoError(t, h.transition(messages.Discard, rep.Handle, "", "").Err)
	assert.Zero(t, h.eng.Bound(), "a discarded value keeps no loader")
	h.drain(locHost, locGPU0)
	assert.Zero(t, h.eng.Buffers.Len())
	assert.Zero(t, h.used(locGPU0))

	// A refused discard keeps it.
	k2 := nextTestKey()
	h.eng.StoreLoader(k2, patternLoader(7, nil))
	rep = h.register(budget.ValueSpec{Name: "v", Bytes: 64, Source: locHost}, nil, k2)
	require.NoError(t, rep.Err)
	require.NoError(t, h.transition(messages.Place, rep.Handle, "", locGPU0).Err)
	lease := h.acquire(rep.Handle, locGPU0)
	var iu *budget.InUseError
	require.ErrorAs(t, h.transition(messages.Discard, rep.Handle, "", "").Err, &iu)
	assert.Equal(t, 1, h.eng.Bound())
	rel, _ := h.ask(func(to *actor.PID) any { return &messages.Release{Lease: lease, ReplyTo: to} })
	require.NoError(t, rel.(*messages.Reply).Err)
	require.NoError(t, h.transition(messages.Discard, rep.Handle, "", "").Err)
	assert.Zero(t, h.eng.Bound())
}

// Concurrent registrations of one name each park their own loader: the one
// that wins is bound to its own loader, the others' are dropped.
func TestSupervisorConcurrentRegistrationsOfOneNameKeepTheirOwnLoader(t *testing.T) {
	h := startEngine(t)
	const n = 8
	boxes := make([]*replyBox, n)
	for i := range boxes {
		boxes[i] = h.box()
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := nextTestKey()
			h.eng.StoreLoader(k, patternLoader(byte(100+i), nil))
			h.send(&messages.Register{Spec: budget.ValueSpec{Name: "same", Bytes: 512, Mode: budget.Replicable, Source: locHost}, LoaderKey: k, ReplyTo: boxes[i].pid})
		}()
	}
	wg.Wait()
	winner := -1
	var hd budget.Handle
	for i, b := range boxes {
		rep := b.next(t).(*messages.HandleReply)
		if rep.Err == nil {
			require.Equal(t, -1, winner, "two registrations of one name succeeded")
			winner, hd = i, rep.Handle
			continue
		}
		assert.ErrorIs(t, rep.Err, budget.ErrInvalidInput)
	}
	require.NotEqual(t, -1, winner)
	loaders, _ := h.eng.Parked()
	assert.Zero(t, loaders)
	assert.Equal(t, 1, h.eng.Bound())
	require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
	assert.Equal(t, testPattern(byte(100+winner), 512), h.read(hd, locGPU0), "the winner reconstructs with its own loader")
}

// ---- consumer events -------------------------------------------------------------

func TestSupervisorRecordedEventIsWatchedAndReaped(t *testing.T) {
	h := startEngine(t)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 256, At: locHost}, nil)
	lease := h.acquire(hd, locHost)

	ev := newTestEvent()
	k := nextTestKey()
	h.eng.StoreEvent(k, ev)
	rep, v := h.ask(func(to *actor.PID) any { return &messages.RecordEvent{Lease: lease, EventKey: k, ReplyTo: to} })
	er := rep.(*messages.EventReply)
	require.NoError(t, er.Err)
	require.NotZero(t, er.Event)
	assert.Equal(t, v, er.Version)

	// The pending event protects the endpoint after the lease is released.
	rel, _ := h.ask(func(to *actor.PID) any { return &messages.Release{Lease: lease, ReplyTo: to} })
	require.NoError(t, rel.(*messages.Reply).Err)
	snap := h.snapshot()
	vr, _ := snap.Value("w")
	require.Len(t, vr.Materializations, 1)
	assert.Equal(t, 1, vr.Materializations[0].PendingEventCount)
	var iu *budget.InUseError
	require.ErrorAs(t, h.transition(messages.Discard, hd, "", "").Err, &iu)

	reaped := h.box()
	h.send(&messages.AwaitReap{Event: er.Event, ReplyTo: reaped.pid})
	ev.complete()
	r := reaped.next(t).(*messages.Reply)
	require.NoError(t, r.Err)

	loaders, events := h.eng.Parked()
	assert.Zero(t, loaders)
	assert.Zero(t, events, "the supervisor took the event to watch it")
	snap = h.snapshot()
	vr, _ = snap.Value("w")
	assert.Zero(t, vr.Materializations[0].PendingEventCount, "the event is reaped")
	var kinds []string
	tr, _ := h.ask(func(to *actor.PID) any { return &messages.Trace{ReplyTo: to} })
	for _, x := range tr.(*messages.TraceReply).Trace {
		kinds = append(kinds, x.Kind)
	}
	assert.Contains(t, kinds, "reap_event")
	require.NoError(t, h.transition(messages.Discard, hd, "", "").Err)

	// Reaping it again is refused.
	rep, _ = h.ask(func(to *actor.PID) any { return &messages.EventDone{Event: er.Event, ReplyTo: to} })
	assert.ErrorIs(t, rep.(*messages.Reply).Err, budget.ErrInvalidInput)
}

func TestSupervisorDropsTheEventOfARefusedRecord(t *testing.T) {
	h := startEngine(t)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 256, At: locHost}, nil)
	lease := h.acquire(hd, locHost)
	rel, _ := h.ask(func(to *actor.PID) any { return &messages.Release{Lease: lease, ReplyTo: to} })
	require.NoError(t, rel.(*messages.Reply).Err)
	v := h.version()

	k := nextTestKey()
	h.eng.StoreEvent(k, newTestEvent())
	rep, _ := h.ask(func(to *actor.PID) any { return &messages.RecordEvent{Lease: lease, EventKey: k, ReplyTo: to} })
	er := rep.(*messages.EventReply)
	require.ErrorIs(t, er.Err, budget.ErrInvalidInput, "recording on a released lease")
	assert.Zero(t, er.Event)
	assert.Equal(t, v, er.Version)
	_, events := h.eng.Parked()
	assert.Zero(t, events, "the refused event is dropped")
}

// ---- Admit -------------------------------------------------------------------------

func TestSupervisorAdmitDecidesAndEntersInOneStep(t *testing.T) {
	h := startEngine(t)
	const size = 600 << 10 // two do not fit in one device budget
	x := h.mustRegister(budget.ValueSpec{Name: "x", Bytes: size, Mode: budget.Replicable, At: locHost}, testPattern(1, size))
	y := h.mustRegister(budget.ValueSpec{Name: "y", Bytes: size, Mode: budget.Replicable, At: locHost}, testPattern(2, size))
	req := func(hd budget.Handle) budget.Request {
		return budget.Request{Name: "need-" + hd.Name, Requirements: []budget.Requirement{{Handle: hd, Tiers: [][]string{{locGPU0}}}}}
	}

	before := h.version()
	rep, after := h.ask(func(to *actor.PID) any { return &messages.Admit{Request: req(x), Scope: "s1", ReplyTo: to} })
	rr := rep.(*messages.RunReply)
	require.NoError(t, rr.Err)
	require.NotNil(t, rr.Decision, "an Admit's reply carries its decision")
	assert.Equal(t, "need-x", rr.Decision.RequestName)
	assert.Equal(t, before, rr.Decision.ExpectedStateVersion, "decided on the state it entered")
	require.Len(t, rr.Decision.Plan.Enter, 1)
	assert.Equal(t, locGPU0, rr.Decision.Plan.Enter[0].Location)
	require.Len(t, rr.Leases, 1, "one lease per entered endpoint")
	assert.Equal(t, after, rr.Version)
	assert.Equal(t, testPattern(1, size), h.read(x, locGPU0))

	// y does not fit while x is leased at locGPU0.
	rep, _ = h.ask(func(to *actor.PID) any { return &messages.Admit{Request: req(y), Scope: "s2", ReplyTo: to} })
	rr2 := rep.(*messages.RunReply)
	require.Error(t, rr2.Err)
	assert.Nil(t, rr2.Decision, "no decision was made")
	assert.Equal(t, after, h.version(), "a refused Admit changes nothing")

	rep, _ = h.ask(func(to *actor.PID) any { return &messages.ExitScope{Scope: "s1", Leases: rr.Leases, ReplyTo: to} })
	require.NoError(t, rep.(*messages.RunReply).Err)

	// Now x is evicted for y, in the same step.
	rep, _ = h.ask(func(to *actor.PID) any { return &messages.Admit{Request: req(y), Scope: "s2", ReplyTo: to} })
	rr3 := rep.(*messages.RunReply)
	require.NoError(t, rr3.Err)
	require.NotNil(t, rr3.Decision)
	require.Len(t, rr3.Decision.Evictions, 1)
	assert.Equal(t, x, rr3.Decision.Evictions[0].Handle)
	assert.Equal(t, locGPU0, rr3.Decision.Evictions[0].Location)
	h.drain(locGPU0)
	_, ok := h.eng.Buffers.Get(messages.BufferKey{Value: x.ID, Location: locGPU0})
	assert.False(t, ok, "the victim's buffer was freed")
	assert.EqualValues(t, size, h.used(locGPU0), "the device holds exactly what the ledger admitted")
	assert.Equal(t, testPattern(2, size), h.read(y, locGPU0))
}

// ---- the fatal stop ------------------------------------------------------------------

func TestSupervisorPanicStopsTheRuntimeWithFatalError(t *testing.T) {
	var armed atomic.Bool
	armed.Store(true)
	var kinds sync.Map
	h := startEngine(t, withHooks(Hooks{AfterLedger: func(kind string) {
		kinds.Store(kind, true)
		if kind == "Reserve" && armed.CompareAndSwap(true, false) {
			panic("injected ledger invariant panic")
		}
	}}))

	// Two transfers held in flight by their loaders: a direct place and a
	// plan step. The loaders ignore their context: Shutdown cancels the
	// context of every load, and a load that honoured it would end its
	// transfer (and answer its caller) before the panic, a race with the
	// Reserve below. They return once the test releases them, before Stop.
	startedA, startedB := make(chan struct{}, 1), make(chan struct{}, 1)
	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	ka, kb := nextTestKey(), nextTestKey()
	h.eng.StoreLoader(ka, stubbornLoader(1, startedA, release))
	h.eng.StoreLoader(kb, stubbornLoader(2, startedB, release))
	a := h.register(budget.ValueSpec{Name: "a", Bytes: 1000, Mode: budget.Replicable, Source: locHost}, nil, ka)
	require.NoError(t, a.Err)
	b := h.register(budget.ValueSpec{Name: "b", Bytes: 1000, Mode: budget.Replicable, Source: locHost}, nil, kb)
	require.NoError(t, b.Err)
	c := h.mustRegister(budget.ValueSpec{Name: "c", Bytes: 1000, At: locHost}, testPattern(3, 1000))
	lease := h.acquire(c, locHost)
	ev := newTestEvent() // never completed
	ke := nextTestKey()
	h.eng.StoreEvent(ke, ev)
	rep, _ := h.ask(func(to *actor.PID) any { return &messages.RecordEvent{Lease: lease, EventKey: ke, ReplyTo: to} })
	event := rep.(*messages.EventReply).Event
	require.NotZero(t, event)

	placeBox, execBox, reapBox, shutBox := h.box(), h.box(), h.box(), h.box()
	h.send(&messages.Transition{Kind: messages.Place, Handle: a.Handle, To: locGPU0, ReplyTo: placeBox.pid})
	<-startedA
	h.send(&messages.Execute{Plan: budget.Plan{Enter: []budget.Action{{Handle: b.Handle, Location: locGPU1}}}, ReplyTo: execBox.pid})
	<-startedB
	h.send(&messages.AwaitReap{Event: event, ReplyTo: reapBox.pid})
	h.send(&messages.Shutdown{ReplyTo: shutBox.pid}) // waits for the transfers
	v := h.version()
	require.Greater(t, h.eng.Buffers.Len(), 0)

	rep, _ = h.ask(func(to *actor.PID) any { return &messages.Reserve{Location: locGPU1, Name: "r", Bytes: 1, ReplyTo: to} })
	fr, ok := rep.(*messages.FatalReply)
	require.True(t, ok, "the request being handled is answered with a FatalReply, got %T", rep)
	var fatal *FatalError
	require.ErrorAs(t, fr.Err, &fatal)
	assert.Equal(t, "Reserve", fatal.Message)
	assert.Contains(t, fatal.Reason, "injected ledger invariant panic")
	assert.Equal(t, v+1, fatal.Version, "the change was applied before the panic")
	assert.Contains(t, fatal.Stack, "actors.(*supervisor)")
	assert.Contains(t, fatal.Error(), "Reserve")

	for name, b := range map[string]*replyBox{"place": placeBox, "execute": execBox, "await reap": reapBox, "shutdown": shutBox} {
		m := b.next(t)
		f, ok := m.(*messages.FatalReply)
		require.True(t, ok, "%s's caller: got %T", name, m)
		assert.Same(t, fatal, f.Err, "%s's caller gets the same fatal error", name)
		assert.Len(t, b.ch, 0, "%s's caller is answered once", name)
	}

	// Every later request.
	later := []func(to *actor.PID) any{
		func(to *actor.PID) any { return &messages.Snapshot{ReplyTo: to} },
		func(to *actor.PID) any { return &messages.Acquire{Handle: c, Location: locHost, ReplyTo: to} },
		func(to *actor.PID) any {
			return &messages.Transition{Kind: messages.Evict, Handle: c, From: locHost, ReplyTo: to}
		},
		func(to *actor.PID) any {
			return &messages.Reserve{Location: locGPU1, Name: "r2", Bytes: 1, ReplyTo: to}
		},
	}
	for _, build := range later {
		rep, _ := h.ask(build)
		f, ok := rep.(*messages.FatalReply)
		require.True(t, ok, "got %T", rep)
		assert.Same(t, fatal, f.Err)
	}
	// What a later request parked is dropped.
	kl, ke2 := nextTestKey(), nextTestKey()
	h.eng.StoreLoader(kl, patternLoader(9, nil))
	rep, _ = h.ask(func(to *actor.PID) any {
		return &messages.Register{Spec: budget.ValueSpec{Name: "late", Bytes: 10, Source: locHost}, LoaderKey: kl, ReplyTo: to}
	})
	require.IsType(t, &messages.FatalReply{}, rep)
	h.eng.StoreEvent(ke2, newTestEvent())
	rep, _ = h.ask(func(to *actor.PID) any { return &messages.RecordEvent{Lease: lease, EventKey: ke2, ReplyTo: to} })
	require.IsType(t, &messages.FatalReply{}, rep)
	loaders, events := h.eng.Parked()
	assert.Zero(t, loaders)
	// The event recorded before the stop was taken by the supervisor when
	// it recorded it; the refused one is gone when the refusal arrives.
	assert.Zero(t, events)
	_, parked := h.eng.events.get(ke2)
	assert.False(t, parked, "the refused RecordEvent's event is dropped")

	// Stop frees every buffer the ledger can no longer free.
	close(release)
	released = true
	h.stop()
	_, sawReserve := kinds.Load("Reserve")
	assert.True(t, sawReserve)
}

func TestRequestKindNamesTheMessageType(t *testing.T) {
	assert.Equal(t, "Register", requestKind(&messages.Register{}))
	assert.Equal(t, "Transition", requestKind(&messages.Transition{}))
	assert.Equal(t, "Admit", requestKind(&messages.Admit{}))
	assert.Equal(t, "<nil>", requestKind(nil))
	assert.Equal(t, "int", requestKind(3))
}

// A panic while the supervisor settles a transfer (TransferDone: the
// ledger's Complete, Fail, or the reply to the transition's caller) must
// still answer the caller waiting on that transfer with the FatalError:
// "every caller waiting on a transfer … receive[s] the same FatalError".
func TestSupervisorPanicWhileSettlingATransferAnswersItsCaller(t *testing.T) {
	var armed atomic.Bool
	h := startEngine(t, withHooks(Hooks{AfterLedger: func(kind string) {
		// A Place with a transfer is answered only while the transfer
		// settles (TransferDone), so the hook for "Transition" runs there.
		if kind == "Transition" && armed.CompareAndSwap(true, false) {
			panic("injected ledger invariant panic while settling")
		}
	}}))
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 100, Mode: budget.Replicable, At: locHost}, testPattern(1, 100))

	armed.Store(true)
	b := h.box()
	h.send(&messages.Transition{Kind: messages.Place, Handle: hd, To: locGPU0, ReplyTo: b.pid})
	select {
	case m := <-b.ch:
		f, ok := m.(*messages.FatalReply)
		require.True(t, ok, "got %T", m)
		var fatal *FatalError
		require.ErrorAs(t, f.Err, &fatal)
	case <-time.After(2 * time.Second):
		t.Fatal("the Place's caller was never answered: the pending transfer was removed before the panic, so the fatal stop did not reach its caller")
	}
	h.stop()
}

// Hooks.AfterLedger is documented to receive the request's kind
// ("Register", "Transition", …). A request whose transfer is pending is
// answered while the supervisor handles TransferDone, and the hook then
// names "TransferDone" instead of the request.
func TestSupervisorAfterLedgerNamesTheRequestOfAPendingTransfer(t *testing.T) {
	var mu sync.Mutex
	var kinds []string
	h := startEngine(t, withHooks(Hooks{AfterLedger: func(kind string) {
		mu.Lock()
		kinds = append(kinds, kind)
		mu.Unlock()
	}}))
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 100, Mode: budget.Replicable, At: locHost}, nil)
	require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, kinds, "Register")
	assert.Contains(t, kinds, "Transition")
	assert.NotContains(t, kinds, "TransferDone", "TransferDone is no request of a caller")
}
