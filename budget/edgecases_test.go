package budget

// Edge cases and the order of checks (docs/semantics.md, "Resolved
// details": "Order of checks" and "Edge cases"), through the checked
// harness of rules_test.go: every refused call must leave the version and
// the snapshot exactly as they were.

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---- order of checks ---------------------------------------------------------

// orderEnv: w (exclusive, no source) at pageable-host; r (replicable, no
// source) at pageable-host and cuda:0, held at cuda:0; s (exclusive,
// source pinned-host) nowhere; d discarded; "live" an active reservation
// at cuda:1; ghost an unknown handle, foreign one of another manager.
type orderEnv struct {
	c              *checked
	w, r, s, d     Handle
	ghost, foreign Handle
}

func newOrderEnv(t *testing.T) *orderEnv {
	c := std(t)
	e := &orderEnv{c: c}
	e.w = c.reg("w", 10, Exclusive, "pageable-host")
	e.r = c.reg("r", 10, Replicable, "pageable-host")
	c.placed(e.r, "cuda:0")
	c.must2(c.Hold(e.r, "cuda:0"))
	e.s = c.regSrc("s", 10, Exclusive, "pinned-host")
	e.d = c.reg("d", 10, Exclusive, "cuda:1")
	c.must2(c.Discard(e.d))
	c.must(c.Reserve("cuda:1", "live", 1))
	e.ghost = Handle{Manager: "m1", ID: 99, Name: "ghost"}
	e.foreign = Handle{Manager: "m9", ID: 1, Name: "w"}
	return e
}

// errWant is the expected first problem: the error's type (by name), its
// Unavailable reason when it is one, and a fragment of its message.
type errWant struct {
	kind     string // invalid, unavailable, plan, inuse, budget, stale
	reason   UnavailableReason
	fragment string
}

var (
	wantDiscarded = errWant{kind: "unavailable", reason: UnavailableDiscarded, fragment: `value "d": value was discarded`}
	wantForeign   = errWant{kind: "unavailable", reason: UnavailableForeign, fragment: "foreign handle"}
	wantGhost     = errWant{kind: "invalid", fragment: `unknown handle "ghost"`}
	wantGPU0      = errWant{kind: "invalid", fragment: `malformed location "gpu0"`}
	wantCUDA9     = errWant{kind: "unavailable", reason: UnavailableLocation, fragment: "cuda:9: location is not configured"}
)

func checkFirst(t *testing.T, what string, err error, want errWant) {
	t.Helper()
	require.Error(t, err, what)
	var (
		ii *InvalidInputError
		ue *UnavailableError
		pe *PlanError
		iu *InUseError
		be *BudgetError
		se *StaleStateError
	)
	switch want.kind {
	case "invalid":
		require.ErrorAs(t, err, &ii, what)
	case "unavailable":
		require.ErrorAs(t, err, &ue, what)
		assert.Equal(t, want.reason, ue.Reason, "%s: unavailable reason (%v)", what, err)
	case "plan":
		require.ErrorAs(t, err, &pe, what)
	case "inuse":
		require.ErrorAs(t, err, &iu, what)
	case "budget":
		require.ErrorAs(t, err, &be, what)
	case "stale":
		require.ErrorAs(t, err, &se, what)
	default:
		t.Fatalf("unknown kind %q", want.kind)
	}
	assert.Contains(t, err.Error(), want.fragment, what)
}

// currentFigures is used+reserved of every location now.
func currentFigures(c *checked) map[string]int64 {
	out := map[string]int64{}
	for _, l := range c.L.Snapshot().Locations {
		out[l.Location] = l.UsedBytes + l.ReservedBytes
	}
	return out
}

