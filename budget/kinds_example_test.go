package budget_test

import (
	"errors"
	"fmt"

	"github.com/residency-go/residency/budget"
)

// A transition says which lease it is about in ID, next to its Detail in
// words; a refusal of a lease no longer active names it in Inactive and
// ID. Programs read the fields, people the words.
func ExampleLifetimeKind() {
	l := newExampleLedger()
	w := mustRegister(l, "w", 10, budget.Exclusive, "cuda:0")
	id, err := l.Acquire(w, "cuda:0")
	if err != nil {
		panic(err)
	}
	if err := l.Release(id); err != nil {
		panic(err)
	}
	tr := l.Trace()
	last := tr[len(tr)-1]
	fmt.Printf("%s: ID %d (%s)\n", last.Kind, last.ID, last.Detail)

	var ie *budget.InvalidInputError
	if errors.As(l.Release(id), &ie) {
		fmt.Printf("refused: %s %d\n", ie.Inactive, ie.ID)
	}
	// Output:
	// release: ID 1 (lease 1)
	// refused: lease 1
}

// A failed transfer says why in Failure: a failed registration retires its
// handle, a failed copy only releases its charge.
func ExampleFailureKind() {
	l := newExampleLedger()
	_, a, err := l.Register(budget.ValueSpec{Name: "w", Bytes: 10, At: "cuda:0"})
	if err != nil {
		panic(err)
	}
	if err := l.Fail(a.ID, errors.New("device lost")); err != nil {
		panic(err)
	}
	tr := l.Trace()
	last := tr[len(tr)-1]
	fmt.Printf("%s %s: %s\n", last.Kind, last.Failure, last.Detail)
	// Output:
	// fail registration: registration failed; handle retired: device lost
}

// A caller that knows a lease by its own name shows the refusal in its
// words: the message is built around the name, never rewritten.
func ExampleInvalidInputError_MessageNaming() {
	l := newExampleLedger()
	w := mustRegister(l, "w", 10, budget.Exclusive, "cuda:0")
	id, err := l.Acquire(w, "cuda:0")
	if err != nil {
		panic(err)
	}
	_ = l.Release(id)
	var ie *budget.InvalidInputError
	if errors.As(l.Release(id), &ie) {
		fmt.Println(ie.Message)
		fmt.Println(ie.MessageNaming(`lease "reader"`))
	}
	// Output:
	// lease 1 is not active (already released or never issued)
	// lease "reader" is not active (already released or never issued)
}
