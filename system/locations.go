package system

import (
	"fmt"
	"maps"
	"slices"

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

// malformedLocation returns the error of the first malformed name in locs
// (an [*InvalidInputError] naming it), or nil when every name is
// well-formed.
func malformedLocation(locs []LocationConfig) error {
	for _, l := range locs {
		if _, err := budget.ParseLocation(l.Name); err != nil {
			return err
		}
	}
	return nil
}

// withSpill returns locs with the spill targets of spill (location →
// target) set on the locations it names; locs itself is not changed.
// A location of spill that locs does not configure is invalid input (so
// is a target that is not configured, or equal to its location: the
// ledger refuses those).
func withSpill(locs []LocationConfig, spill map[string]string) ([]LocationConfig, error) {
	if len(spill) == 0 {
		return locs, nil
	}
	out := append([]LocationConfig(nil), locs...)
	set := 0
	for i := range out {
		if to, ok := spill[out[i].Name]; ok {
			out[i].SpillTo = to
			set++
		}
	}
	if set < len(spill) {
		for _, from := range slices.Sorted(maps.Keys(spill)) {
			to := spill[from]
			found := false
			for _, l := range locs {
				found = found || l.Name == from
			}
			if !found {
				return nil, &budget.InvalidInputError{Message: fmt.Sprintf("spill %s → %s: %s is not a configured location (both ends of a spill target must be configured)", from, to, from)}
			}
		}
	}
	return out, nil
}

// SplitLocation checks a location name — `pageable-host`, `pinned-host`
// or `cuda:N`, each optionally qualified with `@node` — and returns it
// without its qualifier (local) and the node ("" when unqualified). A
// malformed name is an [*InvalidInputError] naming it. The name need not
// be configured anywhere: only its form is checked.
func SplitLocation(name string) (local, node string, err error) {
	n, err := budget.ParseLocation(name)
	if err != nil {
		return "", "", err
	}
	return n.Local().String(), n.Node, nil
}
