package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
)

// attempts asks the candidates in rank order until one admits, at most
// p.maxAttempts of them, while the caller's context lasts. A candidate
// that is not a member is an attempt that fails at once (nothing sent).
func (n *Node) attempts(ctx context.Context, p parsedPlacement, cands []*candidate, v clusterView) (*Placement, error) {
	evidence := make([]PlacementCandidate, len(cands))
	for i, c := range cands {
		evidence[i] = c.PlacementCandidate
	}
	perr := &PlacementError{Request: p.req.Name, Candidates: evidence, Directory: v.notes}
	for i, c := range cands {
		if len(perr.Attempts) == p.maxAttempts || ctx.Err() != nil {
			for _, rest := range cands[i:] {
				perr.NotTried = append(perr.NotTried, rest.Node)
			}
			break
		}
		if !v.isMember(c.Node) {
			perr.Attempts = append(perr.Attempts, PlacementAttempt{Node: c.Node, Err: &budget.UnavailableError{Location: "@" + c.Node, Reason: budget.UnavailableLocation,
				Detail: fmt.Sprintf("node %q is not a member of cluster %q (members: %v)", c.Node, v.clusterName, v.members)}})
			continue
		}
		id := fmt.Sprintf("%s/%d/%d", n.name, n.epoch, n.placeSeq.Add(1))
		others := len(cands)-i > 1 && len(perr.Attempts)+1 < p.maxAttempts
		rep, err := n.askToAdmit(ctx, p.req, c, id, others)
		if err != nil {
			perr.Attempts = append(perr.Attempts, PlacementAttempt{Node: c.Node, Err: err})
			continue
		}
		return n.placed(p.req, c, rep, id, evidence, append(perr.Attempts, PlacementAttempt{Node: c.Node}), v.notes), nil
	}
	if err := ctx.Err(); err != nil {
		perr.Ctx = err
	}
	return nil, perr
}

// askToAdmit asks c's node to decide and enter req under placement id,
// and returns its reply when it admitted, else its reason. The attempt is
// bounded by RequestTimeout and the caller's deadline, and by half the
// caller's time left when other candidates remain (others). When it ends
// without an answer, the node is told to release the placement, should
// it admit after all.
func (n *Node) askToAdmit(ctx context.Context, req PlacementRequest, c *candidate, id string, others bool) (*clusterpb.AdmitPlacementReply, error) {
	t := n.timeout(ctx)
	if dl, has := ctx.Deadline(); has && others {
		// Leave the other candidates half of the time left.
		t = min(t, max(time.Until(dl)/2, time.Millisecond))
	}
	attemptDL := time.Now().Add(t)
	callerDL, hasDL := ctx.Deadline()
	callerBound := hasDL && !callerDL.After(attemptDL)
	actx, cancel := context.WithDeadline(ctx, attemptDL)
	msg := &clusterpb.AdmitPlacement{PlacementId: id, Owner: n.name, Name: req.Name, Requirements: c.reqs, Reservations: c.resv,
		StateLimit: int32(req.StateLimit), TimeoutMs: t.Milliseconds(), Hold: req.Hold}
	r, err := n.request(actx, c.Node, msg)
	cancel()
	if err != nil && ctx.Err() == nil && time.Until(attemptDL) < 50*time.Millisecond {
		if callerBound {
			// The request's timer fired a hair before the caller's
			// deadline: that deadline is what ended it.
			<-ctx.Done()
		} else {
			err = &budget.UnavailableError{Location: "@" + c.Node, Reason: budget.UnavailableLocation,
				Detail: fmt.Sprintf("node %q did not answer the placement within this attempt's bound (%s: RequestTimeout, at most half the caller's time left while other candidates remain)", c.Node, t)}
		}
	}
	if err != nil {
		// The node may still admit after we stopped waiting: tell it
		// to exit the placement when it does.
		if pid, perr := n.endpointOf(c.Node); perr == nil {
			n.csys.Root.Send(pid, &clusterpb.ReleasePlacement{PlacementId: id})
		}
		return nil, err
	}
	rep, ok := r.(*clusterpb.AdmitPlacementReply)
	if !ok {
		return nil, fmt.Errorf("residency: node %q answered AdmitPlacement with %T", c.Node, r)
	}
	if !rep.Admitted {
		if rep.Error != nil {
			return nil, placementFromRemote(rep.Error)
		}
		return nil, &budget.UnavailableError{Location: "@" + c.Node, Reason: budget.UnavailableLocation, Detail: "refused without a reason"}
	}
	return rep, nil
}

// placed is the placement c's node admitted, with its evidence.
func (n *Node) placed(req PlacementRequest, c *candidate, rep *clusterpb.AdmitPlacementReply, id string,
	evidence []PlacementCandidate, attempts []PlacementAttempt, notes []string) *Placement {
	p := &Placement{Request: req.Name, Node: c.Node, Candidates: evidence, Directory: notes, from: n, id: id, hold: req.Hold,
		Attempts: attempts,
		Decision: NodeDecision{Node: c.Node, ExpectedStateVersion: rep.ExpectedStateVersion, ExploredStates: int(rep.ExploredStates),
			Exhaustive: rep.Exhaustive, Reclaim: rep.Reclaim, Reservations: rep.Reservations, Enter: rep.Enter}}
	for _, e := range rep.Evictions {
		p.Decision.Evictions = append(p.Decision.Evictions, PlacementEviction{Value: e.Value, Location: e.Location, Bytes: e.Bytes, Reason: e.Reason})
	}
	p.Why = placementWhy(c.PlacementCandidate, len(p.Attempts))
	if len(notes) > 0 {
		p.Why += "; " + strings.Join(notes, "; ")
	}
	return p
}
