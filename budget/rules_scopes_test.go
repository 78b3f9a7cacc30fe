package budget

// Rule tests of docs/semantics.md, "Plans, explain, scopes, execute"
// (scopes, execute, direct operations). Every call goes through the checked
// harness (rules_test.go).
//
// rule → test
//
// Plans, explain, scopes: runs
//   stale version → StaleStateError before any mutation
//                                        → TestRule_RunStaleStateCheckedBeforeAnyMutation
//   infeasible → PlanError, nothing changed
//                                        → TestRule_RunInfeasiblePlanIsPlanError
//   failure → PlanExecutionError (phase, failed action/reservation and
//   index within its list, -1 unused, partial report, cause); committed
//   reclaims and enters stay; the run's reservations are released
//                                        → TestRule_RunReclaimFailureIsPlanExecutionError,
//                                          TestRule_RunReserveFailureIsPlanExecutionError,
//                                          TestRule_RunEnterFailureIsPlanExecutionError
//   partial report = every committed transition, the release of a failed
//   entry's reservations (and leases) included
//                                        → TestRule_FailedScopeEntryReportListsEveryTransition
//   execute failures carry phase execute → TestRule_ExecuteFailureCarriesPhaseExecute
//   (resolved) direct place/copy/move failing after admission
//                                        → TestRule_DirectTransferFailureIsPlanExecutionError
//   leases on every entered endpoint, only after every enter
//   (resolved: failed entry holds none; one version per lease)
//                                        → TestRule_ScopeLeasesTakenOnlyAfterAllEnters
//   (resolved) duplicate names are invalid input, plan reservations too
//                                        → TestRule_PlanReservationNamesAreValidatedAsInput
//   (resolved) execute's reservations stay active
//                                        → TestRule_ExecuteReservationsStayActive
//   (resolved) scope reservations refused by unreserve
//                                        → TestRule_ScopeReservationsRefusedByUnreserve
//   (ledger API) run step protocol       → TestRule_RunStepProtocol
//   SearchLimitError and StaleStateError match ErrPlan; PlanExecutionError
//   does not                             → TestRule_ErrorCategories

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestRule_RunStaleStateCheckedBeforeAnyMutation(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	v := c.L.Version()
	infeasible := Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 1000}}}
	err := c.refused("stale", func() error {
		_, err := c.StartRun(infeasible, RunOptions{Scope: "s", CheckVersion: true, ExpectedVersion: v - 1})
		return err
	})
	eq(t, "stale", *as[*StaleStateError](t, err), StaleStateError{ExpectedVersion: v - 1, ActualVersion: v})
	if !errors.Is(err, ErrPlan) {
		t.Fatal("StaleStateError must match ErrPlan")
	}
	// A feasible plan is refused as stale before its reclaim removes
	// anything.
	bad := Plan{Reclaim: []Action{{Handle: e.a, Location: "cuda:0"}}, Enter: []Action{{Handle: e.w, Location: "cuda:0"}}}
	err = c.refused("stale feasible", func() error {
		_, err := c.StartRun(bad, RunOptions{CheckVersion: true, ExpectedVersion: v + 1})
		return err
	})
	eq(t, "stale ahead", *as[*StaleStateError](t, err), StaleStateError{ExpectedVersion: v + 1, ActualVersion: v})
	// The right version passes the check.
	r, err := c.StartRun(bad, RunOptions{CheckVersion: true, ExpectedVersion: v})
	c.must(err)
	_, _, _, err = r.all()
	c.must(err)
}

func TestRule_RunInfeasiblePlanIsPlanError(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	p := Plan{Enter: []Action{{Handle: e.s, Location: "cuda:0"}}} // 60 + 50 > 100
	ex := c.Explain(p)
	err := c.refused("infeasible", func() error { _, err := c.StartRun(p, RunOptions{Scope: "s"}); return err })
	eq(t, "plan error", *as[*PlanError](t, err), PlanError{Reason: ex.Reason})
	if !strings.Contains(ex.Reason, "budget exceeded at cuda:0") {
		t.Fatalf("reason %q", ex.Reason)
	}
}

