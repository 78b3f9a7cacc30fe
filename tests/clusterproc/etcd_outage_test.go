package clusterproc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/system/cluster/providers"
)

// etcdOutage is how long etcd stays down: longer than a member's etcd
// lease (3 s), so every member's keepalive gives up and has to register
// again once etcd is back.
const etcdOutage = 4 * time.Second

// etcd is killed (SIGKILL) under nodes a and b, stays down etcdOutage and
// restarts on the same ports with the same data. While it is down the
// members keep their member lists and serve each other (a copy, the
// directory, a placement), and a node trying to join fails typed within
// its dial timeout. After the restart a new node c joins and sees a and b
// (they registered again: timed), and nobody's member list changes while
// the leases etcd renewed at its restart run out (a member whose key
// expired would be dropped, and protoactor never lets a dropped member
// id back).
func TestEtcdOutage(t *testing.T) {
	c := startProxied(t, "etcd", "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*converge)
	defer cancel()
	registerAt(ctx, t, a, "w", sizeW, 1, "cuda:0")
	require.NoError(t, a.Refresh(ctx))
	until(ctx, t, time.Now(), "w on a", whereIsExactly(b, "w", "cuda:0@a"))

	c.etcd.Kill()
	downAt := time.Now()
	two := []string{"a", "b"}
	rounds := 0
	for time.Since(downAt) < etcdOutage {
		rounds++
		for _, n := range []*cluster.Node{a, b} {
			require.Equal(t, two, n.Members(), "%s's members while etcd is down", n.Name())
		}
		c.copyOK(ctx, t, b, "a", "w", sizeW, 1)
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		require.NoError(t, whereIsExactly(b, "w", "cuda:0@a")(rctx))
		p, err := b.Place(rctx, cluster.PlacementRequest{Name: "serve-w",
			Requirements: []cluster.PlacementRequirement{{Value: "w", Tiers: [][]string{{"cuda:0@*"}}}}})
		rcancel()
		require.NoError(t, err)
		require.Equal(t, "a", p.Node)
		if rounds == 1 {
			start := time.Now()
			_, err := providers.Etcd(providers.EtcdOptions{Endpoints: []string{c.etcd.Endpoint}, DialTimeout: time.Second})
			took := time.Since(start)
			require.True(t, errors.Is(err, context.DeadlineExceeded), "joining while etcd is down: %T %v", err, err)
			require.Less(t, took, time.Second+faultMargin)
			t.Logf("joining while etcd is down failed after %s: %v", took, err)
		}
	}

	require.NoError(t, c.etcd.Restart(ctx, &lockedBuffer{}))
	upAt := time.Now()
	p, err := providers.Etcd(providers.EtcdOptions{Endpoints: []string{c.etcd.Endpoint}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	o := cluster.NodeOptions{Name: "c", Provider: p, RefreshInterval: 100 * time.Millisecond, RequestTimeout: 5 * time.Second,
		Options: system.Options{Locations: []system.LocationConfig{system.Limit("pageable-host", 256<<20), system.Limit("cuda:0", 64<<20)}}}
	o.Backend = testsys.Soft(t, o.Locations)
	nc, err := cluster.StartNode(ctx, o)
	require.NoError(t, err)
	c.nodes["c"] = nc // closed with the others
	three := []string{"a", "b", "c"}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	joined := until(wctx, t, upAt, "c sees a and b, they see c", func(context.Context) error {
		for _, n := range []*cluster.Node{a, b, nc} {
			if m := n.Members(); !slices.Equal(m, three) {
				return fmt.Errorf("%s's members %v", n.Name(), m)
			}
		}
		return nil
	})
	dir := until(wctx, t, upAt, "w on a, asked by c", whereIsExactly(nc, "w", "cuda:0@a"))
	// The leases etcd renewed when it restarted (3 s) run out now: the
	// member lists must not change.
	for time.Since(upAt) < 4*time.Second {
		for _, n := range []*cluster.Node{a, b, nc} {
			require.Equal(t, three, n.Members(), "%s's members %s after etcd restarted", n.Name(), time.Since(upAt))
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	c.copyOK(ctx, t, nc, "a", "w", sizeW, 1)
	t.Logf("etcd down %s (%d rounds of requests between members, all served); after its restart a new member saw everyone in %s, directory from it in %s; member lists unchanged 4 s after",
		etcdOutage, rounds, joined, dir)
}
