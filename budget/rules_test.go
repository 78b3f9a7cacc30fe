package budget

// Rule tests: one or more tests for every rule of docs/semantics.md that
// concerns the ledger. Each test fails if its rule is broken. Every
// call goes through the checked harness (bottom of this file): invariants
// after every transition; a refused call must leave Version() and
// Snapshot() exactly as they were; the trace must hold every committed
// version.
//
// docs/semantics.md rule → test
//
// Locations
//   names pageable-host, pinned-host, cuda:N, @node; else bad input naming
//   the string, nothing changes         → TestRule_LocationNames,
//                                          TestRule_MalformedLocationIsInvalidInputAndChangesNothing
//   fixed set; well formed but not configured → Unavailable
//                                        → TestRule_UnconfiguredLocationIsUnavailable
//   (ledger choice) location order       → TestRule_LocationOrder
//   (DESIGN) bad start configuration     → TestRule_NewRejectsBadConfiguration
//   used = charges incl. entering and temporary
//                                        → TestRule_UsedBytesIncludeEnteringAndTemporaryCharges
//   reserved = active reservations       → TestRule_ReservedBytesAreActiveReservations
//   peak = highest used + reserved       → TestRule_PeakIsHighestUsedPlusReserved
//   admission used+reserved+requested <= budget; absent = no limit
//                                        → TestRule_AdmissionBoundary, TestRule_NoBudgetMeansNoLimit,
//                                          TestRule_AdmissionIsExactIntegerArithmetic
//   BudgetError with the five figures at the refusal
//                                        → TestRule_BudgetErrorReportsFiguresAtRefusal
//
// Values and materializations
//   register: bytes > 0                  → TestRule_RegisterBytesMustBePositive
//   replica mode exclusive (default) or replicable
//                                        → TestRule_RegisterReplicaModes
//   first location xor source (Go API)   → TestRule_RegisterNeedsExactlyOneOfAtOrSource
//   charge is exactly bytes              → TestRule_ChargeIsTheFixedValueSize
//   source: has_source, source_location  → TestRule_RegisterWithSource
//   no source: admitted at first location at registration
//                                        → TestRule_RegisterAtAdmitsAtFirstLocation
//   recoverable = resident copy or source → TestRule_Recoverability
//   place already there: no version      → TestRule_PlaceOnResidentIsNoOp
//   place source preference pinned, pageable, cuda:0, …
//                                        → TestRule_PlaceSourcePreference
//   place reconstructs when no resident copy; else Unavailable
//                                        → TestRule_PlaceReconstructsWhenNoResidentCopy
//   exclusive place is a move            → TestRule_PlaceOfExclusiveValueMoves,
//                                          TestRule_PlaceOfReplicableValueCopies
//   copy: replicable only (PlanError)    → TestRule_CopyRequiresReplicableValue
//   move = copy then remove from         → TestRule_MoveRemovesSourceAfterCompletion,
//                                          TestRule_MoveOntoResidentCopyRemovesSource
//   move: from unprotected before anything starts (InUse)
//                                        → TestRule_MoveSourceMustBeUnprotected
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
//   evict removes a materialization      → TestRule_EvictRemovesMaterialization
//   evict protected → InUse naming all three counts
//                                        → TestRule_EvictProtectedIsInUseNamingAllCounts
//   evict last copy without source → PlanError; with source fine
//                                        → TestRule_EvictLastCopyWithoutSourceIsPlanError,
//                                          TestRule_EvictLastCopyWithSourceIsAllowed
//   (resolved) evict checks protection before data loss
//                                        → TestRule_EvictChecksProtectionBeforeDataLoss
//   discard removes everything, retires the handle
//                                        → TestRule_DiscardRemovesEveryMaterializationAndRetires
//   (resolved) discard reports first protected in location order
//   (ledger choice: protection over every materialization before any
//   in-flight check)                     → TestRule_DiscardReportsFirstProtectedInLocationOrder,
//                                          TestRule_DiscardChecksProtectionBeforeInFlight
//   discarded handle → Unavailable "discarded" everywhere (plans too)
//                                        → TestRule_DiscardedHandleIsUnavailableEverywhere
//   its name is free for a new registration, which gets a new handle
//                                        → TestRule_DiscardedNameIsFreeForANewHandle
//   foreign handle → Unavailable "foreign" → TestRule_ForeignHandleIsUnavailable
//   (resolved) unknown names → invalid input
//                                        → TestRule_UnknownHandleIsInvalidInput
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
//
// State version and trace
//   every committed mutation bumps by one; reads and refusals never
//   (resolved versions per operation)    → TestRule_VersionsPerOperation,
//                                          TestRule_BadInputIsRefusedAndChangesNothing,
//                                          and the checked harness on every call
//   trace = committed transitions (version, kind, handle, location,
//   bytes, detail)                       → TestRule_TraceRecordsEveryCommittedTransition
//   bounded ring                         → TestRule_TraceIsBoundedRing
//   capacity 0 disables                  → TestRule_TraceCapacityZeroDisables
//   snapshot: one atomic tensor-free copy with every field
//                                        → TestRule_SnapshotContents, TestRule_SnapshotIsAnIndependentCopy
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
//
// Resolved details: order of checks (edgecases_test.go)
//   fields first in document order, each whole before the next; rules
//   after every field, in the order of the rule list; stale before all
//                                        → TestRule_OrderOfChecksPlans,
//                                          TestRule_OrderOfChecksRequests,
//                                          TestRule_OrderOfChecksDirectOperations
//
// Resolved details: edge cases (edgecases_test.go, scripts)
//   explain never fails on a plan's content (reason = the validation
//   error's message, peaks = current used+reserved)
//                                        → TestRule_ExplainOfAnInvalidPlanIsInfeasible
//   move(h, L, L) resident at L: no-op, protected or not
//                                        → TestRule_MoveOntoItselfIsANoOp
//   register … at L failing: PlanExecutionError (execute, (h, L), 0) after
//   2 versions; retired, name free, absent from snapshots
//                                        → TestRule_RegisterAtFailureRetiresTheHandle
//   reconstruction into L ≠ S through a temporary buffer at S
//                                        → TestRule_ReconstructionThroughATemporaryBuffer
//                                          (the fault order: tests/edgecases_test.go)
//   victims chosen again location by location when together they would
//   remove a last copy; a location then short → infeasible
//                                        → TestDecideUnrecoverableNeverChosen, controller.txt
//
// Not ledger rules (tested where they live): scope exit and exit_error
// (system), fault injection (cuda/soft, replay CLI), the controller
// (decide*_test.go).

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

// ---- Locations -------------------------------------------------------------

func TestRule_LocationNames(t *testing.T) {
	good := map[string]string{
		"pageable-host":        "pageable-host",
		"pinned-host":          "pinned-host",
		"cuda:0":               "cuda:0",
		"cuda:7":               "cuda:7",
		"cuda:123":             "cuda:123",
		"cuda:0@node-b":        "cuda:0@node-b",
		"pinned-host@n1.rack2": "pinned-host@n1.rack2",
	}
	for in, want := range good {
		n, err := ParseLocation(in)
		if err != nil {
			t.Errorf("ParseLocation(%q): %v", in, err)
			continue
		}
		if n.String() != want {
			t.Errorf("ParseLocation(%q).String() = %q", in, n.String())
		}
	}
	bad := []string{"", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda:01", "cuda:x", "cuda:1.5", "cuda: 1",
		"CUDA:0", "gpu:0", "cpu", "pinned", "Pinned-Host", "pageable-host ", " cuda:0",
		"cuda:0@", "cuda:0@a b", "cuda:0@n@m", "@node", "host"}
	for _, in := range bad {
		_, err := ParseLocation(in)
		wantInvalid(t, err, fmt.Sprintf("%q", in))
	}
}

func TestRule_MalformedLocationIsInvalidInputAndChangesNothing(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	const bad = "gpu:0"
	ops := map[string]func() error{
		"register at":     func() error { _, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, At: bad}); return err },
		"register source": func() error { _, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, Source: bad}); return err },
		"place":           func() error { _, err := c.Place(w, bad); return err },
		"copy from":       func() error { _, err := c.Copy(w, bad, "cuda:1"); return err },
		"copy to":         func() error { _, err := c.Copy(w, "cuda:0", bad); return err },
		"move from":       func() error { _, err := c.Move(w, bad, "cuda:1"); return err },
		"move to":         func() error { _, err := c.Move(w, "cuda:0", bad); return err },
		"evict":           func() error { _, err := c.Evict(w, bad); return err },
		"acquire":         func() error { _, err := c.Acquire(w, bad); return err },
		"hold":            func() error { _, err := c.Hold(w, bad); return err },
		"reserve":         func() error { return c.Reserve(bad, "r", 1) },
		"start run": func() error {
			_, err := c.StartRun(Plan{Enter: []Action{{Handle: w, Location: bad}}}, RunOptions{})
			return err
		},
	}
	for name, op := range ops {
		err := c.refused(name, op)
		wantInvalid(t, err, `"gpu:0"`)
	}
	ex := c.Explain(Plan{Reservations: []ReservationSpec{{Name: "r", Location: bad, Bytes: 1}}})
	if ex.Feasible || !strings.Contains(ex.Reason, `"gpu:0"`) {
		t.Fatalf("explain with a malformed location: %+v", ex)
	}
}

