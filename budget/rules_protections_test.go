package budget

// Rule tests of docs/semantics.md, "Protections" (leases, events, holds,
// reservations). Every call goes through the checked harness
// (rules_test.go).
//
// rule → test
//
// Protections
//   acquire needs a resident copy, never places; use_count + 1
//                                        → TestRule_AcquireNeedsResidentAndNeverPlaces
//   release: use_count − 1               → TestRule_ReleaseDecrementsUseCount
//   events pending until reaped protect the materialization
//                                        → TestRule_PendingEventProtectsUntilReaped
//   recording on a released lease is an error
//                                        → TestRule_RecordEventOnReleasedLeaseIsInvalidInput
//   reaping is a mutation                → TestRule_ReapIsAMutation
//   hold/unhold ± 1, needs resident      → TestRule_HoldProtectsAndNeedsResident
//   reservation names unique among active ones
//                                        → TestRule_ReservationNamesUniqueAmongActive
//   release returns the bytes            → TestRule_ReservationReleaseReturnsBytes
//   releasing twice is an error, not a panic (leases, holds, reservations,
//   events, admissions)                  → TestRule_DoubleReleaseIsInvalidInput

import (
	"fmt"
	"testing"
)

func TestRule_AcquireNeedsResidentAndNeverPlaces(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	w := c.reg("w", 10, Replicable, "pageable-host")
	err := c.refused("acquire a value with only a source", func() error { _, err := c.Acquire(s, "cuda:0"); return err })
	wantUnavailable(t, err, "s", "cuda:0", UnavailableEndpoint)
	err = c.refused("acquire where absent", func() error { _, err := c.Acquire(w, "cuda:0"); return err })
	wantUnavailable(t, err, "w", "cuda:0", UnavailableEndpoint)
	eq(t, "nothing placed", c.mats("s"), []string(nil))
	a, err := c.Place(w, "cuda:0")
	c.must(err)
	err = c.refused("acquire entering", func() error { _, err := c.Acquire(w, "cuda:0"); return err })
	wantUnavailable(t, err, "w", "cuda:0", UnavailableInFlight)
	c.must2(c.Complete(a.ID))
	var id LeaseID
	eq(t, "acquire versions", c.delta(func() { var err error; id, err = c.Acquire(w, "cuda:0"); c.must(err) }), uint64(1))
	eq(t, "use count", c.mats("w"), []string{"pageable-host:resident:0/0/0", "cuda:0:resident:1/0/0"})
	h, loc, ok := c.L.LeaseEndpoint(id)
	eq(t, "lease endpoint", []any{h, loc, ok}, []any{w, "cuda:0", true})
}

func TestRule_ReleaseDecrementsUseCount(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "cuda:0")
	l1, err := c.Acquire(w, "cuda:0")
	c.must(err)
	l2, err := c.Acquire(w, "cuda:0")
	c.must(err)
	eq(t, "two leases", c.mats("w"), []string{"cuda:0:resident:2/0/0"})
	eq(t, "release versions", c.delta(func() { c.must(c.Release(l1)) }), uint64(1))
	eq(t, "one lease", c.mats("w"), []string{"cuda:0:resident:1/0/0"})
	c.must(c.Release(l2))
	eq(t, "none", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	c.placed(w, "cuda:1") // unprotected: it can move now
}

func TestRule_PendingEventProtectsUntilReaped(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "cuda:0")
	id, err := c.Acquire(w, "cuda:0")
	c.must(err)
	var ev EventID
	eq(t, "record versions", c.delta(func() { var err error; ev, err = c.RecordEvent(id); c.must(err) }), uint64(1))
	c.must(c.Release(id))
	eq(t, "released, event pending", c.mats("w"), []string{"cuda:0:resident:0/0/1"})
	err = c.refused("move while the event is pending", func() error { _, err := c.Move(w, "cuda:0", "cuda:1"); return err })
	wantInUse(t, err, InUseError{Handle: "w", Location: "cuda:0", PendingEventCount: 1})
	eq(t, "reap versions", c.delta(func() { c.must(c.ReapEvent(ev)) }), uint64(1))
	eq(t, "reaped", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	c.placed(w, "cuda:1")
}

func TestRule_RecordEventOnReleasedLeaseIsInvalidInput(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "cuda:0")
	id, err := c.Acquire(w, "cuda:0")
	c.must(err)
	c.must(c.Release(id))
	err = c.refused("record on released lease", func() error { _, err := c.RecordEvent(id); return err })
	wantInvalid(t, err, fmt.Sprintf("lease %d", id))
	err = c.refused("record on never-issued lease", func() error { _, err := c.RecordEvent(77); return err })
	wantInvalid(t, err, "lease 77")
}

