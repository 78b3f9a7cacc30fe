package replay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
)

// A replay's backend is the soft backend and says so, through its
// truncation and the fault injector.
func TestReplayBackendIsSimulated(t *testing.T) {
	b, err := newBackend([]string{"pageable-host", "cuda:0"})
	require.NoError(t, err)
	defer b.Close()
	require.True(t, cuda.IsSimulated(b), "%s: not simulated", b.Name())
	require.Contains(t, b.Name(), "soft")
}

// A replay's host buffer kept whole has the host view of its soft buffer,
// which Read sees; a truncated one, or a device buffer, has none.
func TestReplayBackendHostBytes(t *testing.T) {
	b, err := newBackend([]string{"pageable-host", "cuda:0"})
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()
	whole, err := b.Allocate(ctx, "pageable-host", BufferLimit)
	require.NoError(t, err)
	view, err := cuda.HostBytes(whole)
	require.NoError(t, err)
	require.Len(t, view, BufferLimit)
	view[BufferLimit-1] = 5
	got, err := b.Read(ctx, whole)
	require.NoError(t, err)
	require.Equal(t, byte(5), got[BufferLimit-1])

	truncated, err := b.Allocate(ctx, "pageable-host", BufferLimit+1)
	require.NoError(t, err)
	_, err = cuda.HostBytes(truncated)
	require.ErrorIs(t, err, cuda.ErrNoHostMemory)
	dev, err := b.Allocate(ctx, "cuda:0", 64)
	require.NoError(t, err)
	_, err = cuda.HostBytes(dev)
	require.ErrorIs(t, err, cuda.ErrNoHostMemory)
	for _, buf := range []cuda.Buffer{whole, truncated, dev} {
		require.NoError(t, b.Free(buf))
	}
}
