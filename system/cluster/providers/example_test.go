package providers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/system/cluster/providers"
)

// A node finds the other members through etcd. Etcd checks that etcd
// answers before it returns: pointed at an address where nothing listens,
// it gives up after the dial timeout with an error that names the
// endpoint, instead of hanging in cluster.StartNode.
func ExampleEtcd() {
	p, err := providers.Etcd(providers.EtcdOptions{
		Endpoints:   []string{"127.0.0.1:1"}, // nothing listens there
		DialTimeout: 200 * time.Millisecond,
	})
	fmt.Println(p == nil, strings.Contains(fmt.Sprint(err), "cannot reach etcd at 127.0.0.1:1"), errors.Is(err, context.DeadlineExceeded))

	// With a running etcd the provider goes into the node's options:
	//
	//	p, err := providers.Etcd(providers.EtcdOptions{Endpoints: []string{"127.0.0.1:2379"}})
	//	n, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-a", Provider: p, Options: ...})

	// Output: true true true
}

// Without etcd, nodes can find each other with the automanaged provider:
// each serves a health check on its own address (loopback here) and polls
// its peers'. Two nodes of one machine, each with its own health port
// (tests/clusterproc runs this for real, with processes; this example is
// compiled, not run, because protoactor's cluster code does not pass the
// race detector this package's tests run under).
func ExampleAutomanaged() {
	ctx := context.Background()
	pa, err := providers.Automanaged(providers.AutomanagedOptions{Addr: "127.0.0.1:16330", Peers: []string{"127.0.0.1:16331"}})
	if err != nil {
		panic(err)
	}
	a, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-a", Provider: pa,
		Options: system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host")}}})
	if err != nil {
		panic(err)
	}
	defer a.Close(ctx)
	// node-b does the same with Addr "127.0.0.1:16331" and node-a's
	// address as its peer; then a.WaitMembers(ctx, "node-a", "node-b").
}

// The automanaged provider refuses, at once, an address its peers could
// not reach it at: the port must be fixed and known to them.
func ExampleAutomanaged_refused() {
	_, err := providers.Automanaged(providers.AutomanagedOptions{Addr: "127.0.0.1:0"})
	fmt.Println(err)
	// Output: residency: automanaged provider: address "127.0.0.1:0": want host:port with a port in 1..65535 (the peers must know it)
}
