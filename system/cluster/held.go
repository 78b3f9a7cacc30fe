package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// heldTable is what this node holds for other nodes: placements' scopes
// and remote leases, by the caller's id.
type heldTable struct {
	mu        sync.Mutex
	m         map[string]*heldEntry
	cancelled map[string]time.Time // released before their admission completed
}

type heldEntry struct {
	owner string
	scope *system.Scope
	lease *system.Lease
}

func (e *heldEntry) release(ctx context.Context) error {
	if e.scope != nil {
		return e.scope.Exit(ctx)
	}
	return e.lease.Release(ctx)
}

// keep stores e under id, unless its release already came, the node is
// closing, or the caller stopped waiting (deadline): then e is released
// and false returned.
func (t *heldTable) keep(ctx context.Context, n *Node, id string, e *heldEntry, deadline time.Time) bool {
	t.mu.Lock()
	_, gone := t.cancelled[id]
	delete(t.cancelled, id)
	late := time.Now().After(deadline)
	if !gone && !late && !n.closed.Load() {
		if t.m == nil {
			t.m = map[string]*heldEntry{}
		}
		t.m[id] = e
		t.mu.Unlock()
		return true
	}
	t.mu.Unlock()
	if err := e.release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, system.ErrClosed) {
		n.log.Warn().Err(err).Str("id", id).Msg("residency node: releasing what a caller no longer waits for")
	}
	return false
}

// drop releases id; an id not held yet is remembered so that its
// admission, when it completes, is released at once.
func (t *heldTable) drop(ctx context.Context, n *Node, id string) error {
	t.mu.Lock()
	e := t.m[id]
	delete(t.m, id)
	if e == nil {
		if t.cancelled == nil {
			t.cancelled = map[string]time.Time{}
		}
		now := time.Now()
		for k, at := range t.cancelled {
			if now.Sub(at) > 10*n.opts.RequestTimeout {
				delete(t.cancelled, k)
			}
		}
		t.cancelled[id] = now
	}
	t.mu.Unlock()
	if e == nil {
		return nil
	}
	return e.release(ctx)
}

// releaseOrphans releases what nodes that left the cluster held here, or
// everything when all (the node closes).
func (t *heldTable) releaseOrphans(ctx context.Context, n *Node, all bool) {
	live := map[string]bool{}
	if !all {
		for _, m := range n.Members() {
			live[m] = true
		}
	}
	var gone []*heldEntry
	t.mu.Lock()
	for id, e := range t.m {
		if all || !live[e.owner] {
			gone = append(gone, e)
			delete(t.m, id)
		}
	}
	t.mu.Unlock()
	for _, e := range gone {
		if err := e.release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, system.ErrClosed) {
			n.log.Warn().Err(err).Str("owner", e.owner).Msg("residency node: releasing what a departed node held")
		}
	}
}

// receivePlacement handles the placement and remote lease messages;
// false for any other message.
func (n *Node) receivePlacement(ctx actor.Context) bool {
	switch m := ctx.Message().(type) {
	case *clusterpb.AdmitPlacement:
		n.serveHeld(ctx, m.TimeoutMs, func(c context.Context, deadline time.Time) any { return n.admitPlacement(c, m, deadline) },
			&clusterpb.AdmitPlacementReply{PlacementId: m.PlacementId, Error: toRemote(system.ErrClosed)})
	case *clusterpb.ReleasePlacement:
		n.serveHeld(ctx, 0, func(c context.Context, _ time.Time) any {
			return &clusterpb.ReleasePlacementReply{Error: placementToRemote(n.held.drop(c, n, m.PlacementId))}
		}, &clusterpb.ReleasePlacementReply{})
	case *clusterpb.AcquireLease:
		n.serveHeld(ctx, m.TimeoutMs, func(c context.Context, deadline time.Time) any { return n.acquireLease(c, m, deadline) },
			&clusterpb.AcquireLeaseReply{LeaseId: m.LeaseId, Error: toRemote(system.ErrClosed)})
	case *clusterpb.ReleaseLease:
		n.serveHeld(ctx, 0, func(c context.Context, _ time.Time) any {
			return &clusterpb.ReleaseLeaseReply{Error: placementToRemote(n.held.drop(c, n, m.LeaseId))}
		}, &clusterpb.ReleaseLeaseReply{})
	default:
		return false
	}
	return true
}

