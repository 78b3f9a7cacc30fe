package cache_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// shardedModel stands for a model whose layers the application placed
// over two GPUs itself.
type shardedModel struct{ name string }

func (m *shardedModel) Close() error {
	fmt.Println("closing", m.name)
	return nil
}

// startSplitExample starts a runtime with two 100-byte GPUs and a cache at
// cuda:0 that may also place parts at cuda:1.
func startSplitExample() (*system.System, *cache.Cache) {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"),
		system.Limit("cuda:0", 100),
		system.Limit("cuda:1", 100),
	}}))
	if err != nil {
		log.Fatal(err)
	}
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Locations: []string{"cuda:1"}, Name: "models"})
	if err != nil {
		log.Fatal(err)
	}
	return sys, c
}

// A model split over cuda:0 and cuda:1 is one entry: both parts are
// reserved before the loader runs, and it leaves whole.
func ExampleLoadSplit() {
	ctx := context.Background()
	sys, c := startSplitExample()
	defer closeCacheExample(sys, c)

	parts := []cache.Part{{Location: "cuda:0", Bytes: 70}, {Location: "cuda:1", Bytes: 50}}
	lease, err := cache.LoadSplit(ctx, c, "llama-70b/q4", parts, nil, func(context.Context) (*shardedModel, error) {
		fmt.Println("loading llama-70b/q4 over two GPUs")
		return &shardedModel{name: "llama-70b/q4"}, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range c.Entries() {
		fmt.Println(e.Key, e.Bytes, "bytes:", e.Parts)
	}
	if err := lease.Release(); err != nil {
		log.Fatal(err)
	}

	// Idle, it may make room at either GPU: the controller drops the part
	// at cuda:1, and the whole entry goes (its cuda:0 part too).
	sc, d, err := sys.Admit(ctx, system.Request{Name: "kv", Reservations: []system.ReservationSpec{{Name: "kv", Location: "cuda:1", Bytes: 80}}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("evicted:", len(d.Evictions), "entries left:", len(c.Entries()))
	if err := sc.Exit(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// loading llama-70b/q4 over two GPUs
	// llama-70b/q4 120 bytes: [{cuda:0 70} {cuda:1 50}]
	// closing llama-70b/q4
	// evicted: 1 entries left: 0
}

// A lease tells where the value's parts are.
func ExampleLease_Parts() {
	ctx := context.Background()
	sys, c := startSplitExample()
	defer closeCacheExample(sys, c)

	parts := []cache.Part{{Location: "cuda:0", Bytes: 40}, {Location: "cuda:1", Bytes: 40}}
	lease, err := cache.LoadSplit(ctx, c, "mixtral/q8", parts, nil, func(context.Context) (string, error) {
		return "mixtral", nil
	})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = lease.Release() }()
	for _, p := range lease.Parts() {
		fmt.Printf("%s: %d bytes\n", p.Location, p.Bytes)
	}
	fmt.Println("total:", lease.Bytes())
	// Output:
	// cuda:0: 40 bytes
	// cuda:1: 40 bytes
	// total: 80
}
