package tests

// The edge cases and the order of checks of docs/semantics.md ("Resolved
// details"), through the public API of package system on the soft backend
// and its fault injector. The ledger side of each is tested in package
// budget (edgecases_test.go, rules_test.go and the scripts).

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

var edgeLocations = []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}

// edgeStart starts a runtime on a soft backend that the test owns, so that
// the backend's physical bytes can be read after Close: every test here
// ends by checking that every location holds nothing (edgeAllFreed).
func edgeStart(t *testing.T, wrap func(*soft.Backend) cuda.Backend) (*system.System, cuda.Backend) {
	t.Helper()
	sb, err := soft.New(soft.Config{Locations: edgeLocations})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Close() }) // runs after the runtime's Close
	var inner cuda.Backend = sb
	if wrap != nil {
		inner = wrap(sb)
	}
	b := faulty.Wrap(inner, soft.ErrorPrefix) // the tests arm faults
	return start(t, system.Options{Locations: fourLocations(0, 1000, 1000), Backend: b}), b
}

// edgeAllFreed closes the runtime and checks that the ledger and the
// device are both back to zero bytes everywhere.
func edgeAllFreed(t *testing.T, sys *system.System, b cuda.Backend) {
	t.Helper()
	err := sys.Close(context.Background())
	var oe *system.OutstandingError
	if err != nil && !errors.As(err, &oe) {
		require.NoError(t, err, "close")
	}
	final, err := sys.Snapshot(context.Background())
	require.NoError(t, err)
	for _, l := range final.Locations {
		assert.Zero(t, l.UsedBytes+l.ReservedBytes+l.TemporaryBytes, "%s after close: %+v", l.Location, l)
		mi, err := b.MemInfo(l.Location)
		require.NoError(t, err)
		assert.Zero(t, mi.UsedBytes, "%s: the device still holds bytes after close", l.Location)
	}
}

// edgeCharges is each location's used, reserved and temporary bytes.
func edgeCharges(s system.Snapshot) map[string][3]int64 {
	out := map[string][3]int64{}
	for _, l := range s.Locations {
		out[l.Location] = [3]int64{l.UsedBytes, l.ReservedBytes, l.TemporaryBytes}
	}
	return out
}

// move(h, L, L) with h resident at L is a no-op: no version, nothing
// removed, no fault consumed — protected or not.
func TestEdgeMoveOntoItselfIsANoOp(t *testing.T) {
	ctx := context.Background()
	sys, b := edgeStart(t, nil)
	data := pattern(100, 11)
	w := register(t, sys, system.Value{Name: "w", Bytes: 100, At: "cuda:0", Data: data})
	r := register(t, sys, system.Value{Name: "r", Bytes: 100, Mode: system.Replicable, At: "pinned-host", Data: data})
	must(t, sys.Copy(ctx, r, "pinned-host", "cuda:1"), "copy r")
	testsys.Faults(sys).Arm(cuda.FaultAlloc, "cuda:0")
	testsys.Faults(sys).Arm(cuda.FaultCopy, "cuda:1")

	moveOntoItself := func(what string, h system.Handle, loc string) {
		t.Helper()
		before := snapshot(t, sys)
		require.NoError(t, sys.Move(ctx, h, loc, loc), what)
		unchanged(t, sys, before, what)
	}
	moveOntoItself("w unprotected", w, "cuda:0")
	moveOntoItself("r unprotected", r, "cuda:1")
	lease, err := sys.Acquire(ctx, w, "cuda:0")
	must(t, err, "acquire w")
	hold, err := sys.Hold(ctx, r, "cuda:1")
	must(t, err, "hold r")
	moveOntoItself("w leased", w, "cuda:0")
	moveOntoItself("r held", r, "cuda:1")
	// As a plan step too (enter from L to L).
	before := snapshot(t, sys)
	rep, err := sys.Execute(ctx, system.Plan{Enter: []system.Action{{Handle: w, Location: "cuda:0", From: "cuda:0"}, {Handle: r, Location: "cuda:1", From: "cuda:1"}}})
	require.NoError(t, err)
	assert.Empty(t, rep.Transitions)
	unchanged(t, sys, before, "execute of enters from L to L")

	assert.Equal(t, 1, testsys.Faults(sys).Armed(cuda.FaultAlloc, "cuda:0"), "a no-op consumes no fault")
	assert.Equal(t, 1, testsys.Faults(sys).Armed(cuda.FaultCopy, "cuda:1"), "a no-op consumes no fault")
	testsys.Faults(sys).Reset()
	got, err := lease.Read(ctx)
	require.NoError(t, err)
	requireBytes(t, data, got, "w after the no-op moves")
	must(t, lease.Release(ctx), "release")
	must(t, hold.Release(ctx), "unhold")
	// Not resident there: Unavailable, nothing changes.
	before = snapshot(t, sys)
	ue := as[*system.UnavailableError](t, sys.Move(ctx, w, "cuda:1", "cuda:1"), "move from an absent endpoint")
	assert.Equal(t, budget.UnavailableEndpoint, ue.Reason)
	unchanged(t, sys, before, "refused move")
	edgeAllFreed(t, sys, b)
}