func TestRule_UnconfiguredLocationIsUnavailable(t *testing.T) {
	c := newChecked(t, Config{ManagerID: "m1", Locations: []LocationConfig{{Name: "pageable-host"}, {Name: "cuda:0"}}})
	w := c.reg("w", 10, Replicable, "pageable-host")
	for _, loc := range []string{"cuda:1", "pinned-host", "cuda:0@node-b"} {
		ops := map[string]func() error{
			"register at":     func() error { _, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, At: loc}); return err },
			"register source": func() error { _, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, Source: loc}); return err },
			"place":           func() error { _, err := c.Place(w, loc); return err },
			"copy":            func() error { _, err := c.Copy(w, "pageable-host", loc); return err },
			"move":            func() error { _, err := c.Move(w, "pageable-host", loc); return err },
			"evict":           func() error { _, err := c.Evict(w, loc); return err },
			"acquire":         func() error { _, err := c.Acquire(w, loc); return err },
			"hold":            func() error { _, err := c.Hold(w, loc); return err },
			"reserve":         func() error { return c.Reserve(loc, "r", 1) },
			"start run": func() error {
				_, err := c.StartRun(Plan{Enter: []Action{{Handle: w, Location: loc}}}, RunOptions{})
				return err
			},
		}
		for name, op := range ops {
			err := c.refused(name+" "+loc, op)
			wantUnavailable(t, err, "", loc, UnavailableLocation)
		}
	}
	// A node-qualified location works once it is configured.
	c2 := newChecked(t, Config{ManagerID: "m2", Locations: []LocationConfig{{Name: "pageable-host"}, {Name: "cuda:0@node-b", HasBudget: true, BudgetBytes: 10}}})
	x := c2.reg("x", 10, Exclusive, "pageable-host")
	c2.placed(x, "cuda:0@node-b")
	eq(t, "mats", c2.mats("x"), []string{"cuda:0@node-b:resident:0/0/0"})
}

func TestRule_LocationOrder(t *testing.T) {
	var locs []LocationConfig
	for _, n := range []string{"cuda:10", "cuda:0@b", "cuda:1", "pinned-host@a", "pinned-host", "cuda:2", "pageable-host", "cuda:0"} {
		locs = append(locs, LocationConfig{Name: n})
	}
	c := newChecked(t, Config{ManagerID: "m1", Locations: locs})
	want := []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1", "cuda:2", "cuda:10", "pinned-host@a", "cuda:0@b"}
	eq(t, "Locations()", c.L.Locations(), want)
	var got []string
	for _, r := range c.Snapshot().Locations {
		got = append(got, r.Location)
	}
	eq(t, "snapshot location order", got, want)
	// Materializations are listed in location order too, whatever the
	// order they were created in.
	w := c.reg("w", 1, Replicable, "cuda:10")
	for _, l := range []string{"cuda:2", "pageable-host", "cuda:0@b", "pinned-host"} {
		c.placed(w, l)
	}
	eq(t, "materialization order", c.mats("w"), []string{
		"pageable-host:resident:0/0/0", "pinned-host:resident:0/0/0", "cuda:2:resident:0/0/0",
		"cuda:10:resident:0/0/0", "cuda:0@b:resident:0/0/0"})
}

func TestRule_NewRejectsBadConfiguration(t *testing.T) {
	cases := map[string]Config{
		"no manager id":      {Locations: []LocationConfig{{Name: "cuda:0"}}},
		"no locations":       {ManagerID: "m"},
		"malformed location": {ManagerID: "m", Locations: []LocationConfig{{Name: "gpu0"}}},
		"non-canonical":      {ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:00"}}},
		"duplicate location": {ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:0"}, {Name: "cuda:0"}}},
		"zero budget":        {ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:0", HasBudget: true}}},
		"negative budget":    {ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:0", HasBudget: true, BudgetBytes: -5}}},
		"negative trace":     {ManagerID: "m", TraceCapacity: -1, Locations: []LocationConfig{{Name: "cuda:0"}}},
	}
	for name, cfg := range cases {
		l, err := New(cfg)
		if l != nil {
			t.Errorf("%s: got a ledger", name)
		}
		wantInvalid(t, err)
	}
}

func TestRule_UsedBytesIncludeEnteringAndTemporaryCharges(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 40, Exclusive, "pinned-host")
	eq(t, "pinned-host before", c.figures("pinned-host"), [3]int64{0, 0, 0})
	a, err := c.Place(s, "cuda:0")
	c.must(err)
	eq(t, "entering materialization", c.mats("s"), []string{"cuda:0:entering:0/0/0"})
	eq(t, "cuda:0 while entering", c.figures("cuda:0"), [3]int64{40, 0, 40})
	eq(t, "pinned-host temporary charge", c.figures("pinned-host"), [3]int64{40, 0, 40})
	_, err = c.Complete(a.ID)
	c.must(err)
	eq(t, "cuda:0 after", c.figures("cuda:0"), [3]int64{40, 0, 40})
	eq(t, "pinned-host after", c.figures("pinned-host"), [3]int64{0, 0, 40})
}

func TestRule_ReservedBytesAreActiveReservations(t *testing.T) {
	c := std(t)
	c.must(c.Reserve("cuda:0", "a", 10))
	c.must(c.Reserve("cuda:0", "b", 20))
	c.must(c.Reserve("cuda:1", "c", 5))
	r := c.loc("cuda:0")
	eq(t, "reserved", r.ReservedBytes, int64(30))
	eq(t, "used", r.UsedBytes, int64(0))
	eq(t, "records", r.Reservations, []ReservationRecord{{Name: "a", Bytes: 10}, {Name: "b", Bytes: 20}})
	c.must(c.Unreserve("a"))
	r = c.loc("cuda:0")
	eq(t, "reserved after release", r.ReservedBytes, int64(20))
	eq(t, "records after release", r.Reservations, []ReservationRecord{{Name: "b", Bytes: 20}})
	eq(t, "cuda:1", c.figures("cuda:1"), [3]int64{0, 5, 5})
}

func TestRule_PeakIsHighestUsedPlusReserved(t *testing.T) {
	c := std(t)
	c.must(c.Reserve("cuda:0", "r", 30))
	w := c.reg("w", 50, Exclusive, "cuda:0")
	eq(t, "after register", c.figures("cuda:0"), [3]int64{50, 30, 80})
	c.must(c.Unreserve("r"))
	eq(t, "after unreserve", c.figures("cuda:0"), [3]int64{50, 0, 80})
	c.placed(w, "cuda:1") // move: cuda:0 keeps 50 until completion
	eq(t, "after move away", c.figures("cuda:0"), [3]int64{0, 0, 80})
	c.must(c.Reserve("cuda:0", "r2", 90))
	eq(t, "new high", c.figures("cuda:0"), [3]int64{0, 90, 90})
	c.must(c.Unreserve("r2"))
	c.must(c.Reserve("cuda:1", "r3", 40))
	eq(t, "cuda:1", c.figures("cuda:1"), [3]int64{50, 40, 90})
}

func TestRule_AdmissionBoundary(t *testing.T) {
	// used + reserved + requested <= budget is admitted; one byte more is not.
	t.Run("register", func(t *testing.T) {
		c := std(t)
		c.must(c.Reserve("cuda:0", "r", 30))
		c.reg("a", 70, Exclusive, "cuda:0") // 0+30+70 = 100
		err := c.refused("register 1 more byte", func() error {
			_, _, err := c.Register(ValueSpec{Name: "b", Bytes: 1, At: "cuda:0"})
			return err
		})
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 70, ReservedBytes: 30, RequestedBytes: 1})
	})
	t.Run("reserve", func(t *testing.T) {
		c := std(t)
		c.reg("a", 60, Exclusive, "cuda:0")
		c.must(c.Reserve("cuda:0", "r", 40))
		err := c.refused("reserve 1 more byte", func() error { return c.Reserve("cuda:0", "r2", 1) })
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 60, ReservedBytes: 40, RequestedBytes: 1})
	})
	t.Run("place copy move", func(t *testing.T) {
		c := std(t)
		w := c.reg("w", 50, Replicable, "pageable-host")
		x := c.reg("x", 51, Replicable, "pageable-host")
		c.must(c.Reserve("cuda:0", "r", 50))
		err := c.refused("copy 51 into 50 free", func() error { _, err := c.Copy(x, "pageable-host", "cuda:0"); return err })
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 50, RequestedBytes: 51})
		err = c.refused("move 51 into 50 free", func() error { _, err := c.Move(x, "pageable-host", "cuda:0"); return err })
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 50, RequestedBytes: 51})
		err = c.refused("place 51 into 50 free", func() error { _, err := c.Place(x, "cuda:0"); return err })
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 50, RequestedBytes: 51})
		c.placed(w, "cuda:0") // exactly fits
		eq(t, "cuda:0", c.figures("cuda:0"), [3]int64{50, 50, 100})
	})
	t.Run("temporary charge", func(t *testing.T) {
		c := std(t)
		s := c.regSrc("s", 40, Exclusive, "cuda:1")
		c.must(c.Reserve("cuda:1", "r", 60))
		c.placed(s, "cuda:0") // 0+60+40 = 100 at cuda:1, temporarily
		eq(t, "cuda:1", c.figures("cuda:1"), [3]int64{0, 60, 100})
		c.must(c.Reserve("cuda:1", "r2", 1))
		c.must2(c.Evict(s, "cuda:0"))
		err := c.refused("temporary charge one byte over", func() error { _, err := c.Place(s, "cuda:0"); return err })
		wantBudget(t, err, BudgetError{Location: "cuda:1", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 61, RequestedBytes: 40})
	})
}

