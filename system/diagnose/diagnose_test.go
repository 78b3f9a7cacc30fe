package diagnose

import (
	"context"
	"errors"
	"flag"
	"github.com/residency-go/residency/system"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
)

var updateDiagnose = flag.Bool("update-diagnose", false, "rewrite the bodies of testdata/*.golden (their hand-checked headers are kept)")

// diagLocations: an unlimited pageable host, and 1000 bytes each of pinned
// host memory and two simulated GPUs.
func diagLocations() []system.LocationConfig {
	return []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("pinned-host", 1000), system.Limit("cuda:0", 1000), system.Limit("cuda:1", 1000)}
}

func startDiag(t *testing.T, traceCap int) *system.System {
	t.Helper()
	locs := diagLocations()
	sys, err := system.Start(context.Background(), system.Options{ManagerID: "diag", Locations: locs, TraceCapacity: traceCap, Backend: testsys.Soft(t, locs)})
	require.NoError(t, err)
	return sys
}

func closeDiag(t *testing.T, sys *system.System) {
	t.Helper()
	require.NoError(t, sys.Close(context.Background()))
}

func reg(t *testing.T, sys *system.System, v system.Value) system.Handle {
	t.Helper()
	h, err := sys.Register(context.Background(), v)
	require.NoError(t, err)
	return h
}

func zeroLoader(_ context.Context, dst []byte) error {
	clear(dst)
	return nil
}

// capture takes the evidence at the failure, through the public Capture.
func capture(t *testing.T, sys *system.System, err error, op Operation) Evidence {
	t.Helper()
	require.Error(t, err)
	ev, cerr := Capture(context.Background(), sys, err, op)
	require.NoError(t, cerr)
	return ev
}

type diagCase struct {
	name string
	run  func(t *testing.T) Evidence
	// check asserts the typed figures of the diagnosis.
	check func(t *testing.T, d Diagnosis)
}

