package cache_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// A cache's name is its owner name in the ledger (`cache "NAME"`), unique
// in its runtime for the runtime's life: a taken name is invalid input,
// also after Close; a cache refused for its location leaves the name
// free; an unnamed cache gets the first free "cache#N".
func TestCacheNamesAreUniquePerRuntime(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 100)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sys.Close(ctx) })

	_, err = cache.New(ctx, sys, cache.Options{Location: "cuda:9", Name: "m"})
	var ue *system.UnavailableError
	require.ErrorAs(t, err, &ue)
	m, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "m"})
	require.NoError(t, err, "a refused cache left its name free")
	assert.Equal(t, `cache "m"`, m.Owner())

	_, err = cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "m"})
	var ie *system.InvalidInputError
	require.ErrorAs(t, err, &ie)
	assert.Contains(t, err.Error(), `cache name "m" is taken`)
	require.NoError(t, m.Close(ctx))
	_, err = cache.New(ctx, sys, cache.Options{Location: "pageable-host", Name: "m"})
	require.ErrorAs(t, err, &ie, "still taken after Close")

	taken, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "cache#1"})
	require.NoError(t, err)
	unnamed, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0"})
	require.NoError(t, err)
	assert.Equal(t, `cache "cache#2"`, unnamed.Owner(), "the first free number")

	l, err := cache.Load(ctx, unnamed, "k", 10, nil, func(context.Context) (int, int64, error) { return 1, 10, nil })
	require.NoError(t, err)
	snap, err := sys.Snapshot(ctx)
	require.NoError(t, err)
	var names []string
	for _, loc := range snap.Locations {
		for _, r := range loc.Reservations {
			names = append(names, r.Name+" @ "+r.Owner)
		}
	}
	assert.Equal(t, []string{`cache "cache#2"/k#1 @ cache "cache#2"`}, names)
	require.NoError(t, l.Release())
	require.NoError(t, unnamed.Close(ctx))
	require.NoError(t, taken.Close(ctx))

	_, err = cache.New(ctx, nil, cache.Options{Location: "cuda:0"})
	require.ErrorAs(t, err, &ie)
}
