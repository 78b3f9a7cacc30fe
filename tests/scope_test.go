package tests

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// scopeFixture: cuda:0 (budget 1000) holds a replicable victim of 500
// bytes (also at pinned-host); x (exclusive, 400) and y (replicable, 100)
// are at pinned-host. The plan reclaims the victim, reserves 200 at cuda:0,
// moves x to cuda:0 and copies y to cuda:1: without the reclaim cuda:0
// would need 500 + 200 + 400 = 1100 bytes.
type scopeFixture struct {
	sys             *system.System
	victim, x, y    system.Handle
	plan            system.Plan
	xData, yData    []byte
	victimData      []byte
	reservationName string
}

func newScopeFixture(t *testing.T) *scopeFixture {
	t.Helper()
	ctx := context.Background()
	f := &scopeFixture{sys: start(t, system.Options{Locations: fourLocations(0, 0, 1000)}), reservationName: "ws"}
	f.victimData, f.xData, f.yData = pattern(500, 1), pattern(400, 2), pattern(100, 3)
	f.victim = register(t, f.sys, system.Value{Name: "victim", Bytes: 500, Mode: system.Replicable, At: "pinned-host", Data: f.victimData})
	must(t, f.sys.Copy(ctx, f.victim, "pinned-host", "cuda:0"), "copy victim")
	f.x = register(t, f.sys, system.Value{Name: "x", Bytes: 400, At: "pinned-host", Data: f.xData})
	f.y = register(t, f.sys, system.Value{Name: "y", Bytes: 100, Mode: system.Replicable, At: "pinned-host", Data: f.yData})
	f.plan = system.Plan{
		Reclaim:      []system.Action{{Handle: f.victim, Location: "cuda:0"}},
		Reservations: []system.ReservationSpec{{Name: f.reservationName, Location: "cuda:0", Bytes: 200}},
		Enter:        []system.Action{{Handle: f.x, Location: "cuda:0"}, {Handle: f.y, Location: "cuda:1"}},
	}
	return f
}

func TestScopeStaleCheckComesFirst(t *testing.T) {
	ctx := context.Background()
	f := newScopeFixture(t)
	v0 := snapshot(t, f.sys).StateVersion
	must(t, f.sys.Reserve(ctx, "cuda:0", "blocker", 500), "reserve")
	// The plan is now infeasible too (its reservation no longer fits),
	// but staleness is checked first, before the preflight.
	ex, err := f.sys.Explain(ctx, f.plan)
	must(t, err, "explain")
	if ex.Feasible {
		t.Fatalf("plan should be infeasible now: %+v", ex)
	}
	before := snapshot(t, f.sys)
	sc := f.sys.NewScopeExpecting(f.plan, v0)
	err = sc.Enter(ctx)
	se := as[*system.StaleStateError](t, err, "stale and infeasible")
	equal(t, system.StaleStateError{ExpectedVersion: v0, ActualVersion: v0 + 1}, *se, "stale state error")
	unchanged(t, f.sys, before, "stale entry")
}

func TestScopePreflightChangesNothing(t *testing.T) {
	ctx := context.Background()
	f := newScopeFixture(t)
	// A lease on y at pinned-host: the plan's reclaim 0 (victim) would
	// succeed, reclaim 1 (y) would not. The preflight refuses the whole
	// plan before the first reclaim.
	l, err := f.sys.Acquire(ctx, f.y, "pinned-host")
	must(t, err, "acquire")
	defer func() { must(t, l.Release(ctx), "release") }()
	must(t, f.sys.Copy(ctx, f.y, "pinned-host", "cuda:1"), "copy y")
	plan := f.plan
	plan.Reclaim = []system.Action{{Handle: f.victim, Location: "cuda:0"}, {Handle: f.y, Location: "pinned-host"}}
	plan.Enter = plan.Enter[:1]

	for _, c := range []struct {
		name string
		p    system.Plan
	}{
		{"reclaim of a leased materialization", plan},
		{"over budget without the reclaim", system.Plan{Reservations: f.plan.Reservations, Enter: f.plan.Enter}},
		{"entered endpoint gone at the end", system.Plan{Enter: []system.Action{
			{Handle: f.x, Location: "cuda:1"}, {Handle: f.x, Location: "pageable-host", From: "cuda:1"}}}},
	} {
		p := c.p
		t.Run(c.name, func(t *testing.T) {
			before := snapshot(t, f.sys)
			ex, err := f.sys.Explain(ctx, p)
			must(t, err, "explain")
			sc := f.sys.NewScopeExpecting(p, before.StateVersion)
			err = sc.Enter(ctx)
			pe := as[*system.PlanError](t, err, "preflight")
			if ex.Feasible || pe.Reason != ex.Reason {
				t.Fatalf("preflight reason %q, explain %+v", pe.Reason, ex)
			}
			unchanged(t, f.sys, before, "preflight refusal")
			if len(sc.Leases()) != 0 || len(sc.Report().Transitions) != 0 {
				t.Fatalf("refused scope has leases %v, report %v", sc.Leases(), sc.Report())
			}
			as[*system.InvalidInputError](t, sc.Enter(ctx), "enter after a refused entry")
			as[*system.InvalidInputError](t, sc.Exit(ctx), "exit after a refused entry")
			unchanged(t, f.sys, before, "enter and exit of a refused scope")
		})
	}
}