func TestRule_NoBudgetMeansNoLimit(t *testing.T) {
	c := std(t)
	for i := range 4 {
		c.reg(fmt.Sprint("big", i), 1<<50, Exclusive, "pageable-host")
	}
	c.must(c.Reserve("pageable-host", "huge", 1<<52))
	eq(t, "pageable-host", c.figures("pageable-host"), [3]int64{1 << 52, 1 << 52, 1 << 53})
	eq(t, "budget flag", c.loc("pageable-host").HasBudget, false)
}

func TestRule_AdmissionIsExactIntegerArithmetic(t *testing.T) {
	// used + reserved + requested must be compared exactly: a request so
	// large that the sum overflows int64 must not wrap around and pass.
	c := std(t)
	c.reg("w", 10, Exclusive, "cuda:0")
	err := c.refused("register MaxInt64", func() error {
		_, _, err := c.Register(ValueSpec{Name: "huge", Bytes: math.MaxInt64, At: "cuda:0"})
		return err
	})
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 10, ReservedBytes: 0, RequestedBytes: math.MaxInt64})
	err = c.refused("reserve MaxInt64", func() error { return c.Reserve("cuda:0", "huge", math.MaxInt64) })
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 10, ReservedBytes: 0, RequestedBytes: math.MaxInt64})
	// Without a budget the figures must stay exact too: a charge that
	// cannot be represented is refused rather than wrapped.
	c.reg("half", math.MaxInt64/2+1, Exclusive, "pageable-host")
	err = c.refused("overflowing unlimited location", func() error {
		_, _, err := c.Register(ValueSpec{Name: "half2", Bytes: math.MaxInt64/2 + 1, At: "pageable-host"})
		return err
	})
	wantInvalid(t, err, "pageable-host")
	eq(t, "pageable-host", c.figures("pageable-host"), [3]int64{math.MaxInt64/2 + 1, 0, math.MaxInt64/2 + 1})
}

func TestRule_BudgetErrorReportsFiguresAtRefusal(t *testing.T) {
	c := std(t)
	c.reg("a", 45, Exclusive, "cuda:1")
	c.must(c.Reserve("cuda:1", "r", 25))
	b := c.reg("b", 31, Exclusive, "pinned-host")
	err := c.refused("move b to cuda:1", func() error { _, err := c.Move(b, "pinned-host", "cuda:1"); return err })
	wantBudget(t, err, BudgetError{Location: "cuda:1", BudgetBytes: 100, UsedBytes: 45, ReservedBytes: 25, RequestedBytes: 31})
	if msg := err.Error(); !strings.Contains(msg, "cuda:1") || !strings.Contains(msg, "short by 1") {
		t.Fatalf("message %q", msg)
	}
}

// ---- Values and materializations ------------------------------------------

func TestRule_RegisterBytesMustBePositive(t *testing.T) {
	c := std(t)
	for _, b := range []int64{0, -1, math.MinInt64} {
		for _, spec := range []ValueSpec{{Name: "w", Bytes: b, At: "cuda:0"}, {Name: "w", Bytes: b, Source: "pinned-host"}} {
			err := c.refused(fmt.Sprint("register bytes ", b), func() error { _, _, err := c.Register(spec); return err })
			wantInvalid(t, err, "bytes must be positive", fmt.Sprint(b))
		}
	}
	if _, ok := c.L.Lookup("w"); ok {
		t.Fatal("a refused registration left the name taken")
	}
}

func TestRule_RegisterReplicaModes(t *testing.T) {
	c := std(t)
	c.reg("d", 1, ReplicaMode(0), "pageable-host")
	c.reg("r", 1, Replicable, "pageable-host")
	eq(t, "default mode", c.val("d").ReplicaMode, Exclusive)
	eq(t, "replicable", c.val("r").ReplicaMode, Replicable)
	for in, want := range map[string]ReplicaMode{"": Exclusive, "exclusive": Exclusive, "replicable": Replicable} {
		m, err := ParseReplicaMode(in)
		c.must(err)
		eq(t, "ParseReplicaMode("+in+")", m, want)
	}
	_, err := ParseReplicaMode("shared")
	wantInvalid(t, err, `"shared"`)
	err = c.refused("unknown mode", func() error {
		_, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, Mode: ReplicaMode(7), At: "cuda:0"})
		return err
	})
	wantInvalid(t, err, "replica mode")
}

func TestRule_RegisterNeedsExactlyOneOfAtOrSource(t *testing.T) {
	c := std(t)
	for _, spec := range []ValueSpec{{Name: "x", Bytes: 1}, {Name: "x", Bytes: 1, At: "cuda:0", Source: "pinned-host"}} {
		err := c.refused(fmt.Sprintf("%+v", spec), func() error { _, _, err := c.Register(spec); return err })
		wantInvalid(t, err, "exactly one")
	}
	err := c.refused("empty name", func() error { _, _, err := c.Register(ValueSpec{Bytes: 1, At: "cuda:0"}); return err })
	wantInvalid(t, err, "name")
}

func TestRule_RegisterAtAdmitsAtFirstLocation(t *testing.T) {
	c := std(t)
	var h Handle
	var a Admission
	if d := c.delta(func() {
		var err error
		h, a, err = c.Register(ValueSpec{Name: "w", Bytes: 30, At: "cuda:0"})
		c.must(err)
	}); d != 1 {
		t.Fatalf("register at: %d versions before completion, want 1", d)
	}
	eq(t, "effects", a.Effects, []Effect{{Kind: EffectInitialize, Handle: h, Location: "cuda:0", Bytes: 30}})
	eq(t, "entering", c.mats("w"), []string{"cuda:0:entering:0/0/0"})
	eq(t, "charged from admission", c.figures("cuda:0"), [3]int64{30, 0, 30})
	if d := c.delta(func() { _, err := c.Complete(a.ID); c.must(err) }); d != 1 {
		t.Fatalf("completion: %d versions, want 1", d)
	}
	eq(t, "resident", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	v := c.val("w")
	eq(t, "has source", v.HasSource, false)
	eq(t, "source location", v.SourceLocation, "")
	// Registration is refused (nothing registered) when the first location
	// lacks room.
	err := c.refused("register over budget", func() error {
		_, _, err := c.Register(ValueSpec{Name: "big", Bytes: 71, At: "cuda:0"})
		return err
	})
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 30, RequestedBytes: 71})
}

func TestRule_RegisterWithSource(t *testing.T) {
	c := std(t)
	if d := c.delta(func() { c.regSrc("s", 40, Exclusive, "pinned-host") }); d != 1 {
		t.Fatalf("register with source: %d versions, want 1", d)
	}
	v := c.val("s")
	eq(t, "has source", v.HasSource, true)
	eq(t, "source location", v.SourceLocation, "pinned-host")
	eq(t, "materializations", len(v.Materializations), 0)
	eq(t, "recoverable", v.Recoverable, true)
	eq(t, "nothing charged", c.figures("pinned-host"), [3]int64{0, 0, 0})
}

func TestRule_ChargeIsTheFixedValueSize(t *testing.T) {
	c := std(t)
	w := c.reg("w", 37, Replicable, "pageable-host")
	c.placed(w, "pinned-host")
	c.placed(w, "cuda:0")
	s := c.regSrc("s", 13, Replicable, "pinned-host")
	c.placed(s, "cuda:1")
	for _, name := range []string{"w", "s"} {
		v := c.val(name)
		for _, m := range v.Materializations {
			if m.ChargedBytes != v.Bytes {
				t.Fatalf("%s at %s charged %d, want %d", name, m.Location, m.ChargedBytes, v.Bytes)
			}
		}
	}
	eq(t, "pageable-host", c.figures("pageable-host")[0], int64(37))
	eq(t, "pinned-host", c.figures("pinned-host")[0], int64(37))
	eq(t, "cuda:0", c.figures("cuda:0")[0], int64(37))
	eq(t, "cuda:1", c.figures("cuda:1")[0], int64(13))
}

func TestRule_Recoverability(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	w := c.reg("w", 10, Exclusive, "pageable-host")
	_, a, err := c.Register(ValueSpec{Name: "lost", Bytes: 10, At: "cuda:0"})
	c.must(err)
	eq(t, "source only", c.val("s").Recoverable, true)
	eq(t, "resident", c.val("w").Recoverable, true)
	eq(t, "entering only, no source", c.val("lost").Recoverable, false)
	c.must(c.Fail(a.ID, errors.New("init failed")))
	// A failed registration never existed: retired, name free, and left
	// out of snapshots.
	if snap := c.L.Snapshot(); func() bool { _, ok := snap.Value("lost"); return ok }() {
		t.Fatal("a value whose registration failed must not appear in snapshots")
	}
	if _, ok := c.L.Lookup("lost"); ok {
		t.Fatal("the name of a failed registration must be free again")
	}
	c.placed(s, "cuda:1")
	eq(t, "source and resident", c.val("s").Recoverable, true)
	// A discarded value is not recoverable: it is gone from snapshots, and
	// its handle answers unavailable (discarded) — not even its source
	// brings it back.
	_, err = c.Discard(w)
	c.must(err)
	c.gone("w")
	_, err = c.Discard(s)
	c.must(err)
	c.gone("s")
	_, err = c.L.Place(s, "cuda:1")
	wantUnavailable(t, err, "s", "", UnavailableDiscarded)
}