// TestRule_OrderOfChecksPlans: fields first, in document order (reclaim,
// then reservations, then enter; an action's handle, location, from; a
// reservation's name, bytes, location), each field whole before the next;
// rules only after every field passed; a scope entry's stale check before
// everything. StartRun (execute and scope) reports the first problem, and
// Explain gives its message as the reason.
func TestRule_OrderOfChecksPlans(t *testing.T) {
	type tc struct {
		name string
		plan func(e *orderEnv) Plan
		want errWant
	}
	cases := []tc{
		{"reclaim before reservations", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.d, Location: "cuda:0"}}, Reservations: []ReservationSpec{{Location: "cuda:0", Bytes: 1}}}
		}, wantDiscarded},
		{"reclaim before enter", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.w, Location: "cuda:9"}}, Enter: []Action{{Handle: e.ghost, Location: "cuda:0"}}}
		}, wantCUDA9},
		{"reservations before enter", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 0}}, Enter: []Action{{Handle: e.d, Location: "cuda:0"}}}
		}, errWant{kind: "invalid", fragment: `reservation "q": bytes must be positive, got 0`}},
		{"earlier reservation before a later one", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:9", Bytes: 1}, {Location: "cuda:0", Bytes: 1}}}
		}, wantCUDA9},
		{"earlier enter before a later one", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.foreign, Location: "cuda:0"}, {Handle: e.ghost, Location: "cuda:0"}}}
		}, wantForeign},
		{"action: handle before location (unknown)", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.ghost, Location: "gpu0"}}}
		}, wantGhost},
		{"action: handle before location (discarded)", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.d, Location: "cuda:9"}}}
		}, wantDiscarded},
		{"action: handle before from", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.d, Location: "cuda:0", From: "gpu0"}}}
		}, wantDiscarded},
		{"action: location before from (unconfigured, malformed)", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.r, Location: "cuda:9", From: "gpu0"}}}
		}, wantCUDA9},
		{"action: location before from (malformed, unconfigured)", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.r, Location: "gpu0", From: "cuda:9"}}}
		}, wantGPU0},
		{"reclaim: location before a from it must not have", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.r, Location: "cuda:9", From: "cuda:0"}}}
		}, wantCUDA9},
		{"reclaim: a from it must not have, before the next action", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.r, Location: "cuda:0", From: "cuda:0"}, {Handle: e.d, Location: "cuda:0"}}}
		}, errWant{kind: "invalid", fragment: "from is only meaningful for enter actions"}},
		{"reservation: name (empty) before bytes and location", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Location: "gpu0", Bytes: 0}}}
		}, errWant{kind: "invalid", fragment: "reservation 0 has an empty name"}},
		{"reservation: name (active) before bytes", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "live", Location: "cuda:0", Bytes: -1}}}
		}, errWant{kind: "invalid", fragment: `duplicate reservation name "live" (already active)`}},
		{"reservation: name (repeated) before bytes", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 1}, {Name: "q", Location: "cuda:9", Bytes: 0}}}
		}, errWant{kind: "invalid", fragment: `reservation name "q" appears twice in the plan`}},
		{"reservation: name (active) before location", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "live", Location: "cuda:9", Bytes: 1}}}
		}, errWant{kind: "invalid", fragment: `"live" (already active)`}},
		{"reservation: bytes before location", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:9", Bytes: -5}}}
		}, errWant{kind: "invalid", fragment: "bytes must be positive, got -5"}},
		{"fields before rules: protection", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.r, Location: "cuda:0"}}, Enter: []Action{{Handle: e.ghost, Location: "cuda:0"}}}
		}, wantGhost},
		{"fields before rules: data loss", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.w, Location: "pageable-host"}}, Reservations: []ReservationSpec{{Name: "q", Location: "cuda:9", Bytes: 1}}}
		}, wantCUDA9},
		{"fields before rules: budget", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 1000}}, Enter: []Action{{Handle: e.s, Location: "gpu0"}}}
		}, wantGPU0},
		{"fields before rules: residency", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.s, Location: "cuda:0", From: "cuda:1"}, {Handle: e.foreign, Location: "cuda:0"}}}
		}, wantForeign},
		{"fields before rules: endpoint missing at the end", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.w, Location: "cuda:0"}, {Handle: e.w, Location: "cuda:1"}, {Handle: e.d, Location: "cuda:1"}}}
		}, wantDiscarded},
		{"rules: protection before data loss (reclaim)", func(e *orderEnv) Plan {
			c := e.c
			c.must2(c.Hold(e.w, "pageable-host"))
			return Plan{Reclaim: []Action{{Handle: e.w, Location: "pageable-host"}}}
		}, errWant{kind: "plan", fragment: `reclaim 0 (w at pageable-host): residency value "w" at pageable-host is in use: 0 leases, 1 holds`}},
		{"rules: the first failing step in plan order", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.w, Location: "pageable-host"}}, Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 1000}}}
		}, errWant{kind: "plan", fragment: "reclaim 0 (w at pageable-host)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newOrderEnv(t)
			c := e.c
			p := tc.plan(e)
			var msgs []string
			for _, scope := range []string{"", "s1"} {
				err := c.refused("start run", func() error { _, err := c.StartRun(p, RunOptions{Scope: scope}); return err })
				checkFirst(t, "StartRun scope="+scope, err, tc.want)
				msg := err.Error()
				if pe := (*PlanError)(nil); errors.As(err, &pe) {
					msg = pe.Reason // a rule: Explain's reason is the PlanError's reason
				}
				msgs = append(msgs, msg)
			}
			require.Equal(t, msgs[0], msgs[1], "execute and scope report the same problem")
			ex := c.Explain(p)
			assert.False(t, ex.Feasible)
			assert.Equal(t, msgs[0], ex.Reason, "explain's reason")
			// Stale before everything, for a scope entry and an execute.
			v := c.L.Version()
			for _, scope := range []string{"s2", ""} {
				err := c.refused("stale start", func() error {
					_, err := c.StartRun(p, RunOptions{Scope: scope, CheckVersion: true, ExpectedVersion: v + 1})
					return err
				})
				checkFirst(t, "stale", err, errWant{kind: "stale", fragment: fmt.Sprintf("expected version %d, actual %d", v+1, v)})
			}
		})
	}
}

