package system_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/system"
)

// loggingCopier is asked to carry out the demotion copies of its route.
// It declines them (served false), so the runtime copies itself, as with
// no copier; a staging pipeline performs them on its copy queue instead.
type loggingCopier struct{}

func (loggingCopier) CopyDemotion(_ context.Context, d system.Demotion) (bool, error) {
	fmt.Printf("asked to copy %s %s → %s (%d bytes)\n", d.Value, d.From, d.To, d.Bytes)
	return false, nil
}

// A DemotionCopier registered for cuda:0 → pinned-host is handed the copy
// of every demotion on that route; the ledger charges the demotion as a
// move whoever copies.
func ExampleSystem_ServeDemotions() {
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
	stop, err := sys.ServeDemotions("cuda:0", "pinned-host", loggingCopier{})
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	load := func(context.Context, []byte) error { return nil }
	kv1, _ := sys.Register(ctx, system.Value{Name: "kv1", Bytes: 48 << 10, Source: "pageable-host", Loader: load})
	kv2, _ := sys.Register(ctx, system.Value{Name: "kv2", Bytes: 48 << 10, Source: "pageable-host", Loader: load})
	if err := sys.Place(ctx, kv1, "cuda:0"); err != nil {
		log.Fatal(err)
	}
	sc, _, err := sys.Admit(ctx, system.Request{Name: "step", Requirements: []system.Requirement{
		{Handle: kv2, Tiers: [][]string{{"cuda:0"}}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer sc.Exit(ctx)
	fmt.Println("kv1:", where(sys, "kv1"), "kv2:", where(sys, "kv2"))
	// Output:
	// asked to copy kv1 cuda:0 → pinned-host (49152 bytes)
	// kv1: [pinned-host] kv2: [cuda:0]
}