func TestScopeLifecycle(t *testing.T) {
	ctx := context.Background()
	f := newScopeFixture(t)
	sys := f.sys

	ex, err := sys.Explain(ctx, f.plan)
	must(t, err, "explain")
	if !ex.Feasible || ex.PredictedPeakBytes["cuda:0"] != 600 || ex.PredictedPeakBytes["cuda:1"] != 100 {
		t.Fatalf("explanation %+v", ex)
	}
	before := snapshot(t, sys)
	equal(t, before, snapshot(t, sys), "explain changes nothing")

	// Never entered: cannot exit.
	sc := sys.NewScopeExpecting(f.plan, before.StateVersion)
	as[*system.InvalidInputError](t, sc.Exit(ctx), "exit before enter")
	unchanged(t, sys, before, "exit before enter")

	// Entry: reclaim → reserve → enter (one after another) → leases.
	must(t, sc.Enter(ctx), "enter")
	rep := sc.Report()
	type tr struct{ kind, handle, loc string }
	var got []tr
	for _, x := range rep.Transitions {
		got = append(got, tr{x.Kind, x.Handle, x.Location})
	}
	equal(t, []tr{
		{"remove", "victim", "cuda:0"},
		{"reserve", "", "cuda:0"},
		{"admit", "x", "cuda:0"},
		{"complete", "x", "cuda:0"},
		{"remove", "x", "pinned-host"},
		{"admit", "y", "cuda:1"},
		{"complete", "y", "cuda:1"},
		{"acquire", "x", "cuda:0"},
		{"acquire", "y", "cuda:1"},
	}, got, "scope entry report")
	requireConsecutive(t, rep, before.StateVersion)
	if r := rep.Transitions[1]; r.Bytes != 200 || r.Detail != f.reservationName {
		t.Fatalf("reservation transition %+v", r)
	}
	entered := snapshot(t, sys)
	equal(t, before.StateVersion+9, entered.StateVersion, "versions of the entry")
	if len(sc.Leases()) != 2 {
		t.Fatalf("leases %v", sc.Leases())
	}
	if m := mats(t, entered, "x")["cuda:0"]; m.UseCount != 1 {
		t.Fatalf("x at cuda:0: %+v", m)
	}
	if m := mats(t, entered, "y")["cuda:1"]; m.UseCount != 1 {
		t.Fatalf("y at cuda:1: %+v", m)
	}
	c0 := loc(t, entered, "cuda:0")
	equal(t, []system.ReservationRecord{{Name: f.reservationName, Bytes: 200, Owner: sc.Name()}}, c0.Reservations, "scope reservation")
	if c0.UsedBytes != 400 || c0.ReservedBytes != 200 {
		t.Fatalf("cuda:0 after entry: %+v", c0)
	}

	// Single use.
	as[*system.InvalidInputError](t, sc.Enter(ctx), "second enter")
	unchanged(t, sys, entered, "second enter")

	// Leases are held until exit: the entered endpoints cannot be removed.
	for _, call := range []struct {
		what string
		err  error
		want system.InUseError
	}{
		{"evict y at cuda:1", sys.Evict(ctx, f.y, "cuda:1"), system.InUseError{Handle: "y", Location: "cuda:1", UseCount: 1}},
		{"move x off cuda:0", sys.Move(ctx, f.x, "cuda:0", "pinned-host"), system.InUseError{Handle: "x", Location: "cuda:0", UseCount: 1}},
	} {
		iu := as[*system.InUseError](t, call.err, call.what)
		equal(t, call.want, *iu, call.what)
	}
	// The scope's reservation is not the user's to release.
	ii := as[*system.InvalidInputError](t, sys.Unreserve(ctx, f.reservationName), "unreserve a scope reservation")
	if ii.Message == "" {
		t.Fatal("empty message")
	}
	unchanged(t, sys, entered, "refusals while entered")

	// The bytes entered are the right ones.
	for _, c := range []struct {
		h    system.Handle
		at   string
		want []byte
	}{{f.x, "cuda:0", f.xData}, {f.y, "cuda:1", f.yData}, {f.victim, "pinned-host", f.victimData}} {
		got, err := sys.Read(ctx, c.h, c.at)
		must(t, err, "read")
		requireBytes(t, c.want, got, c.h.Name+" at "+c.at)
	}

	// Exit releases both leases and the reservation: 3 versions.
	beforeExit := snapshot(t, sys)
	must(t, sc.Exit(ctx), "exit")
	if sc.ExitError() != nil {
		t.Fatalf("exit error %v", sc.ExitError())
	}
	exited := snapshot(t, sys)
	equal(t, beforeExit.StateVersion+3, exited.StateVersion, "versions of the exit")
	if c0 := loc(t, exited, "cuda:0"); c0.ReservedBytes != 0 || len(c0.Reservations) != 0 {
		t.Fatalf("cuda:0 after exit: %+v", c0)
	}
	as[*system.InvalidInputError](t, sc.Exit(ctx), "second exit")
	as[*system.InvalidInputError](t, sc.Enter(ctx), "enter after exit")
	unchanged(t, sys, exited, "second exit")

	// Now the endpoints can be removed.
	must(t, sys.Evict(ctx, f.y, "cuda:1"), "evict y after exit")
	must(t, sys.Move(ctx, f.x, "cuda:0", "pinned-host"), "move x after exit")
	as[*system.InvalidInputError](t, sys.Unreserve(ctx, f.reservationName), "unreserve after exit")
}

