package system_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/residency-go/residency/system"
)

// An integrated GPU allocates from host RAM: cuda:0 and pageable-host
// share one 16 GiB figure, so a placement that fits cuda:0's own budget
// is still refused when the two together would exceed it, and the
// snapshot shows the group's figures.
func ExampleOptions_sharedBudgets() {
	const gib = int64(1) << 30
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{
		Locations: []system.LocationConfig{
			system.NoLimit("pageable-host"),
			system.Limit("cuda:0", 12*gib),
		},
		SharedBudgets: []system.SharedBudget{{Name: "igpu", Locations: []string{"cuda:0", "pageable-host"}, Bytes: 16 * gib}},
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer closeExample(sys)
	load := func(context.Context, []byte) error { return nil }
	weights, _ := sys.Register(ctx, system.Value{Name: "weights", Bytes: 10 * gib, Source: "pageable-host", Loader: load})
	if err := sys.Place(ctx, weights, "pageable-host"); err != nil {
		log.Fatal(err)
	}
	kv, _ := sys.Register(ctx, system.Value{Name: "kv", Bytes: 8 * gib, Source: "pageable-host", Loader: load})
	err = sys.Place(ctx, kv, "cuda:0")
	var be *system.BudgetError
	fmt.Println(errors.As(err, &be), be.Shared, be.SharedUsedBytes/gib, be.SharedRequestedBytes/gib)

	snap, _ := sys.Snapshot(ctx)
	g := snap.SharedBudgets[0]
	fmt.Println(g.Name, g.Locations, g.Bytes/gib, g.UsedBytes/gib)
	// Output:
	// true igpu 10 8
	// igpu [pageable-host cuda:0] 16 10
}
