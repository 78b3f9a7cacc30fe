package cache_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// startGPU100 starts a runtime with a 100-byte cuda:0 and a cache there
// that may also use the host, both closed when the test ends.
func startGPU100(t *testing.T) (*system.System, *cache.Cache, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit(host), system.Limit(gpu0, 100)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	c, err := cache.New(ctx, sys, cache.Options{Location: gpu0, Locations: []string{host}})
	require.NoError(t, err)
	return sys, c, ctx
}

func awaitWaiters(t *testing.T, ctx context.Context, sys *system.System, n int) {
	t.Helper()
	_, err := sys.AwaitWaiters(ctx, func(ws []system.WaiterInfo) bool { return len(ws) == n })
	require.NoError(t, err)
}

// The cache's Close ends its loads that wait for room: each returns
// ErrCacheClosed, and Close returns once they have left the runtime's
// queue, so they hold up nobody after it. Before, Close returned with
// them still queued; they held up other callers at cuda:0 and returned
// only when room was made or their context ended.
func TestCacheCloseEndsItsWaitingLoads(t *testing.T) {
	sys, c, ctx := startGPU100(t)
	full, err := cache.Load(ctx, c, "full", 100, nil, intLoader(100))
	require.NoError(t, err)
	wait := cache.Wait(system.WaitForRoom())
	never := func(context.Context, string) (int, error) { return 1, nil }
	results := make(chan error, 3)
	go func() {
		_, err := cache.Load(ctx, c, "load", 50, nil, intLoader(50), wait)
		results <- err
	}()
	go func() {
		_, err := cache.LoadOn(ctx, c, "on", [][]string{{gpu0}}, 50, nil, never, wait)
		results <- err
	}()
	go func() {
		_, err := cache.LoadSplit(ctx, c, "split", []cache.Part{{Location: gpu0, Bytes: 50}, {Location: host, Bytes: 1}}, nil,
			func(context.Context) (int, error) { return 1, nil }, wait)
		results <- err
	}()
	awaitWaiters(t, ctx, sys, 3)

	require.NoError(t, c.Close(ctx))
	assert.Empty(t, sys.Waiters(), "Close returned once its waiting loads left the queue")
	for range 3 {
		select {
		case err := <-results:
			assert.ErrorIs(t, err, system.ErrCacheClosed)
		case <-ctx.Done():
			t.Fatal("a waiting load did not return after the cache's Close")
		}
	}
	require.NoError(t, sys.Reserve(ctx, host, "after", 10), "nobody waits any more")
	require.NoError(t, full.Release())
}

// A reservation of the memory budget, or its growth, does not take room
// that a caller waiting at the location waits for: it is refused with a
// *CacheBusyError counting the waiters, as a load without a wait option
// is. Before, both were admitted while the waiter waited (and its
// shortfall grew). What a loader reserves during a waiting load's turn
// is part of that load and is admitted.
func TestMemoryBudgetTakesNoRoomAWaiterWaitsFor(t *testing.T) {
	sys, c, ctx := startGPU100(t)
	small, err := c.Budget().Reserve(ctx, 10)
	require.NoError(t, err)
	a, err := cache.Load(ctx, c, "a", 60, nil, intLoader(60))
	require.NoError(t, err)
	waited := make(chan error, 1)
	go func() {
		l, err := cache.LoadBudgeted(ctx, c, "b", nil, func(ctx context.Context, b *cache.MemoryBudget) (*cache.MemoryReservation, error) {
			return b.Reserve(ctx, 50) // the waiter's own turn: admitted
		}, cache.Wait(system.WaitForRoom()))
		if err == nil {
			err = l.Release()
		}
		waited <- err
	}()
	awaitWaiters(t, ctx, sys, 1)

	_, err = c.Budget().Reserve(ctx, 20)
	var cb *system.CacheBusyError
	require.ErrorAs(t, err, &cb, "20 bytes would fit in the 30 free, but a caller waits for them")
	assert.Equal(t, 1, cb.Waiters)
	assert.Equal(t, gpu0, cb.Location)
	err = small.Resize(ctx, 30)
	require.ErrorAs(t, err, &cb, "a growth is a reservation of the difference")
	assert.Equal(t, 1, cb.Waiters)
	assert.Equal(t, int64(10), small.Bytes(), "nothing changed")
	require.NoError(t, small.Resize(ctx, 5), "shrinking takes no room")

	require.NoError(t, a.Release())
	require.NoError(t, <-waited, "the waiter's loader reserved its 50 bytes in its turn")
	require.NoError(t, small.Resize(ctx, 30), "nobody waits any more")
	require.NoError(t, small.Release())
}

