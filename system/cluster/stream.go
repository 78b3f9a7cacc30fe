package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// RemoteSource names a value on another node that a value of this node
// reconstructs from (see [Node.RegisterRemote]).
type RemoteSource struct {
	// Node is the owning node's name.
	Node string
	// Handle is the value's handle on the owning node. With an empty
	// Manager, the owner looks the value up by Handle.Name.
	Handle system.Handle
	// Location is the owner's location to read from ("" = the first
	// resident materialization in preference order).
	Location string
}

// RegisterRemote registers v on this node with a remote source: v.Source
// is a location of this node where the bytes land temporarily during a
// reconstruction (the temporary reconstruction charge, as for any value
// with a source), and v.Loader must be nil: the loader streams the bytes
// from src.Node in chunks. While a reconstruction streams, the owner
// protects its materialization with a transfer-scoped lease (it stays
// charged there and cannot be evicted or moved away) and charges the
// stream's host buffer as a reservation at its pageable-host, when it has
// one; both end when the stream closes, whether it completed or failed.
//
// Registration asks nothing of the owner; a later Place that reconstructs
// the value fails with a [*system.PlanExecutionError] whose cause is an
// [*system.UnavailableError] when the owner is not a member, does not answer
// within the request timeout (or the caller's deadline, whichever is
// earlier), or no longer has the value; with a [*system.BudgetError] when the
// owner cannot charge the stream buffer; with an [*system.InvalidInputError] when
// the owner's value has another size.
func (n *Node) RegisterRemote(ctx context.Context, v system.Value, src RemoteSource) (system.Handle, error) {
	if v.Loader != nil {
		return system.Handle{}, &budget.InvalidInputError{Message: fmt.Sprintf("value %q: a remote source brings its own loader", v.Name)}
	}
	if v.Source == "" {
		return system.Handle{}, &budget.InvalidInputError{Message: fmt.Sprintf("value %q: a remote source needs a local Source location for the temporary buffer", v.Name)}
	}
	if src.Node == "" || src.Handle.Name == "" {
		return system.Handle{}, &budget.InvalidInputError{Message: fmt.Sprintf("value %q: a remote source needs a node and a handle (or at least a value name)", v.Name)}
	}
	v.Loader = n.remoteLoader(src)
	return n.sys.Register(ctx, v)
}

// remoteLoader streams src into dst: open (the owner leases the value),
// read chunks, close (always).
func (n *Node) remoteLoader(src RemoteSource) system.Loader {
	return func(ctx context.Context, dst []byte) error {
		total := int64(len(dst))
		r, err := n.request(ctx, src.Node, &clusterpb.OpenStream{
			Handle:   &clusterpb.HandleRef{ManagerId: src.Handle.Manager, Id: src.Handle.ID, Name: src.Handle.Name},
			Location: src.Location, Bytes: total, Reader: n.name,
		})
		if err != nil {
			return err
		}
		open, ok := r.(*clusterpb.OpenStreamReply)
		if !ok {
			return fmt.Errorf("residency: node %q answered OpenStream with %T", src.Node, r)
		}
		if open.Error != nil {
			return fromRemote(open.Error)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.opts.RequestTimeout)
			defer cancel()
			_, _ = n.request(cctx, src.Node, &clusterpb.CloseStream{StreamId: open.StreamId})
		}()
		pid, err := n.endpointOf(src.Node)
		if err != nil {
			return err
		}
		return n.pullChunks(ctx, src.Node, pid.Address, open.StreamId, dst)
	}
}

// ---- the owner's side ------------------------------------------------------

// serveStream is one stream this node serves: the lease that protects the
// source, the stream buffer's reservation, the value's size. Each chunk is
// read from the leased buffer when it is asked for (Lease.ReadAt), into a
// slice of its own that the transport may keep after the lease ends.
type serveStream struct {
	id          uint64
	reader      string
	lease       *system.Lease
	reservation string // "" when the owner has no pageable-host
	bytes       int64
	last        time.Time
	read        bool // a chunk was asked for: the reader knows the stream

	// mu is held for reading by each chunk read and for writing when the
	// stream ends, so that the lease is released only after the chunk
	// reads in progress, and no read starts after it (ended).
	mu    sync.RWMutex
	ended bool
}

type streamTable struct {
	mu  sync.Mutex
	seq uint64
	m   map[uint64]*serveStream
}

// receiveEndpoint is the node's endpoint actor (and its node kind's
// grain). Requests that call the runtime run on their own goroutine and
// answer the sender from there; chunk reads answer at once.
func (n *Node) receiveEndpoint(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *clusterpb.OpenStream:
		n.async(ctx, func(c context.Context) any { return n.openStream(c, m) })
	case *clusterpb.ReadChunk:
		ctx.Respond(n.readChunk(context.Background(), m, nil))
	case *clusterpb.CloseStream:
		n.async(ctx, func(c context.Context) any {
			n.streams.close(c, n, m.StreamId)
			return &clusterpb.CloseStreamReply{}
		})
	default:
		n.receivePlacement(ctx)
	}
}