func TestScopeFromDecision(t *testing.T) {
	ctx := context.Background()
	f := newScopeFixture(t)
	d, err := f.sys.Decide(ctx, system.Request{
		Name:         "x-on-gpu",
		Requirements: []system.Requirement{{Handle: f.x, Tiers: [][]string{{"cuda:0"}, {"cuda:1"}}}},
		Reservations: []system.ReservationSpec{{Name: "act", Location: "cuda:0", Bytes: 200}},
	})
	must(t, err, "decide")
	// The victim must go for x and the reservation to fit at cuda:0.
	equal(t, []system.Eviction{{Handle: f.victim, Location: "cuda:0", Bytes: 500, Reason: d.Evictions[0].Reason, Kind: system.EvictionLowestPriority}}, d.Evictions, "evictions")
	sc := f.sys.ScopeFor(d)
	must(t, sc.Enter(ctx), "enter")
	equal(t, []string{"remove", "reserve", "admit", "complete", "remove", "acquire"}, kinds(sc.Report()), "report")
	requireConsecutive(t, sc.Report(), d.ExpectedStateVersion)
	must(t, sc.Exit(ctx), "exit")
	s := snapshot(t, f.sys)
	equal(t, []string{"cuda:0"}, keys(mats(t, s, "x")), "x placed")
	if l := loc(t, s, "cuda:0"); l.UsedBytes != 400 || l.ReservedBytes != 0 {
		t.Fatalf("cuda:0 after the scope: %+v", l)
	}
}

func TestWithScope(t *testing.T) {
	ctx := context.Background()
	f := newScopeFixture(t)
	sys := f.sys

	t.Run("success releases everything", func(t *testing.T) {
		var inside *system.Scope
		err := sys.WithScope(ctx, system.Plan{Enter: []system.Action{{Handle: f.y, Location: "cuda:1"}}}, func(sc *system.Scope) error {
			inside = sc
			s := snapshot(t, sys)
			if m := mats(t, s, "y")["cuda:1"]; m.UseCount != 1 {
				t.Errorf("inside the scope y at cuda:1 is %+v", m)
			}
			return nil
		})
		must(t, err, "with scope")
		if inside == nil || inside.ExitError() != nil {
			t.Fatalf("scope %v", inside)
		}
		if m := mats(t, snapshot(t, sys), "y")["cuda:1"]; m.UseCount != 0 {
			t.Fatalf("after the scope y at cuda:1 is %+v", m)
		}
	})

	t.Run("body error is primary", func(t *testing.T) {
		bodyErr := errors.New("the body failed")
		var inside *system.Scope
		err := sys.WithScope(ctx, system.Plan{
			Reservations: []system.ReservationSpec{{Name: "tmp", Location: "cuda:1", Bytes: 10}},
			Enter:        []system.Action{{Handle: f.y, Location: "cuda:1"}},
		}, func(sc *system.Scope) error {
			inside = sc
			// Make the exit fail too: release the scope's lease behind its back.
			must(t, sys.ReleaseByID(ctx, sc.Leases()[0]), "release by id")
			return bodyErr
		})
		if err != bodyErr {
			t.Fatalf("WithScope returned %v, want the body's error", err)
		}
		pe := as[*system.PlanExecutionError](t, inside.ExitError(), "exit error kept on the scope")
		if pe.Phase != "exit" {
			t.Fatalf("phase %q", pe.Phase)
		}
		if l := loc(t, snapshot(t, sys), "cuda:1"); l.ReservedBytes != 0 {
			t.Fatalf("reservation kept: %+v", l)
		}
	})

	t.Run("exit error when the body succeeds", func(t *testing.T) {
		var inside *system.Scope
		err := sys.WithScope(ctx, system.Plan{Enter: []system.Action{{Handle: f.y, Location: "cuda:1"}}}, func(sc *system.Scope) error {
			inside = sc
			return sys.ReleaseByID(ctx, sc.Leases()[0])
		})
		pe := as[*system.PlanExecutionError](t, err, "exit error")
		if pe.Phase != "exit" || inside.ExitError() != err {
			t.Fatalf("%v / %v", err, inside.ExitError())
		}
	})

	t.Run("entry failure skips the body", func(t *testing.T) {
		before := snapshot(t, sys)
		ran := false
		err := sys.WithScope(ctx, system.Plan{Reservations: []system.ReservationSpec{{Name: "huge", Location: "cuda:0", Bytes: 5000}}}, func(*system.Scope) error {
			ran = true
			return nil
		})
		as[*system.PlanError](t, err, "infeasible scope")
		if ran {
			t.Fatal("body ran")
		}
		unchanged(t, sys, before, "infeasible scope")
	})
}

