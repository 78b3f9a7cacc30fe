package tests

// Rules of seed 001 (the byte-budgeted loader cache these tests twin, as
// in cache_seed_test.go) that concern the victim order and eviction:
// each test names the lines of the seed's residency.rs it follows.

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

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

// slowClose is a value whose Close signals that it started and then
// waits for the test to let it finish (the seed's Retiring, lines
// 602–612: a destructor that blocks).
type slowClose struct {
	started chan struct{}
	finish  chan struct{}
}

func (s *slowClose) Close() error {
	close(s.started)
	<-s.finish
	return nil
}

// A caller whose peak fits is never held up by another caller's
// eviction: while A waits for the Close of the victim it evicted, B
// loads the same key (seed lines 350–383: the victim is dropped outside
// the lock and the loop looks again; 172–175: native destruction may
// block "without ... blocking unrelated lookups"), and A then takes a
// lease on B's load.
func TestCacheSeedEvictionDoesNotHoldUpAFittingCaller(t *testing.T) {
	ctx := context.Background()
	_, c := seedCacheWith(t, 100, cache.Options{Name: "seed"})
	old := &slowClose{started: make(chan struct{}), finish: make(chan struct{})}
	l, err := cache.Load(ctx, c, "old", 60, always[*slowClose], value(old, 60))
	require.NoError(t, err)
	require.NoError(t, l.Release())

	var loads atomic.Int32
	loader := func(context.Context) (int, int64, error) { loads.Add(1); return 7, 40, nil }
	type result struct {
		l   cache.Lease[int]
		err error
	}
	a := make(chan result, 1)
	go func() { // A: 60 + 50 > 100, so it evicts old and waits for its Close
		l, err := cache.Load(ctx, c, "new", 50, always[int], loader)
		a <- result{l, err}
	}()
	<-old.started
	// B: 60 (old, still charged while it closes) + 40 fits.
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lb, err := cache.Load(bctx, c, "new", 40, always[int], loader)
	if err != nil { // held up: let A finish before failing
		close(old.finish)
		if ra := <-a; ra.err == nil {
			require.NoError(t, ra.l.Release())
		}
		require.NoError(t, err, "B's peak fits: it loads while A's victim closes")
	}
	assert.Equal(t, 7, lb.Value())
	close(old.finish)
	ra := <-a
	require.NoError(t, ra.err)
	assert.Equal(t, 7, ra.l.Value())
	assert.Equal(t, int32(1), loads.Load(), "A took a lease on B's load")
	require.NoError(t, ra.l.Release())
	require.NoError(t, lb.Release())
	assert.Equal(t, int64(40), stats(t, c).ReservedBytes, "A gave its reservation back")
}

// An idle LoadBudgeted entry is a victim like any other (seed lines
// 304–320: load_budgeted goes through load_inner, so its entry is Ready
// like a declared one and evict_idle weighs it by the same `used`): here
// the budgeted model, taken before the plain entry, goes first; and a
// value's admission can make room from it.
func TestCacheSeedBudgetedEntryIsAVictim(t *testing.T) {
	ctx := context.Background()
	loadModel := func(t *testing.T, c *cache.Cache, closed *atomic.Bool) {
		t.Helper()
		m, err := cache.LoadBudgeted(ctx, c, "model", always[*budgetedModel], func(ctx context.Context, b *cache.MemoryBudget) (*budgetedModel, error) {
			r, err := b.Reserve(ctx, 40)
			if err != nil {
				return nil, err
			}
			return &budgetedModel{res: []*cache.MemoryReservation{r}, closed: closed}, nil
		})
		require.NoError(t, err)
		require.NoError(t, m.Release())
	}
	t.Run("least recently taken first", func(t *testing.T) {
		_, c := seedCacheWith(t, 100, cache.Options{Name: "seed"})
		var closed atomic.Bool
		loadModel(t, c, &closed)
		require.NoError(t, loadInt(t, c, "a", 40).Release())
		require.NoError(t, loadInt(t, c, "b", 50).Release())
		assert.Equal(t, []string{"a", "b"}, cacheKeys(c), "the budgeted model, taken first, is the victim")
		assert.True(t, closed.Load(), "its value was closed")
		assert.Equal(t, int64(90), stats(t, c).ReservedBytes, "its allocation was released")
	})
	t.Run("a value's admission evicts it", func(t *testing.T) {
		sys, c := seedCacheWith(t, 100, cache.Options{Name: "seed"})
		var closed atomic.Bool
		loadModel(t, c, &closed)
		h, err := sys.Register(ctx, system.Value{Name: "v", Bytes: 80, At: "pageable-host"})
		require.NoError(t, err)
		sc, _, err := sys.Admit(ctx, system.Request{Name: "v", Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:0"}}}}})
		require.NoError(t, err, "the idle budgeted entry makes room for the value")
		require.NoError(t, sc.Exit(ctx))
		assert.Empty(t, cacheKeys(c))
		assert.True(t, closed.Load())
	})
}

// A cache at a location without a budget takes a peak of 2^63−1 bytes;
// the next load there, or a memory reservation, is refused as the ledger
// refuses a registration: its byte accounting would overflow (invalid
// input), never a busy budget of 0 B.
func TestCacheUnbudgetedLocationOverflowIsInvalidInput(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host")}})
	c, err := cache.New(ctx, sys, cache.Options{Location: "pageable-host", Name: "host"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(ctx)) })
	require.NoError(t, loadInt(t, c, "a", math.MaxInt64).Release())

	_, regErr := sys.Register(ctx, system.Value{Name: "v", Bytes: 1, At: "pageable-host"})
	require.ErrorIs(t, regErr, system.ErrInvalidInput)
	_, err = cache.Load(ctx, c, "b", 1, always[int], value(2, 1))
	require.ErrorIs(t, err, system.ErrInvalidInput, "%v", err)
	assert.Contains(t, err.Error(), "would overflow its byte accounting")
	assert.NotErrorIs(t, err, system.ErrBusy)
	_, err = c.Budget().Reserve(ctx, 1)
	require.ErrorIs(t, err, system.ErrInvalidInput, "%v", err)
	assert.Contains(t, err.Error(), "would overflow its byte accounting")
	assert.Equal(t, []string{"a"}, cacheKeys(c), "nothing was evicted for it")
}
