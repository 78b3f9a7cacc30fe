package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	protocluster "github.com/asynkron/protoactor-go/cluster"
	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// directoryKind is the kind of the directory grains (system's constant):
// a fake member listed with it hosts some of them.
const directoryKind = "residency.directory"

// ownedBy returns a value name whose directory grain the member at owner
// hosts, among members at addrs (owner included), per protoactor's
// partition rule (rendezvous hashing over the members hosting the kind),
// which is what the nodes follow.
func ownedBy(t *testing.T, prefix, owner string, addrs ...string) string {
	t.Helper()
	var ms protocluster.Members
	for i, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		require.NoError(t, err)
		p, err := strconv.Atoi(port)
		require.NoError(t, err)
		ms = append(ms, &protocluster.Member{Id: fmt.Sprint("m", i), Host: host, Port: int32(p), Kinds: []string{directoryKind}})
	}
	r := protocluster.NewRendezvous()
	r.UpdateMembers(ms)
	for i := 0; i < 1000; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if r.GetByClusterIdentity(protocluster.NewClusterIdentity(name, directoryKind)) == owner {
			return name
		}
	}
	t.Fatalf("no name with prefix %s owned by %s", prefix, owner)
	return ""
}

// hungListener accepts connections and never answers; probes (a
// connection closed without a byte sent, as a node's liveness probe) are
// signalled on the returned channel.
func hungListener(t *testing.T) (net.Listener, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	probes := make(chan struct{}, 1)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				var b [1]byte
				if n, err := conn.Read(b[:]); n == 0 && errors.Is(err, io.EOF) {
					select {
					case probes <- struct{}{}:
					default:
					}
					return
				}
				_, _ = io.Copy(io.Discard, conn) // hold it open, answer nothing
			}()
		}
	}()
	return l, probes
}

