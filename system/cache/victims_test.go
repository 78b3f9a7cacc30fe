package cache_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// Idle cache entries and values share one victim order (docs/cache.md,
// "Eviction"): Admit may evict idle entries, a cache load may evict
// unprotected values, and neither ever evicts what is busy.

const vgpu = "cuda:0"

// startVictims starts a runtime with a host without limit and a 100-byte
// GPU, and n caches there (named c0, c1, ...), closed when the test ends.
func startVictims(t *testing.T, n int) (*system.System, []*cache.Cache) {
	t.Helper()
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit(vgpu, 100)}})
	require.NoError(t, err)
	var cs []*cache.Cache
	for i := range n {
		c, err := cache.New(ctx, sys, cache.Options{Location: vgpu, Name: string(rune('a'+i)) + "-cache"})
		require.NoError(t, err)
		cs = append(cs, c)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			assert.NoError(t, c.Close(ctx))
		}
		assert.NoError(t, sys.Close(ctx))
	})
	return sys, cs
}

// blob is a cached value that counts its closes.
type blob struct {
	closed atomic.Int32
	busy   atomic.Bool // the idle predicate says busy while set
}

func (b *blob) Close() error { b.closed.Add(1); return nil }

func blobIdle(b *blob) bool { return !b.busy.Load() }

func loadBlob(ctx context.Context, c *cache.Cache, key string, bytes int64, opts ...cache.LoadOption) (cache.Lease[*blob], *blob, error) {
	var made *blob
	l, err := cache.Load(ctx, c, key, bytes, blobIdle, func(context.Context) (*blob, int64, error) {
		made = &blob{}
		return made, bytes, nil
	}, opts...)
	if err == nil && made == nil {
		made = l.Value()
	}
	return l, made, err
}

// idleBlob loads key and releases its lease: an idle, offered entry.
func idleBlob(t *testing.T, c *cache.Cache, key string, bytes int64) *blob {
	t.Helper()
	l, b, err := loadBlob(context.Background(), c, key, bytes)
	require.NoError(t, err)
	require.NoError(t, l.Release())
	return b
}

func gpuResv(name string, bytes int64) system.Request {
	return system.Request{Name: name, Reservations: []system.ReservationSpec{{Name: name, Location: vgpu, Bytes: bytes}}}
}

func TestAdmitEvictsIdleCacheEntry(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	c := cs[0]
	b := idleBlob(t, c, "weights", 70)

	sc, d, err := sys.Admit(ctx, gpuResv("kv", 60))
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	ev := d.Evictions[0]
	assert.Equal(t, budget.EvictionIdleCacheEntry, ev.Kind)
	assert.Equal(t, c.Owner(), ev.Owner)
	assert.NotEmpty(t, ev.Charge)
	assert.NotEmpty(t, ev.Reason)
	assert.Equal(t, int64(70), ev.Bytes)
	assert.Equal(t, int32(1), b.closed.Load(), "the evicted value is closed once")
	assert.Empty(t, keys(c))
	st, err := c.Statistics(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.ReservedBytes, "the charge is gone")
	assert.Equal(t, uint64(1), st.Evictions)
	assert.Equal(t, int64(60), st.LocationReservedBytes)
	require.NoError(t, sc.Exit(ctx))
}

func TestAdmitNeverEvictsBusyEntry(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// hold makes the 70-byte entry "weights" busy; its return undoes it.
		hold func(t *testing.T, c *cache.Cache) func()
	}{
		{"leased", func(t *testing.T, c *cache.Cache) func() {
			l, _, err := loadBlob(ctx, c, "weights", 70)
			require.NoError(t, err)
			return func() { require.NoError(t, l.Release()) }
		}},
		{"pinned", func(t *testing.T, c *cache.Cache) func() {
			l, _, err := loadBlob(ctx, c, "weights", 70)
			require.NoError(t, err)
			p := l.Pin()
			require.NoError(t, l.Release())
			return func() { require.NoError(t, p.Release()) }
		}},
		{"idle predicate busy", func(t *testing.T, c *cache.Cache) func() {
			l, b, err := loadBlob(ctx, c, "weights", 70)
			require.NoError(t, err)
			b.busy.Store(true)
			require.NoError(t, l.Release()) // not offered: busy
			return func() {
				b.busy.Store(false)
				_, err := c.EvictIdle(ctx) // the cache finds it idle on its own
				require.NoError(t, err)
			}
		}},
		{"loading", func(t *testing.T, c *cache.Cache) func() {
			started, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				l, err := cache.Load(ctx, c, "weights", 70, nil, func(context.Context) (*blob, int64, error) {
					close(started)
					<-release
					return &blob{}, 70, nil
				})
				if err == nil {
					err = l.Release()
				}
				done <- err
			}()
			<-started
			return func() { close(release); require.NoError(t, <-done) }
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sys, cs := startVictims(t, 1)
			undo := tc.hold(t, cs[0])
			_, _, err := sys.Admit(ctx, gpuResv("kv", 60))
			var pe *system.PlanError
			require.ErrorAs(t, err, &pe, "nothing may be evicted")
			assert.Equal(t, []string{"weights"}, keys(cs[0]))
			undo()
			sc, _, err := sys.Admit(ctx, gpuResv("kv", 60))
			require.NoError(t, err, "once idle it may go")
			require.NoError(t, sc.Exit(ctx))
		})
	}
}

