package budget

// Rule tests of docs/semantics.md, "Plans, explain, scopes, execute" (plans
// and explain). Every call goes through the checked harness (rules_test.go).
//
// rule → test
//
// Plans, explain, scopes
//   order reclaim → reservations → enter, enters one after another
//                                        → TestRule_PlanOrderIsReclaimReserveEnter
//   explain changes nothing              → TestRule_ExplainSimulatesWithoutChangingState
//   explain: feasible, reason (first failure), predicted peaks incl.
//   transfers and temporary charges      → TestRule_ExplainPredictsPeakWithTransfersAndTemporaryCharges,
//                                          TestRule_ExplainReasonIsFirstFailure
//   (resolved) peak starts from current used+reserved, every location
//                                        → TestRule_ExplainPeakStartsFromCurrentAndCoversEveryLocation
//   (resolved) entered endpoint missing at the end → infeasible
//                                        → TestRule_ExplainEndpointMissingAtEndIsInfeasible

import (
	"fmt"
	"strings"
	"testing"
)

// planEnv: a (60, source pinned-host) resident at cuda:0; w (30, exclusive)
// at cuda:1; r (20, replicable) at pageable-host; s (50, source cuda:1) not
// materialized.
type planEnv struct {
	c          *checked
	a, w, r, s Handle
}

func newPlanEnv(t *testing.T) *planEnv {
	c := std(t)
	e := &planEnv{c: c}
	e.a = c.regSrc("a", 60, Exclusive, "pinned-host")
	c.placed(e.a, "cuda:0")
	e.w = c.reg("w", 30, Exclusive, "cuda:1")
	e.r = c.reg("r", 20, Replicable, "pageable-host")
	e.s = c.regSrc("s", 50, Exclusive, "cuda:1")
	return e
}

func TestRule_PlanOrderIsReclaimReserveEnter(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	// Reclaim first: the reservation needs the 60 bytes a frees.
	p := Plan{
		Reclaim:      []Action{{Handle: e.a, Location: "cuda:0"}},
		Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 50}},
		Enter:        []Action{{Handle: e.r, Location: "cuda:0"}},
	}
	ex := c.Explain(p)
	eq(t, "feasible", ex, Explanation{Feasible: true, PredictedPeakBytes: map[string]int64{"pageable-host": 20, "pinned-host": 0, "cuda:0": 70, "cuda:1": 30}})
	// Reservations before enters: a 70-byte reservation at cuda:1 leaves no
	// room for s's 50-byte temporary load there, although the load would be
	// over before the reservation if enters came first.
	p2 := Plan{
		Reservations: []ReservationSpec{{Name: "q2", Location: "cuda:1", Bytes: 40}},
		Enter:        []Action{{Handle: e.s, Location: "pinned-host"}},
	}
	ex = c.Explain(p2)
	if ex.Feasible || !strings.HasPrefix(ex.Reason, "enter 0 (s at pinned-host)") || !strings.Contains(ex.Reason, "cuda:1") {
		t.Fatalf("reservation must precede the enter: %+v", ex)
	}
	// The run commits in the same order.
	r, err := c.StartRun(p, RunOptions{})
	c.must(err)
	rep, leases, steps, err := r.all()
	c.must(err)
	eq(t, "report", kinds(rep.Transitions), []string{"remove a@cuda:0", "reserve@cuda:0", "admit r@cuda:0", "complete r@cuda:0"})
	var phases []string
	for _, s := range steps {
		phases = append(phases, fmt.Sprint(s.Phase, " ", s.Index))
	}
	eq(t, "steps", phases, []string{"reclaim 0", "reserve 0", "enter 0"})
	eq(t, "no leases for execute", len(leases), 0)
}

func TestRule_ExplainSimulatesWithoutChangingState(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	before := c.Snapshot()
	trace := c.L.Trace()
	p := Plan{
		Reclaim:      []Action{{Handle: e.a, Location: "cuda:0"}},
		Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 10}},
		Enter:        []Action{{Handle: e.w, Location: "cuda:0"}, {Handle: e.s, Location: "cuda:0"}, {Handle: e.r, Location: "cuda:0", From: "pageable-host"}},
	}
	ex := c.Explain(p)
	if !ex.Feasible {
		t.Fatalf("%+v", ex)
	}
	eq(t, "snapshot", c.Snapshot(), before)
	eq(t, "trace", c.L.Trace(), trace)
	// The name q is still free and nothing is pending.
	eq(t, "pending", c.L.Pending(), 0)
	c.must(c.Reserve("cuda:1", "q", 1))
}

