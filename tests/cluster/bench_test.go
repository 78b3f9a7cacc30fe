package cluster_test

// Cluster benchmarks, each against its baseline in the same run (see
// BENCHMARKS.md, section Cluster):
//
//	go test -run '^$' -bench 'Cluster' -benchtime 2s -count 3 ./tests/cluster/

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// bareRemote is two protoactor actor systems with remote on loopback and
// an echo actor: the baseline of one remote request.
type bareRemote struct {
	systems []*actor.ActorSystem
	remotes []*remote.Remote
	echo    *actor.PID
}

func startBareRemote(b *testing.B) *bareRemote {
	b.Helper()
	br := &bareRemote{}
	for range 2 {
		sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
			return slog.New(slog.NewTextHandler(io.Discard, nil))
		}))
		r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0))
		r.Start()
		br.systems, br.remotes = append(br.systems, sys), append(br.remotes, r)
	}
	_, err := br.systems[1].Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*clusterpb.WhereIs); ok {
			c.Respond(&clusterpb.WhereIsReply{Value: m.Value})
		}
	}), "echo")
	require.NoError(b, err)
	br.echo = actor.NewPID(br.systems[1].Address(), "echo")
	return br
}

func (br *bareRemote) request(b *testing.B) {
	r, err := br.systems[0].Root.RequestFuture(br.echo, &clusterpb.WhereIs{Value: "w"}, 10*time.Second).Result()
	if err != nil {
		b.Fatal(err)
	}
	if _, ok := r.(*clusterpb.WhereIsReply); !ok {
		b.Fatalf("reply %T", r)
	}
}

func (br *bareRemote) stop() {
	for i := range br.remotes {
		func() {
			// protoactor's graceful stop can panic when the peer closes
			// its stream at the same moment (as in Node.Close): stop the
			// server directly then.
			defer func() {
				if r := recover(); r != nil {
					br.remotes[i].Shutdown(false)
				}
			}()
			br.remotes[i].Shutdown(true)
		}()
		br.systems[i].Shutdown()
	}
}

