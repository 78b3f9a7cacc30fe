package budget_test

import (
	"errors"
	"fmt"

	"github.com/residency-go/residency/budget"
)

// A cap of 60 bytes over a group of reservations at cuda:0 (budget 100):
// each reservation is admitted by the cap first, then by the ledger, and
// held; a refusal of either gives the cap's bytes back.
func ExampleCapBook() {
	l := newExampleLedger()
	clones, _ := budget.NewCapBook("clones", 60)

	reserve := func(name string, bytes int64) (*budget.CapClaim, error) {
		c := new(budget.CapClaim)                      // usually a field of the caller's own record
		if err := clones.Admit(c, bytes); err != nil { // the cap first
			return nil, err
		}
		if err := l.Reserve("cuda:0", name, bytes); err != nil {
			_ = clones.Release(c) // the ledger refused: the cap's bytes go back
			return nil, err
		}
		return c, clones.Hold(c)
	}

	a, _ := reserve("clone/1", 40)
	_, err := reserve("clone/2", 30) // 40 + 30 > 60: the cap refuses
	var ce *budget.CapError
	fmt.Println(errors.As(err, &ce), err)

	_ = l.Reserve("cuda:0", "other", 50) // someone else's bytes at cuda:0
	_, err = reserve("clone/3", 20)      // the cap has room; the location has not
	var be *budget.BudgetError
	fmt.Println(errors.As(err, &be), clones.Used())

	_ = l.Unreserve("clone/1")
	_ = clones.Release(a)
	fmt.Println(clones.Used(), clones.Peak(), clones.Release(a) != nil)
	// Output:
	// true residency cap "clones" exceeded: used 40 + requested 30 > cap 60 (short by 10 bytes)
	// true 40
	// 0 40 true
}
