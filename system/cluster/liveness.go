package cluster

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
)

// livenessInterval is how often a request waiting for another node's
// answer checks that the node is still there.
const livenessInterval = 250 * time.Millisecond

// awaitReply sends msg to pid (node's endpoint) and waits for its answer,
// at most timeout. After first, then every livenessInterval, it checks
// that node is still a member at pid.Address and that the address
// accepts connections: a node that crashed (kill -9: its port is
// closed at once) or left makes the request an [*system.UnavailableError]
// within about one interval, instead of at the request's timeout —
// protoactor drops a message to an unreachable member silently. A node
// that accepts connections but does not answer still costs the whole
// timeout. When ctx ends first, ctx's error is returned.
func (n *Node) awaitReply(ctx context.Context, node string, pid *actor.PID, first, timeout time.Duration, msg any) (any, error) {
	return n.awaitLive(ctx, first, func() error { return n.reachable(node, pid.Address) }, timeout, pid, msg)
}

// grainFirstCheck is when a grain request first checks its member: a
// directory grain answers in well under a millisecond, so a request still
// waiting then is worth one connection attempt (a member that crashed
// just after its last probe is found here instead of a full interval
// later).
const grainFirstCheck = 20 * time.Millisecond

// replySlot is where one request's answer lands: a process of the node's
// actor system, the request's sender, that hands the answer to the
// waiting caller through a channel (as protoactor's future does, without
// a goroutine to wait on the future).
type replySlot struct {
	ch chan any
}

func (r *replySlot) SendUserMessage(_ *actor.PID, m any) {
	_, msg, _ := actor.UnwrapEnvelope(m)
	select {
	case r.ch <- msg:
	default: // a second answer: the first one counts
	}
}

func (r *replySlot) SendSystemMessage(pid *actor.PID, m any) { r.SendUserMessage(pid, m) }

func (r *replySlot) Stop(*actor.PID) {}

// answer is a reply slot's message as a result: a dead letter (no such
// actor at the member) is [actor.ErrDeadLetter].
func answer(m any) (any, error) {
	if _, ok := m.(*actor.DeadLetterResponse); ok {
		return nil, actor.ErrDeadLetter
	}
	return m, nil
}

// awaitLive sends msg to pid and waits for its answer, at most timeout
// ([actor.ErrTimeout]), running check after first and then every
// livenessInterval: its error gives up on the answer and is returned.
// When ctx ends first, ctx's error is returned. An answer that comes
// after the wait ended goes to protoactor's dead letters.
func (n *Node) awaitLive(ctx context.Context, first time.Duration, check func() error, timeout time.Duration, pid *actor.PID, msg any) (any, error) {
	slot := &replySlot{ch: make(chan any, 1)}
	reg := n.csys.ProcessRegistry
	sender, _ := reg.Add(slot, "residency-reply"+reg.NextId())
	defer reg.Remove(sender)
	n.csys.Root.RequestWithCustomSender(pid, msg, sender)
	tick := time.NewTimer(first)
	defer tick.Stop()
	end := time.NewTimer(timeout)
	defer end.Stop()
	giveUp := func(err error) (any, error) {
		reg.Remove(sender)
		select {
		case m := <-slot.ch: // the answer came first
			if r, aerr := answer(m); aerr == nil {
				return r, nil
			}
		default:
		}
		return nil, err
	}
	for {
		select {
		case m := <-slot.ch:
			return answer(m)
		case <-ctx.Done():
			return giveUp(ctx.Err())
		case <-end.C:
			return giveUp(actor.ErrTimeout)
		case <-tick.C:
			if err := check(); err != nil {
				return giveUp(err)
			}
			tick.Reset(livenessInterval)
		}
	}
}

// reachable reports an [*system.UnavailableError] when node is no longer a
// member listed at addr or addr refuses connections.
func (n *Node) reachable(node, addr string) error {
	pid, err := n.endpointOf(node)
	if err != nil {
		n.probed.set(addr, false)
		return err
	}
	if pid.Address != addr {
		n.probed.set(addr, false)
		return &budget.UnavailableError{Location: "@" + node, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q left %s while a request waited for its answer (now at %s)", node, addr, pid.Address)}
	}
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		n.probed.set(addr, false)
		return &budget.UnavailableError{Location: "@" + node, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q stopped accepting connections at %s while a request waited for its answer: %v", node, addr, err)}
	}
	_ = conn.Close()
	return nil
}

// grainMemberReachable reports an [*system.UnavailableError] when no member
// hosting kind is listed at addr any more, or addr refuses connections:
// the member that hosts a grain (see [Node.grainOwner]) crashed or left.
func (n *Node) grainMemberReachable(kind, identity, addr, name string) error {
	if !n.memberAt(addr, kind) {
		n.probed.set(addr, false)
		return &budget.UnavailableError{Location: "@" + name, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("member %s (%s), which hosts grain %s/%s, left the member list while a request waited for its answer", name, addr, kind, identity)}
	}
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		n.probed.set(addr, false)
		return &budget.UnavailableError{Location: "@" + name, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("member %s (%s), which hosts grain %s/%s, stopped accepting connections while a request waited for its answer: %v", name, addr, kind, identity, err)}
	}
	_ = conn.Close()
	return nil
}

// memberAt: a member hosting kind is listed at addr.
func (n *Node) memberAt(addr, kind string) bool {
	for _, m := range n.cl.MemberList.Members().Members() {
		if m.Address() == addr && m.HasKind(kind) {
			return true
		}
	}
	return false
}

// memberName is the node name of the member listed at addr, or addr
// itself when no listed member there runs a node.
func (n *Node) memberName(addr string) string {
	for _, m := range n.cl.MemberList.Members().Members() {
		if m.Address() != addr {
			continue
		}
		for _, k := range m.Kinds {
			if strings.HasPrefix(k, nodeKindPrefix) {
				return strings.TrimPrefix(k, nodeKindPrefix)
			}
		}
	}
	return addr
}

// probeCache remembers, per member address, when a probe last succeeded:
// a grain request, and a node request that probes (see probesFirst),
// skips its probe within livenessInterval of the last one (a member that
// crashed since is caught by the check while the request waits,
// grainFirstCheck into it).
type probeCache struct {
	mu sync.Mutex
	ok map[string]time.Time
}

func (c *probeCache) fresh(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.ok[addr]
	return ok && time.Since(at) < livenessInterval
}

func (c *probeCache) set(addr string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		delete(c.ok, addr)
		return
	}
	if c.ok == nil {
		c.ok = map[string]time.Time{}
	}
	now := time.Now()
	for a, at := range c.ok {
		if now.Sub(at) >= livenessInterval {
			delete(c.ok, a)
		}
	}
	c.ok[addr] = now
}

// probesFirst: the requests before which a node checks that the member's
// port answers (a crashed member's port is closed: an answer at once
// instead of a request timeout).
func probesFirst(msg any) bool {
	switch msg.(type) {
	case *clusterpb.OpenStream, *clusterpb.AdmitPlacement, *clusterpb.AcquireLease:
		return true
	}
	return false
}