// BenchmarkClusterRemoteLease, interleaved in each iteration: a remote
// lease acquired and released
// (AcquireRemote + Release: two requests to the owner, each a step of its
// supervisor) against one bare protoactor remote request to an echo actor
// over the same loopback transport; and a held placement (Place: one
// directory request, a probe, AdmitPlacement; Release) of a value already
// resident on the node asked.
func BenchmarkClusterRemoteLease(b *testing.B) {
	c := startNodes(b,
		cluster.NodeOptions{Name: "node-a", RefreshInterval: time.Hour, Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<30))},
		cluster.NodeOptions{Name: "node-b", RefreshInterval: time.Hour, Options: locs(system.NoLimit("pageable-host"))},
	)
	a, nb := c.nodes["node-a"], c.nodes["node-b"]
	ctx := context.Background()
	_, err := a.System().Register(ctx, system.Value{Name: "w", Bytes: 4096, At: "cuda:0"})
	require.NoError(b, err)
	require.NoError(b, a.Refresh(ctx))
	require.NoError(b, nb.Refresh(ctx))
	br := startBareRemote(b)
	defer br.stop()

	var acquired time.Duration // of leased: AcquireRemote alone
	lease := func() {
		t0 := time.Now()
		l, err := nb.AcquireRemote(ctx, "node-a", system.Handle{Name: "w"}, "cuda:0")
		if err != nil {
			b.Fatal(err)
		}
		acquired += time.Since(t0)
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	req := cluster.PlacementRequest{Name: "bench", Hold: true,
		Requirements: []cluster.PlacementRequirement{{Value: "w", Tiers: [][]string{{"cuda:0@*"}}}}}
	place := func() {
		p, err := nb.Place(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if p.Node != "node-a" {
			b.Fatalf("placed on %s", p.Node)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	br.request(b)
	lease()
	place()
	acquired = 0
	// Interleaved, so that the three see the same load: one of each per
	// iteration, each timed.
	var bare, leased, placed, barec, leasedc time.Duration
	b.ResetTimer()
	for range b.N {
		t0, c0 := time.Now(), cpuTime()
		br.request(b)
		t1, c1 := time.Now(), cpuTime()
		lease()
		t2 := time.Now()
		c2 := cpuTime()
		place()
		t3 := time.Now()
		bare, leased, placed = bare+t1.Sub(t0), leased+t2.Sub(t1), placed+t3.Sub(t2)
		barec, leasedc = barec+c1-c0, leasedc+c2-c1
	}
	b.ReportMetric(float64(bare.Nanoseconds())/float64(b.N), "bare-ns")
	b.ReportMetric(float64(leased.Nanoseconds())/float64(b.N), "lease-ns")
	b.ReportMetric(float64(placed.Nanoseconds())/float64(b.N), "place-ns")
	b.ReportMetric(float64(acquired.Nanoseconds())/float64(b.N), "acquire-ns")
	b.ReportMetric(float64(leased)/float64(bare), "lease/bare")
	b.ReportMetric(float64(placed)/float64(bare), "place/bare")
	b.ReportMetric(float64(leasedc)/float64(barec), "lease/bare-cpu") // CPU time, as in BenchmarkClusterCopy
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ---- a minimal gRPC streaming baseline ------------------------------------

// copyService streams size bytes in chunks of chunk bytes, each a
// BytesValue (the proto codec, as protoactor's remote uses).
type copyService struct {
	data  []byte
	chunk int
}

var copyDesc = grpc.StreamDesc{StreamName: "Pull", ServerStreams: true}

func (s *copyService) pull(_ any, stream grpc.ServerStream) error {
	var req wrapperspb.Int64Value
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	for off := 0; off < len(s.data); off += s.chunk {
		end := min(off+s.chunk, len(s.data))
		if err := stream.SendMsg(wrapperspb.Bytes(s.data[off:end])); err != nil {
			return err
		}
	}
	return nil
}

func startCopyServer(b *testing.B, data []byte, chunk int) (addr string, stop func()) {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	svc := &copyService{data: data, chunk: chunk}
	desc := copyDesc
	desc.Handler = svc.pull
	srv := grpc.NewServer(grpc.MaxSendMsgSize(8 << 20))
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "bench.Copy", HandlerType: (*any)(nil), Streams: []grpc.StreamDesc{desc}}, svc)
	go func() { _ = srv.Serve(l) }()
	return l.Addr().String(), srv.Stop
}

func grpcPull(b *testing.B, conn *grpc.ClientConn, dst []byte) {
	stream, err := conn.NewStream(context.Background(), &copyDesc, "/bench.Copy/Pull")
	if err != nil {
		b.Fatal(err)
	}
	if err := stream.SendMsg(wrapperspb.Int64(int64(len(dst)))); err != nil {
		b.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		b.Fatal(err)
	}
	off := 0
	for {
		var m wrapperspb.BytesValue
		err := stream.RecvMsg(&m)
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		off += copy(dst[off:], m.Value)
	}
	if off != len(dst) {
		b.Fatalf("got %d of %d bytes", off, len(dst))
	}
}

// BenchmarkClusterCopy, interleaved in each iteration: 64 MiB from node-a to another node through a
// remote source (RegisterRemote, Place at the reader's pageable-host,
// Discard; 1 MiB and 3 MiB chunks, pulled one at a time) against the same
// bytes over a plain gRPC server stream on loopback (1 MiB messages).
func BenchmarkClusterCopy(b *testing.B) {
	const size = 64 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 31)
	}
	c := startNodes(b,
		cluster.NodeOptions{Name: "node-a", RefreshInterval: time.Hour, Options: locs(system.NoLimit("pageable-host"))},
		cluster.NodeOptions{Name: "node-b", RefreshInterval: time.Hour, ChunkBytes: 1 << 20, Options: locs(system.NoLimit("pageable-host"))},
		cluster.NodeOptions{Name: "node-c", RefreshInterval: time.Hour, ChunkBytes: 3 << 20, Options: locs(system.NoLimit("pageable-host"))},
	)
	ctx := context.Background()
	ha, err := c.nodes["node-a"].System().Register(ctx, system.Value{Name: "w", Bytes: size, At: "pageable-host", Data: data})
	require.NoError(b, err)

	addr, stop := startCopyServer(b, data, 1<<20)
	defer stop()
	conn, err := grpc.Dial(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)))
	require.NoError(b, err)
	defer conn.Close()
	dst := make([]byte, size)

	copyVia := func(n *cluster.Node, i int) {
		h, err := n.RegisterRemote(ctx, system.Value{Name: fmt.Sprintf("w%d", i), Bytes: size, Source: "pageable-host"},
			cluster.RemoteSource{Node: "node-a", Handle: ha})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.System().Place(ctx, h, "pageable-host"); err != nil {
			b.Fatal(err)
		}
		if err := n.System().Discard(ctx, h); err != nil {
			b.Fatal(err)
		}
	}
	// One of each first: every path connects before it is timed.
	grpcPull(b, conn, dst)
	copyVia(c.nodes["node-b"], -1)
	copyVia(c.nodes["node-c"], -1)
	// Interleaved: per iteration the gRPC stream, then the remote source
	// with 1 MiB chunks (node-b), then with 3 MiB chunks (node-c), each
	// timed.
	var g, r1, r3, gc, r1c, r3c time.Duration
	b.SetBytes(3 * size)
	b.ResetTimer()
	for i := range b.N {
		t0, c0 := time.Now(), cpuTime()
		grpcPull(b, conn, dst)
		t1, c1 := time.Now(), cpuTime()
		copyVia(c.nodes["node-b"], i)
		t2, c2 := time.Now(), cpuTime()
		copyVia(c.nodes["node-c"], i)
		t3, c3 := time.Now(), cpuTime()
		g, r1, r3 = g+t1.Sub(t0), r1+t2.Sub(t1), r3+t3.Sub(t2)
		gc, r1c, r3c = gc+c1-c0, r1c+c2-c1, r3c+c3-c2
	}
	mbps := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(g), "grpc-MB/s")
	b.ReportMetric(mbps(r1), "rs1MiB-MB/s")
	b.ReportMetric(mbps(r3), "rs3MiB-MB/s")
	b.ReportMetric(float64(g)/float64(r1), "rs1MiB/grpc")
	b.ReportMetric(float64(g)/float64(r3), "rs3MiB/grpc")
	// The process's CPU time per path (user + system, all goroutines:
	// the paths run one at a time): the work each does, which the
	// machine's load does not change as it changes the wall time.
	b.ReportMetric(float64(gc)/float64(r1c), "rs1MiB/grpc-cpu")
	b.ReportMetric(float64(gc)/float64(r3c), "rs3MiB/grpc-cpu")
}