func TestRule_PlaceOnResidentIsNoOp(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	x := c.reg("x", 10, Exclusive, "cuda:0")
	c.placed(w, "cuda:1")
	before := c.Snapshot()
	for name, op := range map[string]func() (Admission, error){
		"place replicable": func() (Admission, error) { return c.Place(w, "cuda:1") },
		"place exclusive":  func() (Admission, error) { return c.Place(x, "cuda:0") },
		"copy onto copy":   func() (Admission, error) { return c.Copy(w, "pageable-host", "cuda:1") },
		"move onto itself": func() (Admission, error) { return c.Move(x, "cuda:0", "cuda:0") },
	} {
		a, err := op()
		c.must(err)
		eq(t, name, a, Admission{})
	}
	eq(t, "state after no-ops", c.Snapshot(), before)
}

func TestRule_PlaceSourcePreference(t *testing.T) {
	// Preference among resident copies: pinned-host, pageable-host, cuda:0,
	// cuda:1 — whatever the order the copies were made in.
	cases := []struct {
		resident []string // the first is the registration location
		dest     string
		from     string
	}{
		{[]string{"cuda:1", "cuda:0"}, "pageable-host", "cuda:0"},
		{[]string{"cuda:1", "pageable-host"}, "cuda:0", "pageable-host"},
		{[]string{"cuda:0", "pageable-host", "pinned-host"}, "cuda:1", "pinned-host"},
		{[]string{"pageable-host", "cuda:0"}, "pinned-host", "pageable-host"},
		{[]string{"cuda:1", "cuda:0", "pageable-host"}, "pinned-host", "pageable-host"},
	}
	for _, tc := range cases {
		c := std(t)
		w := c.reg("w", 10, Replicable, tc.resident[0])
		for _, l := range tc.resident[1:] {
			c.placed(w, l)
		}
		a, err := c.Place(w, tc.dest)
		c.must(err)
		eq(t, fmt.Sprintf("%v → %s", tc.resident, tc.dest), a.Effects,
			[]Effect{{Kind: EffectCopy, Handle: w, Location: tc.dest, From: tc.from, Bytes: 10}})
	}
}

func TestRule_PlaceReconstructsWhenNoResidentCopy(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 40, Replicable, "pinned-host")
	var a Admission
	if d := c.delta(func() {
		var err error
		a, err = c.Place(s, "cuda:0")
		c.must(err)
	}); d != 1 {
		t.Fatalf("admission: %d versions", d)
	}
	eq(t, "effects", a.Effects, []Effect{{Kind: EffectReconstruct, Handle: s, Location: "cuda:0", TempAt: "pinned-host", Bytes: 40}})
	c.must2(c.Complete(a.ID))
	// With a resident copy the bytes are copied, not reconstructed.
	a, err := c.Place(s, "cuda:1")
	c.must(err)
	eq(t, "copy instead", a.Effects, []Effect{{Kind: EffectCopy, Handle: s, Location: "cuda:1", From: "cuda:0", Bytes: 40}})
	// Without a resident copy and without a source the value is
	// unavailable: a replicable value whose only copy is still entering.
	g, _, err := c.Register(ValueSpec{Name: "g", Bytes: 5, Mode: Replicable, At: "cuda:1"})
	c.must(err)
	err = c.refused("place without copy or source", func() error { _, err := c.Place(g, "cuda:0"); return err })
	wantUnavailable(t, err, "g", "cuda:0", UnavailableSource)
}

func TestRule_PlaceOfExclusiveValueMoves(t *testing.T) {
	c := std(t)
	w := c.reg("w", 60, Exclusive, "pageable-host")
	var a Admission
	d := c.delta(func() {
		var err error
		a, err = c.Place(w, "cuda:0")
		c.must(err)
	})
	eq(t, "admission versions", d, uint64(1))
	eq(t, "effects", a.Effects, []Effect{{Kind: EffectCopy, Handle: w, Location: "cuda:0", From: "pageable-host", Bytes: 60}})
	eq(t, "during", c.mats("w"), []string{"pageable-host:leaving:0/0/0", "cuda:0:entering:0/0/0"})
	var freed []Effect
	d = c.delta(func() {
		var err error
		freed, err = c.Complete(a.ID)
		c.must(err)
	})
	eq(t, "completion versions (complete + remove source)", d, uint64(2))
	eq(t, "free effect", freed, []Effect{{Kind: EffectFree, Handle: w, Location: "pageable-host", Bytes: 60}})
	eq(t, "after", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	eq(t, "pageable-host released", c.figures("pageable-host")[0], int64(0))
}

func TestRule_PlaceOfReplicableValueCopies(t *testing.T) {
	c := std(t)
	w := c.reg("w", 60, Replicable, "pageable-host")
	d := c.delta(func() { c.placed(w, "cuda:0") })
	eq(t, "versions", d, uint64(2))
	eq(t, "both resident", c.mats("w"), []string{"pageable-host:resident:0/0/0", "cuda:0:resident:0/0/0"})
}

func TestRule_CopyRequiresReplicableValue(t *testing.T) {
	c := std(t)
	x := c.reg("x", 10, Exclusive, "pageable-host")
	err := c.refused("copy exclusive", func() error { _, err := c.Copy(x, "pageable-host", "cuda:0"); return err })
	wantPlanError(t, err, "exclusive")
	w := c.reg("w", 10, Replicable, "pageable-host")
	a, err := c.Copy(w, "pageable-host", "cuda:0")
	c.must(err)
	eq(t, "copy effect", a.Effects, []Effect{{Kind: EffectCopy, Handle: w, Location: "cuda:0", From: "pageable-host", Bytes: 10}})
	// The source of a copy must be resident.
	err = c.refused("copy from absent", func() error { _, err := c.Copy(w, "cuda:1", "pinned-host"); return err })
	wantUnavailable(t, err, "w", "cuda:1", UnavailableEndpoint)
	err = c.refused("copy from entering", func() error { _, err := c.Copy(w, "cuda:0", "pinned-host"); return err })
	wantUnavailable(t, err, "w", "cuda:0", UnavailableInFlight)
}

func TestRule_MoveRemovesSourceAfterCompletion(t *testing.T) {
	c := std(t)
	w := c.reg("w", 60, Exclusive, "cuda:0")
	var a Admission
	eq(t, "admit", c.delta(func() { var err error; a, err = c.Move(w, "cuda:0", "cuda:1"); c.must(err) }), uint64(1))
	eq(t, "source leaving, still charged", c.mats("w"), []string{"cuda:0:leaving:0/0/0", "cuda:1:entering:0/0/0"})
	eq(t, "cuda:0 during", c.figures("cuda:0")[0], int64(60))
	var effs []Effect
	eq(t, "complete + remove", c.delta(func() { var err error; effs, err = c.Complete(a.ID); c.must(err) }), uint64(2))
	eq(t, "free", effs, []Effect{{Kind: EffectFree, Handle: w, Location: "cuda:0", Bytes: 60}})
	eq(t, "after", c.mats("w"), []string{"cuda:1:resident:0/0/0"})
	tr := c.L.Trace()
	eq(t, "last transitions", kinds(tr[len(tr)-3:]), []string{"admit w@cuda:1", "complete w@cuda:1", "remove w@cuda:0"})
	// A leaving source cannot be leased, held, evicted or moved again.
	b := c.reg("b", 10, Exclusive, "pageable-host")
	a, err := c.Move(b, "pageable-host", "cuda:0")
	c.must(err)
	for name, op := range map[string]func() error{
		"acquire": func() error { _, err := c.Acquire(b, "pageable-host"); return err },
		"hold":    func() error { _, err := c.Hold(b, "pageable-host"); return err },
		"evict":   func() error { _, err := c.Evict(b, "pageable-host"); return err },
		"move":    func() error { _, err := c.Move(b, "pageable-host", "cuda:1"); return err },
	} {
		err := c.refused(name+" of a leaving source", op)
		wantUnavailable(t, err, "b", "pageable-host", UnavailableInFlight)
	}
	c.must2(c.Complete(a.ID))
}

func TestRule_MoveSourceMustBeUnprotected(t *testing.T) {
	type protect func(c *checked, h Handle, loc string) InUseError
	cases := map[string]protect{
		"lease": func(c *checked, h Handle, loc string) InUseError {
			c.must2(c.Acquire(h, loc))
			return InUseError{Handle: h.Name, Location: loc, UseCount: 1}
		},
		"hold": func(c *checked, h Handle, loc string) InUseError {
			c.must2(c.Hold(h, loc))
			return InUseError{Handle: h.Name, Location: loc, HoldCount: 1}
		},
		"pending event": func(c *checked, h Handle, loc string) InUseError {
			id, err := c.Acquire(h, loc)
			c.must(err)
			c.must2(c.RecordEvent(id))
			c.must(c.Release(id))
			return InUseError{Handle: h.Name, Location: loc, PendingEventCount: 1}
		},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			c := std(t)
			x := c.reg("x", 10, Exclusive, "pageable-host")
			w := c.reg("w", 10, Replicable, "pageable-host")
			wantX := p(c, x, "pageable-host")
			wantW := p(c, w, "pageable-host")
			err := c.refused("move exclusive", func() error { _, err := c.Move(x, "pageable-host", "cuda:0"); return err })
			wantInUse(t, err, wantX)
			err = c.refused("place exclusive (a move)", func() error { _, err := c.Place(x, "cuda:0"); return err })
			wantInUse(t, err, wantX)
			err = c.refused("move replicable", func() error { _, err := c.Move(w, "pageable-host", "cuda:0"); return err })
			wantInUse(t, err, wantW)
			// Copying from a protected materialization is fine.
			c.placed(w, "cuda:0")
		})
	}
}

