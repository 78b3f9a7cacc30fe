package system

import (
	"fmt"

	"github.com/residency-go/residency/budget"
)

// refuseNodeQualified refuses a node-qualified location (`cuda:0@node-b`)
// in the configuration of a runtime started with [Start]: such a location
// names memory on another cluster member, which a single-node runtime does
// not have and must not simulate locally. A node started with
// cluster.StartNode (package system/cluster) configures its own locations
// unqualified (or qualified with its own name, which it strips before
// calling Start). Malformed names are left to the ledger's validation,
// which reports them.
func refuseNodeQualified(locs []LocationConfig) error {
	for _, l := range locs {
		n, err := budget.ParseLocation(l.Name)
		if err != nil || n.Node == "" {
			continue
		}
		return &budget.InvalidInputError{Message: fmt.Sprintf(
			"location %q names node %q: a node-qualified location must name a cluster member, and outside cluster mode there is none (configure %q unqualified, or start a cluster node with cluster.StartNode)",
			l.Name, n.Node, budget.LocationName{Kind: n.Kind, Device: n.Device}.String())}
	}
	return nil
}