func diagCases() []diagCase {
	ctx := context.Background()
	return []diagCase{{
		name: "budget_materialization",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			w := reg(t, sys, system.Value{Name: "w", Bytes: 400, At: "pinned-host"})
			reg(t, sys, system.Value{Name: "k", Bytes: 700, At: "cuda:0"})
			err := sys.Place(ctx, w, "cuda:0")
			return capture(t, sys, err, Operation{Kind: "place", Handle: w, Location: "cuda:0"})
		},
		check: func(t *testing.T, d Diagnosis) {
			require.NotNil(t, d.Budget)
			assert.Equal(t, BudgetArithmetic{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: 700, RequestedBytes: 400,
				CurrentCharged: 700, NewPeak: 1100, MissingBytes: 100, Charge: ChargeMaterialization,
				ChargeReason: d.Budget.ChargeReason, Now: d.Budget.Now}, *d.Budget)
			assert.True(t, *d.Capture.AtFailure)
		},
	}, {
		name: "budget_reservation",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			reg(t, sys, system.Value{Name: "k", Bytes: 700, At: "cuda:0"})
			require.NoError(t, sys.Reserve(ctx, "cuda:0", "ws", 100))
			err := sys.Reserve(ctx, "cuda:0", "kv", 500)
			return capture(t, sys, err, Operation{Kind: "reserve", Location: "cuda:0", Reservation: "kv", Bytes: 500})
		},
		check: func(t *testing.T, d Diagnosis) {
			require.NotNil(t, d.Budget)
			assert.Equal(t, ChargeReservation, d.Budget.Charge)
			assert.Equal(t, int64(800), d.Budget.CurrentCharged)
			assert.Equal(t, int64(1300), d.Budget.NewPeak)
			assert.Equal(t, int64(300), d.Budget.MissingBytes)
		},
	}, {
		// The same refusal, captured after a cleanup released "ws": the
		// diagnosis still reasons from the error's figures and says the
		// snapshot no longer shows the failure.
		name: "budget_captured_after_cleanup",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			reg(t, sys, system.Value{Name: "k", Bytes: 700, At: "cuda:0"})
			require.NoError(t, sys.Reserve(ctx, "cuda:0", "ws", 100))
			err := sys.Reserve(ctx, "cuda:0", "kv", 500)
			require.NoError(t, sys.Unreserve(ctx, "ws")) // cleanup first: the wrong order
			return capture(t, sys, err, Operation{Kind: "reserve", Location: "cuda:0", Reservation: "kv", Bytes: 500})
		},
		check: func(t *testing.T, d Diagnosis) {
			require.NotNil(t, d.Capture.AtFailure)
			assert.False(t, *d.Capture.AtFailure)
			assert.Equal(t, int64(300), d.Budget.MissingBytes)
		},
	}, {
		name: "budget_temporary_reconstruction",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			reg(t, sys, system.Value{Name: "p", Bytes: 500, At: "pinned-host"})
			big := reg(t, sys, system.Value{Name: "big", Bytes: 600, Source: "pinned-host", Loader: zeroLoader})
			err := sys.Place(ctx, big, "cuda:0")
			return capture(t, sys, err, Operation{Kind: "place", Handle: big, Location: "cuda:0"})
		},
		check: func(t *testing.T, d Diagnosis) {
			require.NotNil(t, d.Budget)
			assert.Equal(t, "pinned-host", d.Budget.Location)
			assert.Equal(t, ChargeTemporary, d.Budget.Charge)
			assert.Equal(t, int64(100), d.Budget.MissingBytes)
		},
	}, {
		name: "budget_unknown_call",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			reg(t, sys, system.Value{Name: "p", Bytes: 500, At: "pinned-host"})
			big := reg(t, sys, system.Value{Name: "big", Bytes: 600, Source: "pinned-host", Loader: zeroLoader})
			err := sys.Place(ctx, big, "cuda:0")
			return capture(t, sys, err, Operation{}) // the caller did not say which call failed
		},
		check: func(t *testing.T, d Diagnosis) {
			assert.Equal(t, ChargeUnknown, d.Budget.Charge)
			assert.Contains(t, d.Budget.ChargeReason, "temporary reconstruction charge fits big")
		},
	}, {
		name: "plan_infeasible",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			w := reg(t, sys, system.Value{Name: "w", Bytes: 400, At: "pinned-host"})
			h := reg(t, sys, system.Value{Name: "h", Bytes: 700, Mode: system.Replicable, At: "pageable-host"})
			require.NoError(t, sys.Place(ctx, h, "cuda:0"))
			hold, err := sys.Hold(ctx, h, "cuda:0")
			require.NoError(t, err)
			defer func() { require.NoError(t, hold.Release(ctx)) }()
			plan := system.Plan{Reclaim: []system.Action{{Handle: h, Location: "cuda:0"}}, Enter: []system.Action{{Handle: w, Location: "cuda:0"}}}
			ex, err := sys.Explain(ctx, plan)
			require.NoError(t, err)
			_, err = sys.Execute(ctx, plan)
			ev := capture(t, sys, err, Operation{Kind: "execute"})
			ev.Plan, ev.Explanation = &plan, &ex
			return ev
		},
		check: func(t *testing.T, d Diagnosis) {
			require.NotNil(t, d.Search)
			assert.False(t, d.Search.Feasible)
		},
	}, {
		name: "search_limit",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			w := reg(t, sys, system.Value{Name: "w", Bytes: 400, At: "pageable-host"})
			reg(t, sys, system.Value{Name: "k", Bytes: 700, At: "cuda:0"})
			req := system.Request{Name: "serve", Requirements: []system.Requirement{{Handle: w, Tiers: [][]string{{"cuda:0"}, {"cuda:1"}}}}}
			_, _, err := sys.AdmitWithLimit(ctx, req, 1)
			return capture(t, sys, err, Operation{Kind: "admit", Handle: w})
		},
		check: func(t *testing.T, d Diagnosis) {
			require.NotNil(t, d.Search)
			assert.Equal(t, 1, d.Search.StateLimit)
			assert.Equal(t, 1, d.Search.ExploredStates)
		},
	}, {
		name: "stale_three_transitions",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			w := reg(t, sys, system.Value{Name: "w", Bytes: 400, At: "pageable-host"})
			v := reg(t, sys, system.Value{Name: "v", Bytes: 700, Mode: system.Replicable, At: "pageable-host"})
			x := reg(t, sys, system.Value{Name: "x", Bytes: 100, At: "pinned-host"})
			require.NoError(t, sys.Place(ctx, v, "cuda:0"))
			req := system.Request{Name: "serve", Requirements: []system.Requirement{{Handle: w, Tiers: [][]string{{"cuda:0"}}}}}
			d, err := sys.Decide(ctx, req)
			require.NoError(t, err)
			// Three transitions the decision does not see.
			lease, err := sys.Acquire(ctx, x, "pinned-host")
			require.NoError(t, err)
			hold, err := sys.Hold(ctx, v, "cuda:0")
			require.NoError(t, err)
			require.NoError(t, sys.Reserve(ctx, "cuda:1", "other", 200))
			err = sys.ScopeFor(d).Enter(ctx)
			ev := capture(t, sys, err, Operation{Kind: "enter"})
			ev.Decision = &d
			require.NoError(t, lease.Release(ctx))
			require.NoError(t, hold.Release(ctx))
			return ev
		},
		check: func(t *testing.T, d Diagnosis) {
			require.NotNil(t, d.Stale)
			assert.True(t, d.Stale.Covered)
			require.Len(t, d.Stale.Intervening, 3)
			assert.Equal(t, []string{"acquire", "hold", "reserve"}, []string{d.Stale.Intervening[0].Kind, d.Stale.Intervening[1].Kind, d.Stale.Intervening[2].Kind})
			require.NotNil(t, d.Search)
			require.Len(t, d.Search.Evictions, 1)
		},
	}, {
		name: "stale_trace_overwritten",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 4) // a ring of four transitions
			defer closeDiag(t, sys)
			w := reg(t, sys, system.Value{Name: "w", Bytes: 400, At: "pageable-host"})
			req := system.Request{Name: "serve", Requirements: []system.Requirement{{Handle: w, Tiers: [][]string{{"cuda:0"}}}}}
			d, err := sys.Decide(ctx, req)
			require.NoError(t, err)
			for _, name := range []string{"r1", "r2", "r3"} {
				require.NoError(t, sys.Reserve(ctx, "cuda:1", name, 10))
			}
			for _, name := range []string{"r1", "r2", "r3"} {
				require.NoError(t, sys.Unreserve(ctx, name))
			}
			err = sys.ScopeFor(d).Enter(ctx)
			ev := capture(t, sys, err, Operation{Kind: "enter"})
			ev.Decision = &d
			return ev
		},
		check: func(t *testing.T, d Diagnosis) {
			require.NotNil(t, d.Stale)
			assert.False(t, d.Stale.Covered)
			assert.Equal(t, uint64(2), d.Stale.Missing)
			assert.Len(t, d.Stale.Intervening, 4)
		},
	}, {
		name: "in_use",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			w := reg(t, sys, system.Value{Name: "w", Bytes: 400, Mode: system.Replicable, At: "pinned-host"})
			require.NoError(t, sys.Place(ctx, w, "cuda:0"))
			reader, err := sys.Acquire(ctx, w, "cuda:0") // still open
			require.NoError(t, err)
			done, err := sys.Acquire(ctx, w, "cuda:0") // released, its event still pending
			require.NoError(t, err)
			evt := system.NewManualEvent()
			eid, err := done.RecordEvent(ctx, evt)
			require.NoError(t, err)
			require.NoError(t, done.Release(ctx))
			hold, err := sys.Hold(ctx, w, "cuda:0")
			require.NoError(t, err)
			err = sys.Evict(ctx, w, "cuda:0")
			ev := capture(t, sys, err, Operation{Kind: "evict", Handle: w, Location: "cuda:0"})
			evt.Complete()
			require.NoError(t, sys.WaitReaped(ctx, eid))
			require.NoError(t, reader.Release(ctx))
			require.NoError(t, hold.Release(ctx))
			return ev
		},
		check: func(t *testing.T, d Diagnosis) {
			p := d.Protection
			require.NotNil(t, p)
			assert.Equal(t, []int{1, 1, 1}, []int{p.UseCount, p.HoldCount, p.PendingEventCount})
			require.Len(t, p.Leases, 1)
			require.Len(t, p.Holds, 1)
			require.Len(t, p.Events, 1)
			assert.True(t, p.Complete)
		},
	}, {
		name: "unavailable",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			w := reg(t, sys, system.Value{Name: "w", Bytes: 400, At: "pinned-host"})
			_, err := sys.Acquire(ctx, w, "cuda:1")
			return capture(t, sys, err, Operation{Kind: "acquire", Handle: w, Location: "cuda:1"})
		},
		check: func(t *testing.T, d Diagnosis) {
			require.Len(t, d.Endpoints, 1)
			assert.Nil(t, d.Endpoints[0].AtLocation)
			assert.True(t, d.Endpoints[0].Live)
		},
	}, {
		name: "unavailable_discarded",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			w := reg(t, sys, system.Value{Name: "w", Bytes: 400, At: "pinned-host"})
			require.NoError(t, sys.Discard(ctx, w))
			err := sys.Place(ctx, w, "cuda:0")
			return capture(t, sys, err, Operation{Kind: "place", Handle: w, Location: "cuda:0"})
		},
		check: func(t *testing.T, d Diagnosis) {
			require.Len(t, d.Endpoints, 1)
			assert.False(t, d.Endpoints[0].Live)
			assert.Equal(t, "discarded at v4", d.Endpoints[0].Gone)
		},
	}, {
		name: "exec_execute",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			a := reg(t, sys, system.Value{Name: "a", Bytes: 300, At: "pinned-host"})
			b := reg(t, sys, system.Value{Name: "b", Bytes: 300, At: "pageable-host"})
			testsys.Faults(sys).Arm(cuda.FaultAlloc, "cuda:1")
			_, err := sys.Execute(ctx, system.Plan{
				Reservations: []system.ReservationSpec{{Name: "ws", Location: "cuda:0", Bytes: 100}},
				Enter:        []system.Action{{Handle: a, Location: "cuda:0"}, {Handle: b, Location: "cuda:1"}},
			})
			return capture(t, sys, err, Operation{Kind: "execute"})
		},
		check: func(t *testing.T, d Diagnosis) {
			e := d.Execution
			require.NotNil(t, e)
			assert.Equal(t, system.PhaseExecute, e.Phase)
			assert.Equal(t, 1, e.FailedActionIndex)
			require.NotNil(t, e.Cause)
			assert.Equal(t, "Error", e.Cause.Class)
		},
	}, {
		name: "exec_enter",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			a := reg(t, sys, system.Value{Name: "a", Bytes: 300, At: "pinned-host"})
			b := reg(t, sys, system.Value{Name: "b", Bytes: 300, At: "pageable-host"})
			v := reg(t, sys, system.Value{Name: "v", Bytes: 600, Mode: system.Replicable, At: "pageable-host"})
			require.NoError(t, sys.Place(ctx, v, "cuda:0"))
			testsys.Faults(sys).Arm(cuda.FaultAlloc, "cuda:1")
			sc := sys.NewScope(system.Plan{
				Reclaim:      []system.Action{{Handle: v, Location: "cuda:0"}},
				Reservations: []system.ReservationSpec{{Name: "ws", Location: "cuda:0", Bytes: 100}},
				Enter:        []system.Action{{Handle: a, Location: "cuda:0"}, {Handle: b, Location: "cuda:1"}},
			})
			err := sc.Enter(ctx)
			return capture(t, sys, err, Operation{Kind: "enter"})
		},
		check: func(t *testing.T, d Diagnosis) {
			e := d.Execution
			require.NotNil(t, e)
			assert.Equal(t, system.PhaseEnter, e.Phase)
			assert.Len(t, e.Cleaned, 1)
		},
	}, {
		name: "exec_exit",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			x := reg(t, sys, system.Value{Name: "x", Bytes: 100, At: "pinned-host"})
			y := reg(t, sys, system.Value{Name: "y", Bytes: 100, At: "pinned-host"})
			sc := sys.NewScope(system.Plan{
				Reservations: []system.ReservationSpec{{Name: "ws", Location: "cuda:0", Bytes: 50}},
				Enter:        []system.Action{{Handle: x, Location: "cuda:0"}, {Handle: y, Location: "cuda:1"}},
			})
			require.NoError(t, sc.Enter(ctx))
			// The scope's first lease is released behind its back.
			require.NoError(t, sys.ReleaseByID(ctx, sc.Leases()[0]))
			err := sc.Exit(ctx)
			return capture(t, sys, err, Operation{Kind: "exit"})
		},
		check: func(t *testing.T, d Diagnosis) {
			e := d.Execution
			require.NotNil(t, e)
			assert.Equal(t, system.PhaseExit, e.Phase)
			require.NotNil(t, e.Cause)
			assert.Equal(t, "InvalidInput", e.Cause.Class)
		},
	}, {
		name: "exec_reclaim",
		run:  func(t *testing.T) Evidence { return ledgerRunFailure(t, "reclaim") },
		check: func(t *testing.T, d Diagnosis) {
			e := d.Execution
			require.NotNil(t, e)
			assert.Equal(t, system.PhaseReclaim, e.Phase)
			require.NotNil(t, e.Cause)
			require.NotNil(t, e.Cause.Protection)
			assert.Equal(t, 1, e.Cause.Protection.UseCount)
		},
	}, {
		name: "exec_reserve",
		run:  func(t *testing.T) Evidence { return ledgerRunFailure(t, "reserve") },
		check: func(t *testing.T, d Diagnosis) {
			e := d.Execution
			require.NotNil(t, e)
			assert.Equal(t, system.PhaseReserve, e.Phase)
			require.NotNil(t, e.Cause)
			require.NotNil(t, e.Cause.Budget)
			assert.Equal(t, ChargeReservation, e.Cause.Budget.Charge)
			assert.Equal(t, int64(50), e.Cause.Budget.MissingBytes)
		},
	}, {
		name: "invalid_input",
		run: func(t *testing.T) Evidence {
			sys := startDiag(t, 0)
			defer closeDiag(t, sys)
			err := sys.Unreserve(ctx, "nope")
			return capture(t, sys, err, Operation{Kind: "unreserve"})
		},
	}}
}