// register … at L with an alloc@L fault: PlanExecutionError (phase
// execute, failed action (h, L), index 0) after 2 versions; the handle is
// retired, its name free, and it is absent from snapshots.
func TestEdgeRegisterAtAllocFaultRetiresTheHandle(t *testing.T) {
	ctx := context.Background()
	sys, b := edgeStart(t, nil)
	register(t, sys, system.Value{Name: "other", Bytes: 10, At: "cuda:0"})
	before := snapshot(t, sys)
	testsys.Faults(sys).Arm(cuda.FaultAlloc, "cuda:0")
	_, err := sys.Register(ctx, system.Value{Name: "n", Bytes: 100, Mode: system.Replicable, At: "cuda:0", Data: pattern(100, 1)})
	pe := as[*system.PlanExecutionError](t, err, "register with an alloc fault")
	require.NotNil(t, pe.FailedAction)
	retired := pe.FailedAction.Handle
	assert.Equal(t, system.Handle{Manager: sys.ManagerID(), ID: retired.ID, Name: "n"}, retired)
	assert.Equal(t, budget.PhaseExecute, pe.Phase)
	assert.Equal(t, system.Action{Handle: retired, Location: "cuda:0"}, *pe.FailedAction)
	assert.Equal(t, []int{0, -1}, []int{pe.FailedActionIndex, pe.FailedReservationIndex})
	assert.Nil(t, pe.FailedReservation)
	assert.Equal(t, []string{"admit", "fail"}, kinds(pe.PartialReport))
	requireConsecutive(t, pe.PartialReport, before.StateVersion)
	ife := as[*cuda.InjectedFaultError](t, err, "cause")
	assert.Equal(t, cuda.InjectedFaultError{Kind: cuda.FaultAlloc, Location: "cuda:0", Backend: soft.ErrorPrefix}, *ife)
	assert.Zero(t, testsys.Faults(sys).Armed(cuda.FaultAlloc, "cuda:0"), "fault consumed")

	after := snapshot(t, sys)
	assert.Equal(t, before.StateVersion+2, after.StateVersion, "2 versions: admit, fail")
	_, listed := after.Value("n")
	assert.False(t, listed, "a failed registration is absent from snapshots")
	assert.Equal(t, before.Values, after.Values)
	assert.Equal(t, edgeCharges(before), edgeCharges(after), "every charge is back")
	// Retired everywhere.
	for what, err := range map[string]error{
		"place":   sys.Place(ctx, retired, "cuda:1"),
		"evict":   sys.Evict(ctx, retired, "cuda:0"),
		"discard": sys.Discard(ctx, retired),
		"execute": func() error {
			_, err := sys.Execute(ctx, system.Plan{Enter: []system.Action{{Handle: retired, Location: "cuda:1"}}})
			return err
		}(),
		"acquire": func() error { _, err := sys.Acquire(ctx, retired, "cuda:0"); return err }(),
	} {
		assert.ErrorIs(t, err, system.ErrDiscarded, what)
	}
	unchanged(t, sys, after, "calls on the retired handle")
	// The name is free; the new registration gets a new handle.
	_, err = sys.Lookup(ctx, "n")
	assert.ErrorIs(t, err, system.ErrInvalidInput, "lookup of the freed name")
	data := pattern(100, 2)
	h := register(t, sys, system.Value{Name: "n", Bytes: 100, At: "cuda:0", Data: data})
	assert.NotEqual(t, retired.ID, h.ID)
	looked, err := sys.Lookup(ctx, "n")
	require.NoError(t, err)
	assert.Equal(t, h, looked)
	got, err := sys.Read(ctx, h, "cuda:0")
	require.NoError(t, err)
	requireBytes(t, data, got, "n")
	edgeAllFreed(t, sys, b)
}