// A lease taken between the decision and the drop: the cache refuses,
// the run fails as busy, the lease's value is intact; once released the
// entry is offered again.
func TestLeaseBetweenDecisionAndDropIsRefused(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	c := cs[0]
	b := idleBlob(t, c, "weights", 70)
	var lease cache.Lease[*blob]
	cache.SetDropHook(c, func() {
		cache.SetDropHook(c, nil)
		var err error
		lease, _, err = loadBlob(ctx, c, "weights", 70) // a hit
		require.NoError(t, err)
	})
	_, _, err := sys.Admit(ctx, gpuResv("kv", 60))
	var pee *system.PlanExecutionError
	require.ErrorAs(t, err, &pee)
	var busy *budget.ChargeBusyError
	require.ErrorAs(t, err, &busy)
	assert.True(t, busy.Refused)
	assert.ErrorIs(t, err, system.ErrBusy)
	require.NotZero(t, lease, "the drop hook took a lease")
	assert.Same(t, b, lease.Value())
	assert.Zero(t, b.closed.Load(), "the leased value is intact")
	st, err := c.Statistics(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(70), st.ReservedBytes)

	require.NoError(t, lease.Release())
	sc, d, err := sys.Admit(ctx, gpuResv("kv", 60))
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	assert.Equal(t, int32(1), b.closed.Load())
	require.NoError(t, sc.Exit(ctx))
}

// A refused drop when another idle entry could go: a waiting Admit
// decides again and takes the other one.
func TestWaitingAdmitDecidesAgainAfterRefusal(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	c := cs[0]
	a := idleBlob(t, c, "a", 50)
	b := idleBlob(t, c, "b", 50)
	cache.SetDropHook(c, func() {
		cache.SetDropHook(c, nil)
		a.busy.Store(true) // device work queued on a after its offer
	})
	sc, _, err := sys.Admit(ctx, gpuResv("kv", 50), system.WaitForRoom())
	require.NoError(t, err)
	assert.Zero(t, a.closed.Load())
	assert.Equal(t, int32(1), b.closed.Load())
	assert.Equal(t, []string{"a"}, keys(c))
	require.NoError(t, sc.Exit(ctx))
}

func TestCacheLoadEvictsUnprotectedValue(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	h, err := sys.Register(ctx, system.Value{Name: "replica", Bytes: 100, Mode: system.Replicable, At: "pageable-host"})
	require.NoError(t, err)
	require.NoError(t, sys.Copy(ctx, h, "pageable-host", vgpu))

	l, _, err := loadBlob(ctx, cs[0], "weights", 60)
	require.NoError(t, err, "the load evicts the replica")
	require.NoError(t, l.Release())
	snap, err := sys.Snapshot(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(60), gpuRecord(t, snap).ReservedBytes)
	assert.Zero(t, gpuRecord(t, snap).UsedBytes, "the GPU copy went; the host copy stays")
}

