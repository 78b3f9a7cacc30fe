package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// The bytes of a remote source travel on a stream of their own, beside
// protoactor's: a gRPC bidirectional stream on the member's protoactor
// port (its gRPC server answers a method it does not know with the
// node's handler), over the same transport credentials. The reader sends
// a ReadChunk per chunk, several ahead; the owner answers each with a
// Chunk without its bytes and, unless the Chunk carries an error, the
// bytes as a message of their own, neither copied into a protobuf
// message nor wrapped in protoactor's envelope and batch (each of which
// costs a copy of every byte on each side). OpenStream and CloseStream,
// which take and release the owner's lease and reservation, stay
// protoactor requests.
const (
	chunkMethod    = "/residency.cluster.Chunks/Read"
	chunkCodecName = "residency-chunks"
	// chunkWindow is how many chunks a reader asks for ahead of the one
	// it waits for.
	chunkWindow = 4
	// chunkMaxMsg bounds a chunk message (ChunkBytes is at most 3 MiB).
	chunkMaxMsg = 4 << 20
	// chunkWindowBytes is the flow-control window a reader gives a chunk
	// stream and its connection: chunks asked ahead are sent without
	// waiting for window updates (gRPC's default, 64 KiB growing with
	// its bandwidth estimate, stalls a fresh connection).
	chunkWindowBytes = 16 << 20
)

var chunkDesc = grpc.StreamDesc{StreamName: "Read", ServerStreams: true, ClientStreams: true}

// chunkRecvPool holds the buffers a chunk stream's messages are received
// into before the codec copies their bytes into the destination
// (chunkInto), for the next message: without it, gRPC makes a new buffer
// for each message, a chunk's size of garbage per chunk.
var chunkRecvPool = grpc.NewSharedBufferPool()

func init() { encoding.RegisterCodec(chunkCodec{}) }

// rawBytes is a chunk's bytes as a message: marshalled as they are.
type rawBytes []byte

// chunkInto receives a chunk's bytes straight into dst (at most len(dst)
// bytes; n is how many came).
type chunkInto struct {
	dst []byte
	n   int
}

// chunkCodec is the chunk stream's codec: protobuf for the messages,
// the bytes as they are for rawBytes and chunkInto.
type chunkCodec struct{}

func (chunkCodec) Name() string { return chunkCodecName }

func (chunkCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case rawBytes:
		return m, nil
	case proto.Message:
		return proto.Marshal(m)
	}
	return nil, fmt.Errorf("residency: chunk codec: cannot marshal %T", v)
}

func (chunkCodec) Unmarshal(data []byte, v any) error {
	switch m := v.(type) {
	case *chunkInto:
		if len(data) > len(m.dst) {
			return fmt.Errorf("residency: chunk of %d bytes, at most %d expected", len(data), len(m.dst))
		}
		m.n = copy(m.dst, data)
		return nil
	case proto.Message:
		return proto.Unmarshal(data, m)
	}
	return fmt.Errorf("residency: chunk codec: cannot unmarshal into %T", v)
}

// serveGRPC is the node's gRPC server's handler of methods protoactor
// does not register: the chunk stream, or Unimplemented.
func (n *Node) serveGRPC(_ any, ss grpc.ServerStream) (err error) {
	if m, _ := grpc.MethodFromServerStream(ss); m != chunkMethod {
		return status.Errorf(codes.Unimplemented, "unknown method %s", m)
	}
	ring := getChunkRing()
	defer func() {
		if err == nil { // the reader received every chunk before it closed
			chunkRings.Put(ring)
		}
	}()
	reqs := make(chan *clusterpb.ReadChunk)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m := &clusterpb.ReadChunk{}
			if err := ss.RecvMsg(m); err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- m:
			case <-ss.Context().Done():
				return
			}
		}
	}()
	for {
		var m *clusterpb.ReadChunk
		select {
		case m = <-reqs:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-n.stop:
			return status.Errorf(codes.Unavailable, "node %q is closing", n.name)
		}
		c := n.readChunk(ss.Context(), m, ring.next)
		data := c.Data
		c.Data = nil
		if err := ss.SendMsg(c); err != nil {
			return err
		}
		if c.Error == nil {
			if err := ss.SendMsg(rawBytes(data)); err != nil {
				return err
			}
		}
	}
}

