package tests

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// twoGPUCache is a cache at cuda:0 that may also load onto cuda:1 and
// pinned-host (100 bytes each).
func twoGPUCache(t *testing.T, opts system.Options) (*system.System, *cache.Cache) {
	t.Helper()
	opts.Locations = []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("pinned-host", 100), system.Limit("cuda:0", 100), system.Limit("cuda:1", 100)}
	sys := start(t, opts)
	c, err := cache.New(context.Background(), sys, cache.Options{Location: "cuda:0", Locations: []string{"cuda:1", "pinned-host"}, Name: "models"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return sys, c
}

var gpusThenHost = [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}

func loadOn(ctx context.Context, c *cache.Cache, key string, bytes int64, opts ...cache.LoadOption) (cache.Lease[string], error) {
	return cache.LoadOn(ctx, c, key, gpusThenHost, bytes, always[string], func(_ context.Context, loc string) (string, error) {
		return key + "@" + loc, nil
	}, opts...)
}

func where[T any](l cache.Lease[T]) string { return l.Parts()[0].Location }

// LoadOn picks the location: where the bytes fit as they are first
// (cuda:1 before evicting at cuda:0), the next tier when both GPUs are
// held, and with a wait option one queue slot for all locations, woken by
// room at any of them.
func TestCacheLoadOnPicksWhereThereIsRoom(t *testing.T) {
	ctx := context.Background()
	sys, c := twoGPUCache(t, system.Options{MaxWaiters: 1})
	a, err := loadOn(ctx, c, "a", 60)
	require.NoError(t, err)
	assert.Equal(t, "cuda:0", where(a))
	assert.Equal(t, "a@cuda:0", a.Value(), "the loader is told the location")
	b, err := loadOn(ctx, c, "b", 60)
	require.NoError(t, err)
	assert.Equal(t, "cuda:1", where(b), "fits there as it is: nothing evicted at cuda:0")
	h, err := loadOn(ctx, c, "h", 60)
	require.NoError(t, err)
	assert.Equal(t, "pinned-host", where(h), "both GPUs held: the next tier")
	hit, err := loadOn(ctx, c, "b", 60)
	require.NoError(t, err)
	assert.Equal(t, "cuda:1", where(hit))
	require.NoError(t, hit.Release())

	// Every location held: a waiting load takes one queue slot.
	out := make(chan waitedLoad, 1)
	queued := make(chan system.WaitState, 4)
	go func() {
		l, err := cache.LoadOn(ctx, c, "d", gpusThenHost, 60, always[int], func(context.Context, string) (int, error) { return 4, nil },
			cache.Wait(system.WaitNotify(func(s system.WaitState) { queued <- s })))
		out <- waitedLoad{l, err}
	}()
	st := <-queued
	assert.ElementsMatch(t, []string{"cuda:0", "cuda:1", "pinned-host"}, st.Locations)
	assert.Len(t, sys.Waiters(), 1, "one slot for every location")
	require.NoError(t, b.Release()) // room at cuda:1: b is idle and may go
	d := <-out
	require.NoError(t, d.err)
	assert.Equal(t, "cuda:1", d.l.Parts()[0].Location)
	assert.Equal(t, []string{"a", "d", "h"}, cacheKeys(c))
	for _, l := range []cache.Lease[string]{a, h} {
		require.NoError(t, l.Release())
	}
	require.NoError(t, d.l.Release())

	_, err = loadOn(ctx, c, "huge", 101)
	var be *system.BudgetError
	require.ErrorAs(t, err, &be, "larger than every location")
	_, err = cache.LoadOn(ctx, c, "x", [][]string{{"cuda:9"}}, 1, always[int], func(context.Context, string) (int, error) { return 1, nil })
	require.ErrorIs(t, err, system.ErrInvalidInput)
}

// WithTie(TieMostFree) picks the location of a tier with the most free
// bytes.
func TestCacheLoadOnMostFree(t *testing.T) {
	ctx := context.Background()
	_, c := twoGPUCache(t, system.Options{})
	a, err := cache.LoadOn(ctx, c, "a", [][]string{{"cuda:1"}}, 30, always[string], func(context.Context, string) (string, error) { return "a", nil })
	require.NoError(t, err)
	b, err := loadOn(ctx, c, "b", 10, cache.WithTie(cache.TieMostFree))
	require.NoError(t, err)
	assert.Equal(t, "cuda:0", where(b), "100 free at cuda:0, 70 at cuda:1")
	c2, err := cache.LoadOn(ctx, c, "c", [][]string{{"cuda:0", "cuda:1"}}, 50, always[string], func(context.Context, string) (string, error) { return "c", nil }, cache.WithTie(cache.TieMostFree))
	require.NoError(t, err)
	assert.Equal(t, "cuda:0", where(c2), "90 free at cuda:0, 70 at cuda:1")
	for _, l := range []cache.Lease[string]{a, b, c2} {
		require.NoError(t, l.Release())
	}
	_, err = loadOn(ctx, c, "d", 10, cache.WithTie(cache.Tie(42)))
	require.ErrorIs(t, err, system.ErrInvalidInput, "an unknown tie is refused, not taken as the default")
	assert.Equal(t, []string{"a", "b", "c"}, cacheKeys(c), "nothing loaded for it")
}