func TestRule_ReapIsAMutation(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "cuda:0")
	id, err := c.Acquire(w, "cuda:0")
	c.must(err)
	ev, err := c.RecordEvent(id)
	c.must(err)
	v := c.L.Version()
	c.must(c.ReapEvent(ev))
	eq(t, "version", c.L.Version(), v+1)
	tr := c.L.Trace()
	eq(t, "trace", tr[len(tr)-1], Transition{Version: v + 1, Kind: "reap_event", Handle: "w", Location: "cuda:0", Detail: fmt.Sprintf("event %d", ev), ID: uint64(ev)})
	err = c.refused("reap twice", func() error { return c.ReapEvent(ev) })
	wantInvalid(t, err, fmt.Sprintf("event %d", ev))
}

func TestRule_HoldProtectsAndNeedsResident(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	err := c.refused("hold absent", func() error { _, err := c.Hold(s, "pinned-host"); return err })
	wantUnavailable(t, err, "s", "pinned-host", UnavailableEndpoint)
	c.placed(s, "cuda:0")
	var id HoldID
	eq(t, "hold versions", c.delta(func() { var err error; id, err = c.Hold(s, "cuda:0"); c.must(err) }), uint64(1))
	eq(t, "held", c.mats("s"), []string{"cuda:0:resident:0/1/0"})
	err = c.refused("evict held", func() error { _, err := c.Evict(s, "cuda:0"); return err })
	wantInUse(t, err, InUseError{Handle: "s", Location: "cuda:0", HoldCount: 1})
	eq(t, "unhold versions", c.delta(func() { c.must(c.Unhold(id)) }), uint64(1))
	c.must2(c.Evict(s, "cuda:0"))
}

func TestRule_ReservationNamesUniqueAmongActive(t *testing.T) {
	c := std(t)
	c.must(c.Reserve("cuda:0", "r", 10))
	for _, loc := range []string{"cuda:0", "cuda:1"} {
		err := c.refused("duplicate at "+loc, func() error { return c.Reserve(loc, "r", 5) })
		wantInvalid(t, err, `duplicate reservation name "r"`)
	}
	c.must(c.Unreserve("r"))
	c.must(c.Reserve("cuda:1", "r", 5)) // the name is free again
	eq(t, "cuda:1", c.loc("cuda:1").Reservations, []ReservationRecord{{Name: "r", Bytes: 5}})
	err := c.refused("empty name", func() error { return c.Reserve("cuda:0", "", 5) })
	wantInvalid(t, err, "name")
	for _, b := range []int64{0, -3} {
		err := c.refused("bytes", func() error { return c.Reserve("cuda:0", "z", b) })
		wantInvalid(t, err, "bytes must be positive")
	}
}

func TestRule_ReservationReleaseReturnsBytes(t *testing.T) {
	c := std(t)
	c.must(c.Reserve("cuda:0", "r", 100))
	err := c.refused("full", func() error { _, _, err := c.Register(ValueSpec{Name: "w", Bytes: 1, At: "cuda:0"}); return err })
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, ReservedBytes: 100, RequestedBytes: 1})
	eq(t, "unreserve versions", c.delta(func() { c.must(c.Unreserve("r")) }), uint64(1))
	eq(t, "returned", c.figures("cuda:0"), [3]int64{0, 0, 100})
	c.reg("w", 100, Exclusive, "cuda:0")
}

func TestRule_DoubleReleaseIsInvalidInput(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "cuda:0")
	l, err := c.Acquire(w, "cuda:0")
	c.must(err)
	c.must(c.Release(l))
	h, err := c.Hold(w, "cuda:0")
	c.must(err)
	c.must(c.Unhold(h))
	c.must(c.Reserve("cuda:1", "r", 5))
	c.must(c.Unreserve("r"))
	_, a, err := c.Register(ValueSpec{Name: "x", Bytes: 1, At: "pageable-host"})
	c.must(err)
	c.must2(c.Complete(a.ID))
	cases := []struct {
		name string
		op   func() error
		want InvalidInputError
	}{
		{"lease", func() error { return c.Release(l) },
			InvalidInputError{Message: fmt.Sprintf("lease %d is not active (already released or never issued)", l), Inactive: LifetimeLease, ID: uint64(l)}},
		{"hold", func() error { return c.Unhold(h) },
			InvalidInputError{Message: fmt.Sprintf("hold %d is not active (already released or never issued)", h), Inactive: LifetimeHold, ID: uint64(h)}},
		{"reservation", func() error { return c.Unreserve("r") }, InvalidInputError{Message: `reservation "r" is not active (already released or never made)`}},
		{"admission complete", func() error { _, err := c.Complete(a.ID); return err }, InvalidInputError{Message: fmt.Sprintf("admission %d is not pending", a.ID)}},
		{"admission fail", func() error { return c.Fail(a.ID, nil) }, InvalidInputError{Message: fmt.Sprintf("admission %d is not pending", a.ID)}},
	}
	for _, tc := range cases {
		err := c.refused("double release of "+tc.name, tc.op)
		eq(t, tc.name, exported(*as[*InvalidInputError](t, err)), tc.want)
	}
}

// exported is e with only its exported fields (what a caller compares).
func exported(e InvalidInputError) InvalidInputError {
	return InvalidInputError{Message: e.Message, Inactive: e.Inactive, ID: e.ID}
}
