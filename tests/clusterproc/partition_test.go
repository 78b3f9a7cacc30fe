package clusterproc_test

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/tests/internal/faultproxy"
)

// Sizes of the partition scenario's values.
const (
	sizeW = 2<<20 + 3 // on node b and node c
	sizeX = 1<<20 + 9 // on node c only
	sizeY = 1<<20 + 1 // registered on node c during the partition
)

// A network partition cuts node c off and heals, with etcd: c's proxy
// drops every connection (closes open ones, and new ones at once); see
// runPartition. Each provider runs one fault to keep `make test` short
// (the member traffic the proxy cuts is the same with both; the
// provider's own traffic bypasses it); both run both with -faults.all.
func TestPartitionEtcd(t *testing.T) { runPartition(t, "etcd", faultproxy.Drop, faultproxy.Blackhole) }

// The same with the automanaged provider, c's proxy a black hole
// (connections accepted, nothing ever forwarded).
func TestPartitionAutomanaged(t *testing.T) {
	runPartition(t, "automanaged", faultproxy.Blackhole, faultproxy.Drop)
}

// allFaults runs every fault with every provider.
var allFaults = flag.Bool("faults.all", false, "fault tests: run every fault with every provider (longer)")

// runPartition: nodes a, b, c in this process, each behind a proxy; w is
// resident on b and c, x on c only, and a holds a remote lease on c's x.
// For each fault in modes c is cut off: every request to c (a
// copy, a remote lease) and every request c makes fails with an
// UnavailableError before its deadline; w stays available (a copy from b,
// a placement that lands on b); c registers y meanwhile. After the heal a
// copy from c, the directory (y on c, w on b and c) and a's summary of c
// converge, timed; c holds exactly the one lease a was granted before the
// partition (none of the failed acquires left one), and 0 after a
// releases it.
func runPartition(t *testing.T, provider string, modes ...faultproxy.Mode) {
	if !*allFaults {
		modes = modes[:1]
	}
	c := startProxied(t, provider, "a", "b", "c")
	a, b, nc := c.nodes["a"], c.nodes["b"], c.nodes["c"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*converge)
	defer cancel()

	registerAt(ctx, t, b, "w", sizeW, 1, "cuda:0")
	registerAt(ctx, t, nc, "x", sizeX, 2, "cuda:0")
	registerAt(ctx, t, a, "v", sizeX, 3, "cuda:0")
	h, err := nc.RegisterRemote(ctx, system.Value{Name: "w", Bytes: sizeW, Source: "pageable-host"}, cluster.RemoteSource{Node: "b", Handle: system.Handle{Name: "w"}})
	require.NoError(t, err)
	require.NoError(t, nc.System().Place(ctx, h, "cuda:0"))
	lease, err := a.AcquireRemote(ctx, "c", system.Handle{Name: "x"}, "cuda:0")
	require.NoError(t, err)
	require.Equal(t, 1, leases(ctx, t, nc, "x", "cuda:0"))
	for _, n := range []*cluster.Node{a, b, nc} {
		require.NoError(t, n.Refresh(ctx))
	}
	until(ctx, t, time.Now(), "w on b and c", whereIsExactly(a, "w", "cuda:0@b", "cuda:0@c"))

	used := map[string]int64{"a": sizeX, "b": sizeW, "c": sizeW + sizeX}
	for i, mode := range modes {
		c.proxies["c"].Set(mode, 0)
		cutAt := time.Now()
		slow := allFail(ctx, t,
			call{what: mode.String() + ": a copying x from c", deadlineOK: true, do: func(ctx context.Context) error {
				_, err := c.copyOnce(ctx, a, "c", "x", sizeX)
				return err
			}},
			call{what: mode.String() + ": a leasing x on c", do: func(ctx context.Context) error {
				l, err := a.AcquireRemote(ctx, "c", system.Handle{Name: "x"}, "cuda:0")
				if err == nil {
					_ = l.Release(ctx)
				}
				return err
			}},
			call{what: mode.String() + ": c copying v from a", deadlineOK: true, do: func(ctx context.Context) error {
				_, err := c.copyOnce(ctx, nc, "a", "v", sizeX)
				return err
			}},
			call{what: mode.String() + ": c leasing v on a", do: func(ctx context.Context) error {
				l, err := nc.AcquireRemote(ctx, "a", system.Handle{Name: "v"}, "cuda:0")
				if err == nil {
					_ = l.Release(ctx)
				}
				return err
			}},
		)
		// w has a surviving copy on b: copied, and placed there.
		c.copyOK(ctx, t, a, "b", "w", sizeW, 1)
		pctx, pcancel := context.WithTimeout(ctx, 2*faultDeadline)
		start := time.Now()
		p, err := a.Place(pctx, cluster.PlacementRequest{Name: "serve-w",
			Requirements: []cluster.PlacementRequirement{{Value: "w", Tiers: [][]string{{"cuda:0@b", "cuda:0@c"}}}}})
		pcancel()
		require.NoError(t, err, "%s: placing w while c is cut off", mode)
		require.Equal(t, "b", p.Node, "%s: %s (attempts %+v)", mode, p.Why, p.Attempts)
		t.Logf("%s/%s: requests across the cut failed within %s (deadline %s); w placed on b in %s (attempts %d, directory notes %v)",
			provider, mode, slow, faultDeadline, time.Since(start), len(p.Attempts), p.Directory)

		// c changes while cut off.
		if i == 0 {
			registerAt(ctx, t, nc, "y", sizeY, 4, "cuda:0")
			used["c"] += sizeY
		}
		require.Less(t, time.Since(cutAt), converge)

		c.proxies["c"].Set(faultproxy.Pass, 0)
		healAt := time.Now()
		req := until(ctx, t, healAt, "a copying x from c after the heal", func(ctx context.Context) error {
			_, err := c.copyOnce(ctx, a, "c", "x", sizeX)
			return err
		})
		back := until(ctx, t, healAt, "c copying v from a after the heal", func(ctx context.Context) error {
			_, err := c.copyOnce(ctx, nc, "a", "v", sizeX)
			return err
		})
		dirY := until(ctx, t, healAt, "y on c", whereIsExactly(a, "y", "cuda:0@c"))
		dirW := until(ctx, t, healAt, "w on b and c", whereIsExactly(b, "w", "cuda:0@b", "cuda:0@c"))
		sums := until(ctx, t, healAt, "a's summaries", usedIs(a, used))
		// No failed acquire or copy left a lease: c holds only the one
		// granted before, a none. A stream opened for a copy whose answer
		// the cut lost is closed one RequestTimeout after its open (not
		// StreamIdleTimeout, 30 s, later): the bound
		// below is that timeout plus two refresh rounds and the margin.
		gctx, gcancel := context.WithTimeout(ctx, time.Until(cutAt.Add(faultDeadline+5*time.Second+200*time.Millisecond+faultMargin)))
		grants := until(gctx, t, healAt, "leases on x and v", func(ctx context.Context) error {
			if n, m := leases(ctx, t, nc, "x", "cuda:0"), leases(ctx, t, a, "v", "cuda:0"); n != 1 || m != 0 {
				return fmt.Errorf("c holds %d leases on x (want 1), a %d on v (want 0)", n, m)
			}
			return nil
		})
		gcancel()
		t.Logf("%s/%s healed: a→c request ok after %s, c→a after %s; directory (y) %s, (w) %s; a's summaries %s; c's leases back to 1 after %s",
			provider, mode, req, back, dirY, dirW, sums, grants)
	}
	require.NoError(t, lease.Release(ctx))
	require.Equal(t, 0, leases(ctx, t, nc, "x", "cuda:0"))
}