// When the member hosting a value's directory grain is gone (listed, its
// port closed: a crash the member list has not noticed yet), WhereIs
// answers an UnavailableError naming it at once (not at its deadline:
// the error says the member cannot be reached, not that it did not
// answer), and Place ranks without the directory and says so. When that
// member accepts connections but never answers (hung), the lookup gets at
// most half the caller's time: Place still places the request, with the
// note that the directory did not answer.
func TestPlacementDirectoryOnDeadOrHungMember(t *testing.T) {
	c := startNodes(t,
		cluster.NodeOptions{Name: "node-a", Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 1000))},
		cluster.NodeOptions{Name: "node-b", Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 1000))},
	)
	a, b := c.nodes["node-a"], c.nodes["node-b"]
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := l.Addr().String()
	require.NoError(t, l.Close())
	hung, _ := hungListener(t)
	hungAddr := hung.Addr().String()
	addrs := []string{a.Address(), b.Address(), deadAddr, hungAddr}
	x := ownedBy(t, "x", deadAddr, addrs...)
	y := ownedBy(t, "y", hungAddr, addrs...)
	for _, n := range []*cluster.Node{a, b} {
		for _, v := range []string{x, y} {
			_, err := n.System().Register(ctx, system.Value{Name: v, Bytes: 100, At: "pageable-host"})
			require.NoError(t, err)
		}
	}
	// w's grain is on node-a or node-b (before and after the fake
	// members join): the directory keeps saying w is on node-b.
	w := ownedBy(t, "w", a.Address(), addrs...)
	_, err = b.System().Register(ctx, system.Value{Name: w, Bytes: 10, At: "cuda:0"})
	require.NoError(t, err)
	_, err = a.System().Register(ctx, loaded(w, 10))
	require.NoError(t, err)
	require.NoError(t, b.Refresh(ctx))
	res, err := a.WhereIs(ctx, w)
	require.NoError(t, err)
	require.Len(t, res, 1)
	c.agent.RegisterService(testprovider.NewAgentServiceStatus("dead-member", "127.0.0.1", hostPort(t, deadAddr), []string{"residency.node.node-dead", directoryKind}))
	c.agent.RegisterService(testprovider.NewAgentServiceStatus("hung-member", "127.0.0.1", hostPort(t, hungAddr), []string{"residency.node.node-hung", directoryKind}))
	defer c.agent.DeregisterService("dead-member")
	defer c.agent.DeregisterService("hung-member")
	require.NoError(t, a.WaitMembers(ctx, "node-dead", "node-hung"))

	// The dead member: an UnavailableError that names it, without
	// waiting for the deadline (converge away).
	_, err = a.WhereIs(ctx, x)
	var un *system.UnavailableError
	require.ErrorAs(t, err, &un)
	require.Equal(t, "@node-dead", un.Location, "%v", err)
	require.Contains(t, err.Error(), "cannot be reached")
	require.NoError(t, ctx.Err())

	p, err := a.Place(ctx, cluster.PlacementRequest{Name: "r-x",
		Requirements: []cluster.PlacementRequirement{{Value: x, Tiers: [][]string{{"pageable-host@*"}}}}})
	require.NoError(t, err)
	require.Contains(t, []string{"node-a", "node-b"}, p.Node)
	require.Len(t, p.Directory, 1, "%v", p.Directory)
	require.Contains(t, p.Directory[0], "directory lookup for "+x+" failed")
	require.Contains(t, p.Directory[0], "node-dead")
	require.Contains(t, p.Directory[0], "ranked by room only")
	require.Contains(t, p.Why, p.Directory[0])
	for _, cand := range p.Candidates {
		require.Empty(t, cand.Resident, "no residency known without the directory: %s", cand.Node)
	}
	t.Logf("dead directory member: %s", p.Why)

	// The hung member: the lookup gets half the caller's time, the rest
	// places the request.
	hctx, hcancel := context.WithTimeout(ctx, 12*time.Second)
	defer hcancel()
	p, err = a.Place(hctx, cluster.PlacementRequest{Name: "r-y",
		Requirements: []cluster.PlacementRequirement{{Value: y, Tiers: [][]string{{"pageable-host@*"}}}}})
	require.NoError(t, err)
	require.NoError(t, hctx.Err(), "placed before the caller's deadline")
	require.Contains(t, []string{"node-a", "node-b"}, p.Node)
	require.Len(t, p.Directory, 1, "%v", p.Directory)
	require.Contains(t, p.Directory[0], "directory did not answer for "+y+" within")
	require.Contains(t, p.Directory[0], "ranked by room only")
	t.Logf("hung directory member: %s", p.Why)

	// Several values: one lookup each, at once; the one that answers is
	// used (x and y fail, w is resident on node-b per the directory).
	hctx2, hcancel2 := context.WithTimeout(ctx, 12*time.Second)
	defer hcancel2()
	p, err = a.Place(hctx2, cluster.PlacementRequest{Name: "r-xyw", Requirements: []cluster.PlacementRequirement{
		{Value: x, Tiers: [][]string{{"pageable-host@*"}}}, {Value: y, Tiers: [][]string{{"pageable-host@*"}}}, {Value: w, Tiers: [][]string{{"cuda:0@*"}}}}})
	require.NoError(t, err)
	require.Equal(t, "node-b", p.Node, "w is resident there: %s", p.Why)
	require.Len(t, p.Directory, 2, "%v", p.Directory)
	require.Contains(t, p.Why, "already resident there: "+w+" at cuda:0@node-b")
	require.Contains(t, p.Directory[0], "directory lookup for "+x+" failed", "x's member is gone: failed at once, not at the bound")
	require.Contains(t, p.Directory[1], "directory did not answer for "+y+" within")
	t.Logf("several values: %s", p.Why)
}

// A placement whose caller's context ends while the directory is asked
// says so ("stopped while asking the directory where … is resident"),
// not that there was no candidate node, and carries the context's error.
func TestPlacementStoppedDuringDirectoryLookup(t *testing.T) {
	c := startNodes(t, cluster.NodeOptions{Name: "node-a", Options: locs(system.NoLimit("pageable-host"))})
	a := c.nodes["node-a"]
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	hung, probes := hungListener(t)
	z := ownedBy(t, "z", hung.Addr().String(), a.Address(), hung.Addr().String())
	c.agent.RegisterService(testprovider.NewAgentServiceStatus("hung-member", "127.0.0.1", hostPort(t, hung.Addr().String()), []string{"residency.node.node-hung", directoryKind}))
	defer c.agent.DeregisterService("hung-member")
	require.NoError(t, a.WaitMembers(ctx, "node-hung"))

	// Nothing else probes the hung member (no value is registered, so no
	// node publishes to a grain there): the first probe is the lookup's,
	// and the caller cancels then.
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	go func() {
		select {
		case <-probes:
			pcancel()
		case <-ctx.Done():
		}
	}()
	_, err := a.Place(pctx, cluster.PlacementRequest{Name: "r-z",
		Requirements: []cluster.PlacementRequirement{{Value: z, Tiers: [][]string{{"pageable-host@*"}}}}})
	var pe *cluster.PlacementError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, pe.Attempts)
	require.Equal(t, "asking the directory where "+z+" is resident", pe.Stage)
	require.Contains(t, err.Error(), "stopped while asking the directory where "+z+" is resident")
	require.NotContains(t, err.Error(), "no candidate node")
	t.Log(err)
}

func hostPort(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return p
}