func TestRule_RunReclaimFailureIsPlanExecutionError(t *testing.T) {
	for _, scope := range []string{"s1", ""} {
		e := newPlanEnv(t)
		c := e.c
		b := c.regSrc("b", 10, Exclusive, "pinned-host")
		c.placed(b, "cuda:1")
		p := Plan{
			Reclaim:      []Action{{Handle: e.a, Location: "cuda:0"}, {Handle: b, Location: "cuda:1"}},
			Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 5}},
		}
		r, err := c.StartRun(p, RunOptions{Scope: scope})
		c.must(err)
		s, ok, err := r.Next()
		c.must(err)
		eq(t, "first step", []any{s.Phase, s.Index, ok}, []any{PhaseReclaim, 0, true})
		v := c.L.Version()
		c.must2(c.Acquire(b, "cuda:1")) // someone leases b between the steps
		_, ok, err = r.Next()
		pe := as[*PlanExecutionError](t, err)
		wantPhase := PhaseReclaim
		if scope == "" {
			wantPhase = PhaseExecute
		}
		eq(t, "error", *pe, PlanExecutionError{
			Phase: wantPhase, FailedAction: &p.Reclaim[1], FailedActionIndex: 1, FailedReservationIndex: -1,
			PartialReport: Report{Transitions: []Transition{{Version: v, Kind: "remove", Handle: "a", Location: "cuda:0", Bytes: 60, Detail: "reclaim", Removal: RemovalReclaim}}},
			Cause:         &InUseError{Handle: "b", Location: "cuda:1", UseCount: 1},
		})
		eq(t, "ok", ok, false)
		// The committed reclaim stays; nothing else happened.
		eq(t, "a", c.mats("a"), []string(nil))
		eq(t, "b", c.mats("b"), []string{"cuda:1:resident:1/0/0"})
		eq(t, "version", c.L.Version(), v+1)
		// The run is over.
		_, _, err = r.Next()
		eq(t, "again", err, error(pe))
		_, _, err = r.Finish()
		eq(t, "finish", err, error(pe))
	}
}

func TestRule_RunReserveFailureIsPlanExecutionError(t *testing.T) {
	for _, scope := range []string{"s1", ""} {
		e := newPlanEnv(t)
		c := e.c
		p := Plan{
			Reservations: []ReservationSpec{{Name: "q1", Location: "cuda:0", Bytes: 10}, {Name: "q2", Location: "cuda:0", Bytes: 20}},
			Enter:        []Action{{Handle: e.r, Location: "cuda:1"}},
		}
		r, err := c.StartRun(p, RunOptions{Scope: scope})
		c.must(err)
		c.must3(r.Next())
		v := c.L.Version()
		c.must(c.Reserve("cuda:0", "other", 25)) // 60 + 10 + 25 = 95: q2 no longer fits
		_, _, err = r.Next()
		pe := as[*PlanExecutionError](t, err)
		wantPhase := PhaseReserve
		report := []Transition{{Version: v, Kind: "reserve", Location: "cuda:0", Bytes: 10, Detail: "q1", Name: "q1"}}
		if scope == "" {
			wantPhase = PhaseExecute
		} else {
			// The release of q1 is a committed transition of the failed
			// entry: the partial report lists it.
			report = append(report, Transition{Version: v + 2, Kind: "unreserve", Location: "cuda:0", Bytes: 10, Detail: "q1", Name: "q1"})
		}
		eq(t, "error", *pe, PlanExecutionError{
			Phase: wantPhase, FailedActionIndex: -1, FailedReservation: &p.Reservations[1], FailedReservationIndex: 1,
			PartialReport: Report{Transitions: report},
			Cause:         &BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 60, ReservedBytes: 35, RequestedBytes: 20},
		})
		if scope != "" {
			// A failed scope entry releases q1 (1 version); "other" is untouched.
			eq(t, "reservations", c.loc("cuda:0").Reservations, []ReservationRecord{{Name: "other", Bytes: 25}})
			eq(t, "version", c.L.Version(), v+2)
			wantInvalid(t, c.Unreserve("q1"), "not active")
		} else {
			// An execute's reservations are ordinary ones: q1 stays active.
			eq(t, "reservations", c.loc("cuda:0").Reservations, []ReservationRecord{{Name: "q1", Bytes: 10}, {Name: "other", Bytes: 25}})
			eq(t, "version", c.L.Version(), v+1)
			c.must(c.Unreserve("q1"))
		}
	}
}

