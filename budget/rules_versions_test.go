package budget

// Rule tests of docs/semantics.md, "State versions". Every call goes through
// the checked harness (rules_test.go).
//
// rule → test
//
// State version and trace
//   every committed mutation bumps by one; reads and refusals never
//   (resolved versions per operation)    → TestRule_VersionsPerOperation,
//                                          TestRule_BadInputIsRefusedAndChangesNothing,
//                                          and the checked harness on every call

import (
	"errors"
	"fmt"
	"testing"
)

// versionEnv is a small state every version case starts from:
//
//	w  exclusive 10, resident at pageable-host
//	r  replicable 10, resident at pageable-host and cuda:0, leased at cuda:0 (lease)
//	s  exclusive 10, source pinned-host, not materialized
//	ev a pending event recorded on lease
type versionEnv struct {
	c       *checked
	w, r, s Handle
	lease   LeaseID
	ev      EventID
	hold    HoldID
	x       Handle
}

func newVersionEnv(t *testing.T) *versionEnv {
	c := std(t)
	e := &versionEnv{c: c}
	e.w = c.reg("w", 10, Exclusive, "pageable-host")
	e.r = c.reg("r", 10, Replicable, "pageable-host")
	c.placed(e.r, "cuda:0")
	e.s = c.regSrc("s", 10, Exclusive, "pinned-host")
	var err error
	e.lease, err = c.Acquire(e.r, "cuda:0")
	c.must(err)
	e.ev, err = c.RecordEvent(e.lease)
	c.must(err)
	return e
}

