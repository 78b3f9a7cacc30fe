package tests

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// The seven error classes of seed 000, driven through the public API, with
// their structured fields checked exactly.

func TestBudgetErrorFields(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"), system.Limit("pinned-host", 500), system.Limit("cuda:0", 1000)}})
	register(t, sys, system.Value{Name: "a", Bytes: 600, At: "cuda:0"})
	must(t, sys.Reserve(ctx, "cuda:0", "scratch", 100), "reserve")
	b := register(t, sys, system.Value{Name: "b", Bytes: 400, At: "pageable-host"})

	// A direct materialization at cuda:0: 600 + 100 + 400 > 1000.
	before := snapshot(t, sys)
	err := sys.Place(ctx, b, "cuda:0")
	be := as[*system.BudgetError](t, err, "place b at cuda:0")
	equal(t, system.BudgetError{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: 600, ReservedBytes: 100, RequestedBytes: 400}, *be, "budget error of the place")
	if errors.Is(err, system.ErrPlan) {
		t.Fatalf("a BudgetError must not match ErrPlan: %v", err)
	}
	unchanged(t, sys, before, "refused place")

	// A reservation: 600 + 100 + 301 > 1000.
	err = sys.Reserve(ctx, "cuda:0", "big", 301)
	be = as[*system.BudgetError](t, err, "reserve 301 at cuda:0")
	equal(t, system.BudgetError{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: 600, ReservedBytes: 100, RequestedBytes: 301}, *be, "budget error of the reservation")
	unchanged(t, sys, before, "refused reservation")

	// A registration at a full location.
	_, err = sys.Register(ctx, system.Value{Name: "c", Bytes: 301, At: "cuda:0"})
	be = as[*system.BudgetError](t, err, "register 301 at cuda:0")
	equal(t, system.BudgetError{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: 600, ReservedBytes: 100, RequestedBytes: 301}, *be, "budget error of the registration")
	unchanged(t, sys, before, "refused registration")

	// Temporary reconstruction charge at the source location: cuda:0
	// admits 300 (600 + 100 + 300 = 1000) but pinned-host, the source
	// location, holds 300 already: 300 + 0 + 300 > 500.
	data := pattern(300, 1)
	s := register(t, sys, system.Value{Name: "s", Bytes: 300, Source: "pinned-host", Loader: loaderOf(data)})
	register(t, sys, system.Value{Name: "p", Bytes: 300, At: "pinned-host"})
	before = snapshot(t, sys)
	err = sys.Place(ctx, s, "cuda:0")
	be = as[*system.BudgetError](t, err, "reconstruct s at cuda:0")
	equal(t, system.BudgetError{Location: "pinned-host", BudgetBytes: 500, UsedBytes: 300, ReservedBytes: 0, RequestedBytes: 300}, *be, "budget error of the temporary charge")
	unchanged(t, sys, before, "refused reconstruction")

	// Destination first: with cuda:0 also short, the destination is the
	// one reported.
	must(t, sys.Reserve(ctx, "cuda:0", "more", 1), "reserve 1 more")
	before = snapshot(t, sys)
	err = sys.Place(ctx, s, "cuda:0")
	be = as[*system.BudgetError](t, err, "reconstruct s at a full cuda:0")
	equal(t, system.BudgetError{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: 600, ReservedBytes: 101, RequestedBytes: 300}, *be, "destination checked first")
	unchanged(t, sys, before, "refused reconstruction")
}

func TestPlanErrorReasons(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	a := register(t, sys, system.Value{Name: "a", Bytes: 600, At: "cuda:0"})
	b := register(t, sys, system.Value{Name: "b", Bytes: 500, At: "pinned-host"})
	lease, err := sys.Acquire(ctx, a, "cuda:0")
	must(t, err, "acquire a")
	defer func() { must(t, lease.Release(ctx), "release a") }()

	cases := []struct {
		name   string
		call   func() error
		reason []string // words the reason must contain
	}{
		{"evict the last copy of a value without a source", func() error { return sys.Evict(ctx, b, "pinned-host") },
			[]string{"b", "pinned-host", "lose its data"}},
		{"copy of an exclusive value", func() error { return sys.Copy(ctx, b, "pinned-host", "cuda:1") },
			[]string{"b", "exclusive"}},
		{"execute a plan over budget", func() error {
			_, err := sys.Execute(ctx, system.Plan{Enter: []system.Action{{Handle: b, Location: "cuda:0"}}})
			return err
		}, []string{"enter 0", "b", "cuda:0", "budget"}},
		{"execute a plan that reclaims a leased value", func() error {
			_, err := sys.Execute(ctx, system.Plan{Reclaim: []system.Action{{Handle: a, Location: "cuda:0"}}})
			return err
		}, []string{"reclaim 0", "a", "in use"}},
		{"decide with no feasible assignment", func() error {
			_, err := sys.Decide(ctx, system.Request{Name: "no-room", Requirements: []system.Requirement{{Handle: b, Tiers: [][]string{{"cuda:0"}}}}})
			return err
		}, []string{"no-room"}},
		{"an exclusive handle required twice", func() error {
			_, err := sys.Decide(ctx, system.Request{Name: "twice", Requirements: []system.Requirement{
				{Handle: b, Tiers: [][]string{{"pinned-host"}}}, {Handle: b, Tiers: [][]string{{"cuda:1"}}}}})
			return err
		}, []string{"b", "exclusive"}},
		{"a requirement without locations", func() error {
			_, err := sys.Decide(ctx, system.Request{Name: "empty", Requirements: []system.Requirement{{Handle: b}}})
			return err
		}, []string{"b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot(t, sys)
			err := c.call()
			pe := as[*system.PlanError](t, err, c.name)
			for _, w := range c.reason {
				if !strings.Contains(pe.Reason, w) {
					t.Errorf("reason %q does not mention %q", pe.Reason, w)
				}
			}
			if !errors.Is(err, system.ErrPlan) {
				t.Errorf("a PlanError must match ErrPlan")
			}
			unchanged(t, sys, before, c.name)
		})
	}
}

