package serving

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
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