// chunkRing is the buffers one chunk stream's handler reads chunks into
// and sends from, reused in turn. The transport still reads a buffer after
// SendMsg has returned, until its bytes are written to the connection; a
// buffer comes round again chunkWindow+1 chunks later. A reader asks for
// chunk k+chunkWindow only once it has received chunk k (readChunks), so by
// the time the handler gets the request that reuses the buffer of chunk k,
// the reader has received chunk k, which the transport sends only after it
// has read all of it: nothing reads the buffer any more. The buffers hold
// copies of the value's bytes, never the leased buffer itself.
type chunkRing struct {
	bufs [chunkWindow + 1][]byte
	k    int
}

var chunkRings sync.Pool

func getChunkRing() *chunkRing {
	if r, ok := chunkRings.Get().(*chunkRing); ok {
		return r
	}
	return &chunkRing{}
}

// next returns the ring's next buffer, of n bytes.
func (r *chunkRing) next(n int) []byte {
	b := &r.bufs[r.k%len(r.bufs)]
	r.k++
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	return (*b)[:n]
}

// dataConns are this node's gRPC connections to other members' ports,
// for chunk streams, by address.
type dataConns struct {
	mu     sync.Mutex
	m      map[string]*grpc.ClientConn
	closed bool
}

// conn returns the connection to addr, dialling it (as protoactor dials
// members: blocking, bounded, once) when there is none.
func (d *dataConns) conn(addr string, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	d.mu.Lock()
	cc, closed := d.m[addr], d.closed
	d.mu.Unlock()
	if closed {
		return nil, system.ErrClosed
	}
	if cc != nil {
		return cc, nil
	}
	cc, err := grpc.Dial(addr, opts...) //nolint:staticcheck // as protoactor's remote dials
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		_ = cc.Close()
		return nil, system.ErrClosed
	}
	if have := d.m[addr]; have != nil {
		_ = cc.Close()
		return have, nil
	}
	if d.m == nil {
		d.m = map[string]*grpc.ClientConn{}
	}
	d.m[addr] = cc
	return cc, nil
}

// drop closes cc, the connection to addr, after a stream on it broke.
func (d *dataConns) drop(addr string, cc *grpc.ClientConn) {
	d.mu.Lock()
	if d.m[addr] == cc {
		delete(d.m, addr)
	}
	d.mu.Unlock()
	_ = cc.Close()
}

func (d *dataConns) closeAll() {
	d.mu.Lock()
	all := d.m
	d.m, d.closed = nil, true
	d.mu.Unlock()
	for _, cc := range all {
		_ = cc.Close()
	}
}