// A reconstruction into L whose source location S ≠ L loads into a
// temporary buffer at S, then copies into L. The faults it can meet, in
// order: alloc@L, alloc@S, reconstruct@L, copy@L. Each fails the place
// with a PlanExecutionError and gives every charge back; armed together,
// they fail four places in that order, and the fifth succeeds.
func TestEdgeReconstructionFaultsInOrder(t *testing.T) {
	ctx := context.Background()
	const L, S = "cuda:0", "pinned-host"
	faults := []cuda.InjectedFaultError{
		{Kind: cuda.FaultAlloc, Location: L, Backend: soft.ErrorPrefix},
		{Kind: cuda.FaultAlloc, Location: S, Backend: soft.ErrorPrefix},
		{Kind: cuda.FaultReconstruct, Location: L, Backend: soft.ErrorPrefix},
		{Kind: cuda.FaultCopy, Location: L, Backend: soft.ErrorPrefix},
	}
	data := pattern(300, 5)
	var loads atomic.Int64
	loader := func(c context.Context, dst []byte) error { loads.Add(1); return loaderOf(data)(c, dst) }

	placeFails := func(t *testing.T, sys *system.System, s system.Handle, want cuda.InjectedFaultError) {
		t.Helper()
		before := snapshot(t, sys)
		err := sys.Place(ctx, s, L)
		pe := as[*system.PlanExecutionError](t, err, "place with "+want.Error())
		assert.Equal(t, budget.PhaseExecute, pe.Phase)
		assert.Equal(t, &system.Action{Handle: s, Location: L}, pe.FailedAction)
		assert.Equal(t, []int{0, -1}, []int{pe.FailedActionIndex, pe.FailedReservationIndex})
		assert.Equal(t, []string{"admit", "fail"}, kinds(pe.PartialReport))
		requireConsecutive(t, pe.PartialReport, before.StateVersion)
		ife := as[*cuda.InjectedFaultError](t, err, "cause")
		assert.Equal(t, want, *ife, "the fault met")
		after := snapshot(t, sys)
		assert.Equal(t, before.StateVersion+2, after.StateVersion)
		assert.Equal(t, edgeCharges(before), edgeCharges(after), "every charge is back after "+want.Error())
		assert.Empty(t, mats(t, after, "s"), "no materialization of s after "+want.Error())
	}
	newValue := func(t *testing.T, sys *system.System) system.Handle {
		return register(t, sys, system.Value{Name: "s", Bytes: 300, Source: S, Loader: loader})
	}

	for _, f := range faults {
		t.Run("alone "+f.Error(), func(t *testing.T) {
			sys, b := edgeStart(t, nil)
			s := newValue(t, sys)
			testsys.Faults(sys).Arm(f.Kind, f.Location)
			placeFails(t, sys, s, f)
			assert.Zero(t, testsys.Faults(sys).Armed(f.Kind, f.Location), "fault consumed")
			must(t, sys.Place(ctx, s, L), "place once the fault is spent")
			got, err := sys.Read(ctx, s, L)
			require.NoError(t, err)
			requireBytes(t, data, got, "s")
			edgeAllFreed(t, sys, b)
		})
	}
	t.Run("all armed: met in order", func(t *testing.T) {
		sys, b := edgeStart(t, nil)
		s := newValue(t, sys)
		for _, f := range faults {
			testsys.Faults(sys).Arm(f.Kind, f.Location)
		}
		loads.Store(0)
		for _, f := range faults {
			placeFails(t, sys, s, f)
		}
		// The loader ran only where the load got that far: the copy fault.
		assert.Equal(t, int64(1), loads.Load(), "loads before the copy fault")
		must(t, sys.Place(ctx, s, L), "the fifth place")
		got, err := sys.Read(ctx, s, L)
		require.NoError(t, err)
		requireBytes(t, data, got, "s")
		edgeAllFreed(t, sys, b)
	})
}