// TestRule_OrderOfChecksRequests: a request's name, then its requirements
// in order (each one's handle, then its tiers' locations in order), then
// its reservations (name, bytes, location); rules only after every field
// passed, in the order of the rule list: a requirement or tier with no
// locations, then an exclusive value required twice, then feasibility.
func TestRule_OrderOfChecksRequests(t *testing.T) {
	type tc struct {
		name string
		req  func(e *orderEnv) Request
		want errWant
	}
	need := func(h Handle, tiers ...[]string) Requirement { return Requirement{Handle: h, Tiers: tiers} }
	one := func(locs ...string) []string { return locs }
	cases := []tc{
		{"request name before requirements", func(e *orderEnv) Request {
			return Request{Requirements: []Requirement{need(e.d, one("cuda:0"))}}
		}, errWant{kind: "invalid", fragment: "request name is empty"}},
		{"requirements in order", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.d, one("cuda:0")), need(e.ghost, one("cuda:0"))}}
		}, wantDiscarded},
		{"requirements in order (location of the first, handle of the second)", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.r, one("gpu0")), need(e.foreign, one("cuda:0"))}}
		}, wantGPU0},
		{"requirement: handle before tiers", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.ghost, one("gpu0"))}}
		}, wantGhost},
		{"requirement: discarded handle before tiers", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.d, one("cuda:9"))}}
		}, wantDiscarded},
		{"tiers in order", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.r, one("cuda:9"), one("gpu0"))}}
		}, wantCUDA9},
		{"locations of a tier in order", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.r, one("cuda:0", "gpu0", "cuda:9"))}}
		}, wantGPU0},
		{"requirements before reservations", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.r, one("cuda:9"))}, Reservations: []ReservationSpec{{Location: "cuda:0", Bytes: 1}}}
		}, wantCUDA9},
		{"reservation: name before bytes", func(e *orderEnv) Request {
			return Request{Name: "q", Reservations: []ReservationSpec{{Location: "cuda:0", Bytes: 0}}}
		}, errWant{kind: "invalid", fragment: "reservation 0 has an empty name"}},
		{"reservation: active name before location", func(e *orderEnv) Request {
			return Request{Name: "q", Reservations: []ReservationSpec{{Name: "live", Location: "gpu0", Bytes: 1}}}
		}, errWant{kind: "invalid", fragment: `"live" is already active`}},
		{"reservation: bytes before location", func(e *orderEnv) Request {
			return Request{Name: "q", Reservations: []ReservationSpec{{Name: "k", Location: "cuda:9", Bytes: 0}}}
		}, errWant{kind: "invalid", fragment: "bytes must be positive"}},
		{"fields before rules: no locations", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.r), need(e.ghost, one("cuda:0"))}}
		}, wantGhost},
		{"fields before rules: empty tier", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.r, one())}, Reservations: []ReservationSpec{{Name: "k", Location: "cuda:0", Bytes: -1}}}
		}, errWant{kind: "invalid", fragment: "bytes must be positive"}},
		{"fields before rules: exclusive twice", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.w, one("cuda:0")), need(e.w, one("cuda:1"))}, Reservations: []ReservationSpec{{Name: "k", Location: "cuda:9", Bytes: 1}}}
		}, wantCUDA9},
		{"fields before rules: infeasible", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.s, one("cuda:0"))}, Reservations: []ReservationSpec{{Name: "k", Location: "cuda:0", Bytes: 1000}, {Name: "k", Location: "cuda:1", Bytes: 1}}}
		}, errWant{kind: "invalid", fragment: `"k" appears twice`}},
		{"rules: no locations before exclusive twice", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.w, one("cuda:0")), need(e.w, one("cuda:1")), need(e.r)}}
		}, errWant{kind: "plan", fragment: "requirement 2 (r) has no locations"}},
		{"rules: an empty tier before exclusive twice", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.w, one("cuda:0")), need(e.w, one("cuda:1")), need(e.r, one("cuda:0"), one())}}
		}, errWant{kind: "plan", fragment: "requirement 2 (r): tier 1 has no locations"}},
		{"rules: exclusive twice before feasibility", func(e *orderEnv) Request {
			return Request{Name: "q", Requirements: []Requirement{need(e.w, one("cuda:0")), need(e.w, one("cuda:1"))}, Reservations: []ReservationSpec{{Name: "k", Location: "cuda:0", Bytes: 1000}}}
		}, errWant{kind: "plan", fragment: `both require "w", an exclusive value`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newOrderEnv(t)
			c := e.c
			req := tc.req(e)
			var err error
			_ = c.do("Decide", read, func() error { _, err = c.L.Decide(req, 0); return nil })
			checkFirst(t, "Decide", err, tc.want)
		})
	}
}