// ledgerRunFailure makes the reclaim or reserve phase of a scope entry
// fail. The runtime cannot: it explains a plan and carries out every
// reclaim and reservation while handling one message, so nothing can
// change the state in between. The ledger's Run API lets a transition
// come between two steps, which is the only way these phases fail; the
// figures are the real ledger's.
func ledgerRunFailure(t *testing.T, phase string) Evidence {
	l, err := budget.New(budget.Config{ManagerID: "diag", TraceCapacity: 64, Locations: diagLocations()})
	require.NoError(t, err)
	reg := func(name string) system.Handle {
		h, adm, err := l.Register(budget.ValueSpec{Name: name, Bytes: 300, Mode: system.Replicable, At: "pinned-host"})
		require.NoError(t, err)
		_, err = l.Complete(adm.ID)
		require.NoError(t, err)
		adm, err = l.Copy(h, "pinned-host", "cuda:0")
		require.NoError(t, err)
		_, err = l.Complete(adm.ID)
		require.NoError(t, err)
		return h
	}
	a, b := reg("a"), reg("b")
	var plan system.Plan
	var between func()
	steps := 1
	switch phase {
	case "reclaim":
		plan = system.Plan{Reclaim: []system.Action{{Handle: a, Location: "cuda:0"}, {Handle: b, Location: "cuda:0"}},
			Reservations: []system.ReservationSpec{{Name: "ws", Location: "cuda:0", Bytes: 100}}}
		between = func() { _, err := l.Acquire(b, "cuda:0"); require.NoError(t, err) }
	default:
		plan = system.Plan{Reclaim: []system.Action{{Handle: a, Location: "cuda:0"}},
			Reservations: []system.ReservationSpec{{Name: "ws", Location: "cuda:0", Bytes: 300}, {Name: "kv", Location: "cuda:0", Bytes: 200}}}
		between = func() { require.NoError(t, l.Reserve("cuda:0", "other", 250)) }
		steps = 2
	}
	run, err := l.StartRun(plan, budget.RunOptions{Scope: "scope-1"})
	require.NoError(t, err)
	for range steps {
		_, _, err := run.Next()
		require.NoError(t, err)
	}
	between()
	_, _, err = run.Next()
	require.Error(t, err)
	require.NoError(t, l.CheckInvariants())
	return Evidence{Err: err, Op: Operation{Kind: "enter"}, Snapshot: l.Snapshot(), Trace: l.Trace()}
}