// serveHeld runs handle on its own goroutine with a context bounded by
// timeoutMs (the caller's wait; RequestTimeout when 0) and answers the
// sender; a closed node answers closed at once.
func (n *Node) serveHeld(ctx actor.Context, timeoutMs int64, handle func(context.Context, time.Time) any, closed any) {
	sender := ctx.Sender()
	if n.closed.Load() {
		if sender != nil {
			ctx.Respond(closed)
		}
		return
	}
	t := n.opts.RequestTimeout
	if timeoutMs > 0 {
		t = time.Duration(timeoutMs) * time.Millisecond
	}
	deadline := time.Now().Add(t)
	n.workWG.Add(1)
	go func() {
		defer n.workWG.Done()
		c, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		reply := handle(c, deadline)
		if sender != nil {
			n.csys.Root.Send(sender, reply)
		}
	}()
}

func (n *Node) admitPlacement(ctx context.Context, m *clusterpb.AdmitPlacement, deadline time.Time) *clusterpb.AdmitPlacementReply {
	rep := &clusterpb.AdmitPlacementReply{PlacementId: m.PlacementId}
	fail := func(err error) *clusterpb.AdmitPlacementReply { rep.Error = placementToRemote(err); return rep }
	req := system.Request{Name: m.Name}
	for _, r := range m.Requirements {
		h, err := n.sys.Lookup(ctx, r.Value)
		if err != nil {
			return fail(&budget.UnavailableError{Handle: r.Value, Location: "@" + n.name, Reason: budget.UnavailableSource,
				Detail: fmt.Sprintf("node %q has no value named %q: %v", n.name, r.Value, err)})
		}
		rq := system.Requirement{Handle: h}
		for _, t := range r.Tiers {
			rq.Tiers = append(rq.Tiers, t.Locations)
		}
		req.Requirements = append(req.Requirements, rq)
	}
	for _, r := range m.Reservations {
		req.Reservations = append(req.Reservations, system.ReservationSpec{Name: r.Name, Location: r.Location, Bytes: r.Bytes})
	}
	sc, d, err := n.sys.AdmitWithLimit(ctx, req, int(m.StateLimit))
	rep.ExpectedStateVersion, rep.ExploredStates, rep.Exhaustive = d.ExpectedStateVersion, int64(d.ExploredStates), d.Exhaustive
	for _, a := range d.Plan.Reclaim {
		rep.Reclaim = append(rep.Reclaim, a.String())
	}
	for _, r := range d.Plan.Reservations {
		rep.Reservations = append(rep.Reservations, r.String())
	}
	for _, a := range d.Plan.Enter {
		rep.Enter = append(rep.Enter, a.String())
	}
	for _, e := range d.Evictions {
		rep.Evictions = append(rep.Evictions, &clusterpb.PlacementEviction{Value: e.Handle.Name, Location: e.Location + "@" + n.name, Bytes: e.Bytes, Reason: e.Reason})
	}
	if err != nil {
		return fail(err)
	}
	if !m.Hold {
		if err := sc.Exit(context.WithoutCancel(ctx)); err != nil {
			return fail(err)
		}
		rep.Admitted = true
		return rep
	}
	if !n.held.keep(ctx, n, m.PlacementId, &heldEntry{owner: m.Owner, scope: sc}, deadline) {
		return fail(&budget.UnavailableError{Location: "@" + n.name, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q admitted placement %s after its caller stopped waiting (or released it); it was exited", n.name, m.PlacementId)})
	}
	rep.Admitted = true
	return rep
}
