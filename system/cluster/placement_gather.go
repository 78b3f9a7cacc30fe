package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/residency-go/residency/budget"
)

// clusterView is what a placement ranks by, gathered once: the
// directory's answers, the gossiped summaries and the member list. The
// ranking reads nothing else.
type clusterView struct {
	self        string                                // the node placing the request
	clusterName string                                // for errors
	where       map[string][]Residency                // directory answers, by value name
	notes       []string                              // directory lookups that failed
	rooms       map[string]map[string]LocationSummary // summaries, by node, by node-qualified location
	members     []string                              // the member list, sorted
}

// gather asks the directory where the request's values are resident
// (see [Node.lookUp]) and reads the summaries and the member list.
func (n *Node) gather(ctx context.Context, req PlacementRequest) (clusterView, error) {
	where, notes, err := n.lookUp(ctx, req)
	if err != nil {
		return clusterView{}, err
	}
	sums, err := n.Summaries(ctx)
	if err != nil {
		return clusterView{}, err
	}
	return clusterView{self: n.name, clusterName: n.opts.ClusterName, where: where, notes: notes,
		rooms: roomsOf(sums), members: n.Members()}, nil
}

// roomsOf indexes summaries by node and location.
func roomsOf(sums []NodeSummary) map[string]map[string]LocationSummary {
	out := make(map[string]map[string]LocationSummary, len(sums))
	for _, s := range sums {
		m := make(map[string]LocationSummary, len(s.Locations))
		for _, l := range s.Locations {
			m[l.Location] = l
		}
		out[s.Node] = m
	}
	return out
}

const maxLookups = 8

// lookUp asks the directory where each distinct requirement value is
// resident, up to maxLookups at once, each lookup bounded by
// RequestTimeout and half the caller's time left (the rest is for the
// nodes). A lookup that fails (its grain's member is gone, or it did not
// answer within its bound) is a note, and the ranking goes on without
// it. The caller's context ending during the lookups is a
// [*PlacementError] saying so.
func (n *Node) lookUp(ctx context.Context, req PlacementRequest) (map[string][]Residency, []string, error) {
	var values []string
	seen := map[string]bool{}
	for _, r := range req.Requirements {
		if !seen[r.Value] {
			seen[r.Value] = true
			values = append(values, r.Value)
		}
	}
	t := n.timeout(ctx)
	if dl, ok := ctx.Deadline(); ok {
		t = min(t, max(time.Until(dl)/2, time.Millisecond))
	}
	lookupDL := time.Now().Add(t)
	lctx, cancel := context.WithDeadline(ctx, lookupDL)
	defer cancel()
	res := make([][]Residency, len(values))
	errs := make([]error, len(values))
	late := make([]bool, len(values)) // failed at the lookup bound
	look := func(i int) {
		res[i], errs[i] = n.WhereIs(lctx, values[i])
		late[i] = !time.Now().Before(lookupDL)
	}
	if len(values) == 1 {
		look(0)
	} else {
		sem := make(chan struct{}, maxLookups)
		var wg sync.WaitGroup
		for i := range values {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				look(i)
			}()
		}
		wg.Wait()
	}
	where := map[string][]Residency{}
	var notes []string
	for i, v := range values {
		where[v] = res[i]
		err := errs[i]
		if err == nil {
			continue
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, nil, &PlacementError{Request: req.Name, Stage: fmt.Sprintf("asking the directory where %s is resident", v), Ctx: cerr}
		}
		// The directory is a preference, not a must: rank without it.
		var un *budget.UnavailableError
		switch {
		case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &un) && late[i]):
			notes = append(notes, fmt.Sprintf("directory did not answer for %s within %s: ranked by room only", v, t.Round(time.Millisecond)))
		default:
			notes = append(notes, fmt.Sprintf("directory lookup for %s failed (%v): ranked by room only", v, err))
		}
		n.log.Debug().Err(err).Str("value", v).Msg("residency placement: directory lookup failed")
	}
	return where, notes, nil
}
