package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// A value registered on node B with a remote source on node A reconstructs
// by streaming A's bytes in chunks. During the transfer (gated between
// chunks) A protects its materialization with a lease and charges the
// stream buffer at its pageable-host, and B carries the destination and
// temporary reconstruction charges of the rules; afterwards the bytes on B
// are A's and every charge of the transfer is gone on both nodes. Then the
// failures: an unknown node, a value the owner no longer has, a wrong
// size, and a member that is listed but dead — each an UnavailableError
// (or InvalidInputError) within the caller's deadline, never a hang.
func TestRemoteSource(t *testing.T) {
	const chunk = 4096
	data := make([]byte, 5*chunk+123)
	for i := range data {
		data[i] = byte(i*7 + i>>8)
	}
	size := int64(len(data))
	gate := make(chan struct{})
	atGate := make(chan struct{})
	gated := false
	c := startNodes(t,
		cluster.NodeOptions{Name: "node-a", Options: locs(system.Limit("pageable-host", 1<<20), system.Limit("cuda:0", 1<<20))},
		cluster.NodeOptions{Name: "node-b", Options: locs(system.Limit("pageable-host", 1<<20), system.Limit("cuda:0", 1<<20)),
			ChunkBytes: chunk, RequestTimeout: 3 * time.Second,
			BeforeChunk: func(source string, offset, total int64) {
				// Gate the first gated transfer after its second chunk.
				if source == "node-a" && offset == 2*chunk && !gated {
					gated = true
					close(atGate)
					<-gate
				}
			}},
	)
	a, b := c.nodes["node-a"], c.nodes["node-b"]
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()

	ha, err := a.System().Register(ctx, system.Value{Name: "w", Bytes: size, At: "cuda:0", Data: data})
	require.NoError(t, err)
	hb, err := b.RegisterRemote(ctx, system.Value{Name: "w", Bytes: size, Source: "pageable-host"}, cluster.RemoteSource{Node: "node-a", Handle: ha})
	require.NoError(t, err)

	placed := make(chan error, 1)
	go func() { placed <- b.System().Place(ctx, hb, "cuda:0") }()
	select {
	case <-atGate:
	case err := <-placed:
		t.Fatalf("place returned before the gate: %v", err)
	}
	// A: its materialization is leased by the stream and still charged;
	// the stream buffer is reserved at pageable-host.
	sa, err := a.System().Snapshot(ctx)
	require.NoError(t, err)
	m, ok := matOf(sa, "w", "cuda:0")
	require.True(t, ok)
	require.Equal(t, 1, m.UseCount, "the stream's lease at A")
	require.Equal(t, system.Resident, m.State)
	loc, _ := sa.Location("cuda:0")
	require.Equal(t, size, loc.UsedBytes)
	host, _ := sa.Location("pageable-host")
	require.Equal(t, size, host.ReservedBytes, "the stream buffer at A")
	// B: the destination is entering and charged; the temporary
	// reconstruction buffer is charged at the value's source location.
	sb, err := b.System().Snapshot(ctx)
	require.NoError(t, err)
	m, ok = matOf(sb, "w", "cuda:0")
	require.True(t, ok)
	require.Equal(t, system.Entering, m.State)
	loc, _ = sb.Location("cuda:0")
	require.Equal(t, size, loc.UsedBytes)
	host, _ = sb.Location("pageable-host")
	require.Equal(t, size, host.TemporaryBytes)
	require.Equal(t, size, host.UsedBytes)
	close(gate)
	require.NoError(t, <-placed)

	got, err := b.System().Read(ctx, hb, "cuda:0")
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "bytes read back on B differ from A's")
	sa, err = a.System().Snapshot(ctx)
	require.NoError(t, err)
	m, _ = matOf(sa, "w", "cuda:0")
	require.Zero(t, m.UseCount, "A's lease is released when the stream closes")
	host, _ = sa.Location("pageable-host")
	require.Zero(t, host.ReservedBytes)
	sb, err = b.System().Snapshot(ctx)
	require.NoError(t, err)
	host, _ = sb.Location("pageable-host")
	require.Zero(t, host.UsedBytes, "B's temporary charge is released")
	m, _ = matOf(sb, "w", "cuda:0")
	require.Equal(t, system.Resident, m.State)

	// An owner that cannot charge the stream buffer refuses with its own
	// BudgetError figures.
	require.NoError(t, a.System().Reserve(ctx, "pageable-host", "fill", 1<<20-100))
	hb2, err := b.RegisterRemote(ctx, system.Value{Name: "w2", Bytes: size, Source: "pageable-host"}, cluster.RemoteSource{Node: "node-a", Handle: system.Handle{Name: "w"}})
	require.NoError(t, err)
	err = b.System().Place(ctx, hb2, "cuda:0")
	var be *system.BudgetError
	require.True(t, errors.As(err, &be), "%v", err)
	require.Equal(t, system.BudgetError{Location: "pageable-host", BudgetBytes: 1 << 20, UsedBytes: 0, ReservedBytes: 1<<20 - 100, RequestedBytes: size}, *be)
	require.NoError(t, a.System().Unreserve(ctx, "fill"))
	// By name (no manager): the owner looks the value up.
	require.NoError(t, b.System().Place(ctx, hb2, "cuda:0"))

	unavailable := func(name string, src cluster.RemoteSource) {
		t.Helper()
		h, err := b.RegisterRemote(ctx, system.Value{Name: name, Bytes: size, Source: "pageable-host"}, src)
		require.NoError(t, err)
		dl, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = b.System().Place(dl, h, "pageable-host")
		var ue *system.UnavailableError
		require.True(t, errors.As(err, &ue), "%s: want an UnavailableError, got %v", name, err)
		require.NoError(t, dl.Err(), "%s: the error came at the caller's deadline, not before", name)
		s, err := b.System().Snapshot(ctx)
		require.NoError(t, err)
		host, _ := s.Location("pageable-host")
		require.Zero(t, host.UsedBytes, "%s: a failed reconstruction releases its charges", name)
	}
	// Not a member.
	unavailable("u-unknown", cluster.RemoteSource{Node: "node-z", Handle: ha})
	// A handle the owner no longer has.
	hgone, err := a.System().Register(ctx, system.Value{Name: "gone", Bytes: size, At: "cuda:0"})
	require.NoError(t, err)
	require.NoError(t, a.System().Discard(ctx, hgone))
	unavailable("u-gone", cluster.RemoteSource{Node: "node-a", Handle: hgone})
	// A location where the owner has no copy.
	unavailable("u-nocopy", cluster.RemoteSource{Node: "node-a", Handle: ha, Location: "pageable-host"})

	// The wrong size: the owner's value has other bytes.
	hs, err := b.RegisterRemote(ctx, system.Value{Name: "u-size", Bytes: size + 1, Source: "pageable-host"}, cluster.RemoteSource{Node: "node-a", Handle: ha})
	require.NoError(t, err)
	err = b.System().Place(ctx, hs, "cuda:0")
	var inv *system.InvalidInputError
	require.True(t, errors.As(err, &inv), "%v", err)

	// A member the provider still lists but that is dead (nothing listens
	// at its address): the request fails within the node's request
	// timeout, well before the caller's deadline.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	c.agent.RegisterService(testprovider.NewAgentServiceStatus("ghost-member", "127.0.0.1", port, []string{"residency.node.node-ghost"}))
	require.NoError(t, b.WaitMembers(ctx, "node-ghost"))
	start := time.Now()
	unavailable("u-dead", cluster.RemoteSource{Node: "node-ghost", Handle: ha})
	t.Logf("dead member refused after %s", time.Since(start).Round(time.Millisecond))
	c.agent.DeregisterService("ghost-member")

	// A member that accepts connections but never answers (hung): the
	// request times out at the node's request timeout, an
	// UnavailableError, before the caller's deadline.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 16)
	go func() {
		defer close(accepted)
		for {
			conn, err := hung.Accept()
			if err != nil {
				return
			}
			accepted <- conn // held open, never read
		}
	}()
	c.agent.RegisterService(testprovider.NewAgentServiceStatus("hung-member", "127.0.0.1", hung.Addr().(*net.TCPAddr).Port, []string{"residency.node.node-hung"}))
	require.NoError(t, b.WaitMembers(ctx, "node-hung"))
	start = time.Now()
	unavailable("u-hung", cluster.RemoteSource{Node: "node-hung", Handle: ha})
	t.Logf("hung member refused after %s", time.Since(start).Round(time.Millisecond))
	c.agent.DeregisterService("hung-member")
	require.NoError(t, hung.Close())
	for conn := range accepted {
		_ = conn.Close()
	}

	// Nothing of the streams is left at A.
	sa, err = a.System().Snapshot(ctx)
	require.NoError(t, err)
	m, _ = matOf(sa, "w", "cuda:0")
	require.Zero(t, m.UseCount)
	host, _ = sa.Location("pageable-host")
	require.Zero(t, host.ReservedBytes)
}
