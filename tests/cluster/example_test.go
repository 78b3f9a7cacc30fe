package cluster_test

import (
	"context"
	"fmt"
	"time"

	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// Two nodes in one process (the in-memory test provider): a value that
// node-b holds is placed on node-b; a value resident nowhere goes to the
// node with room; a held placement keeps its lease until Release; a
// remote lease protects another node's copy.
// (The example lives here, not in package system, because protoactor's
// cluster code does not pass the race detector that package runs under.)
func Example_place() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent := testprovider.NewInMemAgent()
	start := func(name string, gpu int64) *cluster.Node {
		n, err := cluster.StartNode(ctx, cluster.NodeOptions{
			Name: name, Provider: testprovider.NewTestProvider(agent), RefreshInterval: 50 * time.Millisecond,
			Options: simulated(system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", gpu)}}),
		})
		if err != nil {
			panic(err)
		}
		return n
	}
	a, b := start("node-a", 1<<20), start("node-b", 4<<20)
	defer func() { _ = a.Close(ctx); _ = b.Close(ctx) }()
	if err := a.WaitMembers(ctx, "node-a", "node-b"); err != nil {
		panic(err)
	}
	load := func(_ context.Context, dst []byte) error { return nil } // the bytes' origin
	for _, n := range []*cluster.Node{a, b} {
		for _, name := range []string{"weights", "kv"} {
			if _, err := n.System().Register(ctx, system.Value{Name: name, Bytes: 512 << 10, Source: "pageable-host", Loader: load}); err != nil {
				panic(err)
			}
		}
	}
	hw, _ := b.System().Lookup(ctx, "weights")
	if err := b.System().Place(ctx, hw, "pageable-host"); err != nil {
		panic(err)
	}
	// Publish now (the refresh loop would within RefreshInterval) and wait
	// for both summaries to spread.
	_ = a.Refresh(ctx)
	_ = b.Refresh(ctx)
	for {
		sums, err := a.Summaries(ctx)
		if err == nil && len(sums) == 2 && len(sums[1].Locations) > 0 && sums[1].Locations[0].UsedBytes == 512<<10 {
			break
		}
		select {
		case <-ctx.Done():
			panic(fmt.Sprintf("summaries did not spread: %v %v", sums, err))
		case <-time.After(20 * time.Millisecond):
		}
	}

	p, err := a.Place(ctx, cluster.PlacementRequest{Name: "serve", Hold: true,
		Requirements: []cluster.PlacementRequirement{{Value: "weights", Tiers: [][]string{{"cuda:0@*"}}}}})
	if err != nil {
		panic(err)
	}
	fmt.Println("weights →", p.Node, p.Decision.Enter)
	fmt.Println("why:", p.Candidates[0].Resident)
	_ = p.Release(ctx)

	p, err = a.Place(ctx, cluster.PlacementRequest{Name: "cache",
		Requirements: []cluster.PlacementRequirement{{Value: "kv", Tiers: [][]string{{"cuda:0@*"}}}}})
	if err != nil {
		panic(err)
	}
	fmt.Println("kv →", p.Node, "(the most room)")

	// A lease on node-b's copy, taken from node-a: node-b keeps it
	// resident and in place until Release.
	l, err := a.AcquireRemote(ctx, "node-b", system.Handle{Name: "weights"}, "cuda:0")
	if err != nil {
		panic(err)
	}
	fmt.Println("leased", l.Bytes, "bytes at", l.Location+"@"+l.Node)
	_ = l.Release(ctx)
	// Output:
	// weights → node-b [weights at cuda:0]
	// why: [weights at pageable-host@node-b]
	// kv → node-b (the most room)
	// leased 524288 bytes at cuda:0@node-b
}

// simulated returns opts with the soft backend for its locations: the
// examples run without a GPU, so they ask for simulated devices by name
// (system.SoftBackend).
func simulated(opts system.Options) system.Options {
	b, err := system.SoftBackend(opts.Locations, soft.Config{})
	if err != nil {
		panic(err)
	}
	opts.Backend = b
	return opts
}
