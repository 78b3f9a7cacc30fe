package budget

// Rule tests: one or more tests for every rule of docs/semantics.md that
// concerns the ledger. Each test fails if its rule is broken. Every
// call goes through the checked harness (this file): invariants
// after every transition; a refused call must leave Version() and
// Snapshot() exactly as they were; the trace must hold every committed
// version.
//
// The tests are in one file per section of docs/semantics.md, each
// opening with its part of the rule → test index:
//
//   rules_locations_test.go       Locations and budgets
//   rules_values_test.go          Values and materializations
//   rules_transfers_test.go       Transfers and their charges
//   rules_removal_test.go         Evict and discard
//   rules_protections_test.go     Protections (reservations included)
//   rules_versions_test.go        State versions
//   rules_trace_snapshot_test.go  Trace and snapshot
//   rules_plans_test.go           Plans, explain
//   rules_scopes_test.go          Scopes, execute, direct operations
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
	"reflect"
	"strings"
	"testing"
)

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
func (r *checkedRun) FailStep(cause error) (effs []Effect, err error) {
	r.c.t.Helper()
	err = r.c.do("Run.FailStep", errCommitted, func() (e error) { effs, e = r.R.FailStep(cause); return })
	return
}
func (r *checkedRun) CompleteDropped(cause error) error {
	r.c.t.Helper()
	return r.c.do("Run.CompleteDropped", mutation, func() error { return r.R.CompleteDropped(cause) })
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
