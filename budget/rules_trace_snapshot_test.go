package budget

// Rule tests of docs/semantics.md, "Trace and snapshot". Every call goes
// through the checked harness (rules_test.go).
//
// rule → test
//
// State version and trace: trace and snapshot
//   trace = committed transitions (version, kind, handle, location,
//   bytes, detail)                       → TestRule_TraceRecordsEveryCommittedTransition
//   bounded ring                         → TestRule_TraceIsBoundedRing
//   capacity 0 disables                  → TestRule_TraceCapacityZeroDisables
//   snapshot: one atomic tensor-free copy with every field
//                                        → TestRule_SnapshotContents, TestRule_SnapshotIsAnIndependentCopy

import (
	"fmt"
	"testing"
)

func TestRule_TraceRecordsEveryCommittedTransition(t *testing.T) {
	c := std(t)
	w := c.reg("w", 30, Exclusive, "cuda:0")
	id, err := c.Acquire(w, "cuda:0")
	c.must(err)
	c.must(c.Release(id))
	c.must(c.Reserve("cuda:1", "r", 5))
	c.placed(w, "cuda:1")
	want := []Transition{
		{Version: 1, Kind: "admit", Handle: "w", Location: "cuda:0", Bytes: 30, Detail: "register at"},
		{Version: 2, Kind: "complete", Handle: "w", Location: "cuda:0", Bytes: 30},
		{Version: 3, Kind: "acquire", Handle: "w", Location: "cuda:0", Detail: "lease 1", ID: 1},
		{Version: 4, Kind: "release", Handle: "w", Location: "cuda:0", Detail: "lease 1", ID: 1},
		{Version: 5, Kind: "reserve", Location: "cuda:1", Bytes: 5, Detail: "r", Name: "r"},
		{Version: 6, Kind: "admit", Handle: "w", Location: "cuda:1", Bytes: 30, Detail: "move from cuda:0"},
		{Version: 7, Kind: "complete", Handle: "w", Location: "cuda:1", Bytes: 30},
		{Version: 8, Kind: "remove", Handle: "w", Location: "cuda:0", Bytes: 30, Detail: "move source", Removal: RemovalMoveSource},
	}
	eq(t, "trace", c.L.Trace(), want)
	eq(t, "version", c.L.Version(), uint64(8))
	// Refusals and reads add nothing.
	_ = c.refused("refused", func() error { return c.Reserve("cuda:1", "r", 5) })
	c.Explain(Plan{Enter: []Action{{Handle: w, Location: "cuda:0"}}})
	eq(t, "trace after refusal and explain", c.L.Trace(), want)
}

func TestRule_TraceIsBoundedRing(t *testing.T) {
	cfg := stdConfig()
	cfg.TraceCapacity = 3
	c := newChecked(t, cfg)
	for i := range 3 {
		c.must(c.Reserve("cuda:0", fmt.Sprint("r", i), 1))
	}
	eq(t, "full ring", kindsDetails(c.L.Trace()), []string{"1 r0", "2 r1", "3 r2"})
	c.must(c.Reserve("cuda:0", "r3", 1))
	c.must(c.Unreserve("r0"))
	eq(t, "wrapped", kindsDetails(c.L.Trace()), []string{"3 r2", "4 r3", "5 r0"})
	for i := 0; i < 7; i++ {
		c.must(c.Reserve("cuda:1", fmt.Sprint("x", i), 1))
	}
	eq(t, "wrapped again", kindsDetails(c.L.Trace()), []string{"10 x4", "11 x5", "12 x6"})
}

func kindsDetails(ts []Transition) []string {
	var out []string
	for _, x := range ts {
		out = append(out, fmt.Sprintf("%d %s", x.Version, x.Detail))
	}
	return out
}