func TestRule_RunEnterFailureIsPlanExecutionError(t *testing.T) {
	t.Run("transfer fails", func(t *testing.T) {
		e := newPlanEnv(t)
		c := e.c
		p := Plan{
			Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 10}},
			Enter:        []Action{{Handle: e.r, Location: "cuda:1"}, {Handle: e.a, Location: "pinned-host"}},
		}
		v := c.L.Version()
		r, err := c.StartRun(p, RunOptions{Scope: "s1"})
		c.must(err)
		for range 3 { // reserve, enter 0 (admitted and completed), enter 1 admitted
			s, _, err := r.Next()
			c.must(err)
			if s.Phase == PhaseEnter && s.Index == 0 {
				c.must2(r.Complete())
			}
		}
		eq(t, "no lease while entering", c.mats("r"), []string{"pageable-host:resident:0/0/0", "cuda:1:resident:0/0/0"})
		cause := errors.New("loader crashed")
		err = r.Fail(cause)
		pe := as[*PlanExecutionError](t, err)
		eq(t, "phase", pe.Phase, PhaseEnter)
		eq(t, "action", pe.FailedAction, &p.Enter[1])
		eq(t, "indexes", []int{pe.FailedActionIndex, pe.FailedReservationIndex}, []int{1, -1})
		eq(t, "reservation", pe.FailedReservation, (*ReservationSpec)(nil))
		eq(t, "report", kinds(pe.PartialReport.Transitions), []string{"reserve@cuda:1", "admit r@cuda:1", "complete r@cuda:1", "admit a@pinned-host", "fail a@pinned-host", "unreserve@cuda:1"})
		eq(t, "report versions", []uint64{pe.PartialReport.Transitions[0].Version, pe.PartialReport.Transitions[5].Version}, []uint64{v + 1, v + 6})
		if !errors.Is(err, cause) || errors.Unwrap(err) != cause || pe.Cause != cause {
			t.Fatalf("cause lost: %v", err)
		}
		if errors.Is(err, ErrPlan) {
			t.Fatal("PlanExecutionError must not match ErrPlan")
		}
		// Committed enter stays, the reservation is released, no lease.
		eq(t, "r", c.mats("r"), []string{"pageable-host:resident:0/0/0", "cuda:1:resident:0/0/0"})
		eq(t, "a back at its source", c.mats("a"), []string{"cuda:0:resident:0/0/0"})
		eq(t, "cuda:1", c.figures("cuda:1"), [3]int64{50, 0, 60})
		eq(t, "version: 5 committed + 1 release, all reported", c.L.Version(), v+6)
	})
	t.Run("admission refused", func(t *testing.T) {
		e := newPlanEnv(t)
		c := e.c
		p := Plan{
			Reclaim: []Action{{Handle: e.a, Location: "cuda:0"}},
			Enter:   []Action{{Handle: e.r, Location: "pinned-host"}, {Handle: e.w, Location: "cuda:0", From: "cuda:1"}},
		}
		r, err := c.StartRun(p, RunOptions{Scope: "s1"})
		c.must(err)
		c.must3(r.Next()) // reclaim
		c.must3(r.Next()) // enter 0
		c.must2(r.Complete())
		c.must(c.Reserve("cuda:0", "thief", 80))
		_, _, err = r.Next()
		pe := as[*PlanExecutionError](t, err)
		eq(t, "fields", []any{pe.Phase, *pe.FailedAction, pe.FailedActionIndex, pe.FailedReservationIndex, len(pe.PartialReport.Transitions)},
			[]any{PhaseEnter, p.Enter[1], 1, -1, 3})
		eq(t, "cause", pe.Cause, error(&BudgetError{Location: "cuda:0", BudgetBytes: 100, ReservedBytes: 80, RequestedBytes: 30}))
	})
}

