package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	protocluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// Residency is one materialization of a value on one node, as the
// directory reports it.
type Residency struct {
	Location string // node-qualified: "cuda:0@node-b"
	Node     string
	Bytes    int64
	State    string // "entering", "resident" or "leaving"
}

// LocationSummary is one location of a node, as its summary reports it.
type LocationSummary struct {
	Location      string // node-qualified
	HasBudget     bool
	BudgetBytes   int64
	UsedBytes     int64
	ReservedBytes int64
}

// NodeSummary is a node's compact per-location summary at one of its state
// versions (Epoch changes when the node restarts).
type NodeSummary struct {
	Node         string
	Epoch        uint64
	StateVersion uint64
	Locations    []LocationSummary
}

// publisher is what a node last published.
type publisher struct {
	mu       sync.Mutex // one publish at a time
	version  uint64     // state version last published; 0: never
	sent     map[string]string
	forceAll atomic.Bool
}

// Refresh publishes this node's directory entries and location summary
// now, as the refresh loop does at most once per RefreshInterval: it is
// the way to make a change visible to [Node.WhereIs] and [Node.Summaries]
// on every member without waiting. Errors: a directory grain that cannot
// be reached ([*system.UnavailableError]), ctx's error.
func (n *Node) Refresh(ctx context.Context) error { return n.publish(ctx, true) }

// publish sends the directory entries that changed since the last publish
// (every entry after a membership change: a directory grain may have moved
// and lost its state) and gossips the node's summary, when the state
// version changed or force.
func (n *Node) publish(ctx context.Context, force bool) error {
	n.pub.mu.Lock()
	defer n.pub.mu.Unlock()
	all := n.pub.forceAll.Swap(false)
	if !force && !all {
		v, err := n.sys.StateVersion(ctx)
		if err != nil {
			return err
		}
		if v == n.pub.version && n.pub.version != 0 {
			return nil
		}
	}
	snap, err := n.sys.Snapshot(ctx)
	if err != nil {
		if all {
			n.pub.forceAll.Store(true)
		}
		return err
	}
	n.cl.Gossip.SetState(summaryKey, n.summaryOf(snap))
	cur := map[string]*clusterpb.DirectoryUpdate{}
	for _, v := range snap.Values {
		u := &clusterpb.DirectoryUpdate{Value: v.Handle.Name, Node: n.name, Epoch: n.epoch, StateVersion: snap.StateVersion}
		for _, m := range v.Materializations {
			u.Residencies = append(u.Residencies, &clusterpb.Residency{Location: m.Location + "@" + n.name, Node: n.name, Bytes: m.ChargedBytes, State: m.State.String()})
		}
		cur[v.Handle.Name] = u
	}
	names := map[string]bool{}
	for k := range cur {
		names[k] = true
	}
	for k := range n.pub.sent {
		names[k] = true
	}
	var firstErr error
	for name := range names {
		u := cur[name]
		if u == nil {
			u = &clusterpb.DirectoryUpdate{Value: name, Node: n.name, Epoch: n.epoch, StateVersion: snap.StateVersion}
		}
		sig := signature(u)
		if !all && n.pub.sent[name] == sig {
			continue
		}
		if _, err := n.grainRequest(ctx, name, directoryKind, u); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			delete(n.pub.sent, name) // retried next time
			continue
		}
		if len(u.Residencies) == 0 {
			delete(n.pub.sent, name)
		} else {
			n.pub.sent[name] = sig
		}
	}
	if firstErr != nil {
		n.pub.forceAll.Store(all || n.pub.forceAll.Load())
		return firstErr
	}
	n.pub.version = snap.StateVersion
	return nil
}

func signature(u *clusterpb.DirectoryUpdate) string {
	var b strings.Builder
	for _, r := range u.Residencies {
		fmt.Fprintf(&b, "%s/%d/%s;", r.Location, r.Bytes, r.State)
	}
	return b.String()
}

func (n *Node) summaryOf(snap system.Snapshot) *clusterpb.NodeSummary {
	s := &clusterpb.NodeSummary{Node: n.name, Epoch: n.epoch, StateVersion: snap.StateVersion}
	for _, l := range snap.Locations {
		s.Locations = append(s.Locations, &clusterpb.LocationSummary{Location: l.Location + "@" + n.name, HasBudget: l.HasBudget,
			BudgetBytes: l.BudgetBytes, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes})
	}
	return s
}

