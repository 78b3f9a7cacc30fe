package cluster

import (
	"fmt"
	"testing"

	protocluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/residency-go/residency/messages/clusterpb"
)

func gossipSummaries(t testing.TB, nodes int) map[string]*protocluster.GossipKeyValue {
	st := map[string]*protocluster.GossipKeyValue{}
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		s := &clusterpb.NodeSummary{Node: name, Epoch: 1, StateVersion: 7}
		for d := range 10 {
			s.Locations = append(s.Locations, &clusterpb.LocationSummary{Location: fmt.Sprintf("cuda:%d@%s", d, name), HasBudget: true, BudgetBytes: 80 << 30, UsedBytes: 60 << 30})
		}
		a, err := anypb.New(s)
		require.NoError(t, err)
		st["member-"+name] = &protocluster.GossipKeyValue{SequenceNumber: 1, Value: a}
	}
	return st
}

// The cache decodes a member's summary once per gossip sequence number,
// hands out copies, and forgets members that left the gossip state.
func TestSummaryCache(t *testing.T) {
	st := gossipSummaries(t, 3)
	var c summaryCache
	ns, ok := c.decode("member-node-0001", st["member-node-0001"])
	require.True(t, ok)
	require.Equal(t, "node-0001", ns.Node)
	require.Len(t, ns.Locations, 10)
	ns.Locations[0].UsedBytes = -1 // the caller's copy
	again, ok := c.decode("member-node-0001", st["member-node-0001"])
	require.True(t, ok)
	require.Equal(t, int64(60<<30), again.Locations[0].UsedBytes)
	// A new sequence number is decoded again.
	changed := gossipSummaries(t, 3)["member-node-0002"]
	s := &clusterpb.NodeSummary{Node: "node-0001", StateVersion: 8}
	a, err := anypb.New(s)
	require.NoError(t, err)
	changed.Value, changed.SequenceNumber = a, 2
	ns, ok = c.decode("member-node-0001", changed)
	require.True(t, ok)
	require.Equal(t, uint64(8), ns.StateVersion)
	_, ok = c.decode("member-x", &protocluster.GossipKeyValue{SequenceNumber: 1})
	require.False(t, ok, "no value")
	delete(st, "member-node-0001")
	c.prune(st)
	require.NotContains(t, c.m, "member-node-0001")
}

// BenchmarkSummaryCache: reading 1,000 members' summaries when none
// changed (what a placement does in a 1,000-node cluster), against
// decoding them all (BenchmarkNodeSummarySizing in messages).
//
//	go test ./system -run '^$' -bench SummaryCache -benchmem
func BenchmarkSummaryCache(b *testing.B) {
	st := gossipSummaries(b, 1000)
	var c summaryCache
	for m, kv := range st {
		c.decode(m, kv)
	}
	b.ResetTimer()
	for range b.N {
		for m, kv := range st {
			if _, ok := c.decode(m, kv); !ok {
				b.Fatal("miss")
			}
		}
		c.prune(st)
	}
}