// gatedBackend holds the next allocation at one location until the test
// opens the gate, so that a transfer stays in flight.
type gatedBackend struct {
	*soft.Backend
	loc     string
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
	opened  sync.Once
}

// open lets the held allocation go on (idempotent).
func (b *gatedBackend) open() { b.opened.Do(func() { close(b.gate) }) }

func (b *gatedBackend) Allocate(ctx context.Context, loc string, n int64) (cuda.Buffer, error) {
	if loc == b.loc && b.armed.CompareAndSwap(true, false) {
		b.entered <- struct{}{}
		<-b.gate
	}
	return b.Backend.Allocate(ctx, loc, n)
}

// discard reports the first protected materialization in location order,
// even while an earlier one (in location order) is in flight; with nothing
// protected, the one in flight.
func TestEdgeDiscardReportsProtectionBeforeInFlight(t *testing.T) {
	ctx := context.Background()
	var gb *gatedBackend
	sys, b := edgeStart(t, func(sb *soft.Backend) cuda.Backend {
		gb = &gatedBackend{Backend: sb, loc: "pinned-host", entered: make(chan struct{}), gate: make(chan struct{})}
		return gb
	})
	t.Cleanup(gb.open) // before the runtime's Close, which waits for the transfer, even when the test fails
	r := register(t, sys, system.Value{Name: "r", Bytes: 10, Mode: system.Replicable, At: "cuda:1"})
	lease, err := sys.Acquire(ctx, r, "cuda:1")
	must(t, err, "acquire")
	gb.armed.Store(true)
	placed := make(chan error, 1)
	go func() { placed <- sys.Place(ctx, r, "pinned-host") }()
	<-gb.entered // admitted: pinned-host entering, cuda:1 the copy's source
	before := snapshot(t, sys)
	require.Equal(t, budget.Entering, mats(t, before, "r")["pinned-host"].State)

	iu := as[*system.InUseError](t, sys.Discard(ctx, r), "discard while leased and in flight")
	assert.Equal(t, system.InUseError{Handle: "r", Location: "cuda:1", UseCount: 1}, *iu)
	unchanged(t, sys, before, "refused discard")
	must(t, lease.Release(ctx), "release")
	before = snapshot(t, sys)
	ue := as[*system.UnavailableError](t, sys.Discard(ctx, r), "discard while in flight")
	assert.Equal(t, system.UnavailableError{Handle: "r", Location: "pinned-host", Detail: "materialization is entering; a transition is in flight", Reason: budget.UnavailableInFlight}, *ue)
	unchanged(t, sys, before, "refused discard")

	gb.open()
	require.NoError(t, <-placed)
	must(t, sys.Discard(ctx, r), "discard once settled")
	edgeAllFreed(t, sys, b)
}