func TestCacheLoadNeverEvictsProtectedValueOrLastCopy(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		fill func(t *testing.T, sys *system.System)
	}{
		{"leased replica", func(t *testing.T, sys *system.System) {
			h, err := sys.Register(ctx, system.Value{Name: "replica", Bytes: 100, Mode: system.Replicable, At: "pageable-host"})
			require.NoError(t, err)
			require.NoError(t, sys.Copy(ctx, h, "pageable-host", vgpu))
			l, err := sys.Acquire(ctx, h, vgpu)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Release(ctx) })
		}},
		{"last copy", func(t *testing.T, sys *system.System) {
			_, err := sys.Register(ctx, system.Value{Name: "only", Bytes: 100, Mode: system.Exclusive, At: vgpu})
			require.NoError(t, err)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sys, cs := startVictims(t, 1)
			tc.fill(t, sys)
			_, _, err := loadBlob(ctx, cs[0], "weights", 60)
			var busy *system.CacheBusyError
			require.ErrorAs(t, err, &busy)
			require.NotNil(t, busy.Refusal)
			assert.Equal(t, int64(60), busy.Refusal.RequestedBytes)
			snap, err := sys.Snapshot(ctx)
			require.NoError(t, err)
			assert.Equal(t, int64(100), gpuRecord(t, snap).UsedBytes)
			assert.Zero(t, gpuRecord(t, snap).ReservedBytes)
		})
	}
}

// Two caches on one GPU: a load of either evicts the idle entry that
// ranks lowest, whichever cache holds it.
func TestTwoCachesEvictEachOthersIdleEntries(t *testing.T) {
	ctx := context.Background()
	_, cs := startVictims(t, 2)
	c1, c2 := cs[0], cs[1]
	b2 := idleBlob(t, c2, "b", 40) // offered first: lowest
	a1 := idleBlob(t, c1, "a", 40)

	l, _, err := loadBlob(ctx, c1, "c", 40)
	require.NoError(t, err)
	require.NoError(t, l.Release())
	assert.Equal(t, int32(1), b2.closed.Load(), "c1's load evicted c2's entry")
	assert.Empty(t, keys(c2))

	l, _, err = loadBlob(ctx, c2, "d", 40)
	require.NoError(t, err)
	require.NoError(t, l.Release())
	assert.Equal(t, int32(1), a1.closed.Load(), "c2's load evicted c1's entry")
	assert.Equal(t, []string{"c"}, keys(c1))
	assert.Equal(t, []string{"d"}, keys(c2))
}

func TestWaitingAdmitWokenByOffer(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	l, b, err := loadBlob(ctx, cs[0], "weights", 70)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		sc, _, err := sys.Admit(ctx, gpuResv("kv", 60), system.WaitForRoom())
		if err == nil {
			err = sc.Exit(ctx)
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return len(sys.Waiters()) == 1 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("admitted while the entry is leased: %v", err)
	default:
	}
	require.NoError(t, l.Release()) // idle: offered, which wakes the waiter
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the offer did not wake the waiter")
	}
	assert.Equal(t, int32(1), b.closed.Load())
}

// Close of the cache while a drop is pending: nothing hangs, the charge
// is released once, the value closed once.
func TestCacheCloseWithDropPending(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	c := cs[0]
	b := idleBlob(t, c, "weights", 70)
	cache.SetDropHook(c, func() {
		cache.SetDropHook(c, nil)
		require.NoError(t, c.Close(ctx)) // releases the entry itself
	})
	sc, _, err := sys.Admit(ctx, gpuResv("kv", 60))
	require.NoError(t, err)
	assert.Equal(t, int32(1), b.closed.Load())
	snap, err := sys.Snapshot(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(60), gpuRecord(t, snap).ReservedBytes)
	require.NoError(t, sc.Exit(ctx))
}

// Close of the runtime while a drop is pending: the shutdown waits for
// the owner's answer, which comes; nothing hangs.
func TestRuntimeCloseWithDropPending(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	c := cs[0]
	b := idleBlob(t, c, "weights", 70)
	closed := make(chan error, 1)
	cache.SetDropHook(c, func() {
		cache.SetDropHook(c, nil)
		go func() { closed <- sys.Close(ctx) }()
		require.Eventually(t, func() bool { return errors.Is(sys.Unreserve(ctx, "none"), system.ErrClosed) }, 10*time.Second, time.Millisecond)
	})
	_, _, err := sys.Admit(ctx, gpuResv("kv", 60))
	if err != nil {
		assert.ErrorIs(t, err, system.ErrClosed)
	}
	require.NoError(t, <-closed)
	assert.Equal(t, int32(1), b.closed.Load())
}

func gpuRecord(t *testing.T, snap system.Snapshot) budget.LocationRecord {
	t.Helper()
	r, ok := snap.Location(vgpu)
	require.True(t, ok)
	return r
}
