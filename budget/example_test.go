package budget_test

import (
	"errors"
	"fmt"

	"github.com/residency-go/residency/budget"
)

// newExampleLedger: an unlimited pageable-host, a 1000-byte pinned-host and
// a 100-byte GPU.
func newExampleLedger() *budget.Ledger {
	l, err := budget.New(budget.Config{
		ManagerID:     "example",
		TraceCapacity: 16,
		Locations: []budget.LocationConfig{
			{Name: "cuda:0", HasBudget: true, BudgetBytes: 100},
			{Name: "pinned-host", HasBudget: true, BudgetBytes: 1000},
			{Name: "pageable-host"},
		},
	})
	if err != nil {
		panic(err)
	}
	return l
}

// mustRegister registers name at loc and completes its initialization.
func mustRegister(l *budget.Ledger, name string, bytes int64, mode budget.ReplicaMode, at string) budget.Handle {
	h, a, err := l.Register(budget.ValueSpec{Name: name, Bytes: bytes, Mode: mode, At: at})
	if err != nil {
		panic(err)
	}
	if _, err := l.Complete(a.ID); err != nil {
		panic(err)
	}
	return h
}

func ExampleNew() {
	l, err := budget.New(budget.Config{
		ManagerID: "m1",
		Locations: []budget.LocationConfig{
			{Name: "cuda:1", HasBudget: true, BudgetBytes: 8 << 30},
			{Name: "cuda:0", HasBudget: true, BudgetBytes: 8 << 30},
			{Name: "pageable-host"},
		},
		TraceCapacity: budget.DefaultTraceCapacity,
	})
	fmt.Println(l.Locations(), l.Version(), err)

	_, err = budget.New(budget.Config{ManagerID: "m2", Locations: []budget.LocationConfig{{Name: "gpu0"}}})
	fmt.Println(err)
	// Output:
	// [pageable-host cuda:0 cuda:1] 0 <nil>
	// residency invalid input: malformed location "gpu0": want pageable-host, pinned-host or cuda:N
}

// Registering a value at its first location admits it there (one version)
// and returns the effect to carry out; completing the initialization is a
// second version.
func ExampleLedger_Register() {
	l := newExampleLedger()
	h, adm, err := l.Register(budget.ValueSpec{Name: "weights", Bytes: 60, At: "pageable-host"})
	fmt.Println(h.Name, adm.Pending, adm.Effects, err, l.Version())
	_, err = l.Complete(adm.ID)
	fmt.Println(err, l.Version())

	// A value with a source is registered without a materialization.
	s, _, _ := l.Register(budget.ValueSpec{Name: "corpus", Bytes: 40, Mode: budget.Replicable, Source: "pinned-host"})
	snap := l.Snapshot()
	v, _ := snap.Value(s.Name)
	fmt.Println(v.HasSource, v.SourceLocation, v.Recoverable, len(v.Materializations), l.Version())
	// Output:
	// weights true [initialize weights at pageable-host (60 bytes)] <nil> 1
	// <nil> 2
	// true pinned-host true 0 3
}

// Placing an exclusive value elsewhere moves it: the destination is charged
// from admission and the source stays charged until completion.
func ExampleLedger_Place() {
	l := newExampleLedger()
	w := mustRegister(l, "weights", 60, budget.Exclusive, "pageable-host")
	adm, _ := l.Place(w, "cuda:0")
	fmt.Println(adm.Effects)
	snap := l.Snapshot()
	for _, m := range snap.Values[0].Materializations {
		fmt.Println(m.Location, m.State, m.ChargedBytes)
	}
	freed, _ := l.Complete(adm.ID)
	fmt.Println(freed, l.Version())

	// Already there: a no-op. No room: a BudgetError with the figures.
	again, _ := l.Place(w, "cuda:0")
	fmt.Println(again.Pending, len(again.Effects))
	x := mustRegister(l, "x", 50, budget.Exclusive, "pageable-host")
	_, err := l.Place(x, "cuda:0")
	var be *budget.BudgetError
	if errors.As(err, &be) {
		fmt.Println(be.Location, be.BudgetBytes, be.UsedBytes, be.ReservedBytes, be.RequestedBytes)
	}
	// Output:
	// [copy weights pageable-host→cuda:0 (60 bytes)]
	// pageable-host leaving 60
	// cuda:0 entering 60
	// [free weights at pageable-host (60 bytes)] 5
	// false 0
	// cuda:0 100 60 0 50
}

// A lease protects its materialization; a consumer event recorded on it
// keeps protecting after the lease is released, until it is reaped.
func ExampleLedger_Acquire() {
	l := newExampleLedger()
	w := mustRegister(l, "weights", 60, budget.Exclusive, "cuda:0")
	lease, _ := l.Acquire(w, "cuda:0")
	ev, _ := l.RecordEvent(lease)
	_ = l.Release(lease)

	_, err := l.Evict(w, "cuda:0")
	var inUse *budget.InUseError
	if errors.As(err, &inUse) {
		fmt.Println(inUse.UseCount, inUse.HoldCount, inUse.PendingEventCount)
	}
	fmt.Println(l.ReapEvent(ev), l.Version())
	fmt.Println(l.Release(lease))

	// Acquire never places.
	_, err = l.Acquire(w, "pinned-host")
	fmt.Println(errors.Is(err, budget.ErrPlan), err)
	// Output:
	// 0 0 1
	// <nil> 6
	// residency invalid input: lease 1 is not active (already released or never issued)
	// false residency unavailable: value "weights" at pinned-host: no resident materialization (acquire never places; admit the endpoint first)
}