const uncheckedHeader = "# NOT CHECKED BY HAND: check the body against the diagnosis procedure, then replace this line.\n"

// TestDiagnoseGolden builds each failure through the runtime (the soft
// backend and its fault injector) or, for the reclaim and reserve phases,
// the ledger, and compares the rendered diagnosis with its golden file.
// Each golden file starts with comment lines saying how its text was
// checked by hand; -update-diagnose rewrites the body only.
func TestDiagnoseGolden(t *testing.T) {
	for _, c := range diagCases() {
		t.Run(c.name, func(t *testing.T) {
			ev := c.run(t)
			d := DiagnoseEvidence(ev)
			if c.check != nil {
				c.check(t, d)
			}
			got := d.String()
			path := filepath.Join("testdata", c.name+".golden")
			raw, err := os.ReadFile(path)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				require.NoError(t, err)
			}
			header, body := splitGolden(string(raw))
			if *updateDiagnose {
				if header == "" {
					header = uncheckedHeader
				}
				require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				require.NoError(t, os.WriteFile(path, []byte(header+got), 0o644))
				return
			}
			require.NoError(t, err, "no golden file; run go test ./system -run TestDiagnoseGolden -update-diagnose")
			require.NotEmpty(t, header, "%s has no header saying it was checked by hand", path)
			require.NotContains(t, header, "NOT CHECKED BY HAND", "%s was not checked by hand yet", path)
			assert.Equal(t, body, got)
		})
	}
}

