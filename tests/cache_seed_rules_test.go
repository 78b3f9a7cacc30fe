package tests

// Seed 001's rules that wave 3 changed when cache entries joined the
// values' victim order; each test names the seed lines it follows
// (../ is the seed's residency.rs, read as the spec of the loader cache).

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// cacheKeys lists the cache's resident keys.
func cacheKeys(c *cache.Cache) []string {
	var out []string
	for _, e := range c.Entries() {
		out = append(out, e.Key)
	}
	return out
}

// seedCacheWith is seedCache with cache options of the test's own.
func seedCacheWith(t *testing.T, budget int64, opts cache.Options) (*system.System, *cache.Cache) {
	t.Helper()
	sys := start(t, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", budget)}})
	opts.Location = "cuda:0"
	c, err := cache.New(context.Background(), sys, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return sys, c
}

func loadInt(t *testing.T, c *cache.Cache, key string, bytes int64) cache.Lease[int] {
	t.Helper()
	l, err := cache.Load(context.Background(), c, key, bytes, always[int], value(len(key), bytes))
	require.NoError(t, err)
	return l
}

// The victim is the idle entry least recently taken — a load or a hit
// sets the entry's `used` to the clock (seed lines 352–361 and 414), and
// evict_idle picks the minimum (116–132) — whatever the use counts and
// whatever order the leases were released in.
func TestCacheSeedVictimLeastRecentlyTaken(t *testing.T) {
	ctx := context.Background()
	t.Run("release order does not count", func(t *testing.T) {
		_, c := seedCacheWith(t, 100, cache.Options{Name: "seed"})
		a := loadInt(t, c, "a", 40)
		b := loadInt(t, c, "b", 40)
		require.NoError(t, b.Release()) // b goes idle first
		require.NoError(t, a.Release())
		require.NoError(t, loadInt(t, c, "c", 40).Release())
		assert.Equal(t, []string{"b", "c"}, cacheKeys(c), "a, taken first, is the victim")
	})
	t.Run("use count does not count", func(t *testing.T) {
		_, c := seedCacheWith(t, 100, cache.Options{Name: "seed"})
		for range 5 {
			require.NoError(t, loadInt(t, c, "a", 40).Release()) // a load, then hits
		}
		require.NoError(t, loadInt(t, c, "b", 40).Release())
		require.NoError(t, loadInt(t, c, "c", 40).Release())
		assert.Equal(t, []string{"b", "c"}, cacheKeys(c), "a, hit five times but before b was loaded, is the victim")
	})
	t.Run("hits between two runtime steps keep their order", func(t *testing.T) {
		_, c := seedCacheWith(t, 100, cache.Options{Name: "seed"})
		require.NoError(t, loadInt(t, c, "a", 40).Release())
		require.NoError(t, loadInt(t, c, "b", 40).Release())
		// Two hits and their releases with no ledger step between them:
		// b is taken before a, and released after it.
		hb := loadInt(t, c, "b", 40)
		ha := loadInt(t, c, "a", 40)
		require.NoError(t, ha.Release())
		require.NoError(t, hb.Release())
		require.NoError(t, loadInt(t, c, "c", 40).Release())
		assert.Equal(t, []string{"a", "c"}, cacheKeys(c), "b, taken before a, is the victim")
	})
	t.Run("a cache may rank by frequency", func(t *testing.T) {
		_, c := seedCacheWith(t, 100, cache.Options{Name: "seed", Frequency: true})
		for range 5 {
			require.NoError(t, loadInt(t, c, "a", 40).Release())
		}
		require.NoError(t, loadInt(t, c, "b", 40).Release())
		require.NoError(t, loadInt(t, c, "c", 40).Release())
		assert.Equal(t, []string{"a", "c"}, cacheKeys(c), "with Frequency the entry hit five times stays")
	})
	_ = ctx
}
