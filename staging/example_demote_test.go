package staging_test

import (
	"context"
	"fmt"

	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// On a runtime whose cuda:0 spills to pinned-host, a pipeline serving
// cuda:0 carries out the demotions' copies on its copy queue, at the
// lowest priority (Config.OnDemotion and Stats report them).
func Example_demotion() {
	ctx := context.Background()
	sys, _ := system.Start(ctx, simulated(system.Options{
		Locations: []system.LocationConfig{
			system.NoLimit("pageable-host"), system.Limit("pinned-host", 1<<20), system.Limit("cuda:0", 64<<10),
		},
		Spill: map[string]string{"cuda:0": "pinned-host"},
	}))
	defer sys.Close(ctx)
	p, _ := staging.New(ctx, sys, staging.Config{
		Device: "cuda:0", Slots: 1, SlotBytes: 1024,
		Keys: []string{"kv"}, PoolSlots: 4, RowBytes: 512,
		OnDemotion: func(value string, bytes int64, err error) {
			fmt.Println("demoted", value, bytes, err)
		},
	})
	defer p.Close(ctx)

	load := func(context.Context, []byte) error { return nil }
	kv1, _ := sys.Register(ctx, system.Value{Name: "kv1", Bytes: 48 << 10, Source: "pageable-host", Loader: load})
	kv2, _ := sys.Register(ctx, system.Value{Name: "kv2", Bytes: 48 << 10, Source: "pageable-host", Loader: load})
	_ = sys.Place(ctx, kv1, "cuda:0")
	sc, _, err := sys.Admit(ctx, system.Request{Name: "step", Requirements: []system.Requirement{
		{Handle: kv2, Tiers: [][]string{{"cuda:0"}}},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sc.Exit(ctx)
	st := p.Stats()
	fmt.Println("demotions:", st.Demotions, st.DemotedBytes)
	// Output:
	// demoted kv1 49152 <nil>
	// demotions: 1 49152
}
