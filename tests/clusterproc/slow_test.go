package clusterproc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/tests/internal/faultproxy"
)

// slowDelay is how late the slow node hears every request: longer than
// faultDeadline, so each of its answers comes after the caller gave up.
const slowDelay = 1300 * time.Millisecond

// A slow node: node c's proxy delays every byte sent to it by slowDelay;
// see runSlowNode. With the automanaged provider (no etcd needed): the
// delay is on member traffic only, which is the same with both providers.
func TestSlowNodeAutomanaged(t *testing.T) { runSlowNode(t, "automanaged") }

// The same slow node with etcd, with -faults.all.
func TestSlowNodeEtcd(t *testing.T) {
	if !*allFaults {
		t.Skip("the slow node runs with the automanaged provider; -faults.all runs it with etcd too")
	}
	runSlowNode(t, "etcd")
}

// runSlowNode: nodes a, b, c behind proxies; w resident on b and c, x on
// c only. While c hears everything slowDelay late: a copy of x from c and
// a remote lease on c's x fail with an UnavailableError before their
// deadline (faultDeadline < slowDelay); a held placement of w that
// prefers c gives up on c within its share of the deadline and is
// admitted by b. The answers c computes late are not kept: the lease c
// grants after a gave up and the placement c admits after a moved on are
// released (c's use counts of x and w back to 0, bounded), and b holds
// the one placement lease until it is released. After c is fast again, a
// copy from c, the directory and the summaries converge, timed.
func runSlowNode(t *testing.T, provider string) {
	c := startProxied(t, provider, "a", "b", "c")
	a, b, nc := c.nodes["a"], c.nodes["b"], c.nodes["c"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*converge)
	defer cancel()

	registerAt(ctx, t, b, "w", sizeW, 1, "cuda:0")
	registerAt(ctx, t, nc, "w", sizeW, 1, "cuda:0")
	registerAt(ctx, t, nc, "x", sizeX, 2, "cuda:0")
	for _, n := range []*cluster.Node{a, b, nc} {
		require.NoError(t, n.Refresh(ctx))
	}
	until(ctx, t, time.Now(), "w on b and c", whereIsExactly(a, "w", "cuda:0@b", "cuda:0@c"))

	c.proxies["c"].Set(faultproxy.Delay, slowDelay)
	slowAt := time.Now()
	slow := allFail(ctx, t,
		call{what: "a copying x from slow c", deadlineOK: true, do: func(ctx context.Context) error {
			_, err := c.copyOnce(ctx, a, "c", "x", sizeX)
			return err
		}},
		call{what: "a leasing x on slow c", do: func(ctx context.Context) error {
			l, err := a.AcquireRemote(ctx, "c", system.Handle{Name: "x"}, "cuda:0")
			if err == nil {
				_ = l.Release(ctx)
			}
			return err
		}},
	)
	// c first in the tiers: asked first, given half the time left.
	pctx, pcancel := context.WithTimeout(ctx, 2*faultDeadline)
	start := time.Now()
	p, err := a.Place(pctx, cluster.PlacementRequest{Name: "serve-w", Hold: true,
		Requirements: []cluster.PlacementRequirement{{Value: "w", Tiers: [][]string{{"cuda:0@c"}, {"cuda:0@b"}}}}})
	pcancel()
	placed := time.Since(start)
	require.NoError(t, err, "placing w while c is slow")
	require.Equal(t, "b", p.Node, "%s", p.Why)
	require.Len(t, p.Attempts, 2, "%+v", p.Attempts)
	require.Equal(t, "c", p.Attempts[0].Node)
	var u *system.UnavailableError
	require.True(t, errors.As(p.Attempts[0].Err, &u), "c's attempt: %T %v", p.Attempts[0].Err, p.Attempts[0].Err)
	require.Less(t, placed, 2*faultDeadline+faultMargin)
	require.Equal(t, 1, leases(ctx, t, b, "w", "cuda:0"), "b holds the placement's lease")
	t.Logf("%s: requests to slow c failed within %s (deadline %s, c %s late); w placed on b in %s after c's attempt: %v",
		provider, slow, faultDeadline, slowDelay, placed, p.Attempts[0].Err)

	// What c granted late is released once it hears the caller gave up.
	// The lease: a's release follows its acquire on the same connection,
	// one delay later at most. The copy's stream: a's caller gave up,
	// but the reconstruction it started goes on inside a's runtime (the
	// caller's context does not cancel a stream, docs/cluster.md) and
	// holds c's transfer lease until its last request: open, two chunks
	// and close, each heard one delay late.
	lctx, lcancel := context.WithTimeout(ctx, time.Until(slowAt.Add(4*slowDelay+2*faultMargin)))
	late := until(lctx, t, slowAt, "c's late grants released", func(ctx context.Context) error {
		if n, m := leases(ctx, t, nc, "x", "cuda:0"), leases(ctx, t, nc, "w", "cuda:0"); n != 0 || m != 0 {
			return fmt.Errorf("c holds %d leases on x and %d on w, want 0", n, m)
		}
		return nil
	})
	lcancel()
	require.Equal(t, 1, leases(ctx, t, b, "w", "cuda:0"), "one placement, one lease")

	c.proxies["c"].Set(faultproxy.Pass, 0)
	fastAt := time.Now()
	req := until(ctx, t, fastAt, "a copying x from c", func(ctx context.Context) error {
		_, err := c.copyOnce(ctx, a, "c", "x", sizeX)
		return err
	})
	dir := until(ctx, t, fastAt, "w on b and c", whereIsExactly(a, "w", "cuda:0@b", "cuda:0@c"))
	sums := until(ctx, t, fastAt, "a's summaries", usedIs(a, map[string]int64{"a": 0, "b": sizeW, "c": sizeW + sizeX}))
	t.Logf("%s: c's late grants released %s after it turned slow; fast again: a→c request ok after %s, directory %s, summaries %s",
		provider, late, req, dir, sums)
	require.NoError(t, p.Release(ctx))
	require.Equal(t, 0, leases(ctx, t, b, "w", "cuda:0"))
}
