package cluster_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// loaded is a value with a local loader (reconstructable, resident
// nowhere until placed).
func loaded(name string, size int64) system.Value {
	return system.Value{Name: name, Bytes: size, Source: "pageable-host", Loader: func(_ context.Context, dst []byte) error {
		for i := range dst {
			dst[i] = byte(i)
		}
		return nil
	}}
}

// waitSummary waits until from's gossip shows node's loc with the given
// used and reserved bytes.
func waitSummary(t *testing.T, from *cluster.Node, node, loc string, used, reserved int64) {
	t.Helper()
	ctx := context.Background()
	eventually(t, from.Name()+" sees "+loc+"@"+node, func() bool {
		sums, err := from.Summaries(ctx)
		if err != nil {
			return false
		}
		for _, s := range sums {
			if s.Node != node {
				continue
			}
			for _, l := range s.Locations {
				if l.Location == loc+"@"+node {
					return l.UsedBytes == used && l.ReservedBytes == reserved
				}
			}
		}
		return false
	})
}

func candidateNodes(cs []cluster.PlacementCandidate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Node
	}
	return out
}

func attemptNodes(as []cluster.PlacementAttempt) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.Node
	}
	return out
}

func useCount(t *testing.T, n *cluster.Node, value, loc string) (int, bool) {
	t.Helper()
	snap, err := n.System().Snapshot(context.Background())
	require.NoError(t, err)
	m, ok := matOf(snap, value, loc)
	return m.UseCount, ok
}