func TestRule_MoveOntoResidentCopyRemovesSource(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	var a Admission
	eq(t, "versions", c.delta(func() { var err error; a, err = c.Move(w, "pageable-host", "cuda:0"); c.must(err) }), uint64(1))
	eq(t, "admission", a, Admission{Effects: []Effect{{Kind: EffectFree, Handle: w, Location: "pageable-host", Bytes: 10}}})
	eq(t, "after", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
}

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

func TestRule_EvictRemovesMaterialization(t *testing.T) {
	c := std(t)
	w := c.reg("w", 25, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	var effs []Effect
	eq(t, "versions", c.delta(func() { var err error; effs, err = c.Evict(w, "cuda:0"); c.must(err) }), uint64(1))
	eq(t, "free", effs, []Effect{{Kind: EffectFree, Handle: w, Location: "cuda:0", Bytes: 25}})
	eq(t, "cuda:0", c.figures("cuda:0"), [3]int64{0, 0, 25})
	eq(t, "left", c.mats("w"), []string{"pageable-host:resident:0/0/0"})
	err := c.refused("evict absent", func() error { _, err := c.Evict(w, "cuda:0"); return err })
	wantUnavailable(t, err, "w", "cuda:0", UnavailableEndpoint)
	a, err := c.Place(w, "cuda:1")
	c.must(err)
	err = c.refused("evict entering", func() error { _, err := c.Evict(w, "cuda:1"); return err })
	wantUnavailable(t, err, "w", "cuda:1", UnavailableInFlight)
	c.must2(c.Complete(a.ID))
}

func TestRule_EvictProtectedIsInUseNamingAllCounts(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	l1, err := c.Acquire(w, "cuda:0")
	c.must(err)
	c.must2(c.Acquire(w, "cuda:0"))
	c.must2(c.Hold(w, "cuda:0"))
	c.must2(c.RecordEvent(l1))
	c.must2(c.RecordEvent(l1))
	c.must2(c.RecordEvent(l1))
	err = c.refused("evict protected", func() error { _, err := c.Evict(w, "cuda:0"); return err })
	wantInUse(t, err, InUseError{Handle: "w", Location: "cuda:0", UseCount: 2, HoldCount: 1, PendingEventCount: 3})
	if msg := err.Error(); !strings.Contains(msg, "2 leases") || !strings.Contains(msg, "1 holds") || !strings.Contains(msg, "3 pending events") {
		t.Fatalf("message %q does not name all three counts", msg)
	}
}

func TestRule_EvictLastCopyWithoutSourceIsPlanError(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	err := c.refused("evict last copy", func() error { _, err := c.Evict(w, "pageable-host"); return err })
	wantPlanError(t, err, "discard")
	c.placed(w, "cuda:0")
	c.must2(c.Evict(w, "pageable-host")) // another copy remains
	err = c.refused("evict the new last copy", func() error { _, err := c.Evict(w, "cuda:0"); return err })
	wantPlanError(t, err)
}

func TestRule_EvictLastCopyWithSourceIsAllowed(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	c.placed(s, "cuda:0")
	c.must2(c.Evict(s, "cuda:0"))
	v := c.val("s")
	eq(t, "no materializations", len(v.Materializations), 0)
	eq(t, "still recoverable", v.Recoverable, true)
}

func TestRule_EvictChecksProtectionBeforeDataLoss(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "pageable-host")
	c.must2(c.Hold(w, "pageable-host"))
	err := c.refused("evict protected last copy", func() error { _, err := c.Evict(w, "pageable-host"); return err })
	wantInUse(t, err, InUseError{Handle: "w", Location: "pageable-host", HoldCount: 1})
}

func TestRule_DiscardRemovesEveryMaterializationAndRetires(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "cuda:1")
	c.placed(w, "pageable-host")
	c.placed(w, "cuda:0")
	var effs []Effect
	eq(t, "versions (3 removals + retire)", c.delta(func() { var err error; effs, err = c.Discard(w); c.must(err) }), uint64(4))
	eq(t, "frees in location order", effs, []Effect{
		{Kind: EffectFree, Handle: w, Location: "pageable-host", Bytes: 10},
		{Kind: EffectFree, Handle: w, Location: "cuda:0", Bytes: 10},
		{Kind: EffectFree, Handle: w, Location: "cuda:1", Bytes: 10},
	})
	tr := c.L.Trace()
	eq(t, "transitions", kinds(tr[len(tr)-4:]), []string{"remove w@pageable-host", "remove w@cuda:0", "remove w@cuda:1", "discard w"})
	c.gone("w")
	for _, l := range []string{"pageable-host", "cuda:0", "cuda:1"} {
		eq(t, l+" used", c.figures(l)[0], int64(0))
	}
	// A value with only a source: one version, for the retirement.
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	eq(t, "discard source-only", c.delta(func() { c.must2(c.Discard(s)) }), uint64(1))
}

func TestRule_DiscardReportsFirstProtectedInLocationOrder(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "cuda:1")
	c.placed(w, "pinned-host")
	c.placed(w, "pageable-host")
	c.must2(c.Hold(w, "cuda:1"))
	c.must2(c.Acquire(w, "pinned-host"))
	err := c.refused("discard", func() error { _, err := c.Discard(w); return err })
	wantInUse(t, err, InUseError{Handle: "w", Location: "pinned-host", UseCount: 1})
	eq(t, "nothing removed", len(c.val("w").Materializations), 3)
}

// TestRule_DiscardChecksProtectionBeforeInFlight: discard reports the
// first protected materialization in location order, whatever else is in
// flight (issue 7: the in-flight check used to come first); only when
// nothing is protected is the first materialization in flight, in location
// order, Unavailable (in flight).
func TestRule_DiscardChecksProtectionBeforeInFlight(t *testing.T) {
	cases := []struct {
		name  string
		setup func(c *checked) (Handle, []AdmissionID, func())
		check func(t *testing.T, err error)
	}{{
		name: "protected after an entering one in location order",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			r := c.reg("r", 10, Replicable, "cuda:1")
			l, err := c.Acquire(r, "cuda:1")
			c.must(err)
			a, err := c.Place(r, "pageable-host") // pageable-host entering, cuda:1 read
			c.must(err)
			return r, []AdmissionID{a.ID}, func() { c.must(c.Release(l)) }
		},
		check: func(t *testing.T, err error) {
			wantInUse(t, err, InUseError{Handle: "r", Location: "cuda:1", UseCount: 1})
		},
	}, {
		name: "protected source of a copy in flight",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			r := c.reg("r", 10, Replicable, "pinned-host")
			hd, err := c.Hold(r, "pinned-host")
			c.must(err)
			a, err := c.Copy(r, "pinned-host", "cuda:0")
			c.must(err)
			return r, []AdmissionID{a.ID}, func() { c.must(c.Unhold(hd)) }
		},
		check: func(t *testing.T, err error) {
			wantInUse(t, err, InUseError{Handle: "r", Location: "pinned-host", HoldCount: 1})
		},
	}, {
		name: "pending event behind two transfers in flight",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			s := c.regSrc("s", 10, Replicable, "pinned-host")
			c.placed(s, "cuda:1")
			l, err := c.Acquire(s, "cuda:1")
			c.must(err)
			ev, err := c.RecordEvent(l)
			c.must(err)
			c.must(c.Release(l))
			a1, err := c.Place(s, "pageable-host")
			c.must(err)
			a2, err := c.Place(s, "cuda:0")
			c.must(err)
			return s, []AdmissionID{a1.ID, a2.ID}, func() { c.must(c.ReapEvent(ev)) }
		},
		check: func(t *testing.T, err error) {
			wantInUse(t, err, InUseError{Handle: "s", Location: "cuda:1", PendingEventCount: 1})
		},
	}, {
		name: "nothing protected: the first in flight in location order",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			r := c.reg("r", 10, Replicable, "pinned-host")
			c.placed(r, "cuda:1")
			a, err := c.Copy(r, "cuda:1", "cuda:0") // cuda:0 entering, cuda:1 read
			c.must(err)
			return r, []AdmissionID{a.ID}, func() {}
		},
		check: func(t *testing.T, err error) {
			ue := wantUnavailable(t, err, "r", "cuda:0", UnavailableInFlight)
			eq(t, "detail", ue.Detail, "materialization is entering; a transition is in flight")
		},
	}, {
		name: "nothing protected: a copy's source first in location order",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			r := c.reg("r", 10, Replicable, "pinned-host")
			a, err := c.Copy(r, "pinned-host", "cuda:1")
			c.must(err)
			return r, []AdmissionID{a.ID}, func() {}
		},
		check: func(t *testing.T, err error) {
			ue := wantUnavailable(t, err, "r", "pinned-host", UnavailableInFlight)
			eq(t, "detail", ue.Detail, "materialization is the source of a copy in flight")
		},
	}, {
		name: "nothing protected: an exclusive value moving",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			w := c.reg("w", 10, Exclusive, "cuda:0")
			a, err := c.Move(w, "cuda:0", "pageable-host")
			c.must(err)
			return w, []AdmissionID{a.ID}, func() {}
		},
		check: func(t *testing.T, err error) {
			wantUnavailable(t, err, "w", "pageable-host", UnavailableInFlight)
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := std(t)
			h, adms, unprotect := tc.setup(c)
			err := c.refused("discard", func() error { _, err := c.Discard(h); return err })
			tc.check(t, err)
			// Settled and unprotected, the value can be discarded.
			for _, id := range adms {
				c.must2(c.Complete(id))
			}
			unprotect()
			c.must2(c.Discard(h))
		})
	}
}

