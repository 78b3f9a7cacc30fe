package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// The examples that start nodes (example_node_test.go) leave goroutines
// of protoactor's that no API stops, each ignored by exact name (the list
// tests/cluster keeps, with the reasons): the in-memory test provider's
// TTL refresher, and the one-shot timers of actor.NewThrottle and
// NewThrottleWithLogger, in their inlined forms too.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster/clusterproviders/test.(*Provider).startTtlReport.func1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottleWithLogger.func1.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.NewGossipActor.NewThrottleWithLogger.func2.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.(*Gossiper).StartGossiping.NewThrottle.func3.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.newInformer.NewThrottle.func1.1"),
	)
}