// pullChunks reads stream id of node src (listed at addr) into dst on a
// chunk stream, chunkWindow chunks asked ahead. Each chunk is bounded by
// the request timeout (or ctx's deadline), and the member is checked
// every livenessInterval while the stream runs.
func (n *Node) pullChunks(ctx context.Context, src, addr string, id uint64, dst []byte) error {
	unavailable := func(format string, a ...any) error {
		return &budget.UnavailableError{Location: "@" + src, Reason: budget.UnavailableLocation, Detail: fmt.Sprintf(format, a...)}
	}
	cc, err := n.data.conn(addr, append(n.dialOpts[:len(n.dialOpts):len(n.dialOpts)],
		grpc.WithInitialWindowSize(chunkWindowBytes), grpc.WithInitialConnWindowSize(chunkWindowBytes),
		experimental.WithRecvBufferPool(chunkRecvPool)))
	if err != nil {
		return unavailable("node %q cannot be reached at %s for a chunk stream: %v", src, addr, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := n.watchStream(sctx, cancel, src, addr, n.timeout(ctx))
	defer w.stop()
	st, err := cc.NewStream(sctx, &chunkDesc, chunkMethod, grpc.CallContentSubtype(chunkCodecName), grpc.MaxCallRecvMsgSize(chunkMaxMsg))
	if err == nil {
		err = n.readChunks(st, src, id, dst, w)
	}
	if err == nil {
		return nil
	}
	var un *budget.UnavailableError
	var inv *budget.InvalidInputError
	switch {
	case errors.As(err, &un) || errors.As(err, &inv) || errors.Is(err, errBadChunk):
		return err
	case w.err() != nil:
		return w.err()
	case ctx.Err() != nil:
		return unavailable("node %q did not send the chunks of stream %d before the caller's deadline: %v", src, id, ctx.Err())
	}
	n.data.drop(addr, cc)
	return unavailable("the chunk stream from node %q (%s) broke: %v", src, addr, err)
}

// errBadChunk marks a chunk that is not the one asked for.
var errBadChunk = errors.New("residency: unexpected chunk")

// readChunks runs the stream: asks for chunks, chunkWindow ahead, and
// lands each one in dst. The owner's chunkRing depends on both bounds kept
// here: never more than chunkWindow chunks asked and not yet received, and
// CloseSend only once every chunk asked for has been received.
func (n *Node) readChunks(st grpc.ClientStream, src string, id uint64, dst []byte, w *streamWatch) error {
	total := int64(len(dst))
	chunk := int64(n.opts.ChunkBytes)
	var asked, off int64
	for off < total {
		for asked < total && asked < off+chunkWindow*chunk {
			if n.opts.BeforeChunk != nil {
				n.opts.BeforeChunk(src, asked, total)
			}
			if err := st.SendMsg(&clusterpb.ReadChunk{StreamId: id, Offset: asked, MaxBytes: int32(chunk)}); err != nil {
				return err
			}
			asked += chunk
		}
		var c clusterpb.Chunk
		if err := st.RecvMsg(&c); err != nil {
			return err
		}
		if c.Error != nil {
			return fromRemote(c.Error)
		}
		into := chunkInto{dst: dst[off:]}
		if c.Offset == off {
			if err := st.RecvMsg(&into); err != nil {
				return err
			}
		}
		if c.Offset != off || into.n == 0 {
			return fmt.Errorf("%w: node %q sent a chunk of %d bytes at %d, want bytes at %d of %d", errBadChunk, src, into.n, c.Offset, off, total)
		}
		off += int64(into.n)
		w.progress()
	}
	return st.CloseSend()
}

// streamWatch bounds a chunk stream: no chunk for timeout, or the member
// gone (checked every livenessInterval), cancels it with its reason.
type streamWatch struct {
	tick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	why  error
}

func (n *Node) watchStream(ctx context.Context, cancel func(), src, addr string, timeout time.Duration) *streamWatch {
	w := &streamWatch{tick: make(chan struct{}, 1), done: make(chan struct{})}
	fail := func(err error) {
		w.mu.Lock()
		w.why = err
		w.mu.Unlock()
		cancel()
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		idle := time.NewTimer(timeout)
		defer idle.Stop()
		live := time.NewTicker(livenessInterval)
		defer live.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-w.tick:
				idle.Reset(timeout)
			case <-idle.C:
				fail(&budget.UnavailableError{Location: "@" + src, Reason: budget.UnavailableLocation,
					Detail: fmt.Sprintf("node %q did not send a chunk within %s", src, timeout)})
				return
			case <-live.C:
				if err := n.reachable(src, addr); err != nil {
					fail(err)
					return
				}
			}
		}
	}()
	return w
}

func (w *streamWatch) progress() {
	select {
	case w.tick <- struct{}{}:
	default:
	}
}

func (w *streamWatch) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.why
}

func (w *streamWatch) stop() {
	close(w.done)
	w.wg.Wait()
}