func TestRule_TraceCapacityZeroDisables(t *testing.T) {
	cfg := stdConfig()
	cfg.TraceCapacity = 0
	c := newChecked(t, cfg)
	w := c.reg("w", 1, Exclusive, "cuda:0")
	c.placed(w, "cuda:1")
	eq(t, "trace", len(c.L.Trace()), 0)
	eq(t, "versions still count", c.L.Version(), uint64(5))
}

func TestRule_SnapshotContents(t *testing.T) {
	c := std(t)
	w := c.reg("w", 30, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	s := c.regSrc("s", 20, Exclusive, "pinned-host")
	a, err := c.Place(s, "cuda:1") // in flight: entering + temporary charge
	c.must(err)
	l, err := c.Acquire(w, "cuda:0")
	c.must(err)
	c.must2(c.RecordEvent(l))
	c.must2(c.Hold(w, "cuda:0"))
	c.must(c.Reserve("cuda:1", "r", 7))
	c.must(c.ReserveOwned("cuda:1", "o", 3, "scope-1"))
	d := c.reg("d", 5, Exclusive, "pageable-host")
	c.must2(c.Discard(d))
	want := Snapshot{
		StateVersion: c.L.Version(),
		ManagerID:    "m1",
		Locations: []LocationRecord{
			{Location: "pageable-host", UsedBytes: 30, PeakBytes: 35},
			{Location: "pinned-host", HasBudget: true, BudgetBytes: 1000, UsedBytes: 20, PeakBytes: 20, TemporaryBytes: 20},
			{Location: "cuda:0", HasBudget: true, BudgetBytes: 100, UsedBytes: 30, PeakBytes: 30},
			{Location: "cuda:1", HasBudget: true, BudgetBytes: 100, UsedBytes: 20, ReservedBytes: 10, PeakBytes: 30,
				Reservations: []ReservationRecord{{Name: "r", Bytes: 7}, {Name: "o", Bytes: 3, Owner: "scope-1"}}},
		},
		Values: []ValueRecord{
			{Handle: w, Bytes: 30, ReplicaMode: Replicable, Recoverable: true, Materializations: []MaterializationRecord{
				{Location: "pageable-host", State: Resident, ChargedBytes: 30},
				{Location: "cuda:0", State: Resident, ChargedBytes: 30, UseCount: 1, HoldCount: 1, PendingEventCount: 1},
			}},
			{Handle: s, Bytes: 20, ReplicaMode: Exclusive, HasSource: true, SourceLocation: "pinned-host", Recoverable: true,
				Materializations: []MaterializationRecord{{Location: "cuda:1", State: Entering, ChargedBytes: 20}}},
			// d was discarded: not listed.
		},
		// Every committed transition by kind (they add up to the
		// version, 15), and the one removal (d's discard).
		TransitionCounts: map[string]uint64{"register": 1, "admit": 4, "complete": 3, "acquire": 1, "record_event": 1,
			"hold": 1, "reserve": 2, "remove": 1, "discard": 1},
		RemovalCounts: map[RemovalKind]uint64{RemovalDiscard: 1},
	}
	eq(t, "snapshot", c.Snapshot(), want)
	c.must2(c.Complete(a.ID))
}

func TestRule_SnapshotIsAnIndependentCopy(t *testing.T) {
	c := std(t)
	w := c.reg("w", 30, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	c.must(c.Reserve("cuda:1", "r", 7))
	s1 := c.Snapshot()
	keep := c.Snapshot()
	// Mutating the ledger does not change a snapshot already taken…
	c.must2(c.Acquire(w, "cuda:0"))
	c.must(c.Unreserve("r"))
	eq(t, "old snapshot", s1, keep)
	// …and scribbling on a snapshot does not change the ledger.
	now := c.Snapshot()
	s2 := c.Snapshot()
	s2.Values[0].Materializations[0].UseCount = 99
	s2.Locations[0].UsedBytes = 99
	s2.Values[0].Handle.Name = "x"
	eq(t, "ledger unaffected", c.Snapshot(), now)
}