func TestSearchLimitErrorFields(t *testing.T) {
	ctx := context.Background()
	// Both devices are too small for any of the three values, so every
	// assignment that puts one on a device is infeasible; only the last
	// tier-index vector (all pinned-host) is feasible. Per requirement: a
	// first tier of 2 equally preferred locations and a second of 1, so
	// 3^3 = 27 assignments in all, the feasible one last.
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 100)})
	var req system.Request
	req.Name = "too-big-for-devices"
	for _, n := range []string{"x", "y", "z"} {
		h := register(t, sys, system.Value{Name: n, Bytes: 200, At: "pinned-host"})
		req.Requirements = append(req.Requirements, system.Requirement{Handle: h, Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}})
	}
	before := snapshot(t, sys)
	for _, limit := range []int{1, 5, 26} {
		_, err := sys.DecideWithLimit(ctx, req, limit)
		se := as[*system.SearchLimitError](t, err, "decide with a tiny limit")
		if se.RequestName != req.Name || se.StateLimit != limit || se.ExploredStates != limit || se.Detail == "" {
			t.Fatalf("limit %d: search limit error %+v", limit, *se)
		}
		if !errors.Is(err, system.ErrPlan) {
			t.Fatalf("a SearchLimitError must match ErrPlan")
		}
	}
	unchanged(t, sys, before, "decide")
	// At the limit of 27 the feasible assignment is found, exhaustively.
	d, err := sys.DecideWithLimit(ctx, req, 27)
	must(t, err, "decide with limit 27")
	if d.ExploredStates != 27 || !d.Exhaustive || !d.Explanation.Feasible || len(d.Plan.Enter) != 3 {
		t.Fatalf("decision %+v", d)
	}
	for i, a := range d.Plan.Enter {
		if a.Location != "pinned-host" {
			t.Fatalf("enter %d: %s, want pinned-host", i, a)
		}
	}
}

