package cache_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// TestDrainVisitsOnlyCachesWithOffers: the runtime drains the caches that
// recorded offers since its last drain, not every cache it ever had (a
// runtime with many caches pays per change, not per cache).
func TestDrainVisitsOnlyCachesWithOffers(t *testing.T) {
	ctx := context.Background()
	const n = 50
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit(vgpu, 10_000)}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sys.Close(ctx)) })
	var caches []*cache.Cache
	for i := range n {
		c, err := cache.New(ctx, sys, cache.Options{Location: vgpu, Name: fmt.Sprint("c", i)})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, c.Close(ctx)) })
		idleBlob(t, c, "k", 10) // an offer recorded
		caches = append(caches, c)
	}
	_, err = sys.Snapshot(ctx) // a ledger step: every pending offer drained
	require.NoError(t, err)
	before := make([]int, n)
	for i, c := range caches {
		before[i] = cache.Drains(c)
		require.Positive(t, before[i], "cache %d was drained", i)
	}
	idleBlob(t, caches[7], "k", 10) // a hit and a release: a new stamp to offer
	_, err = sys.Snapshot(ctx)
	require.NoError(t, err)
	for i, c := range caches {
		want := before[i]
		if i == 7 {
			want++
		}
		assert.Equal(t, want, cache.Drains(c), "cache %d", i)
	}
}