func splitGolden(s string) (header, body string) {
	for strings.HasPrefix(s, "#") {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			return header + s, ""
		}
		header, s = header+s[:i+1], s[i+1:]
	}
	return header, s
}

func TestDiagnoseNil(t *testing.T) {
	d := Diagnose(nil, system.Snapshot{}, nil)
	assert.Equal(t, "", d.Class)
	assert.Empty(t, d.Steps)
	assert.Equal(t, "no error\n", d.String())
}

// A PlanExecutionError wrapped by the caller is still found, and its
// cause's class is not mistaken for the outer class.
func TestDiagnoseWrapped(t *testing.T) {
	pe := &system.PlanExecutionError{Phase: system.PhaseExecute, FailedActionIndex: -1, FailedReservationIndex: -1,
		Cause: &system.BudgetError{Location: "cuda:0", BudgetBytes: 10, UsedBytes: 8, RequestedBytes: 4}}
	d := Diagnose(errors.Join(errors.New("loading shard 3"), pe), system.Snapshot{StateVersion: 1}, nil)
	assert.Equal(t, "Error", d.Class, "errors.Join has no single Unwrap: not classified")
	d = Diagnose(wrapErr{pe}, system.Snapshot{StateVersion: 1}, nil)
	assert.Equal(t, "ResidencyPlanExecutionError", d.Class)
	require.NotNil(t, d.Execution.Cause)
	assert.Equal(t, "ResidencyBudgetError", d.Execution.Cause.Class)
	assert.Equal(t, int64(2), d.Execution.Cause.Budget.MissingBytes)
}

