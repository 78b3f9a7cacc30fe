package cluster

import "fmt"

// leaveCluster runs protoactor's graceful cluster shutdown (leave the
// member list, stop gossip, then the remote layer). Its last step,
// stopping the endpoint manager, can panic with "send on closed channel"
// when a peer closes its stream to this node at the same moment (several
// nodes stopping together: protoactor's endpoint reader closes its
// disconnect channel before it removes it from the map the manager
// iterates). Everything else is done by then; the panic is recovered, the
// gRPC server is stopped directly and the event logged.
func (n *Node) leaveCluster() {
	defer func() {
		if r := recover(); r != nil {
			n.log.Warn().Str("panic", fmt.Sprint(r)).Msg("protoactor panicked stopping its remote endpoints (a peer closed its stream at the same moment); stopping its gRPC server directly")
			n.cl.Remote.Shutdown(false)
		}
	}()
	n.cl.Shutdown(true)
}
