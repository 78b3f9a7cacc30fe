package cluster

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// The owner's side of a stream reads each chunk from the leased buffer
// when it is asked for: the range asked for, bounded by the value's size;
// a range outside the value is an InvalidInputError; once the stream has
// ended (closed, or released while still listed, as when a close races a
// chunk request) no chunk is read and the lease is released.
func TestServeStreamReadsChunksFromTheLeaseWhileItLasts(t *testing.T) {
	ctx := context.Background()
	opts := system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host")}}
	opts.Backend = testsys.Soft(t, opts.Locations)
	sys, err := system.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sys.Close(context.Background())) })
	const size = 10_000
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*13 + 1)
	}
	h, err := sys.Register(ctx, system.Value{Name: "w", Bytes: size, At: "pageable-host", Data: data})
	require.NoError(t, err)

	n := &Node{name: "node-a", sys: sys, streams: streamTable{m: map[uint64]*serveStream{}}}
	open := func(id uint64) *serveStream {
		l, err := sys.Acquire(ctx, h, "pageable-host")
		require.NoError(t, err)
		st := &serveStream{id: id, lease: l, bytes: size}
		n.streams.m[id] = st
		return st
	}
	st := open(1)
	for _, r := range [][3]int64{{0, 4096, 4096}, {8192, 4096, size - 8192}, {size - 1, 1 << 20, 1}} {
		c := n.readChunk(ctx, &clusterpb.ReadChunk{StreamId: 1, Offset: r[0], MaxBytes: int32(r[1])}, nil)
		require.Nil(t, c.Error, "%v", r)
		require.Equal(t, data[r[0]:r[0]+r[2]], c.Data)
		require.Equal(t, r[0]+r[2] == size, c.Last)
	}
	for _, r := range [][2]int64{{-1, 10}, {size, 10}, {0, 0}, {0, -5}} {
		c := n.readChunk(ctx, &clusterpb.ReadChunk{StreamId: 1, Offset: r[0], MaxBytes: int32(r[1])}, nil)
		require.NotNil(t, c.Error, "%v", r)
		require.Nil(t, c.Data)
		var bad *budget.InvalidInputError
		require.ErrorAs(t, fromRemote(c.Error), &bad)
	}

	unavailable := func(id uint64) {
		t.Helper()
		c := n.readChunk(ctx, &clusterpb.ReadChunk{StreamId: id, Offset: 0, MaxBytes: 16}, nil)
		require.NotNil(t, c.Error)
		require.Nil(t, c.Data)
		var un *budget.UnavailableError
		require.ErrorAs(t, fromRemote(c.Error), &un)
	}
	n.streams.close(ctx, n, 1)
	unavailable(1)
	require.Error(t, st.lease.ReadAt(ctx, 0, make([]byte, 1)), "the stream's close released its lease")

	st = open(2)
	n.releaseStream(ctx, st) // still listed: a chunk request that found it before the close
	unavailable(2)
	require.NoError(t, sys.Discard(ctx, h), "no lease is left on the value")
}
