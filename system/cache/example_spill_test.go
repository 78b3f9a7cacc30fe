package cache_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// pinnedWeights stands for a host copy of model weights in pinned memory.
type pinnedWeights struct{ name string }

func (p *pinnedWeights) Close() error {
	fmt.Println("freeing the host copy of", p.name)
	return nil
}

// A cache that opts into spill: an idle entry the controller evicts for
// room is demoted to cuda:0's spill target (pinned-host) through Demote,
// and the next load of its key starts from that copy.
func ExampleSpill() {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{
		Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("pinned-host", 1000), system.Limit("cuda:0", 100)},
		Spill:     map[string]string{"cuda:0": "pinned-host"},
	}))
	if err != nil {
		log.Fatal(err)
	}
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "models", Spill: &cache.Spill{
		Demote: func(_ context.Context, key string, v any) (any, error) {
			fmt.Println("copying", key, "to pinned host")
			return &pinnedWeights{name: v.(*weights).name}, nil
		},
	}})
	if err != nil {
		log.Fatal(err)
	}

	l, err := cache.Load(ctx, c, "llama", 70, idleWeights, loadWeights("llama", 70))
	if err != nil {
		log.Fatal(err)
	}
	_ = l.Release() // idle: a candidate for eviction

	// Another request needs 60 bytes of cuda:0: the idle entry is demoted.
	sc, d, err := sys.Admit(ctx, system.Request{Name: "kv", Reservations: []system.ReservationSpec{{Name: "kv", Location: "cuda:0", Bytes: 60}}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("evicted", d.Evictions[0].Bytes, "bytes, to", d.Evictions[0].To)
	_ = sc.Exit(ctx)

	// The next load of "llama" gets the host copy: a warm start.
	l, err = cache.Load(ctx, c, "llama", 70, idleWeights, func(ctx context.Context) (*weights, int64, error) {
		if host, ok := cache.Demoted[*pinnedWeights](ctx); ok {
			fmt.Println("warm start from the host copy of", host.name)
		}
		return &weights{name: "llama"}, 70, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = l.Release()
	st, err := c.Statistics(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("demotions:", st.Demotions, "warm starts:", st.WarmStarts, "copies kept:", st.Demoted)
	closeCacheExample(sys, c)
	// Output:
	// loading llama
	// copying llama to pinned host
	// closing llama
	// evicted 70 bytes, to pinned-host
	// warm start from the host copy of llama
	// freeing the host copy of llama
	// demotions: 1 warm starts: 1 copies kept: 0
	// closing llama
}
