package serving

import (
	"time"

	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// Model weights in a loader cache and KV blocks placed by Admit share one
// GPU and make room for each other through the one controller: a request
// that needs room for its KV blocks unloads an idle model (and says so in
// its decision), a model load unloads idle KV blocks, and neither touches
// what a request is using.
func TestWeightsAndKVBlocksMakeRoomForEachOther(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	// An idle model fills 60 of the GPU's 100 bytes.
	l, err := reg.request(ctx, c, "llama", 60)
	require.NoError(t, err)
	require.NoError(t, l.Release())
	llama := reg.last(t, "llama")

	// A conversation's KV blocks (kept on pinned host, so a GPU copy can
	// always go) need 50 bytes on the GPU.
	kv, err := srv.sys.Register(ctx, system.Value{Name: "kv-conv-1", Bytes: 50, At: "pinned-host", Mode: system.Replicable})
	require.NoError(t, err)
	step := system.Request{Name: "decode conv-1", Requirements: []system.Requirement{{Handle: kv, Tiers: [][]string{{"cuda:0"}}}}}
	scope, d, err := srv.sys.Admit(ctx, step)
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	ev := d.Evictions[0]
	assert.Equal(t, system.EvictionIdleCacheEntry, ev.Kind)
	assert.Equal(t, c.Owner(), ev.Owner)
	assert.EqualValues(t, 60, ev.Bytes)
	assert.Contains(t, ev.Reason, "idle cache entry")
	unloaded(t, llama)
	assert.Empty(t, c.Entries())
	require.NoError(t, scope.Exit(ctx))

	// The KV blocks are idle now: loading a 60-byte model evicts their GPU
	// copy (the pinned-host copy keeps the data).
	l, err = reg.request(ctx, c, "mistral", 60)
	require.NoError(t, err)
	snap, err := srv.sys.Snapshot(ctx)
	require.NoError(t, err)
	for _, v := range snap.Values {
		if v.Handle.Name == "kv-conv-1" {
			for _, m := range v.Materializations {
				assert.NotEqual(t, "cuda:0", m.Location, "the KV blocks' GPU copy made room for the model")
			}
		}
	}

	// While the model serves a request, KV blocks that need its room are
	// refused instead of unloading it.
	_, _, err = srv.sys.Admit(ctx, step)
	require.Error(t, err)
	assert.True(t, isLoaded(reg.last(t, "mistral")), "a model in use is never a victim")
	require.NoError(t, l.Release())
}

// A model too big for one GPU is split over two: its halves are reserved
// together (all or nothing), and when a request on either GPU needs the
// room of the idle model, the whole model goes.
func TestModelSplitOverTwoGPUsLoadsAndUnloadsAsOne(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0", func(o *cache.Options) { o.Locations = []string{"cuda:1"} })
	ctx := context.Background()
	halves := []cache.Part{{Location: "cuda:0", Bytes: 70}, {Location: "cuda:1", Bytes: 70}}
	load := func(ctx context.Context, opts ...cache.LoadOption) (cache.Lease[*model], error) {
		return cache.LoadSplit(ctx, c, "llama-140", halves, nil, func(context.Context) (*model, error) {
			return &model{name: "llama-140", unloaded: make(chan struct{})}, nil
		}, opts...)
	}

	// cuda:1 is busy with KV blocks in use: the split load takes nothing on
	// cuda:0 and waits for room on both.
	kv, err := srv.sys.Register(ctx, system.Value{Name: "kv", Bytes: 50, At: "pinned-host", Mode: system.Replicable})
	require.NoError(t, err)
	scope, _, err := srv.sys.Admit(ctx, system.Request{Name: "decode", Requirements: []system.Requirement{{Handle: kv, Tiers: [][]string{{"cuda:1"}}}}})
	require.NoError(t, err)
	waiting := background(func() (cache.Lease[*model], error) { return load(ctx, cache.Wait(system.WaitForRoom())) })
	srv.events.await(t, system.EventWaitStarted, 1)
	assert.Zero(t, srv.charged(t, "cuda:0"), "nothing reserved while the other half cannot be")
	require.NoError(t, scope.Exit(ctx)) // the KV blocks are idle now: the load evicts their GPU copy
	got := answer(t, waiting)
	require.NoError(t, got.err)
	assert.EqualValues(t, 70, srv.charged(t, "cuda:0"))
	assert.EqualValues(t, 70, srv.charged(t, "cuda:1"))
	m := got.lease.Value()
	require.NoError(t, got.lease.Release())

	// A request on cuda:1 that needs 50 bytes unloads the whole model.
	scope, d, err := srv.sys.Admit(ctx, system.Request{Name: "decode again", Requirements: []system.Requirement{{Handle: kv, Tiers: [][]string{{"cuda:1"}}}}})
	require.NoError(t, err)
	require.NotEmpty(t, d.Evictions)
	assert.Equal(t, system.EvictionIdleCacheEntry, d.Evictions[0].Kind)
	unloaded(t, m)
	require.NoError(t, scope.Exit(ctx))
	assert.Empty(t, c.Entries())
	// Its other half is released by the cache right after the drop: all
	// of cuda:0 can be had (waiting for that release, if it is not done).
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	all, _, err := srv.sys.Admit(wctx, system.Request{Name: "all of cuda:0", Reservations: []system.ReservationSpec{{Name: "all", Location: "cuda:0", Bytes: 100}}}, system.WaitForRoom())
	require.NoError(t, err)
	require.NoError(t, all.Exit(ctx))
}
