package budget_test

import (
	"fmt"
	"time"

	"github.com/residency-go/residency/budget"
)

// A loader cache keeps each entry's handle beside its item: a hit looks
// the key up once, and the steps after it (the use, the release that
// makes it idle) go through the handle without a lookup by key.
func ExampleCacheSlot() {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	b := budget.NewCacheBook[string]()
	h, _ := b.StartLoadSlot("weights", "v1")
	_ = b.FinishLoad("weights", "v1")
	_ = b.SetKeepAlive("weights", time.Minute)

	item, state, _ := b.GetSlot("weights") // a hit
	_ = b.UseSlot(h, t0)
	_ = b.IdleSlot(h, t0.Add(time.Second)) // its last holder let go
	at, _ := b.NextExpiry()
	fmt.Println(item, state, at.Format(time.TimeOnly))

	b.EvictAll(func(string) bool { return true })
	fmt.Println(h.State(), b.UseSlot(h, t0) != nil)
	// Output:
	// v1 ready 12:01:01
	// absent true
}
