// Package cluster_test runs several residency nodes in one process on
// protoactor's in-memory test provider, on loopback. `make test` runs it
// without -race (protoactor's cluster code itself races) in its own line.
package cluster_test

import (
	"context"
	"sync"
	"testing"
	"time"

	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// converge bounds what a test waits for membership and gossip: generous,
// so that a slow machine never fails a test; tests assert behaviour, not
// timing.
const converge = 60 * time.Second

// leakOptions are the goroutines protoactor leaves behind and that no API
// stops, each named exactly:
//   - the in-memory test provider's TTL refresher ranges over a ticker
//     channel that Provider.Shutdown stops but never closes: it stays
//     blocked for the life of the process;
//   - actor.NewThrottle / NewThrottleWithLogger start a one-shot timer
//     goroutine per throttle window (dead letters: 1 s; the gossiper, the
//     gossip actor and the informer: 60 s) that ends on its own after the
//     window, long after the node stopped. With inlining their frames are
//     named after the call site, hence both forms.
var leakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster/clusterproviders/test.(*Provider).startTtlReport.func1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottleWithLogger.func1.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.NewGossipActor.NewThrottleWithLogger.func2.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.(*Gossiper).StartGossiping.NewThrottle.func3.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.newInformer.NewThrottle.func1.1"),
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakOptions...)
}

// cluster is a set of nodes sharing one in-memory agent.
type testCluster struct {
	agent *testprovider.InMemAgent
	nodes map[string]*cluster.Node
}

// startNodes starts one node per options (all at once: protoactor's
// StartMember sleeps a second) on a new in-memory agent, waits until each
// sees all of them, and closes them all (at once) when the test ends.
func startNodes(t testing.TB, opts ...cluster.NodeOptions) *testCluster {
	t.Helper()
	c := &testCluster{agent: testprovider.NewInMemAgent(), nodes: map[string]*cluster.Node{}}
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(opts))
	for i, o := range opts {
		o.Provider = testprovider.NewTestProvider(c.agent)
		if o.Backend == nil {
			o.Backend = testsys.Soft(t, o.Locations) // closed after the nodes
		}
		if o.RefreshInterval == 0 {
			o.RefreshInterval = 50 * time.Millisecond
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := cluster.StartNode(ctx, o)
			errs[i] = err
			if err == nil {
				mu.Lock()
				c.nodes[o.Name] = n
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Cleanup(func() { c.closeAll(t) })
	for _, err := range errs {
		require.NoError(t, err)
	}
	names := make([]string, 0, len(opts))
	for _, o := range opts {
		names = append(names, o.Name)
	}
	for _, n := range c.nodes {
		require.NoError(t, n.WaitMembers(ctx, names...))
	}
	return c
}

// closeAll closes every node at once (each takes about 2 s to leave).
func (c *testCluster) closeAll(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	var wg sync.WaitGroup
	for name, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.Close(ctx); err != nil {
				t.Errorf("closing node %s: %v", name, err)
			}
		}()
	}
	wg.Wait()
}

func locs(l ...system.LocationConfig) system.Options { return system.Options{Locations: l} }

// matOf returns the materialization of value name at loc in snap.
func matOf(snap system.Snapshot, name, loc string) (system.MaterializationRecord, bool) {
	for _, v := range snap.Values {
		if v.Handle.Name != name {
			continue
		}
		for _, m := range v.Materializations {
			if m.Location == loc {
				return m, true
			}
		}
	}
	return system.MaterializationRecord{}, false
}
