package system_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/system"
)

// With a spill target, the controller demotes a victim whose value has no
// other resident copy (here cuda:0 → pinned-host) instead of dropping it,
// when the target has room: the next request for it copies it back
// instead of reloading it from its source.
func ExampleOptions_spill() {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{
		Locations: []system.LocationConfig{
			system.NoLimit("pageable-host"),
			system.Limit("pinned-host", 1<<20),
			system.Limit("cuda:0", 64<<10),
		},
		Spill: map[string]string{"cuda:0": "pinned-host"},
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer closeExample(sys)
	load := func(context.Context, []byte) error { return nil } // from disk, say
	kv1, _ := sys.Register(ctx, system.Value{Name: "kv1", Bytes: 48 << 10, Source: "pageable-host", Loader: load})
	kv2, _ := sys.Register(ctx, system.Value{Name: "kv2", Bytes: 48 << 10, Source: "pageable-host", Loader: load})
	if err := sys.Place(ctx, kv1, "cuda:0"); err != nil {
		log.Fatal(err)
	}

	sc, d, err := sys.Admit(ctx, system.Request{Name: "step", Requirements: []system.Requirement{
		{Handle: kv2, Tiers: [][]string{{"cuda:0"}}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer sc.Exit(ctx)
	for _, e := range d.Evictions {
		fmt.Printf("%s at %s → %s (%s)\n", e.Handle.Name, e.Location, e.To, e.Kind)
	}
	fmt.Println("reclaim:", d.Plan.Reclaim[0])
	fmt.Println("kv1:", where(sys, "kv1"), "kv2:", where(sys, "kv2"))
	// Output:
	// kv1 at cuda:0 → pinned-host (demoted)
	// reclaim: kv1 cuda:0→pinned-host (demotion)
	// kv1: [pinned-host] kv2: [cuda:0]
}