func TestRule_ExplainPredictsPeakWithTransfersAndTemporaryCharges(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	// current: pageable 20, pinned 0, cuda:0 60, cuda:1 30
	p := Plan{
		Reclaim:      []Action{{Handle: e.a, Location: "cuda:0"}},                   // cuda:0 0
		Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 10}}, // cuda:1 40
		Enter: []Action{{Handle: e.w, Location: "cuda:0"}, // move: cuda:0 30, cuda:1 40 until complete, then 10
			{Handle: e.s, Location: "cuda:0"},                         // cuda:0 80, temporary at cuda:1: 60, then 10
			{Handle: e.r, Location: "cuda:0", From: "pageable-host"}}, // copy: cuda:0 100
	}
	ex := c.Explain(p)
	eq(t, "explanation", ex, Explanation{Feasible: true, PredictedPeakBytes: map[string]int64{
		"pageable-host": 20, "pinned-host": 0, "cuda:0": 100, "cuda:1": 60}})
	// The run reaches exactly those figures: the real peak of cuda:1 was 30
	// before; after the run it is 60 (the temporary load next to q).
	r, err := c.StartRun(p, RunOptions{})
	c.must(err)
	_, _, _, err = r.all()
	c.must(err)
	eq(t, "cuda:1 real peak", c.figures("cuda:1"), [3]int64{0, 10, 60})
	eq(t, "cuda:0 real peak", c.figures("cuda:0"), [3]int64{100, 0, 100})
	// With a 50-byte reservation the temporary load exactly fits next to it
	// (peak 100 at cuda:1); with 51 it does not.
	for _, tc := range []struct {
		q        int64
		feasible bool
	}{{50, true}, {51, false}} {
		e2 := newPlanEnv(t)
		p2 := p
		p2.Reservations = []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: tc.q}}
		ex := e2.c.Explain(p2)
		eq(t, fmt.Sprint("feasible with q=", tc.q), ex.Feasible, tc.feasible)
		if tc.feasible {
			eq(t, "cuda:1 peak", ex.PredictedPeakBytes["cuda:1"], int64(100))
		} else if !strings.HasPrefix(ex.Reason, "enter 1 (s at cuda:0)") || !strings.Contains(ex.Reason, "budget exceeded at cuda:1") {
			t.Fatalf("%+v", ex)
		}
	}
}

func TestRule_ExplainPeakStartsFromCurrentAndCoversEveryLocation(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	c.must2(c.Evict(e.a, "cuda:0")) // cuda:0 peak 60 stays in the record, current is 0
	c.must(c.Reserve("pinned-host", "q", 5))
	ex := c.Explain(Plan{})
	eq(t, "empty plan", ex, Explanation{Feasible: true, PredictedPeakBytes: map[string]int64{
		"pageable-host": 20, "pinned-host": 5, "cuda:0": 0, "cuda:1": 30}})
	eq(t, "recorded peak differs", c.figures("cuda:0"), [3]int64{0, 0, 60})
}

func TestRule_ExplainReasonIsFirstFailure(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	c.must2(c.Hold(e.a, "cuda:0"))
	ex := c.Explain(Plan{
		Reclaim:      []Action{{Handle: e.a, Location: "cuda:0"}},
		Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 1000}},
	})
	want := `reclaim 0 (a at cuda:0): residency value "a" at cuda:0 is in use: 0 leases, 1 holds, 0 pending events`
	eq(t, "explanation", ex.Feasible, false)
	eq(t, "reason", ex.Reason, want)
}

func TestRule_ExplainEndpointMissingAtEndIsInfeasible(t *testing.T) {
	e := newPlanEnv(t)
	c := e.c
	p := Plan{Enter: []Action{{Handle: e.w, Location: "cuda:0"}, {Handle: e.w, Location: "pinned-host"}}}
	ex := c.Explain(p)
	if ex.Feasible || !strings.Contains(ex.Reason, "enter 0 (w at cuda:0)") || !strings.Contains(ex.Reason, "not resident at the end") {
		t.Fatalf("%+v", ex)
	}
	err := c.refused("start", func() error { _, err := c.StartRun(p, RunOptions{Scope: "s"}); return err })
	wantPlanError(t, err, "not resident at the end")
	// A replicable value may be entered at two locations.
	ex = c.Explain(Plan{Enter: []Action{{Handle: e.r, Location: "cuda:0"}, {Handle: e.r, Location: "pinned-host"}}})
	eq(t, "replicable twice", ex.Feasible, true)
}