// TestRule_OrderOfChecksDirectOperations: a copy/move's handle, from, to;
// a reservation's name, bytes, location; an action's handle, location; and
// the rules after the fields, in the order of the rule list (replica mode,
// residency, protection, data loss, budget).
func TestRule_OrderOfChecksDirectOperations(t *testing.T) {
	type tc struct {
		name string
		op   func(e *orderEnv) error
		want errWant
	}
	// setups run before the refused call, outside the audit of refusal.
	setups := map[string]func(e *orderEnv){
		"move: protection before budget":     func(e *orderEnv) { e.c.must(e.c.Reserve("cuda:1", "fill", 99)) },
		"evict: protection before data loss": func(e *orderEnv) { e.c.must2(e.c.Acquire(e.w, "pageable-host")) },
	}
	copyOp := func(h func(e *orderEnv) Handle, from, to string) func(e *orderEnv) error {
		return func(e *orderEnv) error { _, err := e.c.Copy(h(e), from, to); return err }
	}
	moveOp := func(h func(e *orderEnv) Handle, from, to string) func(e *orderEnv) error {
		return func(e *orderEnv) error { _, err := e.c.Move(h(e), from, to); return err }
	}
	d := func(e *orderEnv) Handle { return e.d }
	ghost := func(e *orderEnv) Handle { return e.ghost }
	foreign := func(e *orderEnv) Handle { return e.foreign }
	w := func(e *orderEnv) Handle { return e.w }
	r := func(e *orderEnv) Handle { return e.r }
	cases := []tc{
		{"copy: handle before from", copyOp(d, "gpu0", "cuda:1"), wantDiscarded},
		{"move: handle before from and to", moveOp(ghost, "cuda:9", "gpu0"), wantGhost},
		{"move: foreign handle before from", moveOp(foreign, "gpu0", "cuda:1"), wantForeign},
		{"copy: from before to (unconfigured, malformed)", copyOp(r, "cuda:9", "gpu0"), wantCUDA9},
		{"move: from before to (malformed, unconfigured)", moveOp(w, "gpu0", "cuda:9"), wantGPU0},
		{"copy: fields before replica mode", copyOp(w, "pageable-host", "cuda:9"), wantCUDA9},
		{"copy: fields before residency", copyOp(r, "cuda:1", "gpu0"), wantGPU0},
		{"move: fields before protection", moveOp(r, "cuda:0", "gpu0"), wantGPU0},
		{"copy: replica mode before residency", copyOp(w, "cuda:1", "cuda:0"),
			errWant{kind: "plan", fragment: `copy of "w": value is exclusive`}},
		{"move: residency before protection", moveOp(w, "cuda:1", "cuda:0"),
			errWant{kind: "unavailable", reason: UnavailableEndpoint, fragment: `value "w" at cuda:1: no resident materialization`}},
		{"move: protection before budget", moveOp(r, "cuda:0", "cuda:1"),
			errWant{kind: "inuse", fragment: `"r" at cuda:0 is in use`}},
		{"evict: protection before data loss", func(e *orderEnv) error { _, err := e.c.Evict(e.w, "pageable-host"); return err },
			errWant{kind: "inuse", fragment: `"w" at pageable-host is in use`}},
		{"evict: residency before protection", func(e *orderEnv) error { _, err := e.c.Evict(e.r, "cuda:1"); return err },
			errWant{kind: "unavailable", reason: UnavailableEndpoint, fragment: "no materialization to evict"}},
		{"place: handle before location", func(e *orderEnv) error { _, err := e.c.Place(e.d, "gpu0"); return err }, wantDiscarded},
		{"place: fields before residency", func(e *orderEnv) error { _, err := e.c.Place(e.ghost, "cuda:0"); return err }, wantGhost},
		{"evict: handle before location", func(e *orderEnv) error { _, err := e.c.Evict(e.ghost, "gpu0"); return err }, wantGhost},
		{"acquire: handle before location", func(e *orderEnv) error { _, err := e.c.Acquire(e.foreign, "gpu0"); return err }, wantForeign},
		{"hold: location before residency", func(e *orderEnv) error { _, err := e.c.Hold(e.s, "cuda:9"); return err }, wantCUDA9},
		{"reserve: name (empty) before bytes and location", func(e *orderEnv) error { return e.c.Reserve("gpu0", "", 0) },
			errWant{kind: "invalid", fragment: "reservation name is empty"}},
		{"reserve: name (active) before bytes", func(e *orderEnv) error { return e.c.Reserve("cuda:0", "live", 0) },
			errWant{kind: "invalid", fragment: `duplicate reservation name "live"`}},
		{"reserve: bytes before location", func(e *orderEnv) error { return e.c.Reserve("gpu0", "q", -1) },
			errWant{kind: "invalid", fragment: "bytes must be positive, got -1"}},
		{"reserve: location before budget", func(e *orderEnv) error { return e.c.Reserve("cuda:9", "q", 1000) }, wantCUDA9},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newOrderEnv(t)
			if setup := setups[tc.name]; setup != nil {
				setup(e)
			}
			err := e.c.refused(tc.name, func() error { return tc.op(e) })
			checkFirst(t, tc.name, err, tc.want)
		})
	}
}

