package cluster

import (
	"slices"
	"sync"

	protocluster "github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/residency-go/residency/messages/clusterpb"
)

// summaryCache keeps every member's summary decoded, by gossip sequence
// number: Summaries (and so every placement) decodes only what changed
// since the last call instead of every member's summary.
type summaryCache struct {
	mu sync.Mutex
	m  map[string]cachedSummary // by member id
}

type cachedSummary struct {
	seq int64
	ns  NodeSummary
}

func (c *summaryCache) decode(member string, kv *protocluster.GossipKeyValue) (NodeSummary, bool) {
	if kv == nil || kv.Value == nil {
		return NodeSummary{}, false
	}
	c.mu.Lock()
	e, ok := c.m[member]
	c.mu.Unlock()
	if ok && e.seq == kv.SequenceNumber {
		ns := e.ns
		ns.Locations = slices.Clone(ns.Locations) // the caller's to keep
		return ns, true
	}
	var s clusterpb.NodeSummary
	if err := anypb.UnmarshalTo(kv.Value, &s, proto.UnmarshalOptions{}); err != nil {
		return NodeSummary{}, false
	}
	ns := NodeSummary{Node: s.Node, Epoch: s.Epoch, StateVersion: s.StateVersion}
	for _, l := range s.Locations {
		ns.Locations = append(ns.Locations, LocationSummary{Location: l.Location, HasBudget: l.HasBudget, BudgetBytes: l.BudgetBytes, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes})
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]cachedSummary{}
	}
	c.m[member] = cachedSummary{seq: kv.SequenceNumber, ns: ns}
	c.mu.Unlock()
	ns.Locations = slices.Clone(ns.Locations)
	return ns, true
}

// prune forgets members that are no longer in the gossip state.
func (c *summaryCache) prune(st map[string]*protocluster.GossipKeyValue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for m := range c.m {
		if _, ok := st[m]; !ok {
			delete(c.m, m)
		}
	}
}
