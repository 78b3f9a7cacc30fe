//go:build !race

// These examples start nodes, and protoactor's cluster code reports data
// races of its own: they are built, and run, without -race only
// (go test ./system/cluster).

package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// startTwo starts node-a and node-b in this process on protoactor's
// in-memory provider (at once: joining takes about a second each), each
// with a pageable-host and a cuda:0 of gpu bytes, and waits until both
// see both. close closes them (at once: leaving takes about two seconds).
func startTwo(ctx context.Context, gpu int64) (a, b *cluster.Node, close func()) {
	agent := testprovider.NewInMemAgent()
	nodes := make([]*cluster.Node, 2)
	var wg sync.WaitGroup
	for i, name := range []string{"node-a", "node-b"} {
		wg.Go(func() {
			n, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: name, Provider: testprovider.NewTestProvider(agent),
				RefreshInterval: 50 * time.Millisecond,
				Options:         system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", gpu)}}})
			if err != nil {
				panic(err)
			}
			nodes[i] = n
		})
	}
	wg.Wait()
	a, b = nodes[0], nodes[1]
	if err := a.WaitMembers(ctx, "node-a", "node-b"); err != nil {
		panic(err)
	}
	if err := b.WaitMembers(ctx, "node-a", "node-b"); err != nil {
		panic(err)
	}
	return a, b, func() {
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Go(func() { _ = n.Close(ctx) })
		}
		wg.Wait()
	}
}

// Two nodes in one process: each is a runtime of its own, and both see
// the same members.
func ExampleStartNode() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b, closeAll := startTwo(ctx, 1<<20)
	defer closeAll()
	fmt.Println(a.Name(), a.Members())
	fmt.Println(b.Name(), b.Members())
	// Output:
	// node-a [node-a node-b]
	// node-b [node-a node-b]
}

// node-b reconstructs a value from node-a's copy: the bytes stream from
// node-a in chunks while node-a keeps its copy leased. Then the directory
// says where the value is resident, on both nodes, and node-b takes a
// lease on node-a's copy.
func ExampleNode_RegisterRemote() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b, closeAll := startTwo(ctx, 1<<20)
	defer closeAll()
	data := bytes.Repeat([]byte("w"), 4096)
	ha, err := a.System().Register(ctx, system.Value{Name: "w", Bytes: int64(len(data)), At: "cuda:0", Data: data})
	if err != nil {
		panic(err)
	}
	hb, err := b.RegisterRemote(ctx, system.Value{Name: "w", Bytes: int64(len(data)), Source: "pageable-host"},
		cluster.RemoteSource{Node: "node-a", Handle: ha})
	if err != nil {
		panic(err)
	}
	if err := b.System().Place(ctx, hb, "cuda:0"); err != nil {
		panic(err)
	}
	l, err := b.System().Acquire(ctx, hb, "cuda:0")
	if err != nil {
		panic(err)
	}
	got, err := l.Read(ctx)
	if err != nil {
		panic(err)
	}
	_ = l.Release(ctx)
	fmt.Println("identical:", bytes.Equal(got, data))

	// Publish now (the refresh loop would within RefreshInterval).
	if err := a.Refresh(ctx); err != nil {
		panic(err)
	}
	if err := b.Refresh(ctx); err != nil {
		panic(err)
	}
	where, err := a.WhereIs(ctx, "w")
	if err != nil {
		panic(err)
	}
	for _, r := range where {
		fmt.Println(r.Location, r.State)
	}

	rl, err := b.AcquireRemote(ctx, "node-a", system.Handle{Name: "w"}, "")
	if err != nil {
		panic(err)
	}
	fmt.Println("leased", rl.Bytes, "bytes at", rl.Location+"@"+rl.Node)
	_ = rl.Release(ctx)
	// Output:
	// identical: true
	// cuda:0@node-a resident
	// cuda:0@node-b resident
	// leased 4096 bytes at cuda:0@node-a
}

// A placement on any node with room: node-b's GPU has more room than
// node-a's, and the value is resident nowhere yet, so node-b's controller
// is asked first and admits. A held placement keeps the value protected
// on node-b until Release. (tests/cluster's Example_place shows the
// directory winning over room.)
func ExampleNode_Place() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b, closeAll := startTwo(ctx, 1<<20)
	defer closeAll()
	load := func(_ context.Context, dst []byte) error { return nil }
	for _, n := range []*cluster.Node{a, b} {
		if _, err := n.System().Register(ctx, system.Value{Name: "kv", Bytes: 256 << 10, Source: "pageable-host", Loader: load}); err != nil {
			panic(err)
		}
	}
	// Fill half of node-a's GPU, then wait until node-a's summary says so.
	if err := a.System().Reserve(ctx, "cuda:0", "other", 512<<10); err != nil {
		panic(err)
	}
	_, _ = a.Refresh(ctx), b.Refresh(ctx)
	for {
		sums, err := a.Summaries(ctx)
		if err == nil && reserved(sums, "cuda:0@node-a") == 512<<10 && len(sums) == 2 {
			break
		}
		select {
		case <-ctx.Done():
			panic("summaries did not spread")
		case <-time.After(20 * time.Millisecond):
		}
	}

	p, err := a.Place(ctx, cluster.PlacementRequest{Name: "cache", Hold: true,
		Requirements: []cluster.PlacementRequirement{{Value: "kv", Tiers: [][]string{{"cuda:0@*"}}}}})
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Node, len(p.Attempts), p.Decision.Enter)
	for _, c := range p.Candidates {
		fmt.Println(c.Node, c.FreeBytes)
	}
	if err := p.Release(ctx); err != nil {
		panic(err)
	}
	// Output:
	// node-b 1 [kv at cuda:0]
	// node-b 1048576
	// node-a 524288
}

// reserved is the reserved bytes of loc in the summaries.
func reserved(sums []cluster.NodeSummary, loc string) int64 {
	for _, s := range sums {
		for _, l := range s.Locations {
			if l.Location == loc {
				return l.ReservedBytes
			}
		}
	}
	return -1
}
