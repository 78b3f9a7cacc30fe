package clusterproc_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/system/cluster/providers"
)

// Two nodes in one process find each other with the automanaged provider
// on loopback: each serves a health check on its own port and polls the
// other's.
func Example_automanaged() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	health := map[string]string{}
	for _, n := range []string{"node-a", "node-b"} {
		port, err := nodeproc.FreePort()
		if err != nil {
			panic(err)
		}
		health[n] = "127.0.0.1:" + strconv.Itoa(port)
	}
	start := func(name, peer string) *cluster.Node {
		p, err := providers.Automanaged(providers.AutomanagedOptions{Addr: health[name], Peers: []string{health[peer]}})
		if err != nil {
			panic(err)
		}
		n, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: name, Provider: p,
			Options: simulated(system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host")}})})
		if err != nil {
			panic(err)
		}
		return n
	}
	a, b := start("node-a", "node-b"), start("node-b", "node-a")
	if err := a.WaitMembers(ctx, "node-a", "node-b"); err != nil {
		panic(err)
	}
	fmt.Println(a.Members())
	_ = b.Close(ctx)
	_ = a.Close(ctx)
	// Output: [node-a node-b]
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