// TestRule_FailedScopeEntryReportListsEveryTransition: the partial report
// of a failed scope entry is every transition the entry committed, in
// order, the cleanup included (the release of the reservations it admitted
// and of the leases it took), and nothing committed by anyone else between
// its steps: the report is copied after the cleanup.
func TestRule_FailedScopeEntryReportListsEveryTransition(t *testing.T) {
	type env struct {
		*planEnv
		outside func(f func()) // commits f's transitions as someone else's
	}
	cases := []struct {
		name   string
		plan   func(e env) Plan
		drive  func(e env, r *checkedRun) error // the steps, up to the failure
		phase  string
		action func(p Plan) *Action
		actIdx int
		resIdx int
		kinds  []string
	}{{
		name: "reclaim refused (nothing to clean up)",
		plan: func(e env) Plan {
			e.c.placed(e.r, "cuda:1")
			return Plan{Reclaim: []Action{{Handle: e.a, Location: "cuda:0"}, {Handle: e.r, Location: "cuda:1"}},
				Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 5}}}
		},
		drive: func(e env, r *checkedRun) error {
			e.c.must3(r.Next())
			e.outside(func() { e.c.must2(e.c.Hold(e.r, "cuda:1")) })
			_, _, err := r.Next()
			return err
		},
		phase: PhaseReclaim, action: func(p Plan) *Action { return &p.Reclaim[1] }, actIdx: 1, resIdx: -1,
		kinds: []string{"remove a@cuda:0"},
	}, {
		name: "reservation refused",
		plan: func(e env) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q1", Location: "cuda:0", Bytes: 10}, {Name: "q2", Location: "cuda:0", Bytes: 20}}}
		},
		drive: func(e env, r *checkedRun) error {
			e.c.must3(r.Next())
			e.outside(func() { e.c.must(e.c.Reserve("cuda:0", "other", 25)) })
			_, _, err := r.Next()
			return err
		},
		phase: PhaseReserve, actIdx: -1, resIdx: 1,
		kinds: []string{"reserve@cuda:0", "unreserve@cuda:0"},
	}, {
		name: "enter admission refused",
		plan: func(e env) Plan {
			return Plan{Reclaim: []Action{{Handle: e.a, Location: "cuda:0"}},
				Reservations: []ReservationSpec{{Name: "q1", Location: "cuda:1", Bytes: 5}, {Name: "q2", Location: "pinned-host", Bytes: 5}},
				Enter:        []Action{{Handle: e.r, Location: "pinned-host"}, {Handle: e.w, Location: "cuda:0", From: "cuda:1"}}}
		},
		drive: func(e env, r *checkedRun) error {
			for range 4 { // reclaim, two reservations, enter 0
				e.c.must3(r.Next())
			}
			e.c.must2(r.Complete())
			e.outside(func() { e.c.must(e.c.Reserve("cuda:0", "thief", 80)) })
			_, _, err := r.Next()
			return err
		},
		phase: PhaseEnter, action: func(p Plan) *Action { return &p.Enter[1] }, actIdx: 1, resIdx: -1,
		kinds: []string{"remove a@cuda:0", "reserve@cuda:1", "reserve@pinned-host", "admit r@pinned-host", "complete r@pinned-host",
			"unreserve@pinned-host", "unreserve@cuda:1"},
	}, {
		name: "enter transfer failed",
		plan: func(e env) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 10}},
				Enter: []Action{{Handle: e.r, Location: "cuda:1"}, {Handle: e.a, Location: "pinned-host"}}}
		},
		drive: func(e env, r *checkedRun) error {
			e.c.must3(r.Next())
			e.c.must3(r.Next())
			e.outside(func() { e.c.must(e.c.Reserve("pageable-host", "elsewhere", 1)) })
			e.c.must2(r.Complete())
			e.c.must3(r.Next())
			return r.Fail(errors.New("loader crashed"))
		},
		phase: PhaseEnter, action: func(p Plan) *Action { return &p.Enter[1] }, actIdx: 1, resIdx: -1,
		kinds: []string{"reserve@cuda:1", "admit r@cuda:1", "complete r@cuda:1", "admit a@pinned-host", "fail a@pinned-host", "unreserve@cuda:1"},
	}, {
		name: "lease refused at the end of the entry",
		plan: func(e env) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q1", Location: "cuda:1", Bytes: 10}, {Name: "q2", Location: "pinned-host", Bytes: 5}},
				Enter: []Action{{Handle: e.w, Location: "cuda:0"}, {Handle: e.r, Location: "cuda:1"}}}
		},
		drive: func(e env, r *checkedRun) error {
			for {
				s, ok, err := r.Next()
				e.c.must(err)
				if !ok {
					break
				}
				if s.Admission.Pending {
					e.c.must2(r.Complete())
				}
			}
			// Someone evicts the second entered endpoint before the
			// scope takes its leases.
			e.outside(func() { e.c.must2(e.c.Evict(e.r, "cuda:1")) })
			_, _, err := r.Finish()
			return err
		},
		phase: PhaseEnter, action: func(p Plan) *Action { return &p.Enter[1] }, actIdx: 1, resIdx: -1,
		kinds: []string{"reserve@cuda:1", "reserve@pinned-host", "admit w@cuda:0", "complete w@cuda:0", "remove w@cuda:1",
			"admit r@cuda:1", "complete r@cuda:1", "acquire w@cuda:0", "release w@cuda:0", "unreserve@pinned-host", "unreserve@cuda:1"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pe0 := newPlanEnv(t)
			c := pe0.c
			others := map[uint64]bool{}
			e := env{planEnv: pe0, outside: func(f func()) {
				v := c.L.Version()
				f()
				for x := v + 1; x <= c.L.Version(); x++ {
					others[x] = true
				}
			}}
			p := tc.plan(e)
			start := c.L.Version()
			r, err := c.StartRun(p, RunOptions{Scope: "s1"})
			c.must(err)
			err = tc.drive(e, r)
			pe := as[*PlanExecutionError](t, err)
			eq(t, "phase", pe.Phase, tc.phase)
			var wantAction *Action
			if tc.action != nil {
				wantAction = tc.action(p)
			}
			eq(t, "failed action", pe.FailedAction, wantAction)
			eq(t, "indexes", []int{pe.FailedActionIndex, pe.FailedReservationIndex}, []int{tc.actIdx, tc.resIdx})
			eq(t, "report", kinds(pe.PartialReport.Transitions), tc.kinds)
			// Exactly the run's own transitions: every version since the
			// start that nobody else committed, with the trace's content.
			var own []Transition
			for _, x := range c.L.Trace() {
				if x.Version > start && !others[x.Version] {
					own = append(own, x)
				}
			}
			eq(t, "report = the entry's committed transitions", pe.PartialReport.Transitions, own)
			if !strings.Contains(pe.Error(), fmt.Sprintf("after %d committed transitions", len(tc.kinds))) {
				t.Fatalf("message %q does not count the cleanup", pe.Error())
			}
			// Nothing of the scope is left: no owned reservation, no lease.
			for _, l := range c.Snapshot().Locations {
				for _, x := range l.Reservations {
					if x.Owner != "" {
						t.Fatalf("%s keeps the scope's reservation %+v", l.Location, x)
					}
				}
			}
			if o := c.L.Outstanding(); len(o.Leases) != 0 {
				t.Fatalf("leases left: %+v", o.Leases)
			}
		})
	}
}