// ---- explain never fails on a plan's content -----------------------------------

// TestRule_ExplainOfAnInvalidPlanIsInfeasible: every validation failure
// makes Explain infeasible (it never errs), with the validation error's
// message as the reason and the current used+reserved as the predicted
// peaks (not the recorded peaks, not a partial simulation).
func TestRule_ExplainOfAnInvalidPlanIsInfeasible(t *testing.T) {
	cases := []struct {
		name string
		plan func(e *orderEnv) Plan
	}{
		{"unknown handle", func(e *orderEnv) Plan { return Plan{Enter: []Action{{Handle: e.ghost, Location: "cuda:0"}}} }},
		{"unknown handle id with a wrong name", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: Handle{Manager: "m1", ID: e.w.ID, Name: "x"}, Location: "pageable-host"}}}
		}},
		{"zero handle", func(e *orderEnv) Plan { return Plan{Enter: []Action{{Location: "cuda:0"}}} }},
		{"discarded handle", func(e *orderEnv) Plan { return Plan{Reclaim: []Action{{Handle: e.d, Location: "cuda:1"}}} }},
		{"foreign handle", func(e *orderEnv) Plan { return Plan{Enter: []Action{{Handle: e.foreign, Location: "cuda:0"}}} }},
		{"malformed location", func(e *orderEnv) Plan { return Plan{Enter: []Action{{Handle: e.r, Location: "gpu0"}}} }},
		{"malformed from", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.r, Location: "cuda:1", From: "cuda:01"}}}
		}},
		{"unconfigured location", func(e *orderEnv) Plan { return Plan{Reclaim: []Action{{Handle: e.r, Location: "cuda:9"}}} }},
		{"unconfigured from", func(e *orderEnv) Plan {
			return Plan{Enter: []Action{{Handle: e.r, Location: "cuda:1", From: "cuda:0@node-b"}}}
		}},
		{"from on a reclaim", func(e *orderEnv) Plan {
			return Plan{Reclaim: []Action{{Handle: e.r, Location: "pageable-host", From: "cuda:0"}}}
		}},
		{"reservation without a name", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Location: "cuda:0", Bytes: 1}}}
		}},
		{"reservation name repeated", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: 1}, {Name: "q", Location: "cuda:1", Bytes: 1}}}
		}},
		{"reservation name already active", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "live", Location: "cuda:0", Bytes: 1}}}
		}},
		{"reservation of zero bytes", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0"}}}
		}},
		{"reservation of negative bytes", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:0", Bytes: -3}}}
		}},
		{"reservation at a malformed location", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "host", Bytes: 1}}}
		}},
		{"reservation at an unconfigured location", func(e *orderEnv) Plan {
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:2", Bytes: 1}}}
		}},
		{"valid steps before the invalid one", func(e *orderEnv) Plan {
			// Simulating the first steps would raise cuda:1's figure; the
			// peaks must still be the current ones.
			return Plan{Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 50}},
				Enter: []Action{{Handle: e.r, Location: "cuda:1"}, {Handle: e.ghost, Location: "cuda:1"}}}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newOrderEnv(t)
			c := e.c
			// Recorded peaks above the current figures, so that the two
			// cannot be confused.
			c.placed(e.r, "cuda:1")
			c.must2(c.Evict(e.r, "cuda:1"))
			p := tc.plan(e)
			err := c.refused("start run", func() error { _, err := c.StartRun(p, RunOptions{Scope: "s"}); return err })
			var ii *InvalidInputError
			var ue *UnavailableError
			require.True(t, errors.As(err, &ii) || errors.As(err, &ue), "validation error, got %T: %v", err, err)
			ex := c.Explain(p)
			assert.Equal(t, Explanation{Reason: err.Error(), PredictedPeakBytes: currentFigures(c)}, ex)
			assert.NotEqual(t, c.loc("cuda:1").PeakBytes, ex.PredictedPeakBytes["cuda:1"], "recorded peak differs from the current figure")
		})
	}
}

