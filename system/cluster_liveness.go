package system

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
)

// livenessInterval is how often a request waiting for another node's
// answer checks that the node is still there.
const livenessInterval = 250 * time.Millisecond

// abandoned completes a future whose node is gone, so that nothing waits
// on it until its timeout.
type abandoned struct{}

// awaitReply waits for fut's answer from node (listed at addr). Every
// livenessInterval it checks that node is still a member at addr and that
// addr accepts connections: a node that crashed (kill -9: its port is
// closed at once) or left makes the request an [*UnavailableError] within
// about one interval, instead of at the request's timeout — protoactor
// drops a message to an unreachable member silently. A node that accepts
// connections but does not answer still costs the whole timeout. When ctx
// ends first, fut is completed and ctx's error returned.
func (n *Node) awaitReply(ctx context.Context, node, addr string, fut *actor.Future) (any, error) {
	type result struct {
		res any
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := fut.Result()
		done <- result{r, err}
	}()
	tick := time.NewTicker(livenessInterval)
	defer tick.Stop()
	giveUp := func(err error) (any, error) {
		n.csys.Root.Send(fut.PID(), abandoned{})
		r := <-done
		if _, ok := r.res.(abandoned); ok || r.err != nil {
			return nil, err
		}
		return r.res, r.err // the answer came first
	}
	for {
		select {
		case r := <-done:
			return r.res, r.err
		case <-ctx.Done():
			return giveUp(ctx.Err())
		case <-tick.C:
			if err := n.reachable(node, addr); err != nil {
				return giveUp(err)
			}
		}
	}
}

// reachable reports an [*UnavailableError] when node is no longer a
// member listed at addr or addr refuses connections.
func (n *Node) reachable(node, addr string) error {
	pid, err := n.endpointOf(node)
	if err != nil {
		return err
	}
	if pid.Address != addr {
		return &budget.UnavailableError{Location: "@" + node, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q left %s while a request waited for its answer (now at %s)", node, addr, pid.Address)}
	}
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return &budget.UnavailableError{Location: "@" + node, Reason: budget.UnavailableLocation,
			Detail: fmt.Sprintf("node %q stopped accepting connections at %s while a request waited for its answer: %v", node, addr, err)}
	}
	_ = conn.Close()
	return nil
}
