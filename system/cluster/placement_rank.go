package cluster

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/residency-go/residency/messages/clusterpb"
)

// The ranking is a pure function: from a validated request and what was
// gathered (a clusterView), it computes the candidates in rank order. It
// does no I/O, reads no clock and gives the same answer for the same
// input, so its table tests (placement_rank_test.go) pin the order
// [PlacementCandidate] documents.

// candidate is a node a placement may ask: what the ranking used, and the
// request restricted to that node's locations.
type candidate struct {
	PlacementCandidate
	reqs  []*clusterpb.PlacementRequirement
	resv  []*clusterpb.PlacementReservation
	known int // requirements resident there
}

// rankCandidates returns the nodes that can serve p, best first.
func rankCandidates(p parsedPlacement, v clusterView) []*candidate {
	var cands []*candidate
	for _, node := range v.nodes(p.named) {
		if c, ok := candidateOn(node, p, v); ok {
			cands = append(cands, c)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return ranksBefore(cands[i], cands[j]) })
	return cands
}

// ranksBefore is the order of [PlacementCandidate]: tier ranks
// (lexicographic, first requirement most significant), then more
// requirements resident, then room for the rest, then a known summary,
// then more free bytes, then the name.
func ranksBefore(a, b *candidate) bool {
	for k := range a.TierRanks {
		if a.TierRanks[k] != b.TierRanks[k] {
			return a.TierRanks[k] < b.TierRanks[k]
		}
	}
	if a.known != b.known {
		return a.known > b.known
	}
	if a.Fits != b.Fits {
		return a.Fits
	}
	if a.HasSummary != b.HasSummary {
		return a.HasSummary
	}
	if a.FreeBytes != b.FreeBytes {
		return a.FreeBytes > b.FreeBytes
	}
	return a.Node < b.Node
}

// isMember: node is in the member list.
func (v clusterView) isMember(node string) bool {
	_, ok := slices.BinarySearch(v.members, node)
	return ok
}

// nodes are the nodes a placement considers: the members, then the nodes
// named in the request that are not members (asking one is an attempt
// that fails).
func (v clusterView) nodes(named []string) []string {
	out := slices.Clone(v.members)
	for _, m := range named {
		if !v.isMember(m) {
			out = append(out, m)
		}
	}
	return out
}

// has: node has loc, as far as its summary says (a node without a summary
// yet is given the benefit of the doubt; its controller refuses an
// unknown location).
func (v clusterView) has(node, loc string) bool {
	s, known := v.rooms[node]
	if !known {
		return true
	}
	_, ok := s[loc+"@"+node]
	return ok
}

// candidateOn is node as a candidate for p; false when some requirement
// or reservation has no location there.
func candidateOn(node string, p parsedPlacement, v clusterView) (*candidate, bool) {
	c := &candidate{PlacementCandidate: PlacementCandidate{Node: node, TierRanks: make([]int, len(p.req.Requirements)), Fits: true}}
	for i, r := range p.req.Requirements {
		pr, first := tiersOn(node, r.Value, p.tiers[i], v)
		if first < 0 {
			return nil, false
		}
		c.TierRanks[i] = first
		c.reqs = append(c.reqs, pr)
		c.addRoom(node, r.Value, pr.Tiers[0].Locations, v)
	}
	for i, r := range p.req.Reservations {
		ref := p.resv[i]
		if !ref.on(v.self, node) || !v.has(node, ref.loc) {
			return nil, false
		}
		c.resv = append(c.resv, &clusterpb.PlacementReservation{Name: r.Name, Location: ref.loc, Bytes: r.Bytes})
	}
	if !c.HasSummary {
		c.Fits = false
	}
	return c, true
}

// tiersOn restricts a requirement's tiers to node's locations (tiers left
// empty are dropped) and returns the first tier with one, or -1.
func tiersOn(node, value string, tiers [][]locRef, v clusterView) (*clusterpb.PlacementRequirement, int) {
	pr := &clusterpb.PlacementRequirement{Value: value}
	first := -1
	for t, tier := range tiers {
		var locs []string
		for _, ref := range tier {
			if ref.on(v.self, node) && v.has(node, ref.loc) {
				locs = append(locs, ref.loc)
			}
		}
		if len(locs) == 0 {
			continue
		}
		if first < 0 {
			first = t
		}
		pr.Tiers = append(pr.Tiers, &clusterpb.PlacementTier{Locations: locs})
	}
	return pr, first
}

// addRoom counts one requirement's residency and room on node: resident
// there per the directory (a copy that is leaving does not count), and
// the most free bytes at a location of its first matching tier per the
// summary. A requirement neither resident nor with its bytes free there
// makes the node not fit.
func (c *candidate) addRoom(node, value string, firstTier []string, v clusterView) {
	var size int64
	resident := false
	for _, x := range v.where[value] {
		size = x.Bytes
		if x.Node == node && x.State != "leaving" {
			resident = true
			c.Resident = append(c.Resident, value+" at "+x.Location)
		}
	}
	if resident {
		c.known++
	}
	free, have := int64(-1), false
	if s, ok := v.rooms[node]; ok {
		c.HasSummary = true
		for _, loc := range firstTier {
			l, there := s[loc+"@"+node]
			if !there {
				continue
			}
			f := int64(math.MaxInt64)
			if l.HasBudget {
				f = l.BudgetBytes - l.UsedBytes - l.ReservedBytes
			}
			if !have || f > free {
				free, have = f, true
			}
		}
	}
	if have {
		if c.FreeBytes < math.MaxInt64-max(free, 0) {
			c.FreeBytes += max(free, 0)
		} else {
			c.FreeBytes = math.MaxInt64
		}
	}
	if !resident && (!have || free < size) {
		c.Fits = false
	}
}

// placementWhy is a placement's reason in words: what the ranking saw on
// the chosen node, and how many nodes refused before it.
func placementWhy(c PlacementCandidate, attempt int) string {
	var parts []string
	if len(c.Resident) > 0 {
		parts = append(parts, "already resident there: "+strings.Join(c.Resident, ", "))
	}
	switch {
	case !c.HasSummary:
		parts = append(parts, "room unknown (no summary yet)")
	case c.Fits && c.FreeBytes == math.MaxInt64:
		parts = append(parts, "room: unlimited")
	case c.Fits:
		parts = append(parts, fmt.Sprintf("room: %d bytes free", c.FreeBytes))
	default:
		parts = append(parts, fmt.Sprintf("short of room per its summary (%d bytes free): its controller may evict", c.FreeBytes))
	}
	s := fmt.Sprintf("node %s ranked %d; %s; tiers %v", c.Node, attempt, strings.Join(parts, "; "), c.TierRanks)
	if attempt > 1 {
		s += fmt.Sprintf("; admitted at attempt %d after %d refusal(s)", attempt, attempt-1)
	}
	return s
}