func TestRule_ExecuteFailureCarriesPhaseExecute(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	p := Plan{
		Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 10}},
		Enter:        []Action{{Handle: e.r, Location: "cuda:0"}},
	}
	r, err := c.StartRun(p, RunOptions{})
	c.must(err)
	c.must3(r.Next())
	c.must3(r.Next())
	err = r.Fail(errors.New("copy engine fault"))
	pe := as[*PlanExecutionError](t, err)
	eq(t, "fields", []any{pe.Phase, *pe.FailedAction, pe.FailedActionIndex, pe.FailedReservationIndex}, []any{PhaseExecute, p.Enter[0], 0, -1})
	// A failed execute keeps the reservations it admitted: they are
	// ordinary named reservations (SEMANTICS: they stay active; only a
	// failed scope entry cleans its reservation prefix).
	eq(t, "kept", c.loc("cuda:0").Reservations, []ReservationRecord{{Name: "q", Bytes: 10}})
}

func TestRule_DirectTransferFailureIsPlanExecutionError(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "cuda:0")
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	cause := errors.New("dma error")
	for _, tc := range []struct {
		h      Handle
		action Action
	}{
		{w, Action{Handle: w, Location: "cuda:1", From: "cuda:0"}},
		{s, Action{Handle: s, Location: "cuda:1"}},
	} {
		a, err := c.Place(tc.h, "cuda:1")
		c.must(err)
		v := c.L.Version()
		err = c.FailDirect(a.ID, cause)
		pe := as[*PlanExecutionError](t, err)
		eq(t, "phase", pe.Phase, PhaseExecute)
		eq(t, "action", *pe.FailedAction, tc.action)
		eq(t, "indexes", []int{pe.FailedActionIndex, pe.FailedReservationIndex}, []int{0, -1})
		eq(t, "report", kinds(pe.PartialReport.Transitions), []string{"admit " + tc.h.Name + "@cuda:1", "fail " + tc.h.Name + "@cuda:1"})
		eq(t, "report versions", []uint64{pe.PartialReport.Transitions[0].Version, pe.PartialReport.Transitions[1].Version}, []uint64{v, v + 1})
		eq(t, "cause", pe.Cause, cause)
		eq(t, "one version", c.L.Version(), v+1)
	}
	eq(t, "w back home", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	wantInvalid(t, c.FailDirect(99, cause), "not pending")
}

