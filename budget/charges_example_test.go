package budget_test

import (
	"errors"
	"fmt"

	"github.com/residency-go/residency/budget"
)

// A cache's idle entry is offered as a victim; a load of another entry
// asks the controller for room; the plan's reclaim step asks the cache
// to drop the idle entry, which it confirms.
func ExampleLedger_OfferCharge() {
	l := newExampleLedger()
	owner := budget.CacheOwnerPrefix + `"weights"`
	_ = l.ReserveOwned("cuda:0", "model-a", 70, owner)
	_ = l.OfferCharge("model-a", owner, 2) // idle: H = L(cuda:0) + 2

	d, _ := l.Decide(budget.Request{Name: "load model-b", Reservations: []budget.ReservationSpec{
		{Name: "model-b", Location: "cuda:0", Bytes: 60, Owner: owner},
	}}, 0)
	for _, e := range d.Evictions {
		fmt.Println(e.Kind, e.Owner, e.Charge, e.Bytes)
	}
	run, _ := l.StartRun(d.Plan, budget.RunOptions{CheckVersion: true, ExpectedVersion: d.ExpectedStateVersion})
	for {
		step, ok, err := run.Next()
		if err != nil || !ok {
			break
		}
		for _, eff := range step.Admission.Effects {
			fmt.Println(eff) // the runtime asks the owner to drop the entry
		}
		if step.Admission.Pending {
			_, _ = run.Complete() // the owner dropped it
		}
	}
	_, _, err := run.Finish()
	info, _ := l.Charge("model-b")
	fmt.Println(err, info.Owner, info.Bytes)
	// Output:
	// idle_cache_entry cache "weights" model-a 70
	// drop charge model-a of cache "weights" at cuda:0 (70 bytes)
	// <nil> cache "weights" 60
}

// A lease taken on an entry withdraws its offer; the controller then
// never chooses it.
func ExampleLedger_WithdrawCharge() {
	l := newExampleLedger()
	owner := budget.CacheOwnerPrefix + `"weights"`
	_ = l.ReserveOwned("cuda:0", "model-a", 70, owner)
	_ = l.OfferCharge("model-a", owner, 0)
	_ = l.WithdrawCharge("model-a", owner)
	info, _ := l.Charge("model-a")
	fmt.Println(info.State)
	_, err := l.Decide(budget.Request{Name: "load", Reservations: []budget.ReservationSpec{{Name: "b", Location: "cuda:0", Bytes: 60}}}, 0)
	var pe *budget.PlanError
	fmt.Println(errors.As(err, &pe))
	// Output:
	// not_offered
	// true
}

// Charge reads one reservation's state as a charge.
func ExampleLedger_Charge() {
	l := newExampleLedger()
	owner := budget.CacheOwnerPrefix + `"weights"`
	_ = l.ReserveOwned("cuda:0", "model-a", 70, owner)
	_ = l.OfferCharge("model-a", owner, 3)
	info, ok := l.Charge("model-a")
	fmt.Println(ok, info.Location, info.Bytes, info.State, info.Priority)
	// Output: true cuda:0 70 offered 3
}

// The owner refuses to drop an entry that became busy after the
// decision: the run fails with a *ChargeBusyError (Refused) that matches
// ErrBusy, and the charge is no longer offered.
func ExampleChargeBusyError() {
	l := newExampleLedger()
	owner := budget.CacheOwnerPrefix + `"weights"`
	_ = l.ReserveOwned("cuda:0", "model-a", 70, owner)
	_ = l.OfferCharge("model-a", owner, 0)
	run, _ := l.StartRun(budget.Plan{Reclaim: []budget.Action{{Location: "cuda:0", Owner: owner, Charge: "model-a"}}}, budget.RunOptions{})
	_, _, _ = run.Next()
	err := run.Fail(errors.New("leased in between"))
	var busy *budget.ChargeBusyError
	fmt.Println(errors.As(err, &busy), busy.Refused, errors.Is(err, budget.ErrBusy))
	info, _ := l.Charge("model-a")
	fmt.Println(info.State, info.Bytes)
	// Output:
	// true true true
	// not_offered 70
}
