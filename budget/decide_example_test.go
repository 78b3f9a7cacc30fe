package budget_test

import (
	"errors"
	"fmt"

	"github.com/residency-go/residency/budget"
)

// decideExampleLedger: two GPUs of 100 bytes, pinned-host of 200, and
// pageable-host (no budget) where every value is reconstructed from.
func decideExampleLedger() *budget.Ledger {
	l, err := budget.New(budget.Config{ManagerID: "example", Locations: []budget.LocationConfig{
		{Name: "pageable-host"},
		{Name: "pinned-host", HasBudget: true, BudgetBytes: 200},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: 100},
		{Name: "cuda:1", HasBudget: true, BudgetBytes: 100},
	}})
	if err != nil {
		panic(err)
	}
	return l
}

func decideExamplePut(l *budget.Ledger, name string, bytes int64, at string, leases int) budget.Handle {
	h, _, err := l.Register(budget.ValueSpec{Name: name, Bytes: bytes, Mode: budget.Replicable, Source: "pageable-host"})
	if err != nil {
		panic(err)
	}
	if at != "" {
		adm, err := l.Place(h, at)
		if err != nil {
			panic(err)
		}
		if _, err := l.Complete(adm.ID); err != nil {
			panic(err)
		}
		for range leases {
			id, _ := l.Acquire(h, at)
			_ = l.Release(id)
		}
	}
	return h
}

func ExampleLedger_Decide() {
	l := decideExampleLedger()
	decideExamplePut(l, "embeddings", 60, "cuda:0", 4) // popular: H = 5
	decideExamplePut(l, "decoder", 40, "cuda:0", 0)    // H = 1
	decideExamplePut(l, "adapter", 70, "cuda:1", 2)    // H = 3
	weights := decideExamplePut(l, "weights", 40, "", 0)

	d, err := l.Decide(budget.Request{
		Name: "generate",
		Requirements: []budget.Requirement{{
			Handle: weights,
			Tiers:  [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}},
		}},
	}, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("expected version:", d.ExpectedStateVersion, "explored:", d.ExploredStates, "exhaustive:", d.Exhaustive)
	for _, e := range d.Evictions {
		fmt.Printf("evict %s at %s (%d bytes): %s\n", e.Handle.Name, e.Location, e.Bytes, e.Reason)
	}
	for _, a := range d.Plan.Enter {
		fmt.Println("enter", a)
	}
	fmt.Println("feasible:", d.Explanation.Feasible, "cuda:0 peak:", d.Explanation.PredictedPeakBytes["cuda:0"])

	// Run the plan; the expected version refuses a stale decision.
	run, err := l.StartRun(d.Plan, budget.RunOptions{CheckVersion: true, ExpectedVersion: d.ExpectedStateVersion})
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
		for _, e := range step.Admission.Effects {
			fmt.Println("effect:", e)
		}
		if step.Admission.Pending {
			if _, err := run.Complete(); err != nil {
				panic(err)
			}
		}
	}
	if _, _, err := run.Finish(); err != nil {
		panic(err)
	}
	s := l.Snapshot()
	c0, _ := s.Location("cuda:0")
	fmt.Println("cuda:0 used:", c0.UsedBytes)
	// Output:
	// expected version: 22 explored: 2 exhaustive: true
	// evict decoder at cuda:0 (40 bytes): priority H=1 (last use v14) among the lowest at cuda:0; evicted to free 40 bytes of the 40-byte shortfall for request "generate"
	// enter weights at cuda:0
	// feasible: true cuda:0 peak: 100
	// effect: free decoder at cuda:0 (40 bytes)
	// effect: reconstruct weights into cuda:0 via temporary buffer at pageable-host (40 bytes)
	// cuda:0 used: 100
}

// A request whose first tier is full of protected values falls back to its
// second tier; a search limit that is hit before any feasible assignment is
// reported as such, not as infeasibility.
func ExampleLedger_Decide_limit() {
	l := decideExampleLedger()
	for i, gpu := range []string{"cuda:0", "cuda:1"} {
		h := decideExamplePut(l, fmt.Sprintf("busy%d", i), 100, gpu, 0)
		if _, err := l.Hold(h, gpu); err != nil {
			panic(err)
		}
	}
	w := decideExamplePut(l, "weights", 40, "", 0)
	req := budget.Request{Name: "generate", Requirements: []budget.Requirement{{
		Handle: w, Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}},
	}}}

	d, err := l.Decide(req, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("enter", d.Plan.Enter[0], "after", d.ExploredStates, "states")

	_, err = l.Decide(req, 2)
	var limit *budget.SearchLimitError
	if errors.As(err, &limit) {
		fmt.Println("limit:", limit.RequestName, limit.StateLimit, limit.ExploredStates, errors.Is(err, budget.ErrPlan))
	}
	// Output:
	// enter weights at pinned-host after 3 states
	// limit: generate 2 2 true
}

// Two GPUs that both fit the request with no victim: by default the first
// listed wins; with TieMostFree the one with more free bytes does.
func ExampleTieBreak() {
	l := decideExampleLedger()
	decideExamplePut(l, "cache", 60, "cuda:0", 0) // cuda:0: 40 free, cuda:1: 100
	weights := decideExamplePut(l, "weights", 30, "", 0)

	for _, tie := range []budget.TieBreak{budget.TieFirstListed, budget.TieMostFree} {
		d, err := l.Decide(budget.Request{
			Name:         "generate",
			Requirements: []budget.Requirement{{Handle: weights, Tiers: [][]string{{"cuda:0", "cuda:1"}}}},
			TieBreak:     tie,
		}, 0)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s (%d explored)\n", tie, d.Plan.Enter[0].Location, d.ExploredStates)
	}
	// Output:
	// first-listed: cuda:0 (2 explored)
	// most-free: cuda:1 (2 explored)
}