// async runs handle on its own goroutine and sends its reply to the
// request's sender.
func (n *Node) async(ctx actor.Context, handle func(context.Context) any) {
	sender := ctx.Sender()
	if n.closed.Load() {
		if sender != nil {
			ctx.Respond(&clusterpb.OpenStreamReply{Error: toRemote(system.ErrClosed)})
		}
		return
	}
	n.workWG.Add(1)
	go func() {
		defer n.workWG.Done()
		c, cancel := context.WithTimeout(context.Background(), n.opts.RequestTimeout)
		defer cancel()
		reply := handle(c)
		if sender != nil {
			n.csys.Root.Send(sender, reply)
		}
	}()
}

// openStream leases the value's materialization, charges the stream
// buffer and reads the bytes.
func (n *Node) openStream(ctx context.Context, m *clusterpb.OpenStream) *clusterpb.OpenStreamReply {
	fail := func(err error) *clusterpb.OpenStreamReply { return &clusterpb.OpenStreamReply{Error: toRemote(err)} }
	if m.Handle == nil {
		return fail(&budget.InvalidInputError{Message: "open stream: no handle"})
	}
	h := system.Handle{Manager: m.Handle.ManagerId, ID: m.Handle.Id, Name: m.Handle.Name}
	if h.Manager == "" {
		var err error
		if h, err = n.sys.Lookup(ctx, m.Handle.Name); err != nil {
			return fail(&budget.UnavailableError{Handle: m.Handle.Name, Location: "@" + n.name, Reason: budget.UnavailableSource,
				Detail: fmt.Sprintf("node %q has no value %q: %v", n.name, m.Handle.Name, err)})
		}
	}
	snap, err := n.sys.Snapshot(ctx)
	if err != nil {
		return fail(err)
	}
	loc, bytes, err := sourceOf(snap, h, m.Location, n.name)
	if err != nil {
		return fail(err)
	}
	if m.Bytes != 0 && m.Bytes != bytes {
		return fail(&budget.InvalidInputError{Message: fmt.Sprintf("value %q on node %q has %d bytes, the reader expects %d", h.Name, n.name, bytes, m.Bytes)})
	}
	st := &serveStream{reader: m.Reader}
	n.streams.mu.Lock()
	n.streams.seq++
	st.id = n.streams.seq
	n.streams.mu.Unlock()
	if _, ok := snap.Location("pageable-host"); ok {
		st.reservation = fmt.Sprintf("residency.stream/%s/%d", n.name, st.id)
		if err := n.sys.Reserve(ctx, "pageable-host", st.reservation, bytes); err != nil {
			return fail(err)
		}
	}
	lease, err := n.sys.Acquire(ctx, h, loc)
	if err != nil {
		n.unreserve(ctx, st)
		return fail(err)
	}
	st.lease, st.bytes, st.last = lease, bytes, time.Now()
	n.streams.mu.Lock()
	if n.closed.Load() {
		n.streams.mu.Unlock()
		n.releaseStream(ctx, st)
		return fail(system.ErrClosed)
	}
	n.streams.m[st.id] = st
	n.streams.mu.Unlock()
	return &clusterpb.OpenStreamReply{StreamId: st.id, Bytes: bytes, Location: loc}
}

// sourceOf picks the materialization a stream reads: loc if given, else
// the first resident one in preference order.
func sourceOf(snap system.Snapshot, h system.Handle, loc, node string) (string, int64, error) {
	for _, v := range snap.Values {
		if v.Handle != h {
			continue
		}
		best, rank := "", 1<<30
		for _, mat := range v.Materializations {
			if mat.State != budget.Resident {
				continue
			}
			if loc != "" {
				if mat.Location == loc {
					return loc, v.Bytes, nil
				}
				continue
			}
			if r := preferenceRank(mat.Location); r < rank {
				best, rank = mat.Location, r
			}
		}
		if best == "" {
			where := loc
			if where == "" {
				where = "any location"
			}
			return "", 0, &budget.UnavailableError{Handle: h.Name, Location: "@" + node, Reason: budget.UnavailableEndpoint,
				Detail: fmt.Sprintf("value %q is not resident at %s on node %q", h.Name, where, node)}
		}
		return best, v.Bytes, nil
	}
	return "", 0, &budget.UnavailableError{Handle: h.Name, Location: "@" + node, Reason: budget.UnavailableSource,
		Detail: fmt.Sprintf("node %q has no live value with handle %s (manager %s, id %d)", node, h.Name, h.Manager, h.ID)}
}