// ---- edge cases -----------------------------------------------------------------

// TestRule_MoveOntoItselfIsANoOp: move(h, L, L) with h resident at L is a
// no-op — 0 versions, nothing removed — protected or not, even while L is
// the source of a copy in flight; a plan's enter from L to L too. Not
// resident at L is still Unavailable.
func TestRule_MoveOntoItselfIsANoOp(t *testing.T) {
	protections := map[string]func(c *checked, h Handle, loc string){
		"unprotected": func(*checked, Handle, string) {},
		"leased":      func(c *checked, h Handle, loc string) { c.must2(c.Acquire(h, loc)) },
		"held":        func(c *checked, h Handle, loc string) { c.must2(c.Hold(h, loc)) },
		"pending event": func(c *checked, h Handle, loc string) {
			l, err := c.Acquire(h, loc)
			c.must(err)
			c.must2(c.RecordEvent(l))
			c.must(c.Release(l))
		},
		"source of a copy in flight": func(c *checked, h Handle, loc string) {
			if h.Name == "r" {
				c.must2(c.Copy(h, loc, "cuda:1"))
			}
		},
	}
	for name, protect := range protections {
		t.Run(name, func(t *testing.T) {
			c := std(t)
			w := c.reg("w", 10, Exclusive, "cuda:0")
			r := c.reg("r", 10, Replicable, "pageable-host")
			s := c.regSrc("s", 10, Exclusive, "pinned-host")
			c.placed(s, "cuda:0")
			for _, h := range []Handle{w, r, s} {
				at := c.val(h.Name).Materializations[0].Location
				protect(c, h, at)
				before := c.Snapshot()
				var a Admission
				require.Equal(t, uint64(0), c.delta(func() { var err error; a, err = c.Move(h, at, at); c.must(err) }), "move %s %s→%s", h.Name, at, at)
				require.Equal(t, Admission{}, a)
				require.Equal(t, before, c.Snapshot(), "nothing removed")
				// The same as a plan step.
				p := Plan{Enter: []Action{{Handle: h, Location: at, From: at}}}
				require.True(t, c.Explain(p).Feasible)
				r, err := c.StartRun(p, RunOptions{})
				c.must(err)
				var rep Report
				require.Equal(t, uint64(0), c.delta(func() { rep, _, _, err = r.all(); c.must(err) }))
				require.Empty(t, rep.Transitions)
			}
			// Not resident there: Unavailable, nothing changes.
			err := c.refused("move from an absent endpoint onto itself", func() error { _, err := c.Move(w, "cuda:1", "cuda:1"); return err })
			wantUnavailable(t, err, "w", "cuda:1", UnavailableEndpoint)
		})
	}
}