// WhereIs asks the directory where the value named value is resident on
// the nodes that are members now: one request, to the value's directory
// grain. It reflects what each node last published (see [Node.Refresh]);
// nil when no node reported the value. Errors: [*system.UnavailableError] at
// once when the member hosting the grain is gone (its port refuses
// connections, or it left the member list while the request waited) and
// the member list names no other member for it yet, or when the grain
// does not answer before ctx's deadline or RequestTimeout (a member that
// accepts connections but does not answer); ctx's error when it is
// cancelled.
func (n *Node) WhereIs(ctx context.Context, value string) ([]Residency, error) {
	r, err := n.grainRequest(ctx, value, directoryKind, &clusterpb.WhereIs{Value: value})
	if err != nil {
		return nil, err
	}
	rep, ok := r.(*clusterpb.WhereIsReply)
	if !ok {
		return nil, fmt.Errorf("residency: directory answered WhereIs with %T", r)
	}
	var out []Residency
	for _, x := range rep.Residencies {
		out = append(out, Residency{Location: x.Location, Node: x.Node, Bytes: x.Bytes, State: x.State})
	}
	return out, nil
}

// Summaries returns the latest location summary of every member node, by
// node name, as gossip has spread them (each node gossips its own at most
// once per RefreshInterval, and at [Node.Refresh]). A node that has not
// published yet is missing.
func (n *Node) Summaries(ctx context.Context) ([]NodeSummary, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := n.cl.Gossip.GetState(summaryKey)
	if err != nil {
		return nil, &budget.UnavailableError{Location: "@" + n.name, Reason: budget.UnavailableLocation, Detail: "gossip state: " + err.Error()}
	}
	live := map[string]bool{}
	for _, m := range n.Members() {
		live[m] = true
	}
	byNode := map[string]NodeSummary{}
	for member, kv := range st {
		ns, ok := n.sums.decode(member, kv)
		if !ok || !live[ns.Node] {
			continue
		}
		// A restarted node's former incarnation (another member id) may
		// linger in the gossip state: the newest epoch is the node.
		if old, seen := byNode[ns.Node]; !seen || ns.Epoch > old.Epoch {
			byNode[ns.Node] = ns
		}
	}
	n.sums.prune(st)
	out := make([]NodeSummary, 0, len(byNode))
	for _, ns := range byNode {
		out = append(out, ns)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// epochs is every live node's current epoch as this member's gossip has
// it (nodes without a summary yet are absent).
func (n *Node) epochs() map[string]uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), n.opts.RequestTimeout)
	defer cancel()
	sums, err := n.Summaries(ctx)
	if err != nil {
		return nil
	}
	out := make(map[string]uint64, len(sums))
	for _, s := range sums {
		out[s.Node] = s.Epoch
	}
	return out
}

// grainRequest sends msg to the grain (identity, kind) and waits for the
// reply, at most until ctx's deadline or RequestTimeout. It finds the
// member that hosts the grain itself (protoactor's partition rule,
// [Node.grainOwner]), asks that member's activator for the grain's PID and
// sends msg there, watching the member as requests to a node do: a member
// whose port refuses connections (crashed: kill -9) or that left the
// member list makes the request an [*system.UnavailableError] at once, or within
// about livenessInterval while it waits, instead of at the deadline —
// protoactor's own lookup waits 5 s for a dead member's activator and
// sends to it until the member list drops it. When the member list then
// names another member for the grain, the request is tried once more
// there. No member hosting kind yet (the membership settles): retried
// until the deadline. (protoactor's cluster.Request keeps its call options
// in a process-wide default bound to the first cluster of the process,
// wrong with several nodes in one process.)
func (n *Node) grainRequest(ctx context.Context, identity, kind string, msg any) (any, error) {
	t := n.timeout(ctx)
	deadline := time.Now().Add(t)
	ci := protocluster.NewClusterIdentity(identity, kind)
	var last error
	tried := map[string]bool{} // owners found gone
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, &budget.UnavailableError{Reason: budget.UnavailableLocation,
				Detail: fmt.Sprintf("grain %s/%s did not answer within %s: %v", kind, identity, t, last)}
		}
		addr := n.grainOwner(ci)
		if addr == "" {
			last = fmt.Errorf("no member hosts kind %s", kind)
		} else {
			name := n.memberName(addr)
			res, err := n.grainAsk(ctx, ci, addr, name, msg, left)
			if err == nil {
				return res, nil
			}
			last = err
			n.cl.PidCache.Remove(identity, kind)
			if gone := (*budget.UnavailableError)(nil); errors.As(err, &gone) {
				// The grain's member is gone: once more if the member
				// list already names another one, else fail now.
				tried[addr] = true
				if next := n.grainOwner(ci); next == "" || tried[next] || len(tried) > 1 {
					return nil, err
				}
				continue
			}
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(min(attempt+1, 10)) * 20 * time.Millisecond):
		}
	}
}