// preferenceRank: pinned-host, pageable-host, cuda:0, cuda:1, ….
func preferenceRank(loc string) int {
	ln, err := budget.ParseLocation(loc)
	if err != nil {
		return 1 << 29
	}
	switch ln.Kind {
	case budget.PinnedHost:
		return 0
	case budget.PageableHost:
		return 1
	default:
		return 2 + ln.Device
	}
}

// readChunk answers a ReadChunk: the bytes of the range asked for (at
// most MaxBytes from Offset, within the value), read from the leased
// buffer into buf(size) (a new slice when buf is nil), or the error.
func (n *Node) readChunk(ctx context.Context, m *clusterpb.ReadChunk, buf func(int) []byte) *clusterpb.Chunk {
	n.streams.mu.Lock()
	st := n.streams.m[m.StreamId]
	if st != nil {
		st.last, st.read = time.Now(), true
	}
	n.streams.mu.Unlock()
	fail := func(err error) *clusterpb.Chunk {
		return &clusterpb.Chunk{StreamId: m.StreamId, Offset: m.Offset, Error: toRemote(err)}
	}
	gone := func() *clusterpb.Chunk {
		return fail(&budget.UnavailableError{Location: "@" + n.name, Reason: budget.UnavailableSource,
			Detail: fmt.Sprintf("node %q has no open stream %d (closed, or idle too long)", n.name, m.StreamId)})
	}
	if st == nil {
		return gone()
	}
	total := st.bytes
	if m.Offset < 0 || m.Offset >= total || m.MaxBytes <= 0 {
		return fail(&budget.InvalidInputError{Message: fmt.Sprintf("stream %d: chunk at %d of %d bytes, at most %d", m.StreamId, m.Offset, total, m.MaxBytes)})
	}
	end := min(m.Offset+int64(m.MaxBytes), total)
	var data []byte
	if buf != nil {
		data = buf(int(end - m.Offset))
	} else {
		data = make([]byte, end-m.Offset)
	}
	st.mu.RLock()
	defer st.mu.RUnlock()
	if st.ended {
		return gone()
	}
	if err := st.lease.ReadAt(ctx, m.Offset, data); err != nil {
		return fail(err)
	}
	return &clusterpb.Chunk{StreamId: m.StreamId, Offset: m.Offset, Data: data, Last: end == total}
}

func (n *Node) unreserve(ctx context.Context, st *serveStream) {
	if st.reservation != "" {
		if err := n.sys.Unreserve(context.WithoutCancel(ctx), st.reservation); err != nil && !errors.Is(err, system.ErrClosed) {
			n.log.Warn().Err(err).Uint64("stream", st.id).Msg("residency node: releasing a stream's reservation")
		}
	}
}

// releaseStream releases a stream's lease and reservation.
func (n *Node) releaseStream(ctx context.Context, st *serveStream) {
	st.mu.Lock() // after the chunk reads in progress; none after this
	st.ended = true
	st.mu.Unlock()
	if st.lease != nil {
		if err := st.lease.Release(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, system.ErrClosed) {
			n.log.Warn().Err(err).Uint64("stream", st.id).Msg("residency node: releasing a stream's lease")
		}
	}
	n.unreserve(ctx, st)
}

func (t *streamTable) close(ctx context.Context, n *Node, id uint64) {
	t.mu.Lock()
	st := t.m[id]
	delete(t.m, id)
	t.mu.Unlock()
	if st != nil {
		n.releaseStream(ctx, st)
	}
}

// closeIdle closes the streams idle for longer than idle, and those
// never read for longer than unread: a reader asks for its first chunk as
// soon as the open's answer reaches it, so a stream still unread after
// one request timeout is one whose answer was lost (a partition) and
// whose reader gave up without knowing its id.
func (t *streamTable) closeIdle(ctx context.Context, n *Node, idle, unread time.Duration) {
	var old []*serveStream
	t.mu.Lock()
	for id, st := range t.m {
		if time.Since(st.last) > idle || (!st.read && time.Since(st.last) > min(idle, unread)) {
			old = append(old, st)
			delete(t.m, id)
		}
	}
	t.mu.Unlock()
	for _, st := range old {
		n.log.Warn().Uint64("stream", st.id).Str("reader", st.reader).Msg("residency node: closing a stream its reader left idle")
		n.releaseStream(ctx, st)
	}
}

func (t *streamTable) closeAll(ctx context.Context, n *Node) {
	t.mu.Lock()
	all := t.m
	t.m = map[uint64]*serveStream{}
	t.mu.Unlock()
	for _, st := range all {
		n.releaseStream(ctx, st)
	}
}