type wrapErr struct{ err error }

func (w wrapErr) Error() string { return "serving: " + w.err.Error() }
func (w wrapErr) Unwrap() error { return w.err }

// Capture after Close reads the final snapshot and no trace.
func TestCaptureAfterClose(t *testing.T) {
	sys := startDiag(t, 0)
	reg(t, sys, system.Value{Name: "w", Bytes: 400, At: "pinned-host"})
	closeDiag(t, sys)
	ev, err := Capture(context.Background(), sys, system.ErrClosed, Operation{})
	require.NoError(t, err)
	assert.Empty(t, ev.Trace)
	assert.Equal(t, "diag", ev.Snapshot.ManagerID)
	d := DiagnoseEvidence(ev)
	assert.Equal(t, "Error", d.Class)
	assert.False(t, d.Capture.OneView)
}

// NVML observations appear next to a budget refusal as diagnostics and
// never change the verdict of the admission arithmetic.
func TestDiagnoseShowsDeviceObservations(t *testing.T) {
	be := &system.BudgetError{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: 900, ReservedBytes: 0, RequestedBytes: 200}
	base := DiagnoseEvidence(Evidence{Err: be})
	cases := map[string]struct {
		dev  cuda.DeviceInfo
		want string
	}{
		"free on the device": {cuda.DeviceInfo{Name: "gpu", UUID: "GPU-1", TotalBytes: 4000, FreeBytes: 3000, UsedBytes: 1000}, "admission is by the budget"},
		"device full":        {cuda.DeviceInfo{Name: "gpu", UUID: "GPU-1", TotalBytes: 4000, FreeBytes: 100, UsedBytes: 3900}, "raising the budget would not help"},
		"budget above total": {cuda.DeviceInfo{Name: "gpu", UUID: "GPU-1", TotalBytes: 800, FreeBytes: 700, UsedBytes: 100}, "above the device's total memory"},
	}
	for name, c := range cases {
		d := DiagnoseEvidence(Evidence{Err: be, Devices: map[string]cuda.DeviceInfo{"cuda:0": c.dev}})
		text := d.String()
		require.Contains(t, text, "NVML observation of cuda:0 (diagnostic, not admission evidence)", name)
		require.Contains(t, text, c.want, name)
		require.Equal(t, base.Budget.MissingBytes, d.Budget.MissingBytes, name)
		require.Equal(t, base.Class, d.Class, name)
	}
	// Without observations, nothing about NVML.
	require.NotContains(t, base.String(), "NVML")
}