// TestRule_RegisterAtFailureRetiresTheHandle: a registration at L whose
// initialization fails is a PlanExecutionError (phase execute, failed
// action (h, L), index 0, report admit + fail) after 2 versions; the
// handle is retired (Unavailable, discarded, everywhere), the name free,
// the value absent from snapshots, every charge back.
func TestRule_RegisterAtFailureRetiresTheHandle(t *testing.T) {
	c := std(t)
	c.reg("other", 10, Exclusive, "cuda:0")
	before := c.Snapshot()
	v := c.L.Version()
	h, a, err := c.Register(ValueSpec{Name: "n", Bytes: 40, Mode: Replicable, At: "cuda:0"})
	c.must(err)
	cause := errors.New("alloc failed")
	err = c.FailDirect(a.ID, cause)
	pe := as[*PlanExecutionError](t, err)
	require.Equal(t, PhaseExecute, pe.Phase)
	require.Equal(t, &Action{Handle: h, Location: "cuda:0"}, pe.FailedAction)
	require.Equal(t, []int{0, -1}, []int{pe.FailedActionIndex, pe.FailedReservationIndex})
	require.Nil(t, pe.FailedReservation)
	require.Equal(t, []string{"admit n@cuda:0", "fail n@cuda:0"}, kinds(pe.PartialReport.Transitions))
	require.Equal(t, []uint64{v + 1, v + 2}, []uint64{pe.PartialReport.Transitions[0].Version, pe.PartialReport.Transitions[1].Version})
	require.ErrorIs(t, err, cause)
	require.Equal(t, v+2, c.L.Version(), "2 versions: admit, fail")
	// Absent from snapshots; every figure but the peak as before.
	after := c.Snapshot()
	_, listed := after.Value("n")
	require.False(t, listed, "a failed registration is not in snapshots")
	require.Equal(t, before.Values, after.Values)
	for i := range after.Locations {
		after.Locations[i].PeakBytes = before.Locations[i].PeakBytes
	}
	after.StateVersion = before.StateVersion
	// The counts grew by exactly the two transitions.
	require.Equal(t, before.TransitionCounts["admit"]+1, after.TransitionCounts["admit"])
	require.Equal(t, before.TransitionCounts["fail"]+1, after.TransitionCounts["fail"])
	after.TransitionCounts, after.RemovalCounts = before.TransitionCounts, before.RemovalCounts
	require.Equal(t, before, after)
	// Retired everywhere; the name is free.
	checkDeadHandle(t, c, h, UnavailableDiscarded, ErrDiscarded, "discarded")
	_, found := c.L.Lookup("n")
	require.False(t, found)
	h2 := c.reg("n", 40, Replicable, "cuda:0")
	require.NotEqual(t, h.ID, h2.ID, "a new handle")
	got, _ := c.L.Lookup("n")
	require.Equal(t, h2, got)
	_, err = c.Place(h, "cuda:1")
	wantUnavailable(t, err, "n", "", UnavailableDiscarded)
}

