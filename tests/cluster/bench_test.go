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
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/residency-go/residency/messages"
	"github.com/residency-go/residency/system"
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
		if m, ok := c.Message().(*messages.WhereIs); ok {
			c.Respond(&messages.WhereIsReply{Value: m.Value})
		}
	}), "echo")
	require.NoError(b, err)
	br.echo = actor.NewPID(br.systems[1].Address(), "echo")
	return br
}

func (br *bareRemote) request(b *testing.B) {
	r, err := br.systems[0].Root.RequestFuture(br.echo, &messages.WhereIs{Value: "w"}, 10*time.Second).Result()
	if err != nil {
		b.Fatal(err)
	}
	if _, ok := r.(*messages.WhereIsReply); !ok {
		b.Fatalf("reply %T", r)
	}
}

func (br *bareRemote) stop() {
	for i := range br.remotes {
		br.remotes[i].Shutdown(true)
		br.systems[i].Shutdown()
	}
}

// BenchmarkClusterRemoteLease: a remote lease acquired and released
// (AcquireRemote + Release: two requests to the owner, each a step of its
// supervisor) against one bare protoactor remote request to an echo actor
// over the same loopback transport; and a held placement (Place: one
// directory request, a probe, AdmitPlacement; Release) of a value already
// resident on the node asked.
func BenchmarkClusterRemoteLease(b *testing.B) {
	c := startNodes(b,
		system.NodeOptions{Name: "node-a", RefreshInterval: time.Hour, Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<30))},
		system.NodeOptions{Name: "node-b", RefreshInterval: time.Hour, Options: locs(system.NoLimit("pageable-host"))},
	)
	a, nb := c.nodes["node-a"], c.nodes["node-b"]
	ctx := context.Background()
	_, err := a.System().Register(ctx, system.Value{Name: "w", Bytes: 4096, At: "cuda:0"})
	require.NoError(b, err)
	require.NoError(b, a.Refresh(ctx))
	require.NoError(b, nb.Refresh(ctx))
	br := startBareRemote(b)
	defer br.stop()

	b.Run("bare-protoactor-request", func(b *testing.B) {
		br.request(b)
		b.ResetTimer()
		for range b.N {
			br.request(b)
		}
	})
	b.Run("acquire-release", func(b *testing.B) {
		for range b.N {
			l, err := nb.AcquireRemote(ctx, "node-a", system.Handle{Name: "w"}, "cuda:0")
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("place-hold-release", func(b *testing.B) {
		req := system.PlacementRequest{Name: "bench", Hold: true,
			Requirements: []system.PlacementRequirement{{Value: "w", Tiers: [][]string{{"cuda:0@*"}}}}}
		for range b.N {
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
	})
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

// BenchmarkClusterCopy: 64 MiB from node-a to another node through a
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
		system.NodeOptions{Name: "node-a", RefreshInterval: time.Hour, Options: locs(system.NoLimit("pageable-host"))},
		system.NodeOptions{Name: "node-b", RefreshInterval: time.Hour, ChunkBytes: 1 << 20, Options: locs(system.NoLimit("pageable-host"))},
		system.NodeOptions{Name: "node-c", RefreshInterval: time.Hour, ChunkBytes: 3 << 20, Options: locs(system.NoLimit("pageable-host"))},
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

	grpcPull(b, conn, dst) // connect
	b.Run("grpc-stream-1MiB", func(b *testing.B) {
		b.SetBytes(size)
		for range b.N {
			grpcPull(b, conn, dst)
		}
	})
	for _, reader := range []string{"node-b", "node-c"} {
		n := c.nodes[reader]
		b.Run(fmt.Sprintf("remote-source-%s", map[string]string{"node-b": "1MiB", "node-c": "3MiB"}[reader]), func(b *testing.B) {
			b.SetBytes(size)
			for i := range b.N {
				h, err := n.RegisterRemote(ctx, system.Value{Name: fmt.Sprintf("w%d", i), Bytes: size, Source: "pageable-host"},
					system.RemoteSource{Node: "node-a", Handle: ha})
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
		})
	}
}