// A discarded value's name is free: a new registration gets a new handle,
// Lookup returns it, and the old handle still answers discarded without
// ever reaching the new value.
func TestEdgeDiscardedNameIsFree(t *testing.T) {
	ctx := context.Background()
	sys, b := edgeStart(t, nil)
	old := register(t, sys, system.Value{Name: "w", Bytes: 100, At: "cuda:0", Data: pattern(100, 1)})
	must(t, sys.Discard(ctx, old), "discard")
	_, err := sys.Lookup(ctx, "w")
	assert.ErrorIs(t, err, system.ErrInvalidInput, "lookup of a discarded name")
	data := pattern(50, 2)
	h := register(t, sys, system.Value{Name: "w", Bytes: 50, At: "pinned-host", Data: data})
	assert.NotEqual(t, old.ID, h.ID)
	looked, err := sys.Lookup(ctx, "w")
	require.NoError(t, err)
	assert.Equal(t, h, looked)
	before := snapshot(t, sys)
	v, ok := before.Value("w")
	require.True(t, ok)
	assert.Equal(t, h, v.Handle, "the snapshot's record under the name is the live value")
	for _, r := range before.Values {
		assert.NotEqual(t, old.ID, r.Handle.ID, "the discarded value must not be listed")
	}
	for what, err := range map[string]error{
		"place":   sys.Place(ctx, old, "cuda:1"),
		"evict":   sys.Evict(ctx, old, "pinned-host"),
		"discard": sys.Discard(ctx, old),
		"read":    func() error { _, err := sys.Read(ctx, old, "pinned-host"); return err }(),
		"hold":    func() error { _, err := sys.Hold(ctx, old, "pinned-host"); return err }(),
	} {
		ue := as[*system.UnavailableError](t, err, what)
		assert.Equal(t, budget.UnavailableDiscarded, ue.Reason, what)
	}
	unchanged(t, sys, before, "calls on the old handle")
	got, err := sys.Read(ctx, h, "pinned-host")
	require.NoError(t, err)
	requireBytes(t, data, got, "the new w")
	edgeAllFreed(t, sys, b)
}

// explain never fails on a plan's content: a plan that fails validation is
// infeasible, its reason the validation error's message (the error
// Execute returns for it), its predicted peaks the current used+reserved.
func TestEdgeExplainNeverFailsOnContent(t *testing.T) {
	ctx := context.Background()
	sys, b := edgeStart(t, nil)
	w := register(t, sys, system.Value{Name: "w", Bytes: 100, At: "cuda:0"})
	d := register(t, sys, system.Value{Name: "d", Bytes: 10, At: "cuda:1"})
	must(t, sys.Discard(ctx, d), "discard d")
	must(t, sys.Reserve(ctx, "cuda:1", "live", 5), "reserve")
	ghost := system.Handle{Manager: sys.ManagerID(), ID: 77, Name: "ghost"}
	plans := map[string]system.Plan{
		"unknown handle":          {Enter: []system.Action{{Handle: ghost, Location: "cuda:1"}}},
		"discarded handle":        {Reclaim: []system.Action{{Handle: d, Location: "cuda:1"}}},
		"malformed location":      {Enter: []system.Action{{Handle: w, Location: "gpu:1"}}},
		"unconfigured location":   {Enter: []system.Action{{Handle: w, Location: "cuda:5"}}},
		"reservation bytes":       {Reservations: []system.ReservationSpec{{Name: "q", Location: "cuda:1", Bytes: 0}}},
		"reservation name active": {Reservations: []system.ReservationSpec{{Name: "live", Location: "cuda:1", Bytes: 1}}},
		"two problems, the first": {Reservations: []system.ReservationSpec{{Name: "", Location: "gpu:1", Bytes: 1}}, Enter: []system.Action{{Handle: d, Location: "cuda:1"}}},
	}
	for name, p := range plans {
		before := snapshot(t, sys)
		current := map[string]int64{}
		for _, l := range before.Locations {
			current[l.Location] = l.UsedBytes + l.ReservedBytes
		}
		_, execErr := sys.Execute(ctx, p)
		require.Error(t, execErr, name)
		var pe *system.PlanError
		assert.False(t, errors.As(execErr, &pe), "%s: a validation error, not a rule: %v", name, execErr)
		ex, err := sys.Explain(ctx, p)
		require.NoError(t, err, "%s: explain never fails on content", name)
		assert.Equal(t, system.Explanation{Reason: execErr.Error(), PredictedPeakBytes: current}, ex, name)
		unchanged(t, sys, before, name)
	}
	edgeAllFreed(t, sys, b)
}

