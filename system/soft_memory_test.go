package system

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda/soft"
)

// TestSoftMemoryFollowsAdmission: on the default
// soft backend a value refused by the budget allocates no real memory,
// and one admitted allocates none until bytes are written to it (64 GiB
// at an 8 GiB cuda:0 is refused before anything is allocated; 1 GiB
// admitted with no data holds nothing real, as the soft package doc
// promises).
func TestSoftMemoryFollowsAdmission(t *testing.T) {
	ctx := context.Background()
	locs := []LocationConfig{NoLimit("pageable-host"), Limit("cuda:0", 8<<30)}
	be, err := soft.New(soft.Config{Locations: budget.LocalNames(locs)})
	require.NoError(t, err)
	defer be.Close()
	s, err := Start(ctx, Options{Locations: locs, Backend: be})
	require.NoError(t, err)
	defer s.Close(ctx)

	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	const slack = 16 << 20 // the runtime's own bookkeeping meanwhile
	n := allocated(func() {
		_, err := s.Register(ctx, Value{Name: "huge", Bytes: 64 << 30, At: "cuda:0"})
		var be *BudgetError
		assert.True(t, errors.As(err, &be), "refused by the budget: %v", err)
	})
	assert.Less(t, n, uint64(slack), "a refused registration allocated %d bytes", n)

	var h Handle
	n = allocated(func() {
		h, err = s.Register(ctx, Value{Name: "kv", Bytes: 1 << 30, At: "cuda:0"})
		require.NoError(t, err)
		require.NoError(t, s.Place(ctx, h, "pageable-host")) // a move: a copy of zeros
	})
	assert.Less(t, n, uint64(slack), "an admitted registration with no data allocated %d bytes", n)
	assert.Zero(t, be.RealBytes())

	small, err := s.Register(ctx, Value{Name: "w", Bytes: 4096, At: "cuda:0", Data: bytes.Repeat([]byte{1}, 4096)})
	require.NoError(t, err)
	assert.Equal(t, int64(4096), be.RealBytes(), "written bytes are real")
	require.NoError(t, s.Discard(ctx, small))
	require.NoError(t, s.Discard(ctx, h))
	// The location actors free the buffers after the ledger committed
	// the discards.
	require.Eventually(t, func() bool { return be.RealBytes() == 0 }, 30*time.Second, time.Millisecond,
		"RealBytes %d after the discards", be.RealBytes())
}
