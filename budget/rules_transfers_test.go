package budget

// Rule tests of docs/semantics.md, "Transfers and their charges". Every call
// goes through the checked harness (rules_test.go).
//
// rule → test
//
// Values and materializations: transfers
//   dest charged from admission, source until completion (overlap)
//                                        → TestRule_TransferOverlap,
//                                          TestRule_CopySourceStaysUntilTheCopySettles
//   temporary reconstruction charge at source_location, not when dest is it
//                                        → TestRule_ReconstructionTemporaryCharge,
//                                          TestRule_NoTemporaryChargeWhenDestIsSourceLocation
//   failure releases what admission charged
//                                        → TestRule_FailReleasesChargesAndRestoresSource
//   admission checks dest, then source_location; first refusal reported
//                                        → TestRule_AdmissionChecksDestinationFirstThenSourceLocation

import (
	"errors"
	"testing"
)

func TestRule_TransferOverlap(t *testing.T) {
	// The destination is charged from admission, the source until the
	// transfer completes: during a move both count, so a move between two
	// locations of one node needs room for both at once.
	c := std(t)
	w := c.reg("w", 60, Exclusive, "cuda:0")
	a, err := c.Move(w, "cuda:0", "cuda:1")
	c.must(err)
	eq(t, "cuda:0 (source)", c.figures("cuda:0"), [3]int64{60, 0, 60})
	eq(t, "cuda:1 (destination)", c.figures("cuda:1"), [3]int64{60, 0, 60})
	// The overlap is real budget: 41 more bytes do not fit at cuda:0 now.
	err = c.refused("reserve during overlap", func() error { return c.Reserve("cuda:0", "r", 41) })
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 60, RequestedBytes: 41})
	c.must2(c.Complete(a.ID))
	eq(t, "cuda:0 after", c.figures("cuda:0"), [3]int64{0, 0, 60})
	c.must(c.Reserve("cuda:0", "r", 41))
	// A copy keeps its source (and its charge) for good.
	v := c.reg("v", 30, Replicable, "pinned-host")
	a, err = c.Copy(v, "pinned-host", "cuda:1")
	c.must(err)
	eq(t, "pinned-host during copy", c.figures("pinned-host")[0], int64(30))
	eq(t, "cuda:1 during copy", c.figures("cuda:1")[0], int64(90))
	c.must2(c.Complete(a.ID))
	eq(t, "pinned-host after copy", c.figures("pinned-host")[0], int64(30))
}

func TestRule_CopySourceStaysUntilTheCopySettles(t *testing.T) {
	// "The source stays charged until the transfer completes": the source
	// of an in-flight copy cannot be evicted, moved or discarded.
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(w, "pinned-host")
	a, err := c.Copy(w, "pageable-host", "cuda:0")
	c.must(err)
	err = c.refused("evict copy source", func() error { _, err := c.Evict(w, "pageable-host"); return err })
	wantUnavailable(t, err, "w", "pageable-host", UnavailableInFlight)
	err = c.refused("move copy source", func() error { _, err := c.Move(w, "pageable-host", "cuda:1"); return err })
	wantUnavailable(t, err, "w", "pageable-host", UnavailableInFlight)
	err = c.refused("discard", func() error { _, err := c.Discard(w); return err })
	as[*UnavailableError](t, err)
	c.must(c.Fail(a.ID, errors.New("copy failed")))
	c.must2(c.Evict(w, "pageable-host"))
}

func TestRule_ReconstructionTemporaryCharge(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 40, Exclusive, "pinned-host")
	a, err := c.Place(s, "cuda:0")
	c.must(err)
	eq(t, "temporary charge at the source location", c.figures("pinned-host"), [3]int64{40, 0, 40})
	eq(t, "no materialization there", c.mats("s"), []string{"cuda:0:entering:0/0/0"})
	c.must2(c.Complete(a.ID))
	eq(t, "released on completion", c.figures("pinned-host"), [3]int64{0, 0, 40})
	c.must2(c.Evict(s, "cuda:0"))
	a, err = c.Place(s, "cuda:1")
	c.must(err)
	c.must(c.Fail(a.ID, errors.New("loader failed")))
	eq(t, "released on failure", c.figures("pinned-host"), [3]int64{0, 0, 40})
	eq(t, "destination released on failure", c.figures("cuda:1"), [3]int64{0, 0, 40})
}

func TestRule_NoTemporaryChargeWhenDestIsSourceLocation(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 40, Exclusive, "cuda:0")
	a, err := c.Place(s, "cuda:0")
	c.must(err)
	eq(t, "one charge only", c.figures("cuda:0"), [3]int64{40, 0, 40})
	eq(t, "effect", a.Effects, []Effect{{Kind: EffectReconstruct, Handle: s, Location: "cuda:0", Bytes: 40}})
	c.must2(c.Complete(a.ID))
	eq(t, "after", c.figures("cuda:0"), [3]int64{40, 0, 40})
	// 40 + 61 would not fit if the load were charged twice; it fits once.
	s2 := c.regSrc("s2", 60, Exclusive, "cuda:0")
	c.placed(s2, "cuda:0")
	eq(t, "full", c.figures("cuda:0"), [3]int64{100, 0, 100})
}

func TestRule_FailReleasesChargesAndRestoresSource(t *testing.T) {
	c := std(t)
	w := c.reg("w", 30, Exclusive, "cuda:0")
	r := c.reg("r", 20, Replicable, "pageable-host")
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	before := c.Snapshot()
	ids := []AdmissionID{}
	for _, op := range []func() (Admission, error){
		func() (Admission, error) { return c.Move(w, "cuda:0", "cuda:1") },
		func() (Admission, error) { return c.Copy(r, "pageable-host", "cuda:1") },
		func() (Admission, error) { return c.Place(s, "cuda:1") },
	} {
		a, err := op()
		c.must(err)
		ids = append(ids, a.ID)
	}
	eq(t, "cuda:1 during", c.figures("cuda:1"), [3]int64{60, 0, 60})
	for _, id := range ids {
		eq(t, "fail versions", c.delta(func() { c.must(c.Fail(id, errors.New("boom"))) }), uint64(1))
	}
	after := c.Snapshot()
	// Everything is as before except the version and the peaks.
	for i := range after.Locations {
		after.Locations[i].PeakBytes = before.Locations[i].PeakBytes
	}
	after.StateVersion = before.StateVersion
	eq(t, "fails counted", after.TransitionCounts["fail"]-before.TransitionCounts["fail"], uint64(len(ids)))
	after.TransitionCounts, after.RemovalCounts = before.TransitionCounts, before.RemovalCounts
	eq(t, "state after failures", after, before)
	err := c.refused("fail twice", func() error { return c.Fail(ids[0], nil) })
	wantInvalid(t, err, "not pending")
}

func TestRule_AdmissionChecksDestinationFirstThenSourceLocation(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 40, Exclusive, "cuda:1")
	c.must(c.Reserve("cuda:0", "d", 70))
	c.must(c.Reserve("cuda:1", "t", 70))
	err := c.refused("both refuse", func() error { _, err := c.Place(s, "cuda:0"); return err })
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, ReservedBytes: 70, RequestedBytes: 40})
	c.must(c.Unreserve("d"))
	err = c.refused("only the source location refuses", func() error { _, err := c.Place(s, "cuda:0"); return err })
	wantBudget(t, err, BudgetError{Location: "cuda:1", BudgetBytes: 100, ReservedBytes: 70, RequestedBytes: 40})
}
