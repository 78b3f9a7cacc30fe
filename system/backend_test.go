package system

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
)

// No silent simulation: without a backend Start refuses, naming the fix.
func TestStartRequiresABackend(t *testing.T) {
	_, err := Start(context.Background(), Options{Locations: []LocationConfig{NoLimit("pageable-host")}})
	var inv *InvalidInputError
	require.ErrorAs(t, err, &inv)
	assert.Contains(t, inv.Message, "Options.Backend")
	assert.Contains(t, inv.Message, "soft.New")
	assert.Contains(t, inv.Message, "cu.New")
}

// The caller's backend is used as given and stays open after Close.
func TestStartUsesAndLeavesTheCallersBackend(t *testing.T) {
	ctx := context.Background()
	locs := []LocationConfig{NoLimit("pageable-host"), Limit("cuda:0@node-a", 1<<20)}
	b, err := SoftBackend(locs, soft.Config{Capacity: map[string]int64{"cuda:0": 1 << 20}})
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, []string{"pageable-host", "cuda:0"}, b.Locations(), "local names, node dropped")
	assert.True(t, cuda.IsSimulated(b))

	s, err := Start(ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), Limit("cuda:0", 1<<20)}, Backend: b})
	require.NoError(t, err)
	assert.Same(t, b, s.Backend())
	_, err = s.Register(ctx, Value{Name: "v", Bytes: 64, At: "cuda:0"})
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
	mi, err := b.MemInfo("cuda:0")
	require.NoError(t, err, "the runtime closed the caller's backend")
	assert.Zero(t, mi.UsedBytes, "Close freed every buffer")
}
