package budget_test

import (
	"fmt"

	"github.com/residency-go/residency/budget"
)

// The wait queue's rule: classes first, then arrival; a waiter is
// eligible when nobody ahead of it at one of its locations waits without
// allowing bypass.
func ExampleWaitQueue() {
	q, _ := budget.NewWaitQueue(8)
	names := map[budget.WaitID]string{}
	push := func(s budget.WaitSpec) {
		id, err := q.Push(s)
		if err != nil {
			fmt.Println(err)
			return
		}
		names[id] = s.Name
	}
	push(budget.WaitSpec{Name: "big", Locations: []string{"cuda:0"}})
	push(budget.WaitSpec{Name: "small", Locations: []string{"cuda:0"}})
	push(budget.WaitSpec{Name: "urgent", Class: 1, Locations: []string{"cuda:0"}, AllowBypass: true})
	push(budget.WaitSpec{Name: "other-gpu", Locations: []string{"cuda:1"}})
	var order, eligible []string
	for _, s := range q.Waiting() {
		order = append(order, s.Name)
	}
	for _, id := range q.Eligible(nil) {
		eligible = append(eligible, names[id])
	}
	fmt.Println("order:", order)
	fmt.Println("eligible:", eligible)
	// Output:
	// order: [urgent big small other-gpu]
	// eligible: [urgent big other-gpu]
}

// A call that does not wait takes no room an earlier waiter holds: the
// runtime runs it under WithHeld with the queue's HeldAt. A reservation
// that would fit at cuda:0 is refused while a waiter holds cuda:0's
// room; the same reservation at cuda:1, where nobody waits, goes ahead.
func ExampleLedger_WithHeld() {
	l, _ := budget.New(budget.Config{ManagerID: "m", Locations: []budget.LocationConfig{
		{Name: "cuda:0", HasBudget: true, BudgetBytes: 100},
		{Name: "cuda:1", HasBudget: true, BudgetBytes: 100},
	}})
	q, _ := budget.NewWaitQueue(0)
	_, _ = q.Push(budget.WaitSpec{Name: "big-model", Locations: []string{"cuda:0"}})

	l.WithHeld(q.HeldAt(0), func() {
		fmt.Println(l.Reserve("cuda:0", "kv", 10))
		fmt.Println(l.Reserve("cuda:1", "kv", 10))
	})
	// Output:
	// residency busy: 1 earlier callers wait for room at cuda:0, and a later call takes none of it (wait for room to be queued behind them, or retry)
	// <nil>
}
