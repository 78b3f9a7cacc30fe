package cache_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// Caches at the members of a shared budget (system.Options.SharedBudgets,
// docs/cache.md "A location in a shared budget"): an integrated GPU
// (cuda:0, its own budget 200) and the host memory it draws on (no budget
// of its own) share one figure of 100 bytes.

// startShared starts that runtime and a cache at loc that may also use
// the other member.
func startShared(t *testing.T, loc string) (*system.System, *cache.Cache) {
	t.Helper()
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{
		Locations:     []system.LocationConfig{system.NoLimit(host), system.Limit(gpu0, 200)},
		SharedBudgets: []system.SharedBudget{{Name: "igpu", Locations: []string{gpu0, host}, Bytes: 100}},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	other := host
	if loc == host {
		other = gpu0
	}
	c, err := cache.New(ctx, sys, cache.Options{Location: loc, Locations: []string{other}})
	require.NoError(t, err)
	return sys, c
}

func intLoader(n int64) func(context.Context) (int, int64, error) {
	return func(context.Context) (int, int64, error) { return 1, n, nil }
}

// requireShared asserts err is the group's *system.BudgetError for
// requested bytes asked of it.
func requireShared(t *testing.T, err error, requested int64) {
	t.Helper()
	var be *system.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "igpu", be.Shared)
	assert.Equal(t, int64(100), be.SharedBytes)
	assert.Equal(t, requested, be.SharedRequestedBytes)
	assert.False(t, errors.Is(err, system.ErrBusy), "a request above the figure is not busy: it can never fit")
}

// Bytes above the group's figure can never fit, though the location's own
// budget (200, or none) would take them: every kind of load refuses them
// at once with the group's *BudgetError, waiting or not, and nothing is
// evicted for them. Before, a load that did not wait was a CacheBusyError
// quoting the location's figures (budget 200, used 0), and a load that
// waited waited until its context ended.
func TestSharedBudgetPeakAboveTheFigureNeverFits(t *testing.T) {
	for _, loc := range []string{gpu0, host} {
		t.Run(loc, func(t *testing.T) {
			ctx := context.Background()
			_, c := startShared(t, loc)
			l, err := cache.Load(ctx, c, "resident", 40, nil, intLoader(40))
			require.NoError(t, err)
			require.NoError(t, l.Release())

			_, err = cache.Load(ctx, c, "big", 150, nil, intLoader(150))
			requireShared(t, err, 150)
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err = cache.Load(wctx, c, "big", 150, nil, intLoader(150), cache.Wait(system.WaitForRoom()))
			requireShared(t, err, 150)
			require.NoError(t, wctx.Err(), "refused at once, not at the deadline")
			_, err = cache.LoadOn(wctx, c, "on", [][]string{{loc}}, 150, nil, func(context.Context, string) (int, error) { return 1, nil }, cache.Wait(system.WaitForRoom()))
			requireShared(t, err, 150)
			_, err = cache.LoadSplit(wctx, c, "split", []cache.Part{{Location: gpu0, Bytes: 60}, {Location: host, Bytes: 60}}, nil,
				func(context.Context) (int, error) { return 1, nil }, cache.Wait(system.WaitForRoom()))
			requireShared(t, err, 120) // each part fits alone; together they never do
			_, err = c.Budget().Reserve(wctx, 150)
			requireShared(t, err, 150)

			assert.Equal(t, []string{"resident"}, keys(c), "nothing evicted, nothing left loading")
		})
	}
}

// A load short of room in the group, not at its location, evicts an idle
// entry; with nothing idle it is a *CacheBusyError whose Refusal names
// the group's figures, and its text says so. At the host (no budget of
// its own) the same holds: before, its refusal quoted a budget of 0.
func TestSharedBudgetShortOfRoomInTheGroup(t *testing.T) {
	for _, loc := range []string{gpu0, host} {
		t.Run(loc, func(t *testing.T) {
			ctx := context.Background()
			_, c := startShared(t, loc)
			other := host
			if loc == host {
				other = gpu0
			}
			// 30 bytes charged at the other member, by an entry loaded there.
			held, err := cache.LoadOn(ctx, c, "elsewhere", [][]string{{other}}, 30, nil, func(context.Context, string) (int, error) { return 1, nil })
			require.NoError(t, err)
			a, err := cache.Load(ctx, c, "a", 60, nil, intLoader(60))
			require.NoError(t, err)
			require.NoError(t, a.Release())

			b, err := cache.Load(ctx, c, "b", 60, nil, intLoader(60))
			require.NoError(t, err, "the group is short by 50; the idle entry a is evicted for it")
			assert.ElementsMatch(t, []string{"elsewhere", "b"}, keys(c))

			_, err = cache.Load(ctx, c, "c", 20, nil, intLoader(20))
			var cb *system.CacheBusyError
			require.ErrorAs(t, err, &cb, "b and elsewhere are leased: nothing idle")
			require.NotNil(t, cb.Refusal)
			assert.Equal(t, "igpu", cb.Refusal.Shared)
			assert.Equal(t, int64(90), cb.Refusal.SharedUsedBytes)
			assert.Contains(t, err.Error(), `shared budget "igpu": 100, charged 90`)
			require.NoError(t, b.Release())
			require.NoError(t, held.Release())
		})
	}
}
