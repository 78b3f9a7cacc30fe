package cluster_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// StartNode refuses options it cannot honour before it starts anything:
// here no provider, then a location that is another node's memory. The
// examples that start nodes are in example_node_test.go.
func ExampleStartNode_refused() {
	ctx := context.Background()
	_, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-a",
		Options: system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host")}}})
	fmt.Println(errors.Is(err, system.ErrInvalidInput), err)
	_, err = cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-a bad"})
	fmt.Println(errors.Is(err, system.ErrInvalidInput))
	// Output:
	// true residency invalid input: node "node-a": a cluster provider is required
	// true
}

// A placement that no node admitted says why, node by node; errors.As
// finds each node's typed error in it.
func ExamplePlacementError() {
	err := error(&cluster.PlacementError{Request: "serve",
		Attempts: []cluster.PlacementAttempt{{Node: "node-b", Err: &system.BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 80, RequestedBytes: 50}}},
		NotTried: []string{"node-c"}})
	var be *system.BudgetError
	fmt.Println(errors.As(err, &be), be.RequestedBytes > be.BudgetBytes-be.UsedBytes)
	var pe *cluster.PlacementError
	if errors.As(err, &pe) {
		fmt.Println(pe.Attempts[0].Node, pe.NotTried)
	}
	// Output:
	// true true
	// node-b [node-c]
}
