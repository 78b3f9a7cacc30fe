package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// eventually polls cond until it holds or converge passes (a generous
// bound: the test asserts what becomes true, not how fast).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(converge)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s", what, converge)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The directory answers "where is value v resident" in one request from
// any member, with node-qualified locations, kept current by the owning
// nodes (explicitly with Refresh, and by the rate-bounded refresh loop);
// a node that leaves drops out of the answer. Each node's per-location
// summary reaches every member by gossip. Nodes may configure their own
// locations qualified with their own name.
func TestDirectoryAndSummaries(t *testing.T) {
	c := startNodes(t,
		cluster.NodeOptions{Name: "node-a", Options: locs(system.NoLimit("pageable-host@node-a"), system.Limit("cuda:0@node-a", 1000))},
		cluster.NodeOptions{Name: "node-b", Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 2000))},
		cluster.NodeOptions{Name: "node-c", Options: locs(system.NoLimit("pageable-host"))},
	)
	a, b, cn := c.nodes["node-a"], c.nodes["node-b"], c.nodes["node-c"]
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()

	_, err := a.System().Register(ctx, system.Value{Name: "w", Bytes: 100, At: "cuda:0"})
	require.NoError(t, err)
	hb, err := b.System().Register(ctx, system.Value{Name: "w", Bytes: 100, At: "pageable-host"})
	require.NoError(t, err)
	require.NoError(t, a.Refresh(ctx))
	require.NoError(t, b.Refresh(ctx))
	want := []cluster.Residency{
		{Location: "cuda:0@node-a", Node: "node-a", Bytes: 100, State: "resident"},
		{Location: "pageable-host@node-b", Node: "node-b", Bytes: 100, State: "resident"},
	}
	for _, n := range []*cluster.Node{a, b, cn} {
		got, err := n.WhereIs(ctx, "w")
		require.NoError(t, err)
		require.Equal(t, want, got, "asked from %s", n.Name())
	}
	none, err := cn.WhereIs(ctx, "nowhere")
	require.NoError(t, err)
	require.Empty(t, none)

	// The refresh loop publishes a change without Refresh.
	require.NoError(t, b.System().Place(ctx, hb, "cuda:0")) // exclusive: a move
	eventually(t, "the directory shows w moved to cuda:0@node-b", func() bool {
		got, err := cn.WhereIs(ctx, "w")
		return err == nil && len(got) == 2 && got[1].Location == "cuda:0@node-b"
	})
	require.NoError(t, b.System().Discard(ctx, hb))
	require.NoError(t, b.Refresh(ctx))
	got, err := cn.WhereIs(ctx, "w")
	require.NoError(t, err)
	require.Equal(t, want[:1], got)

	// Summaries: every node's locations, node-qualified, as gossip spreads
	// them.
	eventually(t, "node-c sees node-a's cuda:0 summary", func() bool {
		sums, err := cn.Summaries(ctx)
		if err != nil || len(sums) != 3 {
			return false
		}
		for _, s := range sums {
			if s.Node != "node-a" {
				continue
			}
			for _, l := range s.Locations {
				if l.Location == "cuda:0@node-a" {
					return l.HasBudget && l.BudgetBytes == 1000 && l.UsedBytes == 100 && l.ReservedBytes == 0
				}
			}
		}
		return false
	})
	require.NoError(t, a.System().Reserve(ctx, "cuda:0", "r", 300))
	eventually(t, "node-b sees node-a's reservation", func() bool {
		sums, err := b.Summaries(ctx)
		if err != nil {
			return false
		}
		for _, s := range sums {
			for _, l := range s.Locations {
				if l.Location == "cuda:0@node-a" && l.ReservedBytes == 300 {
					return true
				}
			}
		}
		return false
	})

	// A node that leaves drops out of the directory's answers and of the
	// summaries.
	_, err = cn.System().Register(ctx, system.Value{Name: "w", Bytes: 100, At: "pageable-host"})
	require.NoError(t, err)
	require.NoError(t, cn.Refresh(ctx))
	got, err = a.WhereIs(ctx, "w")
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.NoError(t, cn.Close(ctx))
	eventually(t, "node-c left the directory's answer", func() bool {
		got, err := a.WhereIs(ctx, "w")
		return err == nil && len(got) == 1 && got[0].Node == "node-a"
	})
	eventually(t, "node-c left the summaries", func() bool {
		sums, err := b.Summaries(ctx)
		return err == nil && len(sums) == 2
	})
}

// StartNode's refusals need no cluster: a location of another node, a
// missing provider, a bad node name.
func TestStartNodeRefusals(t *testing.T) {
	ctx := context.Background()
	_, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-a", Provider: nil, Options: locs(system.NoLimit("pageable-host"))})
	requireInvalid(t, err, "provider")
	for _, name := range []string{"", "a b", "a@b"} {
		_, err = cluster.StartNode(ctx, cluster.NodeOptions{Name: name, Options: locs(system.NoLimit("pageable-host"))})
		requireInvalid(t, err, "node name")
	}
	// Checked before the runtime starts or the node joins.
	prov := testprovider.NewTestProvider(testprovider.NewInMemAgent())
	_, err = cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-a", Provider: prov, Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0@node-b", 10))})
	requireInvalid(t, err, `"cuda:0@node-b"`)
	_, err = cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-a", Provider: prov, Addr: "not-an-address", Options: locs(system.NoLimit("pageable-host"))})
	requireInvalid(t, err, "address")
}

func requireInvalid(t *testing.T, err error, contains string) {
	t.Helper()
	var inv *system.InvalidInputError
	require.True(t, errors.As(err, &inv), "%v", err)
	require.Contains(t, err.Error(), contains)
}