func ExampleLedger_Reserve() {
	l := newExampleLedger()
	fmt.Println(l.Reserve("cuda:0", "kv-cache", 70))
	fmt.Println(l.Reserve("cuda:0", "kv-cache", 10))
	fmt.Println(l.Reserve("cuda:0", "scratch", 31))
	snap := l.Snapshot()
	r, _ := snap.Location("cuda:0")
	fmt.Println(r.ReservedBytes, r.PeakBytes, r.Reservations)
	fmt.Println(l.Unreserve("kv-cache"), l.Unreserve("kv-cache") != nil)
	// Output:
	// <nil>
	// residency invalid input: duplicate reservation name "kv-cache" (already active)
	// residency budget exceeded at cuda:0: used 0 + reserved 70 + requested 31 > budget 100 (short by 1 bytes)
	// 70 70 [{kv-cache 70 }]
	// <nil> true
}

// Explain simulates reclaim → reservations → enter without changing
// anything and predicts every location's peak.
func ExampleLedger_Explain() {
	l := newExampleLedger()
	old := mustRegister(l, "old", 60, budget.Replicable, "pageable-host")
	if a, err := l.Place(old, "cuda:0"); err == nil {
		_, _ = l.Complete(a.ID)
	}
	w, _, _ := l.Register(budget.ValueSpec{Name: "weights", Bytes: 50, Source: "pinned-host"})
	v := l.Version()

	p := budget.Plan{Enter: []budget.Action{{Handle: w, Location: "cuda:0"}}}
	ex := l.Explain(p)
	fmt.Println(ex.Feasible, ex.Reason)

	p.Reclaim = []budget.Action{{Handle: old, Location: "cuda:0"}}
	ex = l.Explain(p)
	fmt.Println(ex.Feasible, ex.PredictedPeakBytes["cuda:0"], ex.PredictedPeakBytes["pinned-host"], l.Version() == v)
	// Output:
	// false enter 0 (weights at cuda:0): residency budget exceeded at cuda:0: used 60 + reserved 0 + requested 50 > budget 100 (short by 10 bytes)
	// true 60 50 true
}

// StartRun executes a plan step by step; the runtime carries out each
// step's effects between Next and Complete. A scope's run ends with a
// lease on every entered endpoint.
func ExampleLedger_StartRun() {
	l := newExampleLedger()
	w := mustRegister(l, "weights", 60, budget.Exclusive, "pageable-host")
	p := budget.Plan{
		Reservations: []budget.ReservationSpec{{Name: "activations", Location: "cuda:0", Bytes: 30}},
		Enter:        []budget.Action{{Handle: w, Location: "cuda:0"}},
	}
	run, err := l.StartRun(p, budget.RunOptions{Scope: "step-1", CheckVersion: true, ExpectedVersion: l.Version()})
	if err != nil {
		panic(err)
	}
	for {
		step, ok, err := run.Next()
		if err != nil {
			panic(err)
		}
		if !ok {
			break
		}
		fmt.Println(step.Phase, step.Index, step.Admission.Effects)
		if step.Admission.Pending {
			_, _ = run.Complete() // the copy was carried out
		}
	}
	report, leases, err := run.Finish()
	fmt.Println(len(report.Transitions), len(leases), err)

	// A stale expected version is refused before anything changes.
	_, err = l.StartRun(p, budget.RunOptions{CheckVersion: true, ExpectedVersion: 1})
	fmt.Println(err, errors.Is(err, budget.ErrPlan))
	// Output:
	// reserve 0 []
	// enter 0 [copy weights pageable-host→cuda:0 (60 bytes)]
	// 5 1 <nil>
	// residency stale state: expected version 1, actual 7 true
}

func ExampleLedger_Snapshot() {
	l := newExampleLedger()
	w := mustRegister(l, "weights", 60, budget.Replicable, "pageable-host")
	if a, err := l.Place(w, "cuda:0"); err == nil {
		_, _ = l.Complete(a.ID)
	}
	_, _ = l.Hold(w, "cuda:0")
	snap := l.Snapshot()
	fmt.Println("version", snap.StateVersion, "manager", snap.ManagerID)
	for _, r := range snap.Locations {
		fmt.Println(r.Location, r.HasBudget, r.BudgetBytes, r.UsedBytes, r.ReservedBytes, r.PeakBytes)
	}
	for _, v := range snap.Values {
		fmt.Println(v.Handle.Name, v.Bytes, v.ReplicaMode, v.Recoverable, v.HasSource)
		for _, m := range v.Materializations {
			fmt.Println(" ", m.Location, m.State, m.ChargedBytes, m.UseCount, m.HoldCount, m.PendingEventCount)
		}
	}
	// Output:
	// version 5 manager example
	// pageable-host false 0 60 0 60
	// pinned-host true 1000 0 0 0
	// cuda:0 true 100 60 0 60
	// weights 60 replicable true false
	//   pageable-host resident 60 0 0 0
	//   cuda:0 resident 60 0 1 0
}

func ExampleLedger_Trace() {
	l := newExampleLedger()
	w := mustRegister(l, "weights", 60, budget.Exclusive, "pageable-host")
	lease, _ := l.Acquire(w, "pageable-host")
	_ = l.Release(lease)
	_ = l.Reserve("cuda:0", "scratch", 10)
	for _, t := range l.Trace() {
		fmt.Println(t)
	}
	// Output:
	// v1 admit weights @pageable-host 60B (register at)
	// v2 complete weights @pageable-host 60B
	// v3 acquire weights @pageable-host (lease 1)
	// v4 release weights @pageable-host (lease 1)
	// v5 reserve @cuda:0 10B (scratch)
}