func TestRule_DiscardedHandleIsUnavailableEverywhere(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.must2(c.Discard(w))
	checkDeadHandle(t, c, w, UnavailableDiscarded, ErrDiscarded, "discarded")
	// Request validation too.
	_, err := c.L.Decide(Request{Name: "q", Requirements: []Requirement{{Handle: w, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	wantUnavailable(t, err, "w", "", UnavailableDiscarded)
}

// TestRule_DiscardedNameIsFreeForANewHandle: a discarded value's name is
// free for a new registration, which gets a new handle (a new ID: IDs are
// never reused); Lookup returns the new handle; the retired handle still
// answers Unavailable (discarded) everywhere and never reaches the new
// value. (Issue 7: Discard used to keep the name taken.)
func TestRule_DiscardedNameIsFreeForANewHandle(t *testing.T) {
	c := std(t)
	old := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(old, "cuda:0")
	c.reg("other", 5, Exclusive, "cuda:1")
	c.must2(c.Discard(old))
	if h, ok := c.L.Lookup("w"); ok {
		t.Fatalf("Lookup of a discarded name found %+v", h)
	}
	// Same name, another size, mode and kind of registration.
	var h2 Handle
	eq(t, "register again: 1 version", c.delta(func() { h2 = c.regSrc("w", 30, Exclusive, "pinned-host") }), uint64(1))
	eq(t, "new handle", h2, Handle{Manager: "m1", ID: 3, Name: "w"})
	if h, ok := c.L.Lookup("w"); !ok || h != h2 {
		t.Fatalf("Lookup(w) = %+v %v, want the new handle %+v", h, ok, h2)
	}
	// The name is taken again while the new value lives.
	err := c.refused("register a live name", func() error {
		_, _, err := c.Register(ValueSpec{Name: "w", Bytes: 1, At: "cuda:0"})
		return err
	})
	wantInvalid(t, err, `duplicate value name "w"`)
	c.placed(h2, "cuda:0")
	// The old handle is dead everywhere, and none of its refusals touched
	// the new value (checkDeadHandle: refused, state unchanged).
	checkDeadHandle(t, c, old, UnavailableDiscarded, ErrDiscarded, "discarded")
	_, err = c.L.Decide(Request{Name: "q", Requirements: []Requirement{{Handle: old, Tiers: [][]string{{"cuda:1"}}}}}, 0)
	wantUnavailable(t, err, "w", "", UnavailableDiscarded)
	eq(t, "new value untouched", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	// The snapshot lists live values only: the new w, not the old one.
	v := c.val("w")
	eq(t, "Value(w)", []any{v.Handle, v.Bytes}, []any{h2, int64(30)})
	var listed []string
	for _, r := range c.Snapshot().Values {
		listed = append(listed, fmt.Sprintf("%s#%d", r.Handle.Name, r.Handle.ID))
	}
	eq(t, "snapshot values", listed, []string{"other#2", "w#3"})
	// The new handle works, and is retired in its turn; a third
	// registration gets a third id.
	l, err := c.Acquire(h2, "cuda:0")
	c.must(err)
	c.must(c.Release(l))
	c.must2(c.Discard(h2))
	checkDeadHandle(t, c, h2, UnavailableDiscarded, ErrDiscarded, "discarded")
	h3 := c.reg("w", 1, Replicable, "cuda:1")
	eq(t, "third handle", h3.ID, uint64(4))
	// A handle that pairs the old id with another name is discarded too:
	// ids, not names, identify values, and the runtime keeps nothing of a
	// retired value but that answer (SEMANTICS: O(1) memory), not even
	// its name. A live id with another name is unknown.
	err = c.refused("old id, other name", func() error {
		_, err := c.Place(Handle{Manager: "m1", ID: old.ID, Name: "other"}, "cuda:0")
		return err
	})
	wantUnavailable(t, err, "other", "", UnavailableDiscarded)
	err = c.refused("live id, other name", func() error {
		_, err := c.Place(Handle{Manager: "m1", ID: h3.ID, Name: "other"}, "cuda:0")
		return err
	})
	wantInvalid(t, err, `handle id 4 names "w", not "other"`)
}

func TestRule_ForeignHandleIsUnavailable(t *testing.T) {
	c := std(t)
	c.reg("w", 10, Replicable, "pageable-host")
	other := newChecked(t, Config{ManagerID: "m2", Locations: []LocationConfig{{Name: "pageable-host"}}})
	f := other.reg("w", 10, Replicable, "pageable-host")
	eq(t, "foreign handle looks local", f.ID, uint64(1))
	checkDeadHandle(t, c, f, UnavailableForeign, ErrForeign, "foreign")
}

// checkDeadHandle: every operation on h is an UnavailableError with the
// given reason, matching sentinel and saying what, and changes nothing.
func checkDeadHandle(t *testing.T, c *checked, h Handle, reason UnavailableReason, sentinel error, what string) {
	t.Helper()
	ops := map[string]func() error{
		"place":   func() error { _, err := c.Place(h, "cuda:0"); return err },
		"copy":    func() error { _, err := c.Copy(h, "pageable-host", "cuda:0"); return err },
		"move":    func() error { _, err := c.Move(h, "pageable-host", "cuda:0"); return err },
		"evict":   func() error { _, err := c.Evict(h, "pageable-host"); return err },
		"discard": func() error { _, err := c.Discard(h); return err },
		"acquire": func() error { _, err := c.Acquire(h, "pageable-host"); return err },
		"hold":    func() error { _, err := c.Hold(h, "pageable-host"); return err },
		"run reclaim": func() error {
			_, err := c.StartRun(Plan{Reclaim: []Action{{Handle: h, Location: "pageable-host"}}}, RunOptions{})
			return err
		},
		"run enter": func() error {
			_, err := c.StartRun(Plan{Enter: []Action{{Handle: h, Location: "cuda:0"}}}, RunOptions{Scope: "s"})
			return err
		},
	}
	for name, op := range ops {
		err := c.refused(name, op)
		wantUnavailable(t, err, h.Name, "", reason)
		if !errors.Is(err, sentinel) {
			t.Fatalf("%s: %v does not match %v", name, err, sentinel)
		}
		if !strings.Contains(err.Error(), what) {
			t.Fatalf("%s: %q does not say %q", name, err.Error(), what)
		}
	}
	ex := c.Explain(Plan{Enter: []Action{{Handle: h, Location: "cuda:0"}}})
	if ex.Feasible || !strings.Contains(ex.Reason, what) {
		t.Fatalf("explain: %+v", ex)
	}
}

func TestRule_UnknownHandleIsInvalidInput(t *testing.T) {
	c := std(t)
	c.reg("w", 10, Replicable, "pageable-host")
	for _, h := range []Handle{{Manager: "m1", ID: 99, Name: "ghost"}, {Manager: "m1"}, {Manager: "m1", ID: 1, Name: "not-w"}} {
		for name, op := range map[string]func() error{
			"place":   func() error { _, err := c.Place(h, "cuda:0"); return err },
			"evict":   func() error { _, err := c.Evict(h, "pageable-host"); return err },
			"acquire": func() error { _, err := c.Acquire(h, "pageable-host"); return err },
			"discard": func() error { _, err := c.Discard(h); return err },
			"run": func() error {
				_, err := c.StartRun(Plan{Enter: []Action{{Handle: h, Location: "cuda:0"}}}, RunOptions{})
				return err
			},
		} {
			err := c.refused(name, op)
			wantInvalid(t, err, fmt.Sprintf("%q", h.Name))
		}
	}
}

// ---- Protections -----------------------------------------------------------

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
	eq(t, "trace", tr[len(tr)-1], Transition{Version: v + 1, Kind: "reap_event", Handle: "w", Location: "cuda:0", Detail: fmt.Sprintf("event %d", ev)})
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
		msg  string
	}{
		{"lease", func() error { return c.Release(l) }, fmt.Sprintf("lease %d is not active (already released or never issued)", l)},
		{"hold", func() error { return c.Unhold(h) }, fmt.Sprintf("hold %d is not active (already released or never issued)", h)},
		{"reservation", func() error { return c.Unreserve("r") }, `reservation "r" is not active (already released or never made)`},
		{"admission complete", func() error { _, err := c.Complete(a.ID); return err }, fmt.Sprintf("admission %d is not pending", a.ID)},
		{"admission fail", func() error { return c.Fail(a.ID, nil) }, fmt.Sprintf("admission %d is not pending", a.ID)},
	}
	for _, tc := range cases {
		err := c.refused("double release of "+tc.name, tc.op)
		eq(t, tc.name, *as[*InvalidInputError](t, err), InvalidInputError{Message: tc.msg})
	}
}

// ---- State version and trace -----------------------------------------------

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
		{Version: 3, Kind: "acquire", Handle: "w", Location: "cuda:0", Detail: "lease 1"},
		{Version: 4, Kind: "release", Handle: "w", Location: "cuda:0", Detail: "lease 1"},
		{Version: 5, Kind: "reserve", Location: "cuda:1", Bytes: 5, Detail: "r"},
		{Version: 6, Kind: "admit", Handle: "w", Location: "cuda:1", Bytes: 30, Detail: "move from cuda:0"},
		{Version: 7, Kind: "complete", Handle: "w", Location: "cuda:1", Bytes: 30},
		{Version: 8, Kind: "remove", Handle: "w", Location: "cuda:0", Bytes: 30, Detail: "move source"},
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
		RemovalCounts: map[string]uint64{"discard": 1},
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

// ---- Plans, explain, scopes ------------------------------------------------

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
			PartialReport: Report{Transitions: []Transition{{Version: v, Kind: "remove", Handle: "a", Location: "cuda:0", Bytes: 60, Detail: "reclaim"}}},
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
		report := []Transition{{Version: v, Kind: "reserve", Location: "cuda:0", Bytes: 10, Detail: "q1"}}
		if scope == "" {
			wantPhase = PhaseExecute
		} else {
			// The release of q1 is a committed transition of the failed
			// entry: the partial report lists it.
			report = append(report, Transition{Version: v + 2, Kind: "unreserve", Location: "cuda:0", Bytes: 10, Detail: "q1"})
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
// its steps. (Issue 7: the report used to be copied before the cleanup.)
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

// TestRule_BadInputIsRefusedAndChangesNothing gathers the bad inputs the
// issue lists: each gives its typed error with exact fields, leaves the
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
			inv(fmt.Sprintf("lease %d is not active (already released or never issued)", lease))},
		{"double release of a hold", func() error { return c.Unhold(hold) },
			inv(fmt.Sprintf("hold %d is not active (already released or never issued)", hold))},
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

// ---- test harness ----------------------------------------------------------

// stdConfig is the configuration most rule tests use: an unlimited
// pageable-host, pinned-host with 1000 bytes, two GPUs with 100 bytes each,
// and a trace large enough to hold every transition of a test.
func stdConfig() Config {
	return Config{ManagerID: "m1", TraceCapacity: 1024, Locations: []LocationConfig{
		{Name: "pageable-host"},
		{Name: "pinned-host", HasBudget: true, BudgetBytes: 1000},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: 100},
		{Name: "cuda:1", HasBudget: true, BudgetBytes: 100},
	}}
}

// checked wraps a Ledger so that every call through it is audited:
//   - CheckInvariants must hold after the call;
//   - a refused call (non-nil error) must leave Version() and Snapshot()
//     exactly as they were (deep-equal) and add nothing to the trace;
//   - a committed call must put exactly its new versions, consecutive and in
//     order, at the end of the trace (as far as the ring holds them).
//
// Reads (Explain) must change nothing at all, error or not. Calls whose
// error is itself a committed result (Run.Next/Fail/Finish failing with a
// *PlanExecutionError after cleanup, FailDirect) skip the "refusal changes
// nothing" check and keep the others.
type checked struct {
	t testing.TB
	L *Ledger
}

func newChecked(t testing.TB, cfg Config) *checked {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c := &checked{t: t, L: l}
	c.invariants("New")
	return c
}

func std(t testing.TB) *checked { t.Helper(); return newChecked(t, stdConfig()) }

func (c *checked) invariants(op string) {
	c.t.Helper()
	if err := c.L.CheckInvariants(); err != nil {
		c.t.Fatalf("after %s: invariant broken: %v", op, err)
	}
}

type callKind int

const (
	mutation     callKind = iota // refusal must change nothing
	read                         // must change nothing, ever
	errCommitted                 // an error may be a committed result
)

// do runs f and audits it as described on checked.
func (c *checked) do(op string, kind callKind, f func() error) error {
	c.t.Helper()
	before := c.L.Snapshot()
	vb := c.L.Version()
	err := f()
	c.invariants(op)
	va := c.L.Version()
	if kind == read || (kind == mutation && err != nil) {
		if va != vb {
			c.t.Fatalf("%s (err=%v) changed the version %d → %d", op, err, vb, va)
		}
		if after := c.L.Snapshot(); !reflect.DeepEqual(before, after) {
			c.t.Fatalf("%s (err=%v) changed the state:\nbefore %+v\nafter  %+v", op, err, before, after)
		}
	}
	c.checkTraceTail(op, vb, va)
	return err
}

// checkTraceTail: the trace entries newer than vb are exactly the versions
// vb+1..va (the last cap of them when the ring is smaller), in order.
func (c *checked) checkTraceTail(op string, vb, va uint64) {
	c.t.Helper()
	tr := c.L.Trace()
	var got []uint64
	for _, x := range tr {
		if x.Version > vb {
			got = append(got, x.Version)
		}
	}
	var want []uint64
	capacity := uint64(c.L.trace.cap)
	first := vb + 1
	if capacity == 0 {
		first = va + 1
	} else if va >= capacity && va-capacity+1 > first {
		first = va - capacity + 1
	}
	for v := first; v <= va; v++ {
		want = append(want, v)
	}
	if !reflect.DeepEqual(got, want) {
		c.t.Fatalf("%s: trace versions after v%d are %v, want %v", op, vb, got, want)
	}
}

func (c *checked) Register(s ValueSpec) (h Handle, a Admission, err error) {
	c.t.Helper()
	err = c.do("Register "+s.Name, mutation, func() (e error) { h, a, e = c.L.Register(s); return })
	return
}
func (c *checked) Complete(id AdmissionID) (effs []Effect, err error) {
	c.t.Helper()
	err = c.do(fmt.Sprint("Complete ", id), mutation, func() (e error) { effs, e = c.L.Complete(id); return })
	return
}
func (c *checked) Fail(id AdmissionID, cause error) error {
	c.t.Helper()
	return c.do(fmt.Sprint("Fail ", id), mutation, func() error { return c.L.Fail(id, cause) })
}
func (c *checked) FailDirect(id AdmissionID, cause error) error {
	c.t.Helper()
	return c.do(fmt.Sprint("FailDirect ", id), errCommitted, func() error { return c.L.FailDirect(id, cause) })
}
func (c *checked) Place(h Handle, loc string) (a Admission, err error) {
	c.t.Helper()
	err = c.do("Place "+h.Name+" "+loc, mutation, func() (e error) { a, e = c.L.Place(h, loc); return })
	return
}
func (c *checked) Copy(h Handle, from, to string) (a Admission, err error) {
	c.t.Helper()
	err = c.do("Copy "+h.Name, mutation, func() (e error) { a, e = c.L.Copy(h, from, to); return })
	return
}
func (c *checked) Move(h Handle, from, to string) (a Admission, err error) {
	c.t.Helper()
	err = c.do("Move "+h.Name, mutation, func() (e error) { a, e = c.L.Move(h, from, to); return })
	return
}
func (c *checked) Evict(h Handle, loc string) (effs []Effect, err error) {
	c.t.Helper()
	err = c.do("Evict "+h.Name+" "+loc, mutation, func() (e error) { effs, e = c.L.Evict(h, loc); return })
	return
}
func (c *checked) Discard(h Handle) (effs []Effect, err error) {
	c.t.Helper()
	err = c.do("Discard "+h.Name, mutation, func() (e error) { effs, e = c.L.Discard(h); return })
	return
}
func (c *checked) Acquire(h Handle, loc string) (id LeaseID, err error) {
	c.t.Helper()
	err = c.do("Acquire "+h.Name+" "+loc, mutation, func() (e error) { id, e = c.L.Acquire(h, loc); return })
	return
}
func (c *checked) Release(id LeaseID) error {
	c.t.Helper()
	return c.do(fmt.Sprint("Release ", id), mutation, func() error { return c.L.Release(id) })
}
func (c *checked) RecordEvent(id LeaseID) (ev EventID, err error) {
	c.t.Helper()
	err = c.do(fmt.Sprint("RecordEvent ", id), mutation, func() (e error) { ev, e = c.L.RecordEvent(id); return })
	return
}
func (c *checked) ReapEvent(id EventID) error {
	c.t.Helper()
	return c.do(fmt.Sprint("ReapEvent ", id), mutation, func() error { return c.L.ReapEvent(id) })
}
func (c *checked) Hold(h Handle, loc string) (id HoldID, err error) {
	c.t.Helper()
	err = c.do("Hold "+h.Name+" "+loc, mutation, func() (e error) { id, e = c.L.Hold(h, loc); return })
	return
}
func (c *checked) Unhold(id HoldID) error {
	c.t.Helper()
	return c.do(fmt.Sprint("Unhold ", id), mutation, func() error { return c.L.Unhold(id) })
}
func (c *checked) Reserve(loc, name string, bytes int64) error {
	c.t.Helper()
	return c.do("Reserve "+name, mutation, func() error { return c.L.Reserve(loc, name, bytes) })
}
func (c *checked) ReserveOwned(loc, name string, bytes int64, owner string) error {
	c.t.Helper()
	return c.do("ReserveOwned "+name, mutation, func() error { return c.L.ReserveOwned(loc, name, bytes, owner) })
}
func (c *checked) Unreserve(name string) error {
	c.t.Helper()
	return c.do("Unreserve "+name, mutation, func() error { return c.L.Unreserve(name) })
}
func (c *checked) UnreserveOwned(name, owner string) error {
	c.t.Helper()
	return c.do("UnreserveOwned "+name, mutation, func() error { return c.L.UnreserveOwned(name, owner) })
}
func (c *checked) Explain(p Plan) (ex Explanation) {
	c.t.Helper()
	_ = c.do("Explain", read, func() error { ex = c.L.Explain(p); return nil })
	return
}
func (c *checked) Snapshot() (s Snapshot) {
	c.t.Helper()
	_ = c.do("Snapshot", read, func() error { s = c.L.Snapshot(); return nil })
	return
}
func (c *checked) StartRun(p Plan, o RunOptions) (*checkedRun, error) {
	c.t.Helper()
	var r *Run
	err := c.do("StartRun", mutation, func() (e error) { r, e = c.L.StartRun(p, o); return })
	if err != nil {
		return nil, err
	}
	return &checkedRun{c: c, R: r}, nil
}

// checkedRun audits a Run's steps like checked audits the ledger.
type checkedRun struct {
	c *checked
	R *Run
}

func (r *checkedRun) Next() (s Step, ok bool, err error) {
	r.c.t.Helper()
	err = r.c.do("Run.Next", errCommitted, func() (e error) { s, ok, e = r.R.Next(); return })
	return
}
func (r *checkedRun) Complete() (effs []Effect, err error) {
	r.c.t.Helper()
	err = r.c.do("Run.Complete", mutation, func() (e error) { effs, e = r.R.Complete(); return })
	return
}
func (r *checkedRun) Fail(cause error) error {
	r.c.t.Helper()
	return r.c.do("Run.Fail", errCommitted, func() error { return r.R.Fail(cause) })
}
func (r *checkedRun) Finish() (rep Report, leases []LeaseID, err error) {
	r.c.t.Helper()
	err = r.c.do("Run.Finish", errCommitted, func() (e error) { rep, leases, e = r.R.Finish(); return })
	return
}

// all admits and completes every step, then finishes the run. It returns
// the first error (a *PlanExecutionError) with the steps admitted so far.
func (r *checkedRun) all() (Report, []LeaseID, []Step, error) {
	r.c.t.Helper()
	var steps []Step
	for {
		s, ok, err := r.Next()
		if err != nil {
			return Report{}, nil, steps, err
		}
		if !ok {
			break
		}
		steps = append(steps, s)
		if s.Admission.Pending {
			if _, err := r.Complete(); err != nil {
				r.c.t.Fatalf("Run.Complete: %v", err)
			}
		}
	}
	rep, leases, err := r.Finish()
	return rep, leases, steps, err
}

// ---- conveniences ----------------------------------------------------------

func (c *checked) must(err error) {
	c.t.Helper()
	if err != nil {
		c.t.Fatalf("unexpected error: %v", err)
	}
}

// reg registers name at loc and completes the initialization.
func (c *checked) reg(name string, bytes int64, mode ReplicaMode, at string) Handle {
	c.t.Helper()
	h, a, err := c.Register(ValueSpec{Name: name, Bytes: bytes, Mode: mode, At: at})
	c.must(err)
	if !a.Pending {
		c.t.Fatalf("register %s at %s: admission not pending", name, at)
	}
	_, err = c.Complete(a.ID)
	c.must(err)
	return h
}

// regSrc registers name with a source.
func (c *checked) regSrc(name string, bytes int64, mode ReplicaMode, source string) Handle {
	c.t.Helper()
	h, _, err := c.Register(ValueSpec{Name: name, Bytes: bytes, Mode: mode, Source: source})
	c.must(err)
	return h
}

// placed places h at loc and completes the transfer; it returns the
// admission's effects and the completion's effects.
func (c *checked) placed(h Handle, loc string) ([]Effect, []Effect) {
	c.t.Helper()
	a, err := c.Place(h, loc)
	c.must(err)
	if !a.Pending {
		c.t.Fatalf("place %s at %s: nothing pending (%+v)", h.Name, loc, a)
	}
	done, err := c.Complete(a.ID)
	c.must(err)
	return a.Effects, done
}

// delta runs f and returns how many versions it committed.
func (c *checked) delta(f func()) uint64 {
	c.t.Helper()
	v := c.L.Version()
	f()
	return c.L.Version() - v
}

func (c *checked) loc(name string) LocationRecord {
	c.t.Helper()
	s := c.L.Snapshot()
	r, ok := s.Location(name)
	if !ok {
		c.t.Fatalf("no location %s in snapshot", name)
	}
	return r
}

// figures returns used, reserved and peak of a location.
func (c *checked) figures(name string) [3]int64 {
	c.t.Helper()
	r := c.loc(name)
	return [3]int64{r.UsedBytes, r.ReservedBytes, r.PeakBytes}
}

// gone checks that no live value named name is in the snapshot.
func (c *checked) gone(name string) {
	c.t.Helper()
	s := c.L.Snapshot()
	if r, ok := s.Value(name); ok {
		c.t.Fatalf("value %s is still in the snapshot: %+v", name, r)
	}
}

func (c *checked) val(name string) ValueRecord {
	c.t.Helper()
	s := c.L.Snapshot()
	r, ok := s.Value(name)
	if !ok {
		c.t.Fatalf("no value %s in snapshot", name)
	}
	return r
}

// mats renders a value's materializations as "loc:state:uses/holds/pending".
func (c *checked) mats(name string) []string {
	c.t.Helper()
	var out []string
	for _, m := range c.val(name).Materializations {
		out = append(out, fmt.Sprintf("%s:%s:%d/%d/%d", m.Location, m.State, m.UseCount, m.HoldCount, m.PendingEventCount))
	}
	return out
}

// refused runs op (through the checked ledger), requires an error, and
// checks explicitly that the version and the snapshot are unchanged.
func (c *checked) refused(what string, op func() error) error {
	c.t.Helper()
	before := c.L.Snapshot()
	v := c.L.Version()
	err := op()
	if err == nil {
		c.t.Fatalf("%s: succeeded, want an error", what)
	}
	if c.L.Version() != v {
		c.t.Fatalf("%s: refused with %v but the version moved %d → %d", what, err, v, c.L.Version())
	}
	if after := c.L.Snapshot(); !reflect.DeepEqual(before, after) {
		c.t.Fatalf("%s: refused with %v but the snapshot changed", what, err)
	}
	return err
}

// as extracts the typed error T from err or fails the test.
func as[T error](t testing.TB, err error) T {
	t.Helper()
	var target T
	if !errors.As(err, &target) {
		t.Fatalf("error %v (%T), want %T", err, err, target)
	}
	return target
}

func wantBudget(t testing.TB, err error, want BudgetError) {
	t.Helper()
	if got := as[*BudgetError](t, err); *got != want {
		t.Fatalf("BudgetError %+v, want %+v", *got, want)
	}
}

func wantInUse(t testing.TB, err error, want InUseError) {
	t.Helper()
	if got := as[*InUseError](t, err); *got != want {
		t.Fatalf("InUseError %+v, want %+v", *got, want)
	}
}

// wantUnavailable checks Handle, Location and Reason exactly.
func wantUnavailable(t testing.TB, err error, handle, loc string, reason UnavailableReason) *UnavailableError {
	t.Helper()
	got := as[*UnavailableError](t, err)
	if got.Handle != handle || got.Location != loc || got.Reason != reason {
		t.Fatalf("UnavailableError %+v, want handle %q location %q reason %d", *got, handle, loc, reason)
	}
	return got
}

// wantInvalid checks an *InvalidInputError whose message contains every
// fragment.
func wantInvalid(t testing.TB, err error, fragments ...string) {
	t.Helper()
	got := as[*InvalidInputError](t, err)
	if !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("%v does not match ErrInvalidInput", err)
	}
	for _, f := range fragments {
		if !strings.Contains(got.Message, f) {
			t.Fatalf("invalid input %q does not mention %q", got.Message, f)
		}
	}
}

func wantPlanError(t testing.TB, err error, fragments ...string) {
	t.Helper()
	got := as[*PlanError](t, err)
	if !errors.Is(err, ErrPlan) {
		t.Fatalf("%v does not match ErrPlan", err)
	}
	for _, f := range fragments {
		if !strings.Contains(got.Reason, f) {
			t.Fatalf("plan error %q does not mention %q", got.Reason, f)
		}
	}
}

func kinds(ts []Transition) []string {
	out := make([]string, len(ts))
	for i, x := range ts {
		out[i] = x.Kind
		if x.Handle != "" {
			out[i] += " " + x.Handle
		}
		if x.Location != "" {
			out[i] += "@" + x.Location
		}
	}
	return out
}

func eq[T any](t testing.TB, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s = %#v, want %#v", what, got, want)
	}
}

// must2 accepts a (value, error) pair and fails on the error.
func (c *checked) must2(_ any, err error) {
	c.t.Helper()
	c.must(err)
}

// must3 accepts a (value, value, error) triple and fails on the error.
func (c *checked) must3(_, _ any, err error) {
	c.t.Helper()
	c.must(err)
}
