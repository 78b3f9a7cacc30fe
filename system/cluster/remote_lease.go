package cluster

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// RemoteLease is a lease held on another node's materialization (see
// [Node.AcquireRemote]).
type RemoteLease struct {
	Node     string
	Location string // the owner's location, unqualified
	Bytes    int64

	from     *Node
	id       string
	released atomic.Bool
}

// AcquireRemote takes a lease on a resident materialization of a value of
// node: while it is held, node keeps the materialization charged and
// never evicts or moves it away (as [system.System.Acquire] on that node). h is
// the owner's handle, or just a name (empty Manager). loc is the owner's
// location, unqualified ("" = the first resident one in preference
// order). The owner releases the lease on [RemoteLease.Release], when this
// node leaves the cluster, or when it closes. Errors: [*system.UnavailableError]
// when node is not a member or does not answer within RequestTimeout (or
// ctx's deadline), or has no such value resident; the owner's
// [*system.InUseError]/[*system.UnavailableError] from Acquire.
func (n *Node) AcquireRemote(ctx context.Context, node string, h system.Handle, loc string) (*RemoteLease, error) {
	if h.Name == "" {
		return nil, &budget.InvalidInputError{Message: "acquire remote: the handle has no name"}
	}
	id := fmt.Sprintf("%s/%d/l%d", n.name, n.epoch, n.placeSeq.Add(1))
	t := n.timeout(ctx)
	r, err := n.request(ctx, node, &clusterpb.AcquireLease{LeaseId: id, Owner: n.name, Location: loc, TimeoutMs: t.Milliseconds(),
		Handle: &clusterpb.HandleRef{ManagerId: h.Manager, Id: h.ID, Name: h.Name}})
	if err != nil {
		if pid, perr := n.endpointOf(node); perr == nil {
			n.csys.Root.Send(pid, &clusterpb.ReleaseLease{LeaseId: id})
		}
		return nil, err
	}
	rep, ok := r.(*clusterpb.AcquireLeaseReply)
	if !ok {
		return nil, fmt.Errorf("residency: node %q answered AcquireLease with %T", node, r)
	}
	if rep.Error != nil {
		return nil, placementFromRemote(rep.Error)
	}
	return &RemoteLease{Node: node, Location: rep.Location, Bytes: rep.Bytes, from: n, id: id}, nil
}

// Release releases the lease on its node. Releasing twice is a no-op.
// Errors: the node cannot be reached ([*system.UnavailableError]).
func (l *RemoteLease) Release(ctx context.Context) error {
	if l.released.Swap(true) {
		return nil
	}
	r, err := l.from.request(ctx, l.Node, &clusterpb.ReleaseLease{LeaseId: l.id})
	if err != nil {
		l.released.Store(false)
		return err
	}
	if rep, ok := r.(*clusterpb.ReleaseLeaseReply); ok && rep.Error != nil {
		return placementFromRemote(rep.Error)
	}
	return nil
}

func (n *Node) acquireLease(ctx context.Context, m *clusterpb.AcquireLease, deadline time.Time) *clusterpb.AcquireLeaseReply {
	rep := &clusterpb.AcquireLeaseReply{LeaseId: m.LeaseId}
	fail := func(err error) *clusterpb.AcquireLeaseReply { rep.Error = placementToRemote(err); return rep }
	if m.Handle == nil {
		return fail(&budget.InvalidInputError{Message: "acquire lease: no handle"})
	}
	h := system.Handle{Manager: m.Handle.ManagerId, ID: m.Handle.Id, Name: m.Handle.Name}
	loc := m.Location
	if h.Manager == "" || loc == "" {
		if h.Manager == "" {
			var err error
			if h, err = n.sys.Lookup(ctx, m.Handle.Name); err != nil {
				return fail(&budget.UnavailableError{Handle: m.Handle.Name, Location: "@" + n.name, Reason: budget.UnavailableSource,
					Detail: fmt.Sprintf("node %q has no value %q: %v", n.name, m.Handle.Name, err)})
			}
		}
		if loc == "" {
			snap, err := n.sys.Snapshot(ctx)
			if err != nil {
				return fail(err)
			}
			if loc, rep.Bytes, err = sourceOf(snap, h, "", n.name); err != nil {
				return fail(err)
			}
		}
	}
	lease, err := n.sys.Acquire(ctx, h, loc)
	if err != nil {
		return fail(err)
	}
	if !n.held.keep(ctx, n, m.LeaseId, &heldEntry{owner: m.Owner, lease: lease}, deadline) {
		return fail(&budget.UnavailableError{Location: "@" + n.name, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q acquired lease %s after its caller stopped waiting (or released it); it was released", n.name, m.LeaseId)})
	}
	rep.Location = loc
	if buf := lease.Buffer(); buf != nil {
		rep.Bytes = buf.Size()
	}
	return rep
}