func TestRule_ScopeLeasesTakenOnlyAfterAllEnters(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	p := Plan{
		Reclaim: []Action{{Handle: e.a, Location: "cuda:0"}},
		Enter:   []Action{{Handle: e.w, Location: "cuda:0"}, {Handle: e.r, Location: "cuda:1"}, {Handle: e.r, Location: "pageable-host"}},
	}
	r, err := c.StartRun(p, RunOptions{Scope: "s1"})
	c.must(err)
	for {
		s, ok, err := r.Next()
		c.must(err)
		if !ok {
			break
		}
		if s.Admission.Pending {
			c.must2(r.Complete())
		}
		for _, v := range c.Snapshot().Values {
			for _, m := range v.Materializations {
				if m.UseCount != 0 {
					t.Fatalf("lease on %s at %s before every enter succeeded", v.Handle.Name, m.Location)
				}
			}
		}
	}
	v := c.L.Version()
	rep, leases, err := r.Finish()
	c.must(err)
	eq(t, "one version per lease", c.L.Version(), v+3)
	eq(t, "leases", len(leases), 3)
	for i, id := range leases {
		h, loc, ok := c.L.LeaseEndpoint(id)
		eq(t, "lease endpoint", []any{h, loc, ok}, []any{p.Enter[i].Handle, p.Enter[i].Location, true})
	}
	n := len(rep.Transitions)
	eq(t, "report ends with the leases", kinds(rep.Transitions[n-3:]), []string{"acquire w@cuda:0", "acquire r@cuda:1", "acquire r@pageable-host"})
	// Scope entry = one version per committed transition and per lease.
	eq(t, "report = every version of the entry", rep.Transitions[n-1].Version-rep.Transitions[0].Version+1, uint64(n))
	_, _, err = r.Finish()
	wantInvalid(t, err, "already finished")
}

