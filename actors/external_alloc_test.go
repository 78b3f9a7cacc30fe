package actors

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A buffer owned outside the engine is allocated and freed by its
// location's actor; the engine's buffer table never holds it; an unknown
// location and a stopped engine are refused.
func TestOwnedBuffersGoThroughTheLocationActor(t *testing.T) {
	h := startEngine(t)
	ctx := context.Background()
	buf, err := h.eng.AllocateAt(ctx, locGPU0, 128)
	require.NoError(t, err)
	assert.Equal(t, locGPU0, buf.Location())
	assert.Equal(t, int64(128), h.used(locGPU0))
	require.NoError(t, h.eng.FreeAt(ctx, buf))
	assert.Zero(t, h.used(locGPU0))
	_, err = h.eng.AllocateAt(ctx, "cuda:9", 1)
	require.Error(t, err)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = h.eng.AllocateAt(cancelled, locGPU0, 64)
	require.Error(t, err)
	assert.Zero(t, h.used(locGPU0), "nothing left allocated for a caller that gave up")

	require.NoError(t, h.eng.Stop(ctx))
	_, err = h.eng.AllocateAt(ctx, locGPU0, 64)
	require.Error(t, err)
	assert.Zero(t, h.used(locGPU0))
}
