package tests

import (
	"context"
	"errors"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/testclock"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// Keep-alive, evict-when-idle, EvictIdle, Entries and the entry cap of the
// loader cache. Time comes from fakeClock: nothing sleeps, and expiry
// happens when the test advances the clock.

// fakeClock is the shared test clock (testclock.Clock), from ckT0.
type fakeClock = testclock.Clock

var ckT0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func newFakeClock() *fakeClock { return testclock.New(ckT0) }

// goneValue records its Close.
type goneValue struct {
	closed chan struct{}
	n      atomic.Int32
}

func newGone() *goneValue { return &goneValue{closed: make(chan struct{})} }

func (g *goneValue) Close() error {
	if g.n.Add(1) == 1 {
		close(g.closed)
	}
	return nil
}

func (g *goneValue) isClosed() bool { return g.n.Load() > 0 }

// waitClosed waits for the value's Close (a watchdog, not a poll).
func (g *goneValue) waitClosed(t *testing.T) {
	t.Helper()
	w := time.NewTimer(10 * time.Second)
	defer w.Stop()
	select {
	case <-g.closed:
	case <-w.C:
		t.Fatal("the value was never closed")
	}
}

func waitDone(t *testing.T, done <-chan struct{}) {
	t.Helper()
	w := time.NewTimer(10 * time.Second)
	defer w.Stop()
	select {
	case <-done:
	case <-w.C:
		t.Fatal("the entry never left the cache")
	}
}

func keepCache(t *testing.T, budgetBytes int64, opts cache.Options) (*system.System, *cache.Cache, *fakeClock) {
	t.Helper()
	sys := start(t, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", budgetBytes)}})
	clk := newFakeClock()
	opts.Location, opts.Clock = "cuda:0", clk
	if opts.Name == "" {
		opts.Name = "keep"
	}
	c, err := cache.New(context.Background(), sys, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return sys, c, clk
}

func entry(t *testing.T, c *cache.Cache, key string) (cache.Entry, bool) {
	t.Helper()
	for _, e := range c.Entries() {
		if e.Key == key {
			return e, true
		}
	}
	return cache.Entry{}, false
}

func loadGone(t *testing.T, c *cache.Cache, key string, bytes int64, opts ...cache.LoadOption) (cache.Lease[*goneValue], *goneValue) {
	t.Helper()
	g := newGone()
	l, err := cache.Load(context.Background(), c, key, bytes, nil, value(g, bytes), opts...)
	require.NoError(t, err)
	return l, l.Value()
}

// An entry expires its keep-alive after its last release, through the
// eviction path: value closed, charge released, counted in the statistics.
func TestCacheKeepAliveExpiresAnIdleEntryOnTheClock(t *testing.T) {
	_, c, clk := keepCache(t, 100, cache.Options{KeepAlive: new(10 * time.Second)})
	l, g := loadGone(t, c, "a", 30)
	clk.Advance(time.Hour)
	assert.False(t, g.isClosed(), "a held entry never expires")
	require.NoError(t, l.Release())
	e, ok := entry(t, c, "a")
	require.True(t, ok)
	assert.Equal(t, ckT0.Add(time.Hour+10*time.Second), e.Expiry, "counted from the release")
	clk.Advance(10*time.Second - time.Nanosecond)
	assert.False(t, g.isClosed())
	clk.Advance(time.Nanosecond)
	g.waitClosed(t)
	_, ok = entry(t, c, "a")
	assert.False(t, ok)
	st := stats(t, c)
	assert.Equal(t, uint64(1), st.Evictions)
	assert.Equal(t, uint64(1), st.Expirations)
	assert.Equal(t, 0, st.Resources)
	assert.Equal(t, 0, clk.Pending(), "no timer left without an expiry")
	// The key loads again.
	l2, g2 := loadGone(t, c, "a", 30)
	assert.NotSame(t, g, g2)
	require.NoError(t, l2.Release())
}

// Every use resets the keep-alive; a request's WithKeepAlive replaces the
// entry's, shorter or longer.
func TestCacheKeepAliveResetsOnUseAndALoadExtendsIt(t *testing.T) {
	_, c, clk := keepCache(t, 100, cache.Options{KeepAlive: new(10 * time.Second)})
	l, g := loadGone(t, c, "a", 30)
	require.NoError(t, l.Release())
	clk.Advance(8 * time.Second)
	hit, err := cache.Load(context.Background(), c, "a", 30, nil, unreachable[*goneValue](t), cache.WithKeepAlive(5*time.Second))
	require.NoError(t, err)
	e, _ := entry(t, c, "a")
	assert.Equal(t, 5*time.Second, e.KeepAlive, "the request's, though shorter")
	assert.True(t, e.Expiry.IsZero(), "held: no expiry")
	assert.Equal(t, ckT0.Add(8*time.Second), e.LastUse)
	require.NoError(t, hit.Release())
	clk.Advance(4 * time.Second)
	assert.False(t, g.isClosed(), "the use at 8 s reset it")

	hit, err = cache.Load(context.Background(), c, "a", 30, nil, unreachable[*goneValue](t), cache.WithKeepAlive(time.Minute))
	require.NoError(t, err)
	require.NoError(t, hit.Release())
	e, _ = entry(t, c, "a")
	assert.Equal(t, time.Minute, e.KeepAlive)
	clk.Advance(time.Minute - time.Second)
	assert.False(t, g.isClosed())
	clk.Advance(time.Second)
	g.waitClosed(t)
}

// The default keeps today's behaviour: entries stay until evicted, and no
// timer is ever set.
func TestCacheKeepAliveDefaultKeepsEntriesForever(t *testing.T) {
	_, c, clk := keepCache(t, 100, cache.Options{})
	l, g := loadGone(t, c, "a", 30)
	require.NoError(t, l.Release())
	clk.Advance(1000 * time.Hour)
	assert.False(t, g.isClosed())
	e, ok := entry(t, c, "a")
	require.True(t, ok)
	assert.Equal(t, cache.KeepForever, e.KeepAlive)
	assert.True(t, e.Expiry.IsZero())
	assert.Equal(t, 0, clk.Pending())
	// A request's keep-alive replaces the default: 0 unloads it once idle.
	hit, err := cache.Load(context.Background(), c, "a", 30, nil, unreachable[*goneValue](t), cache.WithKeepAlive(0))
	require.NoError(t, err)
	assert.False(t, g.isClosed(), "held: it stays")
	require.NoError(t, hit.Release())
	g.waitClosed(t)
}

// Keep-alive 0 unloads an entry at the release of its last holder, whichever
// kind that is; deferred eviction (EvictWhenIdle) does the same for an entry
// kept forever.
func TestCacheEntryLeavesAtTheLastReleaseOfEveryKind(t *testing.T) {
	kinds := []struct {
		name string
		// hold takes more references from the lease and returns their
		// releases in the order the test calls them (the last one frees it).
		hold func(l cache.Lease[*goneValue]) []func() error
	}{
		{"lease", func(l cache.Lease[*goneValue]) []func() error { return []func() error{l.Release} }},
		{"clone", func(l cache.Lease[*goneValue]) []func() error {
			cl := l.Clone()
			return []func() error{l.Release, cl.Release}
		}},
		{"pin", func(l cache.Lease[*goneValue]) []func() error {
			p := l.Pin()
			return []func() error{l.Release, p.Release}
		}},
		{"keep-alive", func(l cache.Lease[*goneValue]) []func() error {
			k := l.KeepAlive()
			return []func() error{l.Release, k.Release}
		}},
	}
	for _, how := range []string{"keep-alive 0", "evict when idle"} {
		for _, k := range kinds {
			t.Run(how+"/"+k.name, func(t *testing.T) {
				opts := cache.Options{}
				if how == "keep-alive 0" {
					opts.KeepAlive = new(time.Duration(0))
				}
				_, c, _ := keepCache(t, 100, opts)
				l, g := loadGone(t, c, "a", 30)
				var done <-chan struct{}
				if how == "evict when idle" {
					var found bool
					var err error
					done, found, err = c.EvictWhenIdle(context.Background(), "a")
					require.NoError(t, err)
					require.True(t, found)
				}
				rel := k.hold(l)
				for _, r := range rel[:len(rel)-1] {
					require.NoError(t, r())
				}
				assert.False(t, g.isClosed(), "still held")
				if done != nil {
					select {
					case <-done:
						t.Fatal("done before the last release")
					default:
					}
				}
				require.NoError(t, rel[len(rel)-1]())
				g.waitClosed(t)
				if done != nil {
					waitDone(t, done)
					assert.Equal(t, int64(0), stats(t, c).ReservedBytes, "done: the charge is released")
				}
				assert.Empty(t, c.Entries())
				st := stats(t, c)
				assert.Equal(t, uint64(1), st.Evictions)
				assert.Equal(t, map[bool]uint64{true: 1, false: 0}[how == "keep-alive 0"], st.Expirations)
			})
		}
	}
}

// An entry whose idle predicate says busy when it expires stays, and goes at
// the next cache operation that finds it idle (nothing polls).
func TestCacheExpiredEntryWaitsForItsIdlePredicate(t *testing.T) {
	ctx := context.Background()
	_, c, clk := keepCache(t, 100, cache.Options{KeepAlive: new(time.Second)})
	var busy atomic.Bool
	busy.Store(true)
	g := newGone()
	l, err := cache.Load(ctx, c, "a", 30, func(*goneValue) bool { return !busy.Load() }, value(g, 30))
	require.NoError(t, err)
	require.NoError(t, l.Release())
	clk.Advance(time.Minute)
	_, ok := entry(t, c, "a")
	assert.True(t, ok, "its device work is still queued")
	assert.Equal(t, 0, clk.Pending(), "no timer polls the predicate")
	busy.Store(false)
	other, err := cache.Load(ctx, c, "b", 10, nil, value(1, 10))
	require.NoError(t, err)
	g.waitClosed(t)
	require.NoError(t, other.Release())
	assert.Equal(t, uint64(1), stats(t, c).Expirations)
}

// A load finished after every caller gave up is idle at once: with
// keep-alive 0 it goes straight away.
func TestCacheKeepAliveZeroUnloadsALoadNobodyWaitsFor(t *testing.T) {
	_, c, _ := keepCache(t, 100, cache.Options{KeepAlive: new(time.Duration(0))})
	g := newGone()
	gate, started := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cache.Load(ctx, c, "a", 30, nil, func(context.Context) (*goneValue, int64, error) {
			close(started)
			<-gate
			return g, 30, nil
		})
		done <- err
	}()
	<-started
	e, _ := entry(t, c, "a")
	assert.Equal(t, cache.Entry{Key: "a", State: cache.EntryLoading, KeepAlive: 0}, e)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	close(gate) // the loader ignores its context and finishes
	g.waitClosed(t)
}

// EvictWhenIdle: an idle entry goes at once; a loading one once its callers
// release it; a failed load ends the wait; an absent key is not found; a
// canceled call marks nothing; a closed cache refuses.
func TestCacheEvictWhenIdleCases(t *testing.T) {
	ctx := context.Background()
	_, c, _ := keepCache(t, 100, cache.Options{})

	l, g := loadGone(t, c, "idle", 10)
	require.NoError(t, l.Release())
	done, found, err := c.EvictWhenIdle(ctx, "idle")
	require.NoError(t, err)
	require.True(t, found)
	waitDone(t, done)
	assert.True(t, g.isClosed())

	done, found, err = c.EvictWhenIdle(ctx, "nope")
	require.NoError(t, err)
	assert.False(t, found)
	assert.Nil(t, done)

	l, g = loadGone(t, c, "held", 10)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = c.EvictWhenIdle(cctx, "held")
	require.ErrorIs(t, err, context.Canceled)
	e, _ := entry(t, c, "held")
	assert.False(t, e.EvictWhenIdle, "a canceled call marks nothing")
	require.NoError(t, l.Release())
	assert.False(t, g.isClosed())

	// Loading: marked, it goes once the load's caller releases its lease;
	// a hit before then still gets the value.
	gate, started := make(chan struct{}), make(chan struct{})
	lg := newGone()
	res := make(chan cache.Lease[*goneValue], 1)
	go func() {
		l, err := cache.Load(ctx, c, "loading", 10, nil, func(context.Context) (*goneValue, int64, error) {
			close(started)
			<-gate
			return lg, 10, nil
		})
		assert.NoError(t, err)
		res <- l
	}()
	<-started
	done, found, err = c.EvictWhenIdle(ctx, "loading")
	require.NoError(t, err)
	require.True(t, found)
	close(gate)
	ll := <-res
	hit, err := cache.Load(ctx, c, "loading", 10, nil, unreachable[*goneValue](t))
	require.NoError(t, err)
	require.NoError(t, ll.Release())
	assert.False(t, lg.isClosed())
	require.NoError(t, hit.Release())
	waitDone(t, done)
	assert.True(t, lg.isClosed())

	// A load that fails ends the wait: nothing is left to evict.
	gate, started = make(chan struct{}), make(chan struct{})
	failed := make(chan error, 1)
	go func() {
		_, err := cache.Load(ctx, c, "failing", 10, nil, func(context.Context) (*goneValue, int64, error) {
			close(started)
			<-gate
			return nil, 0, errors.New("no such model")
		})
		failed <- err
	}()
	<-started
	done, found, err = c.EvictWhenIdle(ctx, "failing")
	require.NoError(t, err)
	require.True(t, found)
	close(gate)
	var le *system.CacheLoadError
	require.ErrorAs(t, <-failed, &le)
	waitDone(t, done)

	require.NoError(t, c.Close(ctx))
	_, _, err = c.EvictWhenIdle(ctx, "held")
	require.ErrorIs(t, err, system.ErrCacheClosed)
}

// EvictIdle evicts every idle entry and leaves held, not-idle and loading
// ones; the cache stays open.
func TestCacheEvictIdleLeavesHeldAndBusyEntries(t *testing.T) {
	ctx := context.Background()
	_, c, _ := keepCache(t, 100, cache.Options{})
	var idle []*goneValue
	for _, k := range []string{"a", "b", "c"} {
		l, g := loadGone(t, c, k, 10)
		require.NoError(t, l.Release())
		idle = append(idle, g)
	}
	held, hg := loadGone(t, c, "held", 10)
	busyVal := newGone()
	bl, err := cache.Load(ctx, c, "busy", 10, func(*goneValue) bool { return false }, value(busyVal, 10))
	require.NoError(t, err)
	require.NoError(t, bl.Release())

	n, err := c.EvictIdle(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	for _, g := range idle {
		assert.True(t, g.isClosed(), "EvictIdle returns after the releases")
	}
	assert.False(t, hg.isClosed())
	assert.False(t, busyVal.isClosed())
	st := stats(t, c)
	assert.Equal(t, int64(20), st.ReservedBytes)
	assert.Equal(t, uint64(3), st.Evictions)
	keys := []string{}
	for _, e := range c.Entries() {
		keys = append(keys, e.Key)
	}
	assert.Equal(t, []string{"busy", "held"}, keys)

	n, err = c.EvictIdle(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, n)
	l, _ := loadGone(t, c, "d", 10) // still open
	require.NoError(t, l.Release())
	require.NoError(t, held.Release())
	require.NoError(t, c.Close(ctx))
	_, err = c.EvictIdle(ctx)
	require.ErrorIs(t, err, system.ErrCacheClosed)
}

// Entries lists every entry by key with its references, bytes and times.
func TestCacheEntriesDescribeEachEntry(t *testing.T) {
	ctx := context.Background()
	_, c, clk := keepCache(t, 100, cache.Options{KeepAlive: new(time.Minute)})
	lb, _ := loadGone(t, c, "b", 20)
	pin := lb.Pin()
	ka := lb.KeepAlive()
	clone := lb.Clone()
	clk.Advance(time.Second)
	la, _ := loadGone(t, c, "a", 15)
	require.NoError(t, la.Release())

	got := c.Entries()
	require.Len(t, got, 2)
	assert.Equal(t, cache.Entry{Key: "a", State: cache.EntryReady, Bytes: 15, LastUse: ckT0.Add(time.Second),
		KeepAlive: time.Minute, Expiry: ckT0.Add(time.Second + time.Minute)}, got[0])
	assert.Equal(t, cache.Entry{Key: "b", State: cache.EntryReady, Bytes: 20, Leases: 2, Pins: 1, KeepAlives: 1,
		LastUse: ckT0, KeepAlive: time.Minute}, got[1])
	assert.True(t, sort.SliceIsSorted(got, func(i, j int) bool { return got[i].Key < got[j].Key }))

	for _, r := range []func() error{lb.Release, clone.Release, pin.Release} {
		require.NoError(t, r())
	}
	e, _ := entry(t, c, "b")
	assert.Equal(t, cache.Entry{Key: "b", State: cache.EntryReady, Bytes: 20, KeepAlives: 1, LastUse: ckT0, KeepAlive: time.Minute}, e)
	require.NoError(t, ka.Release())
	_ = ctx
}

// The entry cap: a new key at the cap evicts the least recently used idle
// entry; with none idle it is a CacheBusyError naming the cap, and the
// loader does not run.
func TestCacheMaxEntriesEvictsTheLeastRecentlyUsedOrAnswersBusy(t *testing.T) {
	ctx := context.Background()
	_, c, _ := keepCache(t, 1000, cache.Options{MaxEntries: 2})
	la, ga := loadGone(t, c, "a", 10)
	lb, gb := loadGone(t, c, "b", 10)
	require.NoError(t, la.Release())
	require.NoError(t, lb.Release())
	hit, err := cache.Load(ctx, c, "a", 10, nil, unreachable[*goneValue](t)) // b is now the LRU
	require.NoError(t, err)
	require.NoError(t, hit.Release())

	lc, _ := loadGone(t, c, "c", 10)
	assert.True(t, gb.isClosed(), "the least recently used idle entry made room (waited for)")
	assert.False(t, ga.isClosed())
	assert.Len(t, c.Entries(), 2)

	la, err = cache.Load(ctx, c, "a", 10, nil, unreachable[*goneValue](t))
	require.NoError(t, err)
	_, err = cache.Load(ctx, c, "d", 10, nil, unreachable[*goneValue](t))
	var busy *system.CacheBusyError
	require.ErrorAs(t, err, &busy)
	assert.ErrorIs(t, err, system.ErrBusy)
	assert.Equal(t, system.CacheBusyError{Key: "d", Location: "cuda:0", MaxEntries: 2}, *busy)
	assert.Len(t, c.Entries(), 2)
	require.NoError(t, la.Release())
	require.NoError(t, lc.Release())
	assert.Equal(t, uint64(1), stats(t, c).Evictions)

	sys := start(t, system.Options{Locations: []system.LocationConfig{system.Limit("cuda:0", 10)}})
	_, err = cache.New(ctx, sys, cache.Options{Location: "cuda:0", MaxEntries: -1})
	require.ErrorIs(t, err, system.ErrInvalidInput)
}

// A load waiting for the release of the entry the cap evicted can be
// canceled; it leaves nothing behind, and the eviction completes.
func TestCacheMaxEntriesWaitCanceledLeavesNothingBehind(t *testing.T) {
	ctx := context.Background()
	_, c, _ := keepCache(t, 1000, cache.Options{MaxEntries: 1})
	slow := &blocking{started: make(chan struct{}), gate: make(chan struct{})}
	l, err := cache.Load(ctx, c, "slow", 10, nil, value(slow, 10))
	require.NoError(t, err)
	require.NoError(t, l.Release())
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := cache.Load(cctx, c, "next", 10, nil, unreachable[int](t))
		done <- err
	}()
	<-slow.started
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	assert.Empty(t, c.Entries(), "no entry for the canceled key, the victim is out")
	close(slow.gate)
	require.NoError(t, c.Close(ctx))
	assert.Equal(t, int64(0), stats(t, c).ReservedBytes)
}

// Close stops the keep-alive timer: nothing expires after it and no timer
// is left pending (goleak, TestMain, checks for goroutines).
func TestCacheCloseStopsTheKeepAliveTimer(t *testing.T) {
	ctx := context.Background()
	_, c, clk := keepCache(t, 100, cache.Options{KeepAlive: new(time.Minute)})
	l, _ := loadGone(t, c, "a", 10)
	require.NoError(t, l.Release())
	assert.Equal(t, 1, clk.Pending())
	require.NoError(t, c.Close(ctx))
	assert.Equal(t, 0, clk.Pending())
	clk.Advance(time.Hour)
	st := stats(t, c)
	assert.Equal(t, uint64(0), st.Expirations)

	// The real clock: a pending timer is stopped by Close.
	sys := start(t, system.Options{Locations: []system.LocationConfig{system.Limit("cuda:0", 100)}})
	rc, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", KeepAlive: new(time.Hour)})
	require.NoError(t, err)
	rl, err := cache.Load(ctx, rc, "a", 10, nil, value(1, 10))
	require.NoError(t, err)
	require.NoError(t, rl.Release())
	e, _ := entry(t, rc, "a")
	assert.False(t, e.Expiry.IsZero())
	require.NoError(t, rc.Close(ctx))
}

// A request's keep-alive works on a cache created without one (whose
// default keeps entries forever), and the last request to take the entry
// sets it, longer or shorter.
func TestCacheKeepAliveOfARequestReplacesTheEntrys(t *testing.T) {
	_, c, clk := keepCache(t, 100, cache.Options{})
	l, g := loadGone(t, c, "a", 30, cache.WithKeepAlive(time.Minute))
	require.NoError(t, l.Release())
	e, _ := entry(t, c, "a")
	assert.Equal(t, time.Minute, e.KeepAlive)
	hit, err := cache.Load(context.Background(), c, "a", 30, nil, unreachable[*goneValue](t), cache.WithKeepAlive(time.Hour))
	require.NoError(t, err)
	require.NoError(t, hit.Release())
	clk.Advance(time.Hour - time.Nanosecond)
	assert.False(t, g.isClosed(), "the longer one replaced a minute")
	hit, err = cache.Load(context.Background(), c, "a", 30, nil, unreachable[*goneValue](t), cache.WithKeepAlive(time.Second))
	require.NoError(t, err)
	require.NoError(t, hit.Release())
	clk.Advance(time.Second)
	g.waitClosed(t)
}