func TestRule_PlanReservationNamesAreValidatedAsInput(t *testing.T) {
	// Duplicate names are invalid input (resolved details), in a plan too:
	// repeated within the plan, or already active.
	e := newPlanEnv(t)
	c := e.c
	c.must(c.Reserve("cuda:1", "q", 1))
	for _, p := range []Plan{
		{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 1}}},
		{Reservations: []ReservationSpec{{Name: "z", Location: "cuda:0", Bytes: 1}, {Name: "z", Location: "cuda:1", Bytes: 1}}},
		{Reservations: []ReservationSpec{{Name: "", Location: "cuda:0", Bytes: 1}}},
		{Reservations: []ReservationSpec{{Name: "z", Location: "cuda:0", Bytes: 0}}},
	} {
		for _, scope := range []string{"", "s"} {
			err := c.refused("start", func() error { _, err := c.StartRun(p, RunOptions{Scope: scope}); return err })
			wantInvalid(t, err)
		}
		if ex := c.Explain(p); ex.Feasible {
			t.Fatalf("explain of %+v is feasible", p)
		}
	}
}

func TestRule_ExecuteReservationsStayActive(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	r, err := c.StartRun(Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 10}}}, RunOptions{})
	c.must(err)
	_, leases, _, err := r.all()
	c.must(err)
	eq(t, "leases", len(leases), 0)
	eq(t, "ordinary reservation", c.loc("cuda:1").Reservations, []ReservationRecord{{Name: "q", Bytes: 10}})
	eq(t, "unreserve", c.delta(func() { c.must(c.Unreserve("q")) }), uint64(1))
}

func TestRule_ScopeReservationsRefusedByUnreserve(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	r, err := c.StartRun(Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 10}}}, RunOptions{Scope: "s1"})
	c.must(err)
	_, _, _, err = r.all()
	c.must(err)
	eq(t, "owned", c.loc("cuda:1").Reservations, []ReservationRecord{{Name: "q", Bytes: 10, Owner: "s1"}})
	err = c.refused("unreserve scope reservation", func() error { return c.Unreserve("q") })
	wantInvalid(t, err, `reservation "q" belongs to scope "s1"`)
	err = c.refused("other owner", func() error { return c.UnreserveOwned("q", "s2") })
	wantInvalid(t, err, `does not belong to "s2"`)
	err = c.refused("owned, empty owner", func() error { return c.ReserveOwned("cuda:1", "z", 1, "") })
	wantInvalid(t, err, "owner")
	eq(t, "exit releases", c.delta(func() { c.must(c.UnreserveOwned("q", "s1")) }), uint64(1))
}

func TestRule_RunStepProtocol(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	r, err := c.StartRun(Plan{Enter: []Action{{Handle: e.r, Location: "cuda:1"}}}, RunOptions{Scope: "s"})
	c.must(err)
	_, _, err = r.Finish()
	wantInvalid(t, err, "not finished")
	_, err = r.Complete()
	wantInvalid(t, err, "no run step is pending")
	wantInvalid(t, r.Fail(errors.New("x")), "no run step is pending")
	c.must3(r.Next())
	_, _, err = r.Next()
	wantInvalid(t, err, "still pending")
	c.must2(r.Complete())
	_, ok, err := r.Next()
	c.must(err)
	eq(t, "done", ok, false)
	c.must3(r.Finish())
}

