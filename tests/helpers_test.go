// Package tests holds the integration, fault and stress tests of the
// residency runtime. They drive the public API of package system (and, where
// the runtime cannot reach a state on its own, the ledger of package budget)
// and check exact structured errors, data bytes and ledger invariants on
// snapshots.
package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"go.uber.org/goleak"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/internal/testhooks"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start starts a runtime and closes it when the test ends (a test that
// closes it itself makes that close a no-op).
func start(t *testing.T, opts system.Options) *system.System {
	t.Helper()
	sys, err := startSoft(t, context.Background(), opts)
	must(t, err, "start")
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	return sys
}

// startHooked is start with test knobs in the runtime's actors (package
// internal/testhooks).
func startHooked(t *testing.T, k testhooks.Knobs, opts system.Options) *system.System {
	t.Helper()
	sys, err := startSoft(t, context.Background(), testhooks.With(opts, k))
	must(t, err, "start")
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	return sys
}

// startSoft is system.Start on the soft backend behind the fault injector
// (testsys.Soft, closed when the test ends) when opts names no backend.
func startSoft(tb testing.TB, ctx context.Context, opts system.Options) (*system.System, error) {
	tb.Helper()
	if opts.Backend == nil {
		opts.Backend = testsys.Soft(tb, opts.Locations)
	}
	return system.Start(ctx, opts)
}

// fourLocations is the usual configuration: every location kind, the
// devices with strict budgets.
func fourLocations(host, pinned, dev int64) []system.LocationConfig {
	lim := func(name string, b int64) system.LocationConfig {
		if b <= 0 {
			return system.NoLimit(name)
		}
		return system.Limit(name, b)
	}
	return []system.LocationConfig{lim("pageable-host", host), lim("pinned-host", pinned), lim("cuda:0", dev), lim("cuda:1", dev)}
}

func snapshot(t *testing.T, sys *system.System) system.Snapshot {
	t.Helper()
	s, err := sys.Snapshot(context.Background())
	must(t, err, "snapshot")
	must(t, checkInvariants(s), "invariants")
	return s
}

func register(t *testing.T, sys *system.System, v system.Value) system.Handle {
	t.Helper()
	h, err := sys.Register(context.Background(), v)
	must(t, err, "register "+v.Name)
	return h
}

// pattern returns n bytes that depend on seed and on the position, so that
// a copy from the wrong place or a torn copy is visible.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i/251) ^ seed
	}
	return b
}

// loaderOf returns a loader that produces data.
func loaderOf(data []byte) func(context.Context, []byte) error {
	return func(_ context.Context, dst []byte) error {
		if len(dst) != len(data) {
			return fmt.Errorf("loader: destination has %d bytes, want %d", len(dst), len(data))
		}
		copy(dst, data)
		return nil
	}
}

// checkInvariants verifies, on one snapshot, the accounting rules every
// state must satisfy: at every location used + reserved ≤ budget (when it
// has one), used = the charges of its materializations + its temporary
// reconstruction bytes, reserved = the sum of its reservations, no figure or
// count negative, peak ≥ used + reserved; every charge is the value's
// fixed size.
func checkInvariants(s system.Snapshot) error {
	charged := map[string]int64{}
	for _, v := range s.Values {
		seen := map[string]bool{}
		for _, m := range v.Materializations {
			if seen[m.Location] {
				return fmt.Errorf("v%d: value %s has two materializations at %s", s.StateVersion, v.Handle.Name, m.Location)
			}
			seen[m.Location] = true
			if m.ChargedBytes != v.Bytes {
				return fmt.Errorf("v%d: value %s at %s charged %d, value has %d bytes", s.StateVersion, v.Handle.Name, m.Location, m.ChargedBytes, v.Bytes)
			}
			if m.UseCount < 0 || m.HoldCount < 0 || m.PendingEventCount < 0 {
				return fmt.Errorf("v%d: value %s at %s has a negative count: %+v", s.StateVersion, v.Handle.Name, m.Location, m)
			}
			charged[m.Location] += m.ChargedBytes
		}
	}
	for _, l := range s.Locations {
		if l.UsedBytes < 0 || l.ReservedBytes < 0 || l.TemporaryBytes < 0 {
			return fmt.Errorf("v%d: %s has a negative figure: %+v", s.StateVersion, l.Location, l)
		}
		if l.HasBudget && l.UsedBytes+l.ReservedBytes > l.BudgetBytes {
			return fmt.Errorf("v%d: %s over budget: used %d + reserved %d > budget %d", s.StateVersion, l.Location, l.UsedBytes, l.ReservedBytes, l.BudgetBytes)
		}
		if want := charged[l.Location] + l.TemporaryBytes; l.UsedBytes != want {
			return fmt.Errorf("v%d: %s used %d, but materializations charge %d + temporary %d", s.StateVersion, l.Location, l.UsedBytes, charged[l.Location], l.TemporaryBytes)
		}
		var r int64
		for _, x := range l.Reservations {
			if x.Bytes <= 0 {
				return fmt.Errorf("v%d: %s reservation %q of %d bytes", s.StateVersion, l.Location, x.Name, x.Bytes)
			}
			r += x.Bytes
		}
		if l.ReservedBytes != r {
			return fmt.Errorf("v%d: %s reserved %d, reservations sum to %d", s.StateVersion, l.Location, l.ReservedBytes, r)
		}
		if l.PeakBytes < l.UsedBytes+l.ReservedBytes {
			return fmt.Errorf("v%d: %s peak %d below used+reserved %d", s.StateVersion, l.Location, l.PeakBytes, l.UsedBytes+l.ReservedBytes)
		}
	}
	return nil
}