// grainOwner is the address of the member that hosts the grain ci, per
// this node's member list: protoactor's partition rule (disthash, the
// identity lookup the node joins with: rendezvous hashing of the members
// that host the kind). "" when no member hosts the kind.
func (n *Node) grainOwner(ci *protocluster.ClusterIdentity) string {
	r := protocluster.NewRendezvous()
	r.UpdateMembers(n.cl.MemberList.Members().Members())
	return r.GetByClusterIdentity(ci)
}

// grainAsk probes the member at addr (name: its node, for errors; not
// itself, nor a member probed within livenessInterval), asks
// its activator for the grain's PID (unless cached) and sends msg there,
// watching the member while it waits.
func (n *Node) grainAsk(ctx context.Context, ci *protocluster.ClusterIdentity, addr, name string, msg any, left time.Duration) (any, error) {
	if addr != n.csys.Address() && !n.probed.fresh(addr) {
		if err := n.probe(addr, min(left, dialTimeout)); err != nil {
			n.probed.set(addr, false)
			return nil, &budget.UnavailableError{Location: "@" + name, Reason: budget.UnavailableLocation,
				Detail: fmt.Sprintf("member %s (%s), which hosts grain %s/%s, is listed but cannot be reached: %v", name, addr, ci.Kind, ci.Identity, err)}
		}
		n.probed.set(addr, true)
	}
	check := func() error { return n.grainMemberReachable(ci.Kind, ci.Identity, addr, name) }
	rctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	pid, _ := n.cl.PidCache.Get(ci.Identity, ci.Kind)
	if pid == nil || pid.Address != addr {
		r, err := n.awaitLive(rctx, grainFirstCheck, check, left, actor.NewPID(addr, disthash.PartitionActivatorActorName),
			&protocluster.ActivationRequest{ClusterIdentity: ci})
		if err != nil {
			return nil, err
		}
		rep, ok := r.(*protocluster.ActivationResponse)
		if !ok || rep.Pid == nil {
			return nil, fmt.Errorf("member %s (%s) did not activate grain %s/%s (answer %T)", name, addr, ci.Kind, ci.Identity, r)
		}
		pid = rep.Pid
		n.cl.PidCache.Set(ci.Identity, ci.Kind, pid)
	}
	return n.awaitLive(rctx, grainFirstCheck, check, left, pid, msg)
}

// directoryGrain is the directory entry of one value name: per node, the
// newest update (by epoch, then state version) that node sent. An entry
// from an earlier epoch than the node's current one (its summary, as the
// hosting member's gossip has it) is a restarted node's former life: the
// new incarnation never had the value and sends nothing for it, so the
// grain drops the entry when it answers.
type directoryGrain struct {
	node    *Node // the member hosting the grain
	entries map[string]*clusterpb.DirectoryUpdate
}

func (g *directoryGrain) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *clusterpb.DirectoryUpdate:
		old := g.entries[m.Node]
		if old == nil || m.Epoch > old.Epoch || (m.Epoch == old.Epoch && m.StateVersion >= old.StateVersion) {
			if len(m.Residencies) == 0 {
				delete(g.entries, m.Node)
			} else {
				g.entries[m.Node] = m
			}
		}
		ctx.Respond(&clusterpb.DirectoryAck{})
	case *clusterpb.WhereIs:
		live := map[string]bool{}
		for _, mem := range protocluster.GetCluster(ctx.ActorSystem()).MemberList.Members().Members() {
			for _, k := range mem.Kinds {
				if strings.HasPrefix(k, nodeKindPrefix) {
					live[strings.TrimPrefix(k, nodeKindPrefix)] = true
				}
			}
		}
		rep := &clusterpb.WhereIsReply{Value: m.Value}
		epochs := g.node.epochs()
		nodes := make([]string, 0, len(g.entries))
		for node, e := range g.entries {
			if cur, ok := epochs[node]; ok && e.Epoch < cur {
				delete(g.entries, node) // a former incarnation's
				continue
			}
			if live[node] {
				nodes = append(nodes, node)
			}
		}
		sort.Strings(nodes)
		for _, node := range nodes {
			rep.Residencies = append(rep.Residencies, g.entries[node].Residencies...)
		}
		ctx.Respond(rep)
	}
}