func TestRule_ErrorCategories(t *testing.T) {
	plan := []error{&PlanError{Reason: "x"}, &SearchLimitError{RequestName: "r"}, &StaleStateError{ExpectedVersion: 1, ActualVersion: 2}}
	for _, err := range plan {
		if !errors.Is(err, ErrPlan) {
			t.Errorf("%T must match ErrPlan", err)
		}
		if !errors.Is(fmt.Errorf("wrapped: %w", err), ErrPlan) {
			t.Errorf("wrapped %T must match ErrPlan", err)
		}
	}
	notPlan := []error{
		&PlanExecutionError{Phase: PhaseEnter, FailedActionIndex: 0, FailedReservationIndex: -1, Cause: errors.New("boom")},
		&PlanExecutionError{Phase: PhaseReserve, FailedActionIndex: -1, Cause: &BudgetError{Location: "cuda:0"}},
		&PlanExecutionError{Phase: PhaseReclaim, Cause: &InUseError{Handle: "w"}},
		// A sibling category even when its cause is a plan error.
		&PlanExecutionError{Phase: PhaseReclaim, Cause: &PlanError{Reason: "would lose data"}},
		&PlanExecutionError{Phase: PhaseEnter, Cause: fmt.Errorf("wrapped: %w", &StaleStateError{})},
		&BudgetError{}, &InUseError{}, &UnavailableError{}, &InvalidInputError{},
	}
	for _, err := range notPlan {
		if errors.Is(err, ErrPlan) {
			t.Errorf("%T (%v) must not match ErrPlan", err, err)
		}
	}
	// The cause stays reachable for everything but the plan category.
	pe := &PlanExecutionError{Phase: PhaseReclaim, Cause: &PlanError{Reason: "would lose data"}}
	var cause *PlanError
	if !errors.As(pe, &cause) || cause.Reason != "would lose data" {
		t.Error("errors.As must still find a PlanExecutionError's cause")
	}
	inner := &UnavailableError{Reason: UnavailableDiscarded}
	if !errors.Is(&PlanExecutionError{Cause: inner}, ErrDiscarded) || !errors.Is(&PlanExecutionError{Cause: inner}, inner) {
		t.Error("errors.Is must still reach a PlanExecutionError's cause")
	}
	if !errors.Is(&InvalidInputError{Message: "m"}, ErrInvalidInput) || errors.Is(&PlanError{}, ErrInvalidInput) {
		t.Error("ErrInvalidInput category")
	}
	if !errors.Is(&UnavailableError{Reason: UnavailableDiscarded}, ErrDiscarded) || errors.Is(&UnavailableError{Reason: UnavailableForeign}, ErrDiscarded) {
		t.Error("ErrDiscarded")
	}
	if !errors.Is(&UnavailableError{Reason: UnavailableForeign}, ErrForeign) || errors.Is(&UnavailableError{Reason: UnavailableEndpoint}, ErrForeign) {
		t.Error("ErrForeign")
	}
	// ErrBusy: in use or in flight, never over budget or absent.
	for _, err := range []error{&InUseError{Handle: "w", UseCount: 1}, &UnavailableError{Reason: UnavailableInFlight}, fmt.Errorf("wrapped: %w", &InUseError{})} {
		if !errors.Is(err, ErrBusy) {
			t.Errorf("%T (%v) must match ErrBusy", err, err)
		}
	}
	for _, err := range []error{&BudgetError{}, &UnavailableError{Reason: UnavailableEndpoint}, &UnavailableError{Reason: UnavailableDiscarded}, &PlanError{}, &InvalidInputError{}} {
		if errors.Is(err, ErrBusy) {
			t.Errorf("%T (%v) must not match ErrBusy", err, err)
		}
	}
}