func TestStaleStateErrorFields(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	h := register(t, sys, system.Value{Name: "w", Bytes: 300, At: "pinned-host"})
	d, err := sys.Decide(ctx, system.Request{Name: "w-on-gpu", Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:0"}}}}})
	must(t, err, "decide")
	equal(t, snapshot(t, sys).StateVersion, d.ExpectedStateVersion, "decision's expected version")

	// An intervening mutation makes the decision stale.
	must(t, sys.Reserve(ctx, "cuda:1", "intervening", 10), "reserve")
	before := snapshot(t, sys)
	sc := sys.ScopeFor(d)
	err = sc.Enter(ctx)
	se := as[*system.StaleStateError](t, err, "enter a stale decision")
	equal(t, system.StaleStateError{ExpectedVersion: d.ExpectedStateVersion, ActualVersion: d.ExpectedStateVersion + 1}, *se, "stale state error")
	if !errors.Is(err, system.ErrPlan) {
		t.Fatalf("a StaleStateError must match ErrPlan")
	}
	unchanged(t, sys, before, "stale scope entry")
	if len(sc.Leases()) != 0 || len(sc.Report().Transitions) != 0 {
		t.Fatalf("a stale scope holds %v and reports %v", sc.Leases(), sc.Report())
	}

	// NewScopeExpecting, same rule.
	sc = sys.NewScopeExpecting(d.Plan, before.StateVersion-1)
	err = sc.Enter(ctx)
	se = as[*system.StaleStateError](t, err, "enter with an old expected version")
	equal(t, system.StaleStateError{ExpectedVersion: before.StateVersion - 1, ActualVersion: before.StateVersion}, *se, "stale state error")
	unchanged(t, sys, before, "stale scope entry")
}

func TestInUseErrorCounts(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	h := register(t, sys, system.Value{Name: "v", Bytes: 100, Mode: system.Replicable, At: "pinned-host"})
	must(t, sys.Copy(ctx, h, "pinned-host", "cuda:0"), "copy to cuda:0")

	refused := func(what string, uses, holds, events int) {
		t.Helper()
		before := snapshot(t, sys)
		for _, call := range []struct {
			op  string
			err error
		}{
			{"evict", sys.Evict(ctx, h, "cuda:0")},
			{"move", sys.Move(ctx, h, "cuda:0", "cuda:1")},
			{"discard", sys.Discard(ctx, h)},
		} {
			iu := as[*system.InUseError](t, call.err, what+": "+call.op)
			equal(t, system.InUseError{Handle: "v", Location: "cuda:0", UseCount: uses, HoldCount: holds, PendingEventCount: events}, *iu, what+": "+call.op)
		}
		unchanged(t, sys, before, what)
	}

	// A lease.
	l, err := sys.Acquire(ctx, h, "cuda:0")
	must(t, err, "acquire")
	refused("leased", 1, 0, 0)
	l2, err := sys.Acquire(ctx, h, "cuda:0")
	must(t, err, "acquire again")
	refused("leased twice", 2, 0, 0)
	must(t, l.Release(ctx), "release")
	must(t, l2.Release(ctx), "release")

	// A hold.
	hd, err := sys.Hold(ctx, h, "cuda:0")
	must(t, err, "hold")
	refused("held", 0, 1, 0)
	must(t, hd.Release(ctx), "unhold")

	// A recorded consumer event, pending after the lease is released.
	l, err = sys.Acquire(ctx, h, "cuda:0")
	must(t, err, "acquire")
	ev := system.NewManualEvent()
	id, err := l.RecordEvent(ctx, ev)
	must(t, err, "record event")
	refused("leased with a pending event", 1, 0, 1)
	must(t, l.Release(ctx), "release")
	refused("pending event", 0, 0, 1)
	ev.Complete()
	must(t, sys.WaitReaped(ctx, id), "wait reaped")
	must(t, sys.Evict(ctx, h, "cuda:0"), "evict once nothing protects")
}

func TestUnavailableErrors(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{ManagerID: "rm-one", Locations: fourLocations(0, 0, 1000)})
	other := start(t, system.Options{ManagerID: "rm-two", Locations: fourLocations(0, 0, 1000)})
	h := register(t, sys, system.Value{Name: "v", Bytes: 100, At: "pinned-host"})

	t.Run("acquire never places", func(t *testing.T) {
		before := snapshot(t, sys)
		_, err := sys.Acquire(ctx, h, "cuda:0")
		ue := as[*system.UnavailableError](t, err, "acquire at an absent endpoint")
		if ue.Handle != "v" || ue.Location != "cuda:0" || ue.Reason != budget.UnavailableEndpoint || ue.Detail == "" {
			t.Fatalf("unavailable error %+v", *ue)
		}
		unchanged(t, sys, before, "acquire at an absent endpoint")
		if _, ok := mats(t, snapshot(t, sys), "v")["cuda:0"]; ok {
			t.Fatalf("acquire placed the value")
		}
		_, err = sys.Hold(ctx, h, "cuda:1")
		as[*system.UnavailableError](t, err, "hold at an absent endpoint")
		err = sys.Evict(ctx, h, "cuda:1")
		as[*system.UnavailableError](t, err, "evict at an absent endpoint")
		unchanged(t, sys, before, "hold and evict at an absent endpoint")
	})

	t.Run("no source", func(t *testing.T) {
		g := register(t, sys, system.Value{Name: "g", Bytes: 10, Mode: system.Replicable, At: "cuda:0"})
		before := snapshot(t, sys)
		err := sys.Copy(ctx, g, "cuda:1", "pinned-host")
		ue := as[*system.UnavailableError](t, err, "copy from an absent endpoint")
		if ue.Handle != "g" || ue.Location != "cuda:1" || ue.Reason != budget.UnavailableEndpoint {
			t.Fatalf("unavailable error %+v", *ue)
		}
		unchanged(t, sys, before, "copy from an absent endpoint")
	})

	t.Run("discarded handle", func(t *testing.T) {
		d := register(t, sys, system.Value{Name: "d", Bytes: 10, At: "pinned-host"})
		must(t, sys.Discard(ctx, d), "discard")
		before := snapshot(t, sys)
		if v, ok := before.Value("d"); ok {
			t.Fatalf("a discarded value must not be listed in snapshots: %+v", v)
		}
		calls := map[string]error{
			"place":   sys.Place(ctx, d, "cuda:0"),
			"evict":   sys.Evict(ctx, d, "pinned-host"),
			"discard": sys.Discard(ctx, d),
		}
		_, calls["acquire"] = sys.Acquire(ctx, d, "pinned-host")
		_, calls["hold"] = sys.Hold(ctx, d, "pinned-host")
		_, calls["decide"] = sys.Decide(ctx, system.Request{Name: "r", Requirements: []system.Requirement{{Handle: d, Tiers: [][]string{{"cuda:0"}}}}})
		_, calls["execute"] = sys.Execute(ctx, system.Plan{Enter: []system.Action{{Handle: d, Location: "cuda:0"}}})
		for op, err := range calls {
			ue := as[*system.UnavailableError](t, err, op+" of a discarded handle")
			if !errors.Is(err, system.ErrDiscarded) || errors.Is(err, system.ErrForeign) || ue.Handle != "d" || !strings.Contains(ue.Error(), "discarded") {
				t.Errorf("%s: %v (%+v)", op, err, *ue)
			}
		}
		unchanged(t, sys, before, "calls with a discarded handle")
	})

	t.Run("foreign handle", func(t *testing.T) {
		f := register(t, other, system.Value{Name: "v", Bytes: 100, At: "pinned-host"})
		if f.ID != h.ID || f.Name != h.Name || f.Manager == h.Manager {
			t.Fatalf("want a handle that differs only by manager: %+v vs %+v", f, h)
		}
		before := snapshot(t, sys)
		calls := map[string]error{
			"place": sys.Place(ctx, f, "cuda:0"),
			"evict": sys.Evict(ctx, f, "pinned-host"),
		}
		_, calls["acquire"] = sys.Acquire(ctx, f, "pinned-host")
		_, calls["execute"] = sys.Execute(ctx, system.Plan{Enter: []system.Action{{Handle: f, Location: "cuda:0"}}})
		for op, err := range calls {
			ue := as[*system.UnavailableError](t, err, op+" of a foreign handle")
			if !errors.Is(err, system.ErrForeign) || errors.Is(err, system.ErrDiscarded) || !strings.Contains(ue.Error(), "another manager") {
				t.Errorf("%s: %v", op, err)
			}
		}
		unchanged(t, sys, before, "calls with a foreign handle")
	})

	t.Run("unconfigured location", func(t *testing.T) {
		before := snapshot(t, sys)
		calls := map[string]error{
			"place":   sys.Place(ctx, h, "cuda:7"),
			"reserve": sys.Reserve(ctx, "cuda:7", "r", 1),
		}
		_, calls["acquire"] = sys.Acquire(ctx, h, "cuda:7")
		_, calls["register"] = sys.Register(ctx, system.Value{Name: "n", Bytes: 1, At: "cuda:7"})
		_, calls["execute"] = sys.Execute(ctx, system.Plan{Enter: []system.Action{{Handle: h, Location: "cuda:7"}}})
		_, calls["decide"] = sys.Decide(ctx, system.Request{Name: "r", Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:7"}}}}})
		for op, err := range calls {
			ue := as[*system.UnavailableError](t, err, op+" at an unconfigured location")
			if ue.Location != "cuda:7" || ue.Reason != budget.UnavailableLocation {
				t.Errorf("%s: %+v", op, *ue)
			}
		}
		unchanged(t, sys, before, "calls at an unconfigured location")
	})
}

// checkExecErr checks the fixed fields of a PlanExecutionError and that it
// is not in the ErrPlan category.
func checkExecErr(t *testing.T, err error, phase string, action *system.Action, actionIndex int, resv *system.ReservationSpec, resvIndex int, reportKinds []string) *system.PlanExecutionError {
	t.Helper()
	pe := as[*system.PlanExecutionError](t, err, "plan execution error")
	if errors.Is(err, system.ErrPlan) {
		t.Fatalf("a PlanExecutionError must not match ErrPlan: %v", err)
	}
	if pe.Phase != phase {
		t.Fatalf("phase %q, want %q: %v", pe.Phase, phase, err)
	}
	equal(t, action, pe.FailedAction, "failed action")
	equal(t, actionIndex, pe.FailedActionIndex, "failed action index")
	equal(t, resv, pe.FailedReservation, "failed reservation")
	equal(t, resvIndex, pe.FailedReservationIndex, "failed reservation index")
	equal(t, reportKinds, kinds(pe.PartialReport), "partial report kinds")
	if pe.Cause == nil || errors.Unwrap(err) != pe.Cause {
		t.Fatalf("cause %v, unwrap %v", pe.Cause, errors.Unwrap(err))
	}
	return pe
}

func TestPlanExecutionErrorDirect(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	data := pattern(200, 3)
	x := register(t, sys, system.Value{Name: "x", Bytes: 200, At: "pinned-host", Data: data})
	r := register(t, sys, system.Value{Name: "r", Bytes: 200, Mode: system.Replicable, At: "pinned-host", Data: data})
	s := register(t, sys, system.Value{Name: "s", Bytes: 200, Source: "pageable-host", Loader: loaderOf(data)})

	cases := []struct {
		name   string
		fault  cuda.FaultKind
		at     string
		call   func() error
		action system.Action
	}{
		{"place that moves, copy fault", cuda.FaultCopy, "cuda:0", func() error { return sys.Place(ctx, x, "cuda:0") },
			system.Action{Handle: x, Location: "cuda:0", From: "pinned-host"}},
		{"move, allocation fault", cuda.FaultAlloc, "cuda:1", func() error { return sys.Move(ctx, x, "pinned-host", "cuda:1") },
			system.Action{Handle: x, Location: "cuda:1", From: "pinned-host"}},
		{"copy, copy fault", cuda.FaultCopy, "cuda:1", func() error { return sys.Copy(ctx, r, "pinned-host", "cuda:1") },
			system.Action{Handle: r, Location: "cuda:1", From: "pinned-host"}},
		{"reconstruction, reconstruct fault", cuda.FaultReconstruct, "cuda:0", func() error { return sys.Place(ctx, s, "cuda:0") },
			system.Action{Handle: s, Location: "cuda:0"}},
		{"reconstruction, fault on the temporary buffer", cuda.FaultAlloc, "pageable-host", func() error { return sys.Place(ctx, s, "cuda:0") },
			system.Action{Handle: s, Location: "cuda:0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := snapshot(t, sys)
			testsys.Faults(sys).Arm(c.fault, c.at)
			err := c.call()
			action := c.action
			pe := checkExecErr(t, err, budget.PhaseExecute, &action, 0, nil, -1, []string{"admit", "fail"})
			requireConsecutive(t, pe.PartialReport, before.StateVersion)
			ife := as[*cuda.InjectedFaultError](t, err, "cause")
			equal(t, cuda.InjectedFaultError{Kind: c.fault, Location: c.at, Backend: soft.ErrorPrefix}, *ife, "injected fault")
			if n := testsys.Faults(sys).Armed(c.fault, c.at); n != 0 {
				t.Fatalf("fault not consumed: %d armed", n)
			}
			// Nothing stays: the same materializations and bytes as before,
			// two versions later (admission and failure).
			after := snapshot(t, sys)
			equal(t, before.StateVersion+2, after.StateVersion, "versions of a failed transfer")
			for i := range before.Locations {
				b, a := before.Locations[i], after.Locations[i]
				if a.UsedBytes != b.UsedBytes || a.ReservedBytes != b.ReservedBytes || a.TemporaryBytes != 0 {
					t.Fatalf("%s: before %+v after %+v", a.Location, b, a)
				}
			}
			for i := range before.Values {
				equal(t, before.Values[i].Materializations, after.Values[i].Materializations, "materializations of "+before.Values[i].Handle.Name)
			}
		})
	}
	// The runtime still works and the bytes are intact.
	must(t, sys.Place(ctx, x, "cuda:0"), "place x")
	must(t, sys.Place(ctx, s, "cuda:0"), "place s")
	for _, h := range []system.Handle{x, s} {
		got, err := sys.Read(ctx, h, "cuda:0")
		must(t, err, "read")
		requireBytes(t, data, got, h.Name)
	}
}

func TestPlanExecutionErrorExecute(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	x := register(t, sys, system.Value{Name: "x", Bytes: 200, At: "pinned-host"})
	y := register(t, sys, system.Value{Name: "y", Bytes: 200, At: "pinned-host"})
	z := register(t, sys, system.Value{Name: "z", Bytes: 200, At: "pinned-host"})
	plan := system.Plan{
		Reservations: []system.ReservationSpec{{Name: "ws", Location: "cuda:0", Bytes: 100}},
		Enter: []system.Action{
			{Handle: x, Location: "cuda:0"},
			{Handle: y, Location: "cuda:1"},
			{Handle: z, Location: "cuda:1"},
		},
	}
	before := snapshot(t, sys)
	testsys.Faults(sys).Arm(cuda.FaultAlloc, "cuda:1")
	_, err := sys.Execute(ctx, plan)
	pe := checkExecErr(t, err, budget.PhaseExecute, &plan.Enter[1], 1, nil, -1,
		[]string{"reserve", "admit", "complete", "remove", "admit", "fail"})
	requireConsecutive(t, pe.PartialReport, before.StateVersion)
	if !errors.Is(err, cuda.ErrInjectedFault) {
		t.Fatalf("cause %v", pe.Cause)
	}
	after := snapshot(t, sys)
	// x's move stays committed; y is back at pinned-host only; the
	// reservation the execute admitted is an ordinary named one: it stays
	// active until released by name, even though the execute failed.
	equal(t, []string{"cuda:0"}, keys(mats(t, after, "x")), "x after the failed execute")
	equal(t, []string{"pinned-host"}, keys(mats(t, after, "y")), "y after the failed execute")
	equal(t, []string{"pinned-host"}, keys(mats(t, after, "z")), "z after the failed execute")
	if l := loc(t, after, "cuda:0"); l.ReservedBytes != 100 || l.UsedBytes != 200 {
		t.Fatalf("cuda:0 after the failed execute: %+v", l)
	}
	must(t, sys.Unreserve(ctx, "ws"), "unreserve ws")
	if l := loc(t, after, "cuda:1"); l.UsedBytes != 0 {
		t.Fatalf("cuda:1 after the failed execute: %+v", l)
	}
}

func keys(m map[string]system.MaterializationRecord) []string {
	var out []string
	for _, l := range []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"} {
		if _, ok := m[l]; ok {
			out = append(out, l)
		}
	}
	return out
}

func TestPlanExecutionErrorScopeEnter(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	victim := register(t, sys, system.Value{Name: "victim", Bytes: 300, Mode: system.Replicable, At: "pinned-host"})
	must(t, sys.Copy(ctx, victim, "pinned-host", "cuda:0"), "copy victim")
	x := register(t, sys, system.Value{Name: "x", Bytes: 400, At: "pinned-host"})
	y := register(t, sys, system.Value{Name: "y", Bytes: 400, Mode: system.Replicable, At: "pinned-host"})
	z := register(t, sys, system.Value{Name: "z", Bytes: 400, At: "pinned-host"})
	plan := system.Plan{
		Reclaim: []system.Action{{Handle: victim, Location: "cuda:0"}},
		Reservations: []system.ReservationSpec{
			{Name: "ws0", Location: "cuda:0", Bytes: 100},
			{Name: "ws1", Location: "cuda:1", Bytes: 100},
		},
		Enter: []system.Action{
			{Handle: x, Location: "cuda:0"},
			{Handle: y, Location: "cuda:1", From: "pinned-host"},
			{Handle: z, Location: "pageable-host"},
		},
	}
	for nth := range plan.Enter {
		t.Run("fault at enter "+string(rune('0'+nth)), func(t *testing.T) {
			// Each run starts over from the plan's precondition.
			for _, h := range []system.Handle{x, z} {
				must(t, sys.Place(ctx, h, "pinned-host"), "reset "+h.Name)
			}
			for _, l := range []string{"cuda:0", "cuda:1"} {
				if _, ok := mats(t, snapshot(t, sys), "y")[l]; ok {
					must(t, sys.Evict(ctx, y, l), "reset y")
				}
			}
			if _, ok := mats(t, snapshot(t, sys), "victim")["cuda:0"]; !ok {
				must(t, sys.Copy(ctx, victim, "pinned-host", "cuda:0"), "reset victim")
			}
			before := snapshot(t, sys)
			testsys.Faults(sys).Arm(cuda.FaultCopy, plan.Enter[nth].Location)
			sc := sys.NewScope(plan)
			err := sc.Enter(ctx)
			want := []string{"remove", "reserve", "reserve"}
			steps := [][]string{{"admit", "complete", "remove"}, {"admit", "complete"}, {"admit", "complete", "remove"}}
			for i := 0; i < nth; i++ {
				want = append(want, steps[i]...)
			}
			// The failed entry then releases the scope's two reservations;
			// the partial report lists every committed transition.
			want = append(want, "admit", "fail", "unreserve", "unreserve")
			pe := checkExecErr(t, err, budget.PhaseEnter, &plan.Enter[nth], nth, nil, -1, want)
			requireConsecutive(t, pe.PartialReport, before.StateVersion)
			if !errors.Is(err, cuda.ErrInjectedFault) {
				t.Fatalf("cause %v", pe.Cause)
			}
			after := snapshot(t, sys)
			// The reclaim and the enters before the failed one stay.
			if _, ok := mats(t, after, "victim")["cuda:0"]; ok {
				t.Fatalf("the committed reclaim was undone")
			}
			wantAt := map[string][]string{
				"x": {"pinned-host"}, "y": {"pinned-host"}, "z": {"pinned-host"},
			}
			if nth > 0 {
				wantAt["x"] = []string{"cuda:0"}
			}
			if nth > 1 {
				wantAt["y"] = []string{"pinned-host", "cuda:1"}
			}
			for name, at := range wantAt {
				equal(t, at, keys(mats(t, after, name)), name+" after the failed entry")
			}
			// The scope's reservations are released, no lease is held.
			for _, l := range after.Locations {
				if l.ReservedBytes != 0 || len(l.Reservations) != 0 {
					t.Fatalf("%s keeps reservations after the failed entry: %+v", l.Location, l)
				}
			}
			for _, v := range after.Values {
				for _, m := range v.Materializations {
					if m.UseCount != 0 || m.HoldCount != 0 || m.PendingEventCount != 0 {
						t.Fatalf("%s at %s protected after the failed entry: %+v", v.Handle.Name, m.Location, m)
					}
				}
			}
			if len(sc.Leases()) != 0 {
				t.Fatalf("failed scope holds leases %v", sc.Leases())
			}
			// A failed scope can neither exit nor be entered again.
			as[*system.InvalidInputError](t, sc.Exit(ctx), "exit of a failed scope")
			as[*system.InvalidInputError](t, sc.Enter(ctx), "enter of a failed scope")
			unchanged(t, sys, after, "exit and enter of a failed scope")
		})
	}
}

// The reclaim and reserve phases of a run cannot fail through the runtime:
// the supervisor checks the plan (Explain) and carries out every reclaim and
// reservation while handling one message, so nothing can change the state
// in between, and Explain simulates exactly those steps. The ledger's Run
// API lets other transitions interleave between steps (that is how the
// runtime commits completions of other transfers while an enter is in
// flight), so these phases are exercised there, with the same fields.
func TestPlanExecutionErrorReclaimAndReservePhases(t *testing.T) {
	newLedger := func(t *testing.T) (*budget.Ledger, budget.Handle, budget.Handle) {
		l, err := budget.New(budget.Config{ManagerID: "m", TraceCapacity: 64, Locations: []budget.LocationConfig{
			{Name: "pinned-host"}, {Name: "cuda:0", HasBudget: true, BudgetBytes: 1000}}})
		must(t, err, "ledger")
		reg := func(name string) budget.Handle {
			h, adm, err := l.Register(budget.ValueSpec{Name: name, Bytes: 300, Mode: budget.Replicable, At: "pinned-host"})
			must(t, err, "register")
			_, err = l.Complete(adm.ID)
			must(t, err, "complete")
			adm, err = l.Copy(h, "pinned-host", "cuda:0")
			must(t, err, "copy")
			_, err = l.Complete(adm.ID)
			must(t, err, "complete")
			return h
		}
		return l, reg("a"), reg("b")
	}

	t.Run("reclaim", func(t *testing.T) {
		l, a, b := newLedger(t)
		plan := budget.Plan{Reclaim: []budget.Action{{Handle: a, Location: "cuda:0"}, {Handle: b, Location: "cuda:0"}},
			Reservations: []budget.ReservationSpec{{Name: "r", Location: "cuda:0", Bytes: 100}}}
		run, err := l.StartRun(plan, budget.RunOptions{Scope: "s1"})
		must(t, err, "start run")
		step, ok, err := run.Next()
		must(t, err, "reclaim 0")
		if !ok || step.Phase != budget.PhaseReclaim || step.Index != 0 {
			t.Fatalf("step %+v", step)
		}
		// Someone leases the second victim between steps.
		if _, err := l.Acquire(b, "cuda:0"); err != nil {
			t.Fatal(err)
		}
		_, _, err = run.Next()
		pe := checkExecErr(t, err, budget.PhaseReclaim, &plan.Reclaim[1], 1, nil, -1, []string{"remove"})
		iu := as[*budget.InUseError](t, pe, "cause")
		equal(t, budget.InUseError{Handle: "b", Location: "cuda:0", UseCount: 1}, *iu, "cause")
		if err := l.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		s := l.Snapshot()
		if v, _ := s.Value("a"); len(v.Materializations) != 1 {
			t.Fatalf("the committed reclaim was undone: %+v", v)
		}
	})

	t.Run("reserve", func(t *testing.T) {
		l, a, _ := newLedger(t)
		plan := budget.Plan{Reclaim: []budget.Action{{Handle: a, Location: "cuda:0"}},
			Reservations: []budget.ReservationSpec{{Name: "r0", Location: "cuda:0", Bytes: 100}, {Name: "r1", Location: "cuda:0", Bytes: 200}}}
		run, err := l.StartRun(plan, budget.RunOptions{Scope: "s1"})
		must(t, err, "start run")
		for i := 0; i < 2; i++ { // reclaim 0, reserve 0
			if _, _, err := run.Next(); err != nil {
				t.Fatal(err)
			}
		}
		// Someone reserves the room r1 needed: 300 + 100 + 450 + 200 > 1000.
		must(t, l.Reserve("cuda:0", "other", 450), "reserve other")
		_, _, err = run.Next()
		pe := checkExecErr(t, err, budget.PhaseReserve, nil, -1, &plan.Reservations[1], 1, []string{"remove", "reserve", "unreserve"})
		be := as[*budget.BudgetError](t, pe, "cause")
		equal(t, budget.BudgetError{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: 300, ReservedBytes: 550, RequestedBytes: 200}, *be, "cause")
		// r0, admitted by the failed run, is released; the other one stays.
		s := l.Snapshot()
		if r, _ := s.Location("cuda:0"); r.ReservedBytes != 450 || len(r.Reservations) != 1 || r.Reservations[0].Name != "other" {
			t.Fatalf("cuda:0 after the failed reservation: %+v", r)
		}
		if err := l.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestPlanExecutionErrorScopeExit(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	x := register(t, sys, system.Value{Name: "x", Bytes: 100, At: "pinned-host"})
	y := register(t, sys, system.Value{Name: "y", Bytes: 100, At: "pinned-host"})
	sc := sys.NewScope(system.Plan{
		Reservations: []system.ReservationSpec{{Name: "ws", Location: "cuda:0", Bytes: 50}},
		Enter:        []system.Action{{Handle: x, Location: "cuda:0"}, {Handle: y, Location: "cuda:1"}},
	})
	must(t, sc.Enter(ctx), "enter")
	leases := sc.Leases()
	if len(leases) != 2 {
		t.Fatalf("leases %v", leases)
	}
	// The first lease is released behind the scope's back, so the scope
	// cannot release it at exit.
	must(t, sys.ReleaseByID(ctx, leases[0]), "release the scope's lease by id")
	before := snapshot(t, sys)
	err := sc.Exit(ctx)
	pe := checkExecErr(t, err, budget.PhaseExit, nil, -1, nil, -1, []string{"release", "unreserve"})
	requireConsecutive(t, pe.PartialReport, before.StateVersion)
	as[*system.InvalidInputError](t, pe.Cause, "cause of the exit failure")
	if sc.ExitError() != err {
		t.Fatalf("ExitError %v, want %v", sc.ExitError(), err)
	}
	// Everything else was released anyway.
	after := snapshot(t, sys)
	for _, l := range after.Locations {
		if l.ReservedBytes != 0 {
			t.Fatalf("%s keeps reservations after exit: %+v", l.Location, l)
		}
	}
	for _, name := range []string{"x", "y"} {
		for l, m := range mats(t, after, name) {
			if m.UseCount != 0 {
				t.Fatalf("%s at %s still leased after exit", name, l)
			}
		}
	}
	as[*system.InvalidInputError](t, sc.Exit(ctx), "second exit")
	if sc.ExitError() != err {
		t.Fatalf("a second exit replaced the exit error: %v", sc.ExitError())
	}
}

func TestInvalidInputLeavesStateUnchanged(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	h := register(t, sys, system.Value{Name: "v", Bytes: 100, At: "pinned-host"})
	lease, err := sys.Acquire(ctx, h, "pinned-host")
	must(t, err, "acquire")
	must(t, lease.Release(ctx), "release")
	hold, err := sys.Hold(ctx, h, "pinned-host")
	must(t, err, "hold")
	must(t, hold.Release(ctx), "unhold")
	must(t, sys.Reserve(ctx, "cuda:0", "taken", 10), "reserve")

	cases := map[string]func() error{
		"double release of a lease":  func() error { return lease.Release(ctx) },
		"double release by id":       func() error { return sys.ReleaseByID(ctx, lease.ID()) },
		"double release of a hold":   func() error { return hold.Release(ctx) },
		"event on a released lease":  func() error { _, err := lease.RecordEvent(ctx, system.NewManualEvent()); return err },
		"unknown reservation":        func() error { return sys.Unreserve(ctx, "never-made") },
		"duplicate reservation name": func() error { return sys.Reserve(ctx, "cuda:1", "taken", 10) },
		"reservation of 0 bytes":     func() error { return sys.Reserve(ctx, "cuda:0", "zero", 0) },
		"reservation of -1 bytes":    func() error { return sys.Reserve(ctx, "cuda:0", "neg", -1) },
		"value of 0 bytes":           func() error { _, err := sys.Register(ctx, system.Value{Name: "z", Bytes: 0, At: "cuda:0"}); return err },
		"value of -5 bytes": func() error {
			_, err := sys.Register(ctx, system.Value{Name: "z", Bytes: -5, At: "cuda:0"})
			return err
		},
		"duplicate value name": func() error { _, err := sys.Register(ctx, system.Value{Name: "v", Bytes: 1, At: "cuda:0"}); return err },
		"both at and source": func() error {
			_, err := sys.Register(ctx, system.Value{Name: "z", Bytes: 1, At: "cuda:0", Source: "pinned-host", Loader: loaderOf([]byte{1})})
			return err
		},
		"source without loader": func() error {
			_, err := sys.Register(ctx, system.Value{Name: "z", Bytes: 1, Source: "pinned-host"})
			return err
		},
		"malformed location cuda:01": func() error { return sys.Place(ctx, h, "cuda:01") },
		"malformed location gpu0":    func() error { return sys.Reserve(ctx, "gpu0", "g", 1) },
		"malformed location in a plan": func() error {
			_, err := sys.Execute(ctx, system.Plan{Enter: []system.Action{{Handle: h, Location: "CUDA:0"}}})
			return err
		},
		"malformed location acquire": func() error { _, err := sys.Acquire(ctx, h, "cuda:-1"); return err },
		"duplicate reservation in a plan": func() error {
			_, err := sys.Execute(ctx, system.Plan{Reservations: []system.ReservationSpec{{Name: "d", Location: "cuda:0", Bytes: 1}, {Name: "d", Location: "cuda:1", Bytes: 1}}})
			return err
		},
		"unknown handle": func() error {
			return sys.Place(ctx, system.Handle{Manager: h.Manager, ID: 99, Name: "ghost"}, "cuda:0")
		},
	}
	for name, call := range cases {
		t.Run(name, func(t *testing.T) {
			before := snapshot(t, sys)
			err := call()
			ii := as[*system.InvalidInputError](t, err, name)
			if !errors.Is(err, system.ErrInvalidInput) || ii.Message == "" {
				t.Fatalf("%v", err)
			}
			unchanged(t, sys, before, name)
		})
	}
}

// Recording a nil event is bad input: refused, nothing changed (before the
// fix it was recorded as pending and crashed the watcher goroutine).
func TestRecordNilEventIsInvalidInput(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 0)})
	h := register(t, sys, system.Value{Name: "v", Bytes: 10, At: "cuda:0"})
	l, err := sys.Acquire(ctx, h, "cuda:0")
	must(t, err, "acquire")
	before := snapshot(t, sys)
	_, err = l.RecordEvent(ctx, nil)
	as[*system.InvalidInputError](t, err, "record a nil event")
	unchanged(t, sys, before, "nil event")
	must(t, l.Release(ctx), "release")
}

// A registration whose initialization fails is a PlanExecutionError; the
// handle is retired and the name is free again.
func TestRegistrationFailureRetiresHandle(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1000)})
	before := snapshot(t, sys)
	testsys.Faults(sys).Arm(cuda.FaultAlloc, "cuda:0")
	_, err := sys.Register(ctx, system.Value{Name: "n", Bytes: 100, At: "cuda:0"})
	pe := as[*system.PlanExecutionError](t, err, "register with an allocation fault")
	if pe.Phase != budget.PhaseExecute || pe.FailedAction == nil || pe.FailedAction.Location != "cuda:0" || pe.FailedAction.Handle.Name != "n" {
		t.Fatalf("%+v", pe)
	}
	equal(t, []string{"admit", "fail"}, kinds(pe.PartialReport), "report")
	retired := pe.FailedAction.Handle
	after := snapshot(t, sys)
	equal(t, before.StateVersion+2, after.StateVersion, "versions")
	if l := loc(t, after, "cuda:0"); l.UsedBytes != 0 {
		t.Fatalf("cuda:0 after the failed registration: %+v", l)
	}
	if err := sys.Place(ctx, retired, "pinned-host"); !errors.Is(err, system.ErrDiscarded) {
		t.Fatalf("the retired handle: %v", err)
	}
	data := pattern(100, 6)
	h := register(t, sys, system.Value{Name: "n", Bytes: 100, At: "cuda:0", Data: data})
	if h == retired {
		t.Fatal("the new registration reuses the retired handle")
	}
	got, err := sys.Read(ctx, h, "cuda:0")
	must(t, err, "read")
	requireBytes(t, data, got, "n")
	if looked, err := sys.Lookup(ctx, "n"); err != nil || looked != h {
		t.Fatalf("lookup %v %v", looked, err)
	}
}
