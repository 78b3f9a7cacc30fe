package cache_test

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// app is what an application keeps: the runtime and a cache of it, and a
// value whose loader reaches both through the app (the common shape: a
// server struct whose methods load). The runtime then reaches the cache
// through the loader it keeps.
type app struct {
	sys   *system.System
	cache *cache.Cache
}

// A closed runtime and its cache are garbage once the application drops
// them, even when the runtime reaches the cache through a loader. Before,
// the cache's cleanup (which unregisters it from the runtime's Close)
// held the runtime strongly from a collector root; the runtime reached
// the cache, so neither was ever collected — a soak of
// TestCloseChecker grew by every runtime it started.
func TestClosedRuntimeAndCacheAreCollected(t *testing.T) {
	ctx := context.Background()
	const n = 8
	var syss []weak.Pointer[system.System]
	var caches []weak.Pointer[cache.Cache]
	for range n {
		sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<20)}})
		require.NoError(t, err)
		c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "models"})
		require.NoError(t, err)
		a := &app{sys: sys, cache: c}
		h, err := sys.Register(ctx, system.Value{Name: "w", Bytes: 1 << 10, Source: "pageable-host",
			Loader: func(_ context.Context, dst []byte) error {
				if a.cache.Location() == "" { // the loader reaches the cache
					dst[0] = 1
				}
				return nil
			}})
		require.NoError(t, err)
		require.NoError(t, sys.Place(ctx, h, "cuda:0"))
		syss = append(syss, weak.Make(sys))
		caches = append(caches, weak.Make(c))
		require.NoError(t, sys.Close(ctx))
	}
	live := func() (s, c int) {
		for i := range syss {
			if syss[i].Value() != nil {
				s++
			}
			if caches[i].Value() != nil {
				c++
			}
		}
		return s, c
	}
	// A cleanup runs on the collection after the one that found its
	// object unreachable, and the runtime's goroutines may still be
	// winding down just after Close: collect until nothing is left or
	// the tries run out (a bound on tries, not a timing).
	s, c := live()
	for try := 0; try < 200 && s+c > 0; try++ {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
		s, c = live()
	}
	require.Zero(t, s, "closed runtimes still reachable, of %d", n)
	require.Zero(t, c, "closed caches still reachable, of %d", n)
}