// The members of a shared budget draw on one figure: a caller waiting at
// one member (cuda:0) holds up calls that do not wait at another
// (pageable-host) — a cache load, a memory budget reservation — and a
// later waiting call there queues behind it. Before, the cache's load
// and reservation at pageable-host were admitted and took group room the
// waiter needed.
func TestWaiterAtOneMemberHoldsTheSharedBudget(t *testing.T) {
	sys, c := startShared(t, gpu0) // igpu: cuda:0 (200) and pageable-host (none) share 100
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h, err := cache.LoadOn(ctx, c, "h", [][]string{{host}}, 60, nil, func(context.Context, string) (int, error) { return 1, nil })
	require.NoError(t, err)
	waited := make(chan error, 1)
	go func() {
		l, err := cache.Load(ctx, c, "g", 50, nil, intLoader(50), cache.Wait(system.WaitForRoom()))
		if err == nil {
			err = l.Release()
		}
		waited <- err
	}()
	awaitWaiters(t, ctx, sys, 1)

	hc, err := cache.New(ctx, sys, cache.Options{Location: host})
	require.NoError(t, err)
	_, err = cache.Load(ctx, hc, "x", 10, nil, intLoader(10))
	var cb *system.CacheBusyError
	require.ErrorAs(t, err, &cb, "10 bytes at the host would fit the group's 40 free, but the waiter at cuda:0 needs them")
	assert.Equal(t, 1, cb.Waiters)
	_, err = hc.Budget().Reserve(ctx, 10)
	require.ErrorAs(t, err, &cb)
	assert.Equal(t, 1, cb.Waiters)

	later := make(chan error, 1)
	go func() {
		l, err := cache.Load(ctx, hc, "y", 10, nil, intLoader(10), cache.Wait(system.WaitForRoom()))
		if err == nil {
			err = l.Release()
		}
		later <- err
	}()
	awaitWaiters(t, ctx, sys, 2)
	ws := sys.Waiters()
	require.Len(t, ws, 2)
	assert.Equal(t, "g", ws[0].Name)
	assert.False(t, ws[1].Eligible, "the later waiter at the host is held up by the one at cuda:0")

	require.NoError(t, h.Release())
	require.NoError(t, <-waited)
	require.NoError(t, <-later)
}

// A cache's load, or a reservation of its memory budget, takes no room
// that a waiter holds elsewhere: its plan drops a victim rather than
// demote it into a spill target where a caller waits. Before, the
// demotion took 30 of the 40 bytes free at pageable-host, where a
// waiter needed them, and with the demoted copy leased the waiter could
// never be admitted.
func TestCacheLoadDemotesNothingIntoHeldRoom(t *testing.T) {
	for name, reserve := range map[string]func(context.Context, *cache.Cache) (func() error, error){
		"load": func(ctx context.Context, c *cache.Cache) (func() error, error) {
			l, err := cache.Load(ctx, c, "k", 80, nil, intLoader(80))
			return l.Release, err
		},
		"memory budget": func(ctx context.Context, c *cache.Cache) (func() error, error) {
			r, err := c.Budget().Reserve(ctx, 80)
			if err != nil {
				return nil, err
			}
			return r.Release, nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sys, err := startSoft(t, ctx, system.Options{
				Locations: []system.LocationConfig{system.Limit(host, 100), system.Limit(gpu0, 100)},
				Spill:     map[string]string{gpu0: host},
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = sys.Close(context.Background()) })
			c, err := cache.New(ctx, sys, cache.Options{Location: gpu0})
			require.NoError(t, err)
			v, err := sys.Register(ctx, system.Value{Name: "v", Bytes: 30, Mode: system.Replicable, Source: host, Loader: zeroLoader})
			require.NoError(t, err)
			require.NoError(t, sys.Place(ctx, v, gpu0))
			holder, _, err := sys.Admit(ctx, system.Request{Name: "holder", Reservations: []system.ReservationSpec{{Name: "holder", Location: host, Bytes: 60}}})
			require.NoError(t, err)
			waited := make(chan error, 1)
			go func() {
				sc, _, err := sys.Admit(ctx, system.Request{Name: "w1", Reservations: []system.ReservationSpec{{Name: "w1", Location: host, Bytes: 80}}}, system.WaitForRoom())
				if err == nil {
					err = sc.Exit(context.Background())
				}
				waited <- err
			}()
			awaitWaiters(t, ctx, sys, 1)

			release, err := reserve(ctx, c)
			require.NoError(t, err, "v makes the room at cuda:0")
			assert.Equal(t, int64(60), charged(t, ctx, sys, host), "v was dropped, not demoted into the room w1 waits for")
			require.NoError(t, release())
			require.NoError(t, holder.Exit(ctx))
			require.NoError(t, <-waited)
		})
	}
}

func zeroLoader(_ context.Context, dst []byte) error {
	clear(dst)
	return nil
}

// charged is loc's used and reserved bytes now.
func charged(t *testing.T, ctx context.Context, sys *system.System, loc string) int64 {
	t.Helper()
	snap, err := sys.Snapshot(ctx)
	require.NoError(t, err)
	for _, l := range snap.Locations {
		if l.Location == loc {
			return l.UsedBytes + l.ReservedBytes
		}
	}
	t.Fatalf("no location %s", loc)
	return 0
}