// mats returns the locations of a value's materializations in the
// snapshot, in location order, with their states.
func mats(t *testing.T, s system.Snapshot, name string) map[string]system.MaterializationRecord {
	t.Helper()
	v, ok := s.Value(name)
	if !ok {
		t.Fatalf("value %s is not in the snapshot", name)
	}
	out := map[string]system.MaterializationRecord{}
	for _, m := range v.Materializations {
		out[m.Location] = m
	}
	return out
}

func loc(t *testing.T, s system.Snapshot, name string) budget.LocationRecord {
	t.Helper()
	r, ok := s.Location(name)
	if !ok {
		t.Fatalf("location %s is not in the snapshot", name)
	}
	return r
}

// kinds lists the kinds of a report's transitions.
func kinds(r system.Report) []string {
	out := make([]string, len(r.Transitions))
	for i, x := range r.Transitions {
		out[i] = x.Kind
	}
	return out
}

// requireConsecutive checks that a report's versions are consecutive,
// starting right after from.
func requireConsecutive(t *testing.T, r system.Report, from uint64) {
	t.Helper()
	for i, x := range r.Transitions {
		if want := from + uint64(i) + 1; x.Version != want {
			t.Fatalf("transition %d (%s) has version %d, want %d; report %v", i, x, x.Version, want, r.Transitions)
		}
	}
}

func requireBytes(t *testing.T, want, got []byte, what string) {
	t.Helper()
	if !bytes.Equal(want, got) {
		t.Fatalf("%s: %d bytes differ from the %d expected", what, len(got), len(want))
	}
}

// errorType names the typed error err is, or "" for an untyped one.
func errorType(err error) string {
	var (
		be  *system.BudgetError
		pe  *system.PlanError
		sle *system.SearchLimitError
		se  *system.StaleStateError
		iu  *system.InUseError
		ue  *system.UnavailableError
		pee *system.PlanExecutionError
		ii  *system.InvalidInputError
		wa  *system.WaitersAheadError
	)
	// Order matters only for wrapping types; these never wrap each other
	// except PlanExecutionError, which wraps its cause: check it first.
	switch {
	case errors.As(err, &pee):
		return "PlanExecutionError"
	case errors.As(err, &be):
		return "BudgetError"
	case errors.As(err, &pe):
		return "PlanError"
	case errors.As(err, &sle):
		return "SearchLimitError"
	case errors.As(err, &se):
		return "StaleStateError"
	case errors.As(err, &iu):
		return "InUseError"
	case errors.As(err, &ue):
		return "UnavailableError"
	case errors.As(err, &ii):
		return "InvalidInputError"
	case errors.As(err, &wa):
		return "WaitersAheadError"
	}
	return ""
}

// must fails the test at once on err.
func must(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// equal fails the test when got differs from want (reflect.DeepEqual).
func equal[T any](t testing.TB, want, got T, what string) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("%s:\n got: %+v\nwant: %+v", what, got, want)
	}
}

// as fails the test unless err is (or wraps) a *E, and returns it.
func as[E error](t testing.TB, err error, what string) E {
	t.Helper()
	var target E
	if !errors.As(err, &target) {
		t.Fatalf("%s: want a %T, got %T: %v", what, target, err, err)
	}
	return target
}

// unchanged fails the test when the runtime's state differs from before.
func unchanged(t *testing.T, sys *system.System, before system.Snapshot, what string) {
	t.Helper()
	equal(t, before, snapshot(t, sys), what+": state after the refused call")
}