func TestRule_VersionsPerOperation(t *testing.T) {
	cases := []struct {
		name  string
		want  uint64
		setup func(e *versionEnv) // not counted
		op    func(e *versionEnv)
	}{
		{name: "register at (admit, complete)", want: 2, op: func(e *versionEnv) { e.c.reg("n", 1, Exclusive, "cuda:1") }},
		{name: "register at, admission only", want: 1, op: func(e *versionEnv) {
			e.c.must3(e.c.Register(ValueSpec{Name: "n", Bytes: 1, At: "cuda:1"}))
		}},
		{name: "register with source", want: 1, op: func(e *versionEnv) { e.c.regSrc("n", 1, Exclusive, "cuda:1") }},
		{name: "place that copies", want: 2, op: func(e *versionEnv) { e.c.placed(e.r, "cuda:1") }},
		{name: "place that reconstructs", want: 2, op: func(e *versionEnv) { e.c.placed(e.s, "cuda:1") }},
		{name: "copy", want: 2, op: func(e *versionEnv) {
			a, err := e.c.Copy(e.r, "pageable-host", "pinned-host")
			e.c.must(err)
			e.c.must2(e.c.Complete(a.ID))
		}},
		{name: "place that moves", want: 3, op: func(e *versionEnv) { e.c.placed(e.w, "cuda:1") }},
		{name: "move", want: 3, op: func(e *versionEnv) {
			a, err := e.c.Move(e.w, "pageable-host", "cuda:1")
			e.c.must(err)
			e.c.must2(e.c.Complete(a.ID))
		}},
		{name: "move onto a resident copy", want: 1,
			setup: func(e *versionEnv) { e.c.placed(e.r, "cuda:1") },
			op:    func(e *versionEnv) { e.c.must2(e.c.Move(e.r, "cuda:1", "pageable-host")) }},
		{name: "place onto a resident copy", want: 0, op: func(e *versionEnv) { e.c.must2(e.c.Place(e.r, "cuda:0")) }},
		{name: "copy onto a resident copy", want: 0, op: func(e *versionEnv) { e.c.must2(e.c.Copy(e.r, "cuda:0", "pageable-host")) }},
		{name: "move from == to", want: 0, op: func(e *versionEnv) { e.c.must2(e.c.Move(e.w, "pageable-host", "pageable-host")) }},
		{name: "failed transfer (admit, fail)", want: 2, op: func(e *versionEnv) {
			a, err := e.c.Place(e.s, "cuda:1")
			e.c.must(err)
			e.c.must(e.c.Fail(a.ID, errors.New("x")))
		}},
		{name: "evict", want: 1, op: func(e *versionEnv) { e.c.must2(e.c.Evict(e.r, "pageable-host")) }},
		{name: "discard, one materialization", want: 2, op: func(e *versionEnv) { e.c.must2(e.c.Discard(e.w)) }},
		{name: "discard, two materializations", want: 3,
			setup: func(e *versionEnv) { e.x = e.c.reg("x", 1, Replicable, "pageable-host"); e.c.placed(e.x, "cuda:1") },
			op:    func(e *versionEnv) { e.c.must2(e.c.Discard(e.x)) }},
		{name: "discard, no materialization", want: 1, op: func(e *versionEnv) { e.c.must2(e.c.Discard(e.s)) }},
		{name: "acquire", want: 1, op: func(e *versionEnv) { e.c.must2(e.c.Acquire(e.w, "pageable-host")) }},
		{name: "release", want: 1, op: func(e *versionEnv) { e.c.must(e.c.Release(e.lease)) }},
		{name: "record event", want: 1, op: func(e *versionEnv) { e.c.must2(e.c.RecordEvent(e.lease)) }},
		{name: "reap event", want: 1, op: func(e *versionEnv) { e.c.must(e.c.ReapEvent(e.ev)) }},
		{name: "hold", want: 1, op: func(e *versionEnv) { e.c.must2(e.c.Hold(e.w, "pageable-host")) }},
		{name: "unhold", want: 1,
			setup: func(e *versionEnv) { var err error; e.hold, err = e.c.Hold(e.w, "pageable-host"); e.c.must(err) },
			op:    func(e *versionEnv) { e.c.must(e.c.Unhold(e.hold)) }},
		{name: "reserve", want: 1, op: func(e *versionEnv) { e.c.must(e.c.Reserve("cuda:1", "q", 5)) }},
		{name: "unreserve", want: 1,
			setup: func(e *versionEnv) { e.c.must(e.c.Reserve("cuda:1", "q", 5)) },
			op:    func(e *versionEnv) { e.c.must(e.c.Unreserve("q")) }},
		{name: "explain", want: 0, op: func(e *versionEnv) { e.c.Explain(Plan{Enter: []Action{{Handle: e.w, Location: "cuda:1"}}}) }},
		{name: "snapshot", want: 0, op: func(e *versionEnv) { e.c.Snapshot() }},
		{name: "trace, lookup, locations, pending, invariants", want: 0, op: func(e *versionEnv) {
			e.c.L.Trace()
			e.c.L.Lookup("w")
			e.c.L.Locations()
			e.c.L.Pending()
			e.c.must(e.c.L.CheckInvariants())
		}},
		{name: "execute: reclaim 1, reserve 1, enter place-copy 2", want: 4, op: func(e *versionEnv) {
			r, err := e.c.StartRun(Plan{
				Reclaim:      []Action{{Handle: e.r, Location: "pageable-host"}},
				Reservations: []ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 5}},
				Enter:        []Action{{Handle: e.r, Location: "cuda:1"}},
			}, RunOptions{})
			e.c.must(err)
			_, _, _, err = r.all()
			e.c.must(err)
		}},
		{name: "scope entry: enter move 3 + lease 1", want: 4, op: func(e *versionEnv) {
			r, err := e.c.StartRun(Plan{Enter: []Action{{Handle: e.w, Location: "cuda:1"}}}, RunOptions{Scope: "sc"})
			e.c.must(err)
			_, _, _, err = r.all()
			e.c.must(err)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newVersionEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			v := e.c.L.Version()
			tc.op(e)
			if got := e.c.L.Version() - v; got != tc.want {
				t.Fatalf("%s committed %d versions, want %d", tc.name, got, tc.want)
			}
		})
	}
}