func TestExecuteReservationsStayActive(t *testing.T) {
	ctx := context.Background()
	f := newScopeFixture(t)
	before := snapshot(t, f.sys)
	rep, err := f.sys.Execute(ctx, f.plan)
	must(t, err, "execute")
	// No leases at the end of an execute.
	equal(t, []string{"remove", "reserve", "admit", "complete", "remove", "admit", "complete"}, kinds(rep), "execute report")
	requireConsecutive(t, rep, before.StateVersion)
	s := snapshot(t, f.sys)
	c0 := loc(t, s, "cuda:0")
	equal(t, []system.ReservationRecord{{Name: f.reservationName, Bytes: 200}}, c0.Reservations, "execute's reservation is an ordinary one")
	for _, name := range []string{"x", "y"} {
		for l, m := range mats(t, s, name) {
			if m.UseCount != 0 {
				t.Fatalf("%s at %s leased after execute", name, l)
			}
		}
	}
	// It stays until released by name, once.
	must(t, f.sys.Unreserve(ctx, f.reservationName), "unreserve")
	if c0 := loc(t, snapshot(t, f.sys), "cuda:0"); c0.ReservedBytes != 0 {
		t.Fatalf("cuda:0 after unreserve: %+v", c0)
	}
	as[*system.InvalidInputError](t, f.sys.Unreserve(ctx, f.reservationName), "second unreserve")
}

// waitFor takes snapshots until cond holds (each snapshot is a round trip
// through the supervisor, so this waits on the state, not on a clock) and
// returns the first snapshot where it does; it gives up after a deadline.
func waitFor(t *testing.T, sys *system.System, what string, cond func(system.Snapshot) bool) system.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		s, err := sys.Snapshot(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if cond(s) {
			return s
		}
		runtime.Gosched()
	}
}

// A caller that stops waiting for a scope entry (its context ends while an
// enter is in flight) never gets the scope: the leases and reservations the
// entry takes when it completes must be released, as for a lease or hold
// granted to a caller who stopped waiting.
func TestScopeEntryAbandonedByCallerIsReleased(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1<<20)})
	data := pattern(2000, 5)
	ld := newBlockingLoader(data)
	h := register(t, sys, system.Value{Name: "s", Bytes: 2000, Source: "pageable-host", Loader: ld.load})
	sc := sys.NewScope(system.Plan{
		Reservations: []system.ReservationSpec{{Name: "scratch", Location: "cuda:0", Bytes: 100}},
		Enter:        []system.Action{{Handle: h, Location: "cuda:0"}},
	})
	callerCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- sc.Enter(callerCtx) }()
	<-ld.started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("enter: %v, want context.Canceled", err)
	}
	close(ld.release)
	// The entry completes inside the runtime; whatever it took for the
	// caller who left is handed back right after (ordered before any later
	// request), so the snapshot after the first one showing s resident
	// must show it released.
	waitFor(t, sys, "s resident at cuda:0", func(s system.Snapshot) bool {
		m, ok := mats(t, s, "s")["cuda:0"]
		return ok && m.State == budget.Resident
	})
	s := snapshot(t, sys)
	if m := mats(t, s, "s")["cuda:0"]; m.UseCount != 0 {
		t.Errorf("s at cuda:0 still leased by the abandoned scope: %+v", m)
	}
	if l := loc(t, s, "cuda:0"); l.ReservedBytes != 0 {
		t.Errorf("the abandoned scope's reservation is still active: %+v", l.Reservations)
	}
	as[*system.InvalidInputError](t, sc.Exit(ctx), "exit of the abandoned scope")
	as[*system.InvalidInputError](t, sc.Enter(ctx), "enter of the abandoned scope")
	must(t, sys.Evict(ctx, h, "cuda:0"), "evict once nothing protects s")
}