// One op with several problems reports the first, through the runtime.
func TestEdgeOrderOfChecks(t *testing.T) {
	ctx := context.Background()
	sys, b := edgeStart(t, nil)
	w := register(t, sys, system.Value{Name: "w", Bytes: 10, At: "cuda:0"})
	d := register(t, sys, system.Value{Name: "d", Bytes: 10, At: "cuda:1"})
	must(t, sys.Discard(ctx, d), "discard d")
	ghost := system.Handle{Manager: sys.ManagerID(), ID: 77, Name: "ghost"}
	before := snapshot(t, sys)

	// copy/move: handle, from, to.
	assert.ErrorIs(t, sys.Copy(ctx, d, "gpu:0", "cuda:9"), system.ErrDiscarded, "copy: handle first")
	ue := as[*system.UnavailableError](t, sys.Move(ctx, w, "cuda:9", "gpu:0"), "move: from before to")
	assert.Equal(t, "cuda:9", ue.Location)
	ii := as[*system.InvalidInputError](t, sys.Copy(ctx, w, "cuda:0", "gpu:0"), "copy: fields before the replica mode")
	assert.Contains(t, ii.Message, `"gpu:0"`)
	// a reservation: name, bytes, location.
	ii = as[*system.InvalidInputError](t, sys.Reserve(ctx, "gpu:0", "", 0), "reserve")
	assert.Contains(t, ii.Message, "name is empty")
	// a plan: reclaim, reservations, enter; fields before rules.
	_, err := sys.Execute(ctx, system.Plan{
		Reclaim:      []system.Action{{Handle: w, Location: "cuda:0"}}, // a rule problem: data loss
		Reservations: []system.ReservationSpec{{Name: "q", Location: "cuda:9", Bytes: 1}},
		Enter:        []system.Action{{Handle: ghost, Location: "cuda:0"}},
	})
	ue = as[*system.UnavailableError](t, err, "execute")
	assert.Equal(t, "cuda:9", ue.Location)
	// a request: requirements, then reservations; rules in the rule list's
	// order (no locations before an exclusive value required twice).
	_, err = sys.Decide(ctx, system.Request{Name: "q",
		Requirements: []system.Requirement{{Handle: w, Tiers: [][]string{{"cuda:9"}}}},
		Reservations: []system.ReservationSpec{{Name: "", Location: "cuda:0", Bytes: 1}}})
	ue = as[*system.UnavailableError](t, err, "decide: requirements before reservations")
	assert.Equal(t, "cuda:9", ue.Location)
	_, err = sys.Decide(ctx, system.Request{Name: "q", Requirements: []system.Requirement{
		{Handle: w, Tiers: [][]string{{"cuda:0"}}}, {Handle: w, Tiers: [][]string{{"cuda:1"}}}, {Handle: w}}})
	pe := as[*system.PlanError](t, err, "decide: rules in order")
	assert.Contains(t, pe.Reason, "requirement 2 (w) has no locations")
	// A scope entry's stale check before everything.
	sc := sys.NewScopeExpecting(system.Plan{Enter: []system.Action{{Handle: ghost, Location: "gpu:0"}}}, before.StateVersion+1)
	se := as[*system.StaleStateError](t, sc.Enter(ctx), "stale scope entry")
	assert.Equal(t, system.StaleStateError{ExpectedVersion: before.StateVersion + 1, ActualVersion: before.StateVersion}, *se)
	unchanged(t, sys, before, "every refused call")
	edgeAllFreed(t, sys, b)
}
