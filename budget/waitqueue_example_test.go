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
