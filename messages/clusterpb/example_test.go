package clusterpb_test

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/residency-go/residency/messages/clusterpb"
)

// A node's location summary survives the wire as protobuf: this is what
// each node gossips, at most once per refresh interval.
func ExampleNodeSummary() {
	in := &clusterpb.NodeSummary{Node: "node-a", Epoch: 1, StateVersion: 9, Locations: []*clusterpb.LocationSummary{
		{Location: "cuda:0@node-a", HasBudget: true, BudgetBytes: 1 << 30, UsedBytes: 1 << 29},
	}}
	b, err := proto.Marshal(in)
	if err != nil {
		panic(err)
	}
	var out clusterpb.NodeSummary
	if err := proto.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	l := out.Locations[0]
	fmt.Println(out.Node, out.StateVersion, l.Location, l.BudgetBytes-l.UsedBytes)
	fmt.Println(proto.Equal(in, &out), in.ProtoReflect().Descriptor().FullName())
	// Output:
	// node-a 9 cuda:0@node-a 536870912
	// true residency.cluster.v1.NodeSummary
}

// A typed error crosses nodes as a RemoteError: its kind says which Go
// type the receiver rebuilds, and the fields carry that type's figures.
func ExampleRemoteError() {
	e := &clusterpb.RemoteError{Kind: clusterpb.RemoteError_BUDGET, Location: "cuda:0",
		HasBudget: true, BudgetBytes: 100, UsedBytes: 80, RequestedBytes: 50}
	b, _ := proto.Marshal(e)
	var got clusterpb.RemoteError
	_ = proto.Unmarshal(b, &got)
	fmt.Println(got.Kind, got.Location, got.BudgetBytes-got.UsedBytes < got.RequestedBytes)
	// Output: BUDGET cuda:0 true
}