// TestRule_BadInputIsRefusedAndChangesNothing gathers the bad inputs of
// docs/semantics.md ("Invalid input"): each gives its typed error with exact fields, leaves the
// version where it was and the snapshot deep-equal.
func TestRule_BadInputIsRefusedAndChangesNothing(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "pageable-host")
	r := c.reg("r", 10, Replicable, "pageable-host")
	d := c.reg("d", 10, Exclusive, "pageable-host")
	c.must2(c.Discard(d))
	lease, err := c.Acquire(w, "pageable-host")
	c.must(err)
	c.must(c.Release(lease))
	hold, err := c.Hold(w, "pageable-host")
	c.must(err)
	c.must(c.Unhold(hold))
	c.must(c.Reserve("cuda:0", "gone", 1))
	c.must(c.Unreserve("gone"))
	c.must(c.Reserve("cuda:0", "live", 1))
	foreign := Handle{Manager: "m9", ID: w.ID, Name: "w"}
	unknown := Handle{Manager: "m1", ID: 42, Name: "nobody"}

	inv := func(msg string) func(error) {
		return func(err error) {
			eq(t, "invalid input", *as[*InvalidInputError](t, err), InvalidInputError{Message: msg})
		}
	}
	// inactive: a refusal naming an inactive lifetime carries its kind and id.
	inactive := func(kind LifetimeKind, id uint64, msg string) func(error) {
		return func(err error) {
			eq(t, "invalid input", exported(*as[*InvalidInputError](t, err)), InvalidInputError{Message: msg, Inactive: kind, ID: id})
		}
	}
	unav := func(want UnavailableError) func(error) {
		return func(err error) { eq(t, "unavailable", *as[*UnavailableError](t, err), want) }
	}
	cases := []struct {
		name  string
		op    func() error
		check func(error)
	}{
		{"malformed location", func() error { _, err := c.Place(w, "cuda:x"); return err },
			inv(`malformed location "cuda:x": want cuda:N with N a decimal device index`)},
		{"malformed location (reserve)", func() error { return c.Reserve("vram", "q", 1) },
			inv(`malformed location "vram": want pageable-host, pinned-host or cuda:N`)},
		{"zero bytes", func() error { _, _, err := c.Register(ValueSpec{Name: "z", Bytes: 0, At: "cuda:0"}); return err },
			inv(`value "z": bytes must be positive, got 0`)},
		{"negative bytes", func() error { _, _, err := c.Register(ValueSpec{Name: "z", Bytes: -4, Source: "cuda:0"}); return err },
			inv(`value "z": bytes must be positive, got -4`)},
		{"zero reservation", func() error { return c.Reserve("cuda:0", "z", 0) },
			inv(`reservation "z": bytes must be positive, got 0`)},
		{"unknown handle", func() error { _, err := c.Place(unknown, "cuda:0"); return err },
			inv(`unknown handle "nobody" (id 42)`)},
		{"double release of a lease", func() error { return c.Release(lease) },
			inactive(LifetimeLease, uint64(lease), fmt.Sprintf("lease %d is not active (already released or never issued)", lease))},
		{"double release of a hold", func() error { return c.Unhold(hold) },
			inactive(LifetimeHold, uint64(hold), fmt.Sprintf("hold %d is not active (already released or never issued)", hold))},
		{"double release of a reservation", func() error { return c.Unreserve("gone") },
			inv(`reservation "gone" is not active (already released or never made)`)},
		{"duplicate reservation name", func() error { return c.Reserve("cuda:1", "live", 1) },
			inv(`duplicate reservation name "live" (already active)`)},
		{"duplicate value name", func() error { _, _, err := c.Register(ValueSpec{Name: "r", Bytes: 1, At: "cuda:0"}); return err },
			inv(`duplicate value name "r"`)},
		{"copy of an exclusive value", func() error { _, err := c.Copy(w, "pageable-host", "cuda:0"); return err },
			func(err error) {
				eq(t, "plan error", *as[*PlanError](t, err), PlanError{Reason: `copy of "w": value is exclusive; only replicable values may be copied (use move)`})
			}},
		{"foreign handle", func() error { _, err := c.Acquire(foreign, "pageable-host"); return err },
			unav(UnavailableError{Handle: "w", Detail: `foreign handle: it belongs to another manager ("m9", this is "m1")`, Reason: UnavailableForeign})},
		{"discarded handle", func() error { _, err := c.Place(d, "cuda:0"); return err },
			unav(UnavailableError{Handle: "d", Detail: "value was discarded", Reason: UnavailableDiscarded})},
		{"unconfigured location", func() error { _, err := c.Place(r, "cuda:3"); return err },
			unav(UnavailableError{Location: "cuda:3", Detail: "location is not configured", Reason: UnavailableLocation})},
	}
	for _, tc := range cases {
		before := c.L.Snapshot()
		v := c.L.Version()
		err := c.refused(tc.name, tc.op)
		tc.check(err)
		eq(t, tc.name+": version", c.L.Version(), v)
		eq(t, tc.name+": snapshot", c.L.Snapshot(), before)
	}
}
