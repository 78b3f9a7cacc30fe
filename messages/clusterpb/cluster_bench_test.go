package clusterpb

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// sizingSummary is a node's summary as docs/cluster.md sizes it: 10
// locations (pageable-host, pinned-host, cuda:0..7) with GiB-scale
// figures, a 9-character node name.
func sizingSummary(node int) *NodeSummary {
	name := fmt.Sprintf("node-%04d", node)
	s := &NodeSummary{Node: name, Epoch: 1_764_500_000_000_000_000, StateVersion: 123_456_789}
	locs := []string{"pageable-host", "pinned-host"}
	for d := range 8 {
		locs = append(locs, fmt.Sprintf("cuda:%d", d))
	}
	for i, l := range locs {
		s.Locations = append(s.Locations, &LocationSummary{Location: l + "@" + name, HasBudget: i > 0,
			BudgetBytes: 80 << 30, UsedBytes: 61<<30 + int64(i)*12345, ReservedBytes: 3<<30 + int64(i)})
	}
	return s
}

// BenchmarkNodeSummarySizing: the bytes of one summary (bare and wrapped
// in the Any that gossip carries) and the time to decode 1,000 of them,
// what Node.Summaries does per placement in a 1,000-node cluster.
//
//	go test ./messages/clusterpb -run '^$' -bench NodeSummarySizing -benchmem
func BenchmarkNodeSummarySizing(b *testing.B) {
	const nodes = 1000
	wire := make([]*anypb.Any, nodes)
	for i := range wire {
		a, err := anypb.New(sizingSummary(i))
		if err != nil {
			b.Fatal(err)
		}
		wire[i] = a
	}
	b.ResetTimer()
	for range b.N {
		for _, a := range wire {
			var s NodeSummary
			if err := anypb.UnmarshalTo(a, &s, proto.UnmarshalOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(proto.Size(sizingSummary(0))), "summary-bytes")
	b.ReportMetric(float64(proto.Size(wire[0])), "any-bytes")
}
