//go:build cuda && gpu

package cu

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Freeing both buffers of a copy that has been issued to the device (and
// is most likely still running: 256 MiB) releases their bytes at once but
// their memory only after the copy: the copy completes without error and
// the driver is never asked to free memory under it.
func TestFreeWhileCopyIsOnTheDevice(t *testing.T) {
	ctx := context.Background()
	b, err := New(Config{Locations: []string{"cuda:0", "pinned-host"}, Capacity: map[string]int64{"cuda:0": 1 << 30}})
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	st, err := b.NewStream("cuda:0")
	require.NoError(t, err)
	s := st.(*stream)
	const n = 256 << 20
	for round := range 3 {
		src, err := b.Allocate(ctx, "cuda:0", n)
		require.NoError(t, err)
		dst, err := b.Allocate(ctx, "pinned-host", n)
		require.NoError(t, err)
		before := s.issued.Load()
		require.NoError(t, st.CopyAsync(dst, src))
		deadline := time.Now().Add(time.Minute)
		for s.issued.Load() == before { // wait for the feeder to issue it
			require.True(t, time.Now().Before(deadline), "the copy was never issued")
			runtime.Gosched()
		}
		require.NoError(t, b.Free(src), "round %d", round)
		require.NoError(t, b.Free(dst))
		mi, err := b.MemInfo("cuda:0")
		require.NoError(t, err)
		require.Zero(t, mi.UsedBytes, "the bytes return to the capacity at once")
		ev, err := st.Record()
		require.NoError(t, err)
		require.NoError(t, ev.Wait(ctx), "an issued copy completes although its buffers were freed")
	}
	require.NoError(t, st.Close())
}