// Cluster placement, on three nodes (each: cuda:0 with a 1000-byte budget,
// unlimited pageable-host) that publish only when told (Refresh), so what
// the directory and the summaries say is exactly what the test set up:
//   - a value already resident on a node is placed there, although
//     another node has more room;
//   - a value resident nowhere goes to the node with the most room;
//   - a node-qualified requirement goes to that node, a bare one to the
//     caller's;
//   - a held placement protects what it entered until Release;
//   - a value too big for every node: a refusal that explains each node;
//   - a node whose room went since its summary (the race) refuses and the
//     next candidate admits, both attempts reported;
//   - nodes without the value refuse and the next is asked;
//   - a dead and a hung member are skipped within the caller's deadline;
//     a request only they can serve fails with UnavailableError at the
//     caller's deadline, and one naming a non-member at once;
//   - a remote lease (AcquireRemote) protects the owner's copy until
//     released;
//   - a held placement is released by its node when the caller leaves.
func TestPlacement(t *testing.T) {
	opts := func(name string) cluster.NodeOptions {
		return cluster.NodeOptions{Name: name, RefreshInterval: time.Hour, RequestTimeout: 2 * time.Second,
			Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 1000))}
	}
	// node-d has no cuda:0 (never a candidate for cuda:0@*) and a running
	// refresh loop: it holds a placement for node-c at the end.
	c := startNodes(t, opts("node-a"), opts("node-b"), opts("node-c"),
		cluster.NodeOptions{Name: "node-d", RefreshInterval: 50 * time.Millisecond, RequestTimeout: 2 * time.Second,
			Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:1", 1000))})
	a, b, cn, d := c.nodes["node-a"], c.nodes["node-b"], c.nodes["node-c"], c.nodes["node-d"]
	all := []*cluster.Node{a, b, cn}
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()

	for _, n := range all {
		for _, v := range []system.Value{loaded("w", 300), loaded("x", 200), loaded("y", 100), loaded("z", 100), loaded("big", 2000), loaded("v", 500), loaded("v3", 100)} {
			_, err := n.System().Register(ctx, v)
			require.NoError(t, err)
		}
	}
	_, err := cn.System().Register(ctx, loaded("q", 10))
	require.NoError(t, err)
	hw, err := b.System().Lookup(ctx, "w")
	require.NoError(t, err)
	require.NoError(t, b.System().Place(ctx, hw, "cuda:0"))
	require.NoError(t, a.System().Reserve(ctx, "cuda:0", "fill", 900))
	refresh := func() {
		t.Helper()
		for _, n := range all {
			require.NoError(t, n.Refresh(ctx))
		}
	}
	refresh()
	waitSummary(t, a, "node-a", "cuda:0", 0, 900)
	waitSummary(t, a, "node-b", "cuda:0", 300, 0)
	waitSummary(t, a, "node-c", "cuda:0", 0, 0)
	// node-d publishes on its own refresh loop. Until its summary reaches
	// node-a, node-a gives it the benefit of the doubt (it might have
	// cuda:0) and lists it as a candidate without room: on a loaded
	// machine the gossip can take longer than the steps above, so wait for
	// it too, not for a time.
	waitSummary(t, a, "node-d", "cuda:1", 0, 0)

	// Already resident on node-b: placed there (node-c has more room), and
	// held: node-b's copy is leased until Release.
	p, err := a.Place(ctx, cluster.PlacementRequest{Name: "r-w", Hold: true,
		Requirements: []cluster.PlacementRequirement{{Value: "w", Tiers: [][]string{{"cuda:0@*"}}}}})
	require.NoError(t, err)
	require.Equal(t, "node-b", p.Node)
	require.Equal(t, []string{"node-b", "node-c", "node-a"}, candidateNodes(p.Candidates), "resident first, then room")
	require.Equal(t, []string{"w at cuda:0@node-b"}, p.Candidates[0].Resident)
	require.True(t, p.Candidates[1].Fits)
	require.False(t, p.Candidates[2].Fits, "node-a has 100 bytes free, w needs 300")
	require.Equal(t, []string{"node-b"}, attemptNodes(p.Attempts))
	require.Equal(t, []string{"w at cuda:0"}, p.Decision.Enter)
	require.Contains(t, p.Why, "already resident there: w at cuda:0@node-b")
	n, ok := useCount(t, b, "w", "cuda:0")
	require.True(t, ok)
	require.Equal(t, 1, n, "the held placement's lease on node-b")
	require.NoError(t, p.Release(ctx))
	n, _ = useCount(t, b, "w", "cuda:0")
	require.Equal(t, 0, n)
	require.NoError(t, p.Release(ctx), "releasing twice is a no-op")

	// Resident nowhere: the node with the most room (c: 1000 > b: 700 >
	// a: 100), decided and entered there (the loader ran on node-c).
	p, err = a.Place(ctx, cluster.PlacementRequest{Name: "r-x",
		Requirements: []cluster.PlacementRequirement{{Value: "x", Tiers: [][]string{{"cuda:0@*"}}}}})
	require.NoError(t, err)
	require.Equal(t, "node-c", p.Node)
	require.Equal(t, []string{"node-c", "node-b", "node-a"}, candidateNodes(p.Candidates))
	require.Equal(t, int64(1000), p.Candidates[0].FreeBytes)
	require.Equal(t, int64(700), p.Candidates[1].FreeBytes)
	require.Equal(t, "node-c", p.Decision.Node)
	require.Positive(t, p.Decision.ExploredStates)
	_, ok = useCount(t, cn, "x", "cuda:0")
	require.True(t, ok, "x is resident on node-c")
	n, _ = useCount(t, cn, "x", "cuda:0")
	require.Equal(t, 0, n, "not held: no lease left")

	// Node-qualified: node-a although it has the least room; bare: the
	// caller's own node.
	p, err = b.Place(ctx, cluster.PlacementRequest{Name: "r-y",
		Requirements: []cluster.PlacementRequirement{{Value: "y", Tiers: [][]string{{"cuda:0@node-a"}}}}})
	require.NoError(t, err)
	require.Equal(t, "node-a", p.Node)
	require.Equal(t, []string{"node-a"}, candidateNodes(p.Candidates))
	_, ok = useCount(t, a, "y", "cuda:0")
	require.True(t, ok)
	p, err = b.Place(ctx, cluster.PlacementRequest{Name: "r-z",
		Requirements: []cluster.PlacementRequirement{{Value: "z", Tiers: [][]string{{"cuda:0"}}}}})
	require.NoError(t, err)
	require.Equal(t, "node-b", p.Node)

	// Too big everywhere: every node's controller refuses, each reason
	// reported.
	_, err = a.Place(ctx, cluster.PlacementRequest{Name: "r-big",
		Requirements: []cluster.PlacementRequirement{{Value: "big", Tiers: [][]string{{"cuda:0@*"}}}}})
	var pe *cluster.PlacementError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Attempts, 3)
	for _, at := range pe.Attempts {
		var plan *system.PlanError
		require.ErrorAs(t, at.Err, &plan, "%s", at.Node)
		require.Contains(t, err.Error(), at.Node+": ")
	}
	require.ErrorIs(t, err, system.ErrPlan)
	require.Empty(t, pe.NotTried)
	t.Logf("all full: %v", err)

	// The race: node-c's room goes after its summary was published. It is
	// still ranked first, refuses (x there is evictable but frees only 200
	// of the 500 bytes v needs), and node-b admits.
	refresh()
	waitSummary(t, a, "node-c", "cuda:0", 200, 0)
	waitSummary(t, a, "node-b", "cuda:0", 400, 0)
	require.NoError(t, cn.System().Reserve(ctx, "cuda:0", "grab", 800))
	p, err = a.Place(ctx, cluster.PlacementRequest{Name: "r-v",
		Requirements: []cluster.PlacementRequirement{{Value: "v", Tiers: [][]string{{"cuda:0@*"}}}}})
	require.NoError(t, err)
	require.Equal(t, []string{"node-c", "node-b"}, attemptNodes(p.Attempts))
	var plan *system.PlanError
	require.ErrorAs(t, p.Attempts[0].Err, &plan)
	require.NoError(t, p.Attempts[1].Err)
	require.Equal(t, "node-b", p.Node)
	require.Contains(t, p.Why, "after 1 refusal")

	// Only node-c has q: the others refuse (no such value) and are
	// reported; unlimited pageable-host everywhere ranks them by name.
	p, err = a.Place(ctx, cluster.PlacementRequest{Name: "r-q",
		Requirements: []cluster.PlacementRequirement{{Value: "q", Tiers: [][]string{{"pageable-host@*"}}}}})
	require.NoError(t, err)
	require.Equal(t, []string{"node-a", "node-b", "node-c"}, attemptNodes(p.Attempts))
	for _, at := range p.Attempts[:2] {
		var un *system.UnavailableError
		require.ErrorAs(t, at.Err, &un)
		require.Contains(t, at.Err.Error(), `no value named "q"`)
	}

	// A dead member (listed, port closed) and a hung one (accepts, never
	// answers), preferred by the request's first tier: both are skipped and
	// the second tier is placed, before the caller's deadline.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadPort := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer hung.Close()
	go func() {
		for {
			conn, err := hung.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	c.agent.RegisterService(testprovider.NewAgentServiceStatus("dead-member", "127.0.0.1", deadPort, []string{"residency.node.node-dead"}))
	c.agent.RegisterService(testprovider.NewAgentServiceStatus("hung-member", "127.0.0.1", hung.Addr().(*net.TCPAddr).Port, []string{"residency.node.node-hung"}))
	defer c.agent.DeregisterService("dead-member")
	defer c.agent.DeregisterService("hung-member")
	require.NoError(t, a.WaitMembers(ctx, "node-dead", "node-hung"))

	dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
	defer dcancel()
	p, err = a.Place(dctx, cluster.PlacementRequest{Name: "r-v3",
		Requirements: []cluster.PlacementRequirement{{Value: "v3", Tiers: [][]string{{"cuda:0@node-dead", "cuda:0@node-hung"}, {"pageable-host@*"}}}}})
	require.NoError(t, err)
	require.NoError(t, dctx.Err(), "placed before the caller's deadline")
	require.Equal(t, []string{"node-dead", "node-hung"}, attemptNodes(p.Attempts[:2]))
	for _, at := range p.Attempts[:2] {
		var un *system.UnavailableError
		require.ErrorAs(t, at.Err, &un, "%s", at.Node)
	}
	require.NotContains(t, []string{"node-dead", "node-hung"}, p.Node)
	t.Logf("skipped dead and hung: %v / %v", p.Attempts[0].Err, p.Attempts[1].Err)

	// Only the hung member can serve it: the caller's deadline ends the
	// placement with UnavailableError (and the context's error).
	hctx, hcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer hcancel()
	_, err = a.Place(hctx, cluster.PlacementRequest{Name: "r-hung",
		Requirements: []cluster.PlacementRequirement{{Value: "v3", Tiers: [][]string{{"cuda:0@node-hung"}}}}})
	var un *system.UnavailableError
	require.ErrorAs(t, err, &un)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// A node that is not a member: an UnavailableError at once, nothing
	// sent.
	_, err = a.Place(ctx, cluster.PlacementRequest{Name: "r-gone",
		Requirements: []cluster.PlacementRequirement{{Value: "v3", Tiers: [][]string{{"cuda:0@node-gone"}}}}})
	require.ErrorAs(t, err, &un)
	require.Contains(t, err.Error(), `node "node-gone" is not a member`)

	// A remote lease keeps the owner's materialization protected until it
	// is released; a value the owner does not have, or a node that is not
	// a member, is an UnavailableError.
	_, err = a.System().Register(ctx, system.Value{Name: "lw", Bytes: 64, At: "pageable-host"})
	require.NoError(t, err)
	rl, err := b.AcquireRemote(ctx, "node-a", system.Handle{Name: "lw"}, "")
	require.NoError(t, err)
	require.Equal(t, "pageable-host", rl.Location)
	require.Equal(t, int64(64), rl.Bytes)
	n, _ = useCount(t, a, "lw", "pageable-host")
	require.Equal(t, 1, n)
	h, err := a.System().Lookup(ctx, "lw")
	require.NoError(t, err)
	var inUse *system.InUseError
	require.ErrorAs(t, a.System().Evict(ctx, h, "pageable-host"), &inUse, "the remote lease protects it")
	require.NoError(t, rl.Release(ctx))
	n, _ = useCount(t, a, "lw", "pageable-host")
	require.Equal(t, 0, n)

	_, err = b.AcquireRemote(ctx, "node-a", system.Handle{Name: "nope"}, "")
	un = nil
	require.ErrorAs(t, err, &un)
	_, err = b.AcquireRemote(ctx, "node-x", system.Handle{Name: "lw"}, "")
	require.ErrorAs(t, err, &un)

	// A held placement whose caller leaves the cluster is released by the
	// node that holds it (its refresh loop checks the members).
	_, err = d.System().Register(ctx, loaded("o", 10))
	require.NoError(t, err)
	p, err = cn.Place(ctx, cluster.PlacementRequest{Name: "r-o", Hold: true,
		Requirements: []cluster.PlacementRequirement{{Value: "o", Tiers: [][]string{{"cuda:1@*"}}}}})
	require.NoError(t, err)
	require.Equal(t, "node-d", p.Node)
	n, _ = useCount(t, d, "o", "cuda:1")
	require.Equal(t, 1, n)
	require.NoError(t, cn.Close(ctx))
	eventually(t, "node-d released node-c's placement", func() bool {
		n, ok := useCount(t, d, "o", "cuda:1")
		return ok && n == 0
	})

	// Malformed requests: nothing asked.
	_, err = a.Place(ctx, cluster.PlacementRequest{Name: "r-bad", Requirements: []cluster.PlacementRequirement{{Value: "v3", Tiers: [][]string{{"gpu@*"}}}}})
	requireInvalid(t, err, "r-bad")
	_, err = a.Place(ctx, cluster.PlacementRequest{Requirements: []cluster.PlacementRequirement{{Value: "v3", Tiers: [][]string{{"cuda:0@*"}}}}})
	requireInvalid(t, err, "name")
	require.False(t, errors.Is(err, system.ErrPlan))
}