// TestRule_ReconstructionThroughATemporaryBuffer: reconstruction into L
// with source location S ≠ L is one effect (load into a temporary buffer
// at S, then copy into L) charging both L and S from admission; it can
// fail at any of its steps, and a failure releases both charges.
func TestRule_ReconstructionThroughATemporaryBuffer(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 40, Exclusive, "pinned-host")
	for _, cause := range []string{"alloc@cuda:0", "alloc@pinned-host", "reconstruct@cuda:0", "copy@cuda:0"} {
		a, err := c.Place(s, "cuda:0")
		c.must(err)
		require.Equal(t, []Effect{{Kind: EffectReconstruct, Handle: s, Location: "cuda:0", TempAt: "pinned-host", Bytes: 40}}, a.Effects)
		require.Equal(t, "reconstruct s into cuda:0 via temporary buffer at pinned-host (40 bytes)", a.Effects[0].String())
		require.Equal(t, int64(40), c.loc("pinned-host").TemporaryBytes)
		require.Equal(t, [3]int64{40, 0, 40}, c.figures("cuda:0"))
		pe := as[*PlanExecutionError](t, c.FailDirect(a.ID, errors.New(cause)))
		require.Equal(t, &Action{Handle: s, Location: "cuda:0"}, pe.FailedAction)
		require.Equal(t, [3]int64{0, 0, 40}, c.figures("cuda:0"), cause)
		require.Equal(t, [3]int64{0, 0, 40}, c.figures("pinned-host"), cause)
		require.Equal(t, int64(0), c.loc("pinned-host").TemporaryBytes)
		require.True(t, strings.HasSuffix(c.L.Trace()[len(c.L.Trace())-1].Detail, cause))
	}
	c.placed(s, "cuda:0")
	require.Equal(t, []string{"cuda:0:resident:0/0/0"}, c.mats("s"))
}
