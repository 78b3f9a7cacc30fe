package cache_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// Split entries (LoadSplit): one key over several locations, reserved all
// or nothing, evicted as one.

const (
	gpu0 = "cuda:0"
	gpu1 = "cuda:1"
	gpu2 = "cuda:2" // configured, but not a location of the split cache
	host = "pageable-host"
)

// startSplit starts a runtime with a host without limit and three
// 100-byte GPUs, and a cache at cuda:0 that may also use cuda:1 and the
// host (opts adjusts it), closed when the test ends.
func startSplit(t *testing.T, adjust func(*cache.Options)) (*system.System, *cache.Cache) {
	t.Helper()
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{
		system.NoLimit(host), system.Limit(gpu0, 100), system.Limit(gpu1, 100), system.Limit(gpu2, 100),
	}})
	require.NoError(t, err)
	opts := cache.Options{Location: gpu0, Locations: []string{gpu1, host}, Name: "split"}
	if adjust != nil {
		adjust(&opts)
	}
	c, err := cache.New(ctx, sys, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, c.Close(ctx))
		assert.NoError(t, sys.Close(ctx))
	})
	return sys, c
}

// other is the other GPU of the split cache.
func other(loc string) string {
	if loc == gpu0 {
		return gpu1
	}
	return gpu0
}

func parts(p0, p1 int64) []cache.Part {
	return []cache.Part{{Location: gpu0, Bytes: p0}, {Location: gpu1, Bytes: p1}}
}

// loadSplitBlob loads key over parts; calls counts the loader's runs.
func loadSplitBlob(ctx context.Context, c *cache.Cache, key string, p []cache.Part, calls *atomic.Int32, opts ...cache.LoadOption) (cache.Lease[*blob], error) {
	return cache.LoadSplit(ctx, c, key, p, blobIdle, func(context.Context) (*blob, error) {
		if calls != nil {
			calls.Add(1)
		}
		return &blob{}, nil
	}, opts...)
}

// idleSplit loads key over parts and releases its lease: an idle entry
// whose parts are all offered.
func idleSplit(t *testing.T, c *cache.Cache, key string, p []cache.Part) *blob {
	t.Helper()
	l, err := loadSplitBlob(context.Background(), c, key, p, nil)
	require.NoError(t, err)
	b := l.Value()
	require.NoError(t, l.Release())
	return b
}

// reserved returns each location's reserved bytes.
func reserved(t *testing.T, sys *system.System) map[string]int64 {
	t.Helper()
	snap, err := sys.Snapshot(context.Background())
	require.NoError(t, err)
	out := map[string]int64{}
	for _, r := range snap.Locations {
		out[r.Location] = r.ReservedBytes
	}
	return out
}

func TestLoadSplitReservesEveryPart(t *testing.T) {
	ctx := context.Background()
	sys, c := startSplit(t, nil)
	p := []cache.Part{{Location: gpu0, Bytes: 60}, {Location: gpu1, Bytes: 40}, {Location: host, Bytes: 500}}
	v0, err := sys.StateVersion(ctx)
	require.NoError(t, err)
	l, err := loadSplitBlob(ctx, c, "llama", p, nil)
	require.NoError(t, err)
	v1, err := sys.StateVersion(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), v1-v0, "one version per part")
	assert.Equal(t, int64(600), l.Bytes())
	assert.Equal(t, p, l.Parts())
	r := reserved(t, sys)
	assert.Equal(t, int64(60), r[gpu0])
	assert.Equal(t, int64(40), r[gpu1])
	assert.Equal(t, int64(500), r[host])

	es := c.Entries()
	require.Len(t, es, 1)
	assert.Equal(t, "llama", es[0].Key)
	assert.Equal(t, int64(600), es[0].Bytes)
	assert.Equal(t, p, es[0].Parts)
	assert.Equal(t, 1, es[0].Leases)

	// A hit is the same entry, whatever parts it names.
	l2, err := loadSplitBlob(ctx, c, "llama", parts(1, 1), nil)
	require.NoError(t, err)
	assert.Same(t, l.Value(), l2.Value())
	require.NoError(t, l2.Release())
	require.NoError(t, l.Release())

	// A plain entry has no parts.
	pl, _, err := loadBlob(ctx, c, "plain", 10)
	require.NoError(t, err)
	assert.Nil(t, pl.Parts())
	require.NoError(t, pl.Release())
	for _, e := range c.Entries() {
		if e.Key == "plain" {
			assert.Nil(t, e.Parts)
		}
	}
}

// A location short of room refuses the whole load: nothing is reserved
// at the others, the loader never runs. Waiting, the load takes every
// part once room is made.
func TestLoadSplitIsAtomic(t *testing.T) {
	ctx := context.Background()
	sys, c := startSplit(t, nil)
	require.NoError(t, sys.Reserve(ctx, gpu1, "wall", 80)) // not a victim
	var calls atomic.Int32

	_, err := loadSplitBlob(ctx, c, "llama", parts(50, 50), &calls)
	var busy *system.CacheBusyError
	require.ErrorAs(t, err, &busy)
	assert.ErrorIs(t, err, system.ErrBusy)
	assert.Equal(t, gpu1, busy.Location, "the short location")
	assert.Zero(t, calls.Load())
	assert.Empty(t, c.Entries())
	r := reserved(t, sys)
	assert.Zero(t, r[gpu0], "nothing reserved at cuda:0")
	assert.Equal(t, int64(80), r[gpu1])

	done := make(chan error, 1)
	go func() {
		l, err := loadSplitBlob(ctx, c, "llama", parts(50, 50), &calls, cache.Wait(system.WaitForRoom()))
		if err == nil {
			err = l.Release()
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return len(sys.Waiters()) == 1 }, 10*time.Second, time.Millisecond)
	w := sys.Waiters()[0]
	assert.ElementsMatch(t, []string{gpu0, gpu1}, w.Locations)
	assert.Zero(t, reserved(t, sys)[gpu0], "a waiter holds nothing")
	assert.Zero(t, calls.Load())

	require.NoError(t, sys.Unreserve(ctx, "wall"))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the unreserve did not wake the waiting split load")
	}
	assert.Equal(t, int32(1), calls.Load())
	r = reserved(t, sys)
	assert.Equal(t, int64(50), r[gpu0])
	assert.Equal(t, int64(50), r[gpu1])
}

// The controller may drop any one part of an idle split entry to make
// room; the entry leaves whole: every part's bytes are freed, the value
// is closed once.
func TestLoadSplitEvictedAsOneByAdmit(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		req   system.Request
		drops int              // parts the decision evicts
		after map[string]int64 // reserved bytes once admitted
	}{
		{"room at cuda:0", resvAt("kv", 60, gpu0), 1, map[string]int64{gpu0: 60, gpu1: 0}},
		{"room at cuda:1", resvAt("kv", 60, gpu1), 1, map[string]int64{gpu0: 0, gpu1: 60}},
		// Both parts are victims of one plan: the first drop releases
		// the second part too; the second drop finds it gone.
		{"room at both", system.Request{Name: "kv", Reservations: []system.ReservationSpec{
			{Name: "kv0", Location: gpu0, Bytes: 60}, {Name: "kv1", Location: gpu1, Bytes: 60},
		}}, 2, map[string]int64{gpu0: 60, gpu1: 60}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sys, c := startSplit(t, nil)
			b := idleSplit(t, c, "llama", parts(70, 70))
			sc, d, err := sys.Admit(ctx, tc.req)
			require.NoError(t, err)
			require.Len(t, d.Evictions, tc.drops)
			for _, ev := range d.Evictions {
				assert.Equal(t, budget.EvictionIdleCacheEntry, ev.Kind)
				assert.Equal(t, c.Owner(), ev.Owner)
			}
			assert.Equal(t, int32(1), b.closed.Load(), "closed before the drop is confirmed")
			assert.Empty(t, c.Entries())
			// The dropped part is released by the run; the cache releases
			// the others right after confirming.
			waitReserved(t, sys, tc.after)
			assert.Equal(t, int32(1), b.closed.Load(), "closed once")
			st, err := c.Statistics(ctx)
			require.NoError(t, err)
			assert.Equal(t, uint64(1), st.Evictions)
			require.NoError(t, sc.Exit(ctx))
		})
	}
}

// waitReserved waits until each location of want has its reserved bytes.
func waitReserved(t *testing.T, sys *system.System, want map[string]int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		r := reserved(t, sys)
		for loc, n := range want {
			if r[loc] != n {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "reserved bytes %v", want)
}

func resvAt(name string, bytes int64, loc string) system.Request {
	return system.Request{Name: name, Reservations: []system.ReservationSpec{{Name: name, Location: loc, Bytes: bytes}}}
}

// Every way the cache itself removes an entry releases every part.
func TestLoadSplitRemovedByCacheReleasesEveryPart(t *testing.T) {
	ctx := context.Background()
	zero := time.Duration(0)
	cases := []struct {
		name   string
		adjust func(*cache.Options)
		remove func(t *testing.T, c *cache.Cache)
		others int64 // what stays at cuda:0 (another entry)
	}{
		{"Evict", nil, func(t *testing.T, c *cache.Cache) {
			ok, err := c.Evict(ctx, "llama")
			require.NoError(t, err)
			require.True(t, ok)
		}, 0},
		{"EvictIdle", nil, func(t *testing.T, c *cache.Cache) {
			n, err := c.EvictIdle(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}, 0},
		{"EvictWhenIdle", nil, func(t *testing.T, c *cache.Cache) {
			done, found, err := c.EvictWhenIdle(ctx, "llama")
			require.NoError(t, err)
			require.True(t, found)
			<-done
		}, 0},
		{"Close", nil, func(t *testing.T, c *cache.Cache) {
			require.NoError(t, c.Close(ctx))
		}, 0},
		{"entry cap", func(o *cache.Options) { o.MaxEntries = 1 }, func(t *testing.T, c *cache.Cache) {
			l, _, err := loadBlob(ctx, c, "other", 10)
			require.NoError(t, err)
			require.NoError(t, l.Release())
		}, 10},
		{"keep-alive 0", func(o *cache.Options) { o.KeepAlive = &zero }, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sys, c := startSplit(t, tc.adjust)
			b := idleSplit(t, c, "llama", []cache.Part{{Location: gpu0, Bytes: 30}, {Location: gpu1, Bytes: 40}, {Location: host, Bytes: 50}})
			if tc.remove != nil {
				tc.remove(t, c)
			}
			want := map[string]int64{gpu0: tc.others, gpu1: 0, host: 0}
			require.Eventually(t, func() bool { // a keep-alive's release runs on its own
				r := reserved(t, sys)
				return b.closed.Load() == 1 && r[gpu0] == want[gpu0] && r[gpu1] == 0 && r[host] == 0
			}, 10*time.Second, time.Millisecond)
			assert.Equal(t, int32(1), b.closed.Load(), "closed once")
			for _, e := range c.Entries() {
				assert.NotEqual(t, "llama", e.Key)
			}
		})
	}
}

// A leased split entry is never dropped, at any of its locations; once
// released it goes as one.
func TestLoadSplitLeasedNeverDropped(t *testing.T) {
	ctx := context.Background()
	for _, loc := range []string{gpu0, gpu1} {
		t.Run(loc, func(t *testing.T) {
			sys, c := startSplit(t, nil)
			l, err := loadSplitBlob(ctx, c, "llama", parts(70, 70), nil)
			require.NoError(t, err)
			_, _, err = sys.Admit(ctx, resvAt("kv", 60, loc))
			var pe *system.PlanError
			require.ErrorAs(t, err, &pe, "nothing may be evicted")
			assert.Zero(t, l.Value().closed.Load())
			r := reserved(t, sys)
			assert.Equal(t, int64(70), r[gpu0])
			assert.Equal(t, int64(70), r[gpu1])

			b := l.Value()
			require.NoError(t, l.Release())
			sc, _, err := sys.Admit(ctx, resvAt("kv", 60, loc))
			require.NoError(t, err, "idle, it may go")
			assert.Equal(t, int32(1), b.closed.Load())
			waitReserved(t, sys, map[string]int64{loc: 60, other(loc): 0})
			require.NoError(t, sc.Exit(ctx))
		})
	}
}

// The entry turns busy between the decision and the drop of one part (a
// lease taken, or its idle predicate false): the cache refuses, and the
// other part is not offered either, so the controller does not ask again
// at the other location; once idle the entry is offered again, whole.
func TestLoadSplitBusyBetweenDecisionAndDrop(t *testing.T) {
	ctx := context.Background()
	for _, leased := range []bool{true, false} {
		name := "idle predicate false"
		if leased {
			name = "leased"
		}
		t.Run(name, func(t *testing.T) {
			sys, c := startSplit(t, nil)
			b := idleSplit(t, c, "llama", parts(70, 70))
			var lease cache.Lease[*blob]
			var drops atomic.Int32
			cache.SetDropHook(c, func() {
				if drops.Add(1) > 1 {
					return
				}
				if !leased {
					b.busy.Store(true)
					return
				}
				var err error
				lease, err = loadSplitBlob(ctx, c, "llama", parts(70, 70), nil) // a hit
				require.NoError(t, err)
			})
			_, _, err := sys.Admit(ctx, resvAt("kv", 60, gpu1))
			var busy *budget.ChargeBusyError
			require.ErrorAs(t, err, &busy)
			assert.True(t, busy.Refused)
			assert.Zero(t, b.closed.Load())

			_, _, err = sys.Admit(ctx, resvAt("kv", 60, gpu0))
			assert.Equal(t, int32(1), drops.Load(), "the cuda:0 part is no longer offered")
			var pe *system.PlanError
			require.ErrorAs(t, err, &pe, "nothing to evict")

			if leased {
				require.NoError(t, lease.Release())
			} else {
				b.busy.Store(false)
				l, err := loadSplitBlob(ctx, c, "llama", parts(70, 70), nil)
				require.NoError(t, err)
				require.NoError(t, l.Release()) // idle again: offered
			}
			sc, _, err := sys.Admit(ctx, resvAt("kv", 60, gpu0))
			require.NoError(t, err, "offered again, whole, once idle")
			assert.Equal(t, int32(1), b.closed.Load())
			waitReserved(t, sys, map[string]int64{gpu0: 60, gpu1: 0})
			require.NoError(t, sc.Exit(ctx))
		})
	}
}

// A loader that fails releases every part.
func TestLoadSplitFailedLoadReleasesEveryPart(t *testing.T) {
	ctx := context.Background()
	sys, c := startSplit(t, nil)
	boom := errors.New("boom")
	_, err := cache.LoadSplit(ctx, c, "llama", parts(50, 50), nil, func(context.Context) (*blob, error) {
		return nil, boom
	})
	var le *system.CacheLoadError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, boom)
	assert.Empty(t, c.Entries())
	r := reserved(t, sys)
	assert.Zero(t, r[gpu0])
	assert.Zero(t, r[gpu1])
}

func TestLoadSplitRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	sys, c := startSplit(t, nil)
	before := reserved(t, sys)
	var calls atomic.Int32
	loader := func(context.Context) (*blob, error) { calls.Add(1); return &blob{}, nil }
	cases := []struct {
		name   string
		key    string
		parts  []cache.Part
		loader func(context.Context) (*blob, error)
	}{
		{"no parts", "k", nil, loader},
		{"empty location", "k", []cache.Part{{Location: "", Bytes: 1}}, loader},
		{"malformed location", "k", []cache.Part{{Location: "gpu", Bytes: 1}}, loader},
		{"unknown location", "k", []cache.Part{{Location: "cuda:7", Bytes: 1}}, loader},
		{"location the cache may not use", "k", []cache.Part{{Location: gpu0, Bytes: 1}, {Location: gpu2, Bytes: 1}}, loader},
		{"location twice", "k", []cache.Part{{Location: gpu0, Bytes: 1}, {Location: gpu0, Bytes: 1}}, loader},
		{"zero bytes", "k", parts(10, 0), loader},
		{"negative bytes", "k", parts(-1, 10), loader},
		{"empty key", "", parts(10, 10), loader},
		{"nil loader", "k", parts(10, 10), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cache.LoadSplit(ctx, c, tc.key, tc.parts, nil, tc.loader)
			var ie *system.InvalidInputError
			require.ErrorAs(t, err, &ie)
		})
	}
	_, err := loadSplitBlob(ctx, c, "huge", parts(10, 101), &calls)
	var be *system.BudgetError
	require.ErrorAs(t, err, &be, "a part above its location's whole budget")
	assert.Equal(t, gpu1, be.Location)

	assert.Zero(t, calls.Load())
	assert.Empty(t, c.Entries())
	assert.Equal(t, before, reserved(t, sys), "nothing changed")
}

func TestNewRefusesBadLocations(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.Limit(gpu0, 100), system.Limit(gpu1, 100)}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sys.Close(ctx)) })
	for _, locs := range [][]string{{""}, {gpu0}, {gpu1, gpu1}} {
		_, err := cache.New(ctx, sys, cache.Options{Location: gpu0, Locations: locs, Name: "m"})
		var ie *system.InvalidInputError
		require.ErrorAs(t, err, &ie, "%q", locs)
	}
	_, err = cache.New(ctx, sys, cache.Options{Location: gpu0, Locations: []string{"cuda:5"}, Name: "m"})
	require.Error(t, err, "an unconfigured location")
	c, err := cache.New(ctx, sys, cache.Options{Location: gpu0, Locations: []string{gpu1}, Name: "m"})
	require.NoError(t, err, "the refusals left the name free")
	require.NoError(t, c.Close(ctx))
}

// Split loads, hits and releases race with admissions that evict the
// entry at either GPU: every value made is closed exactly once, and once
// the cache is closed nothing of it is charged anywhere.
func TestLoadSplitConcurrentWithAdmit(t *testing.T) {
	ctx := context.Background()
	sys, c := startSplit(t, nil)
	var mu sync.Mutex
	var made []*blob
	load := func() error {
		l, err := cache.LoadSplit(ctx, c, "llama", parts(60, 60), blobIdle, func(context.Context) (*blob, error) {
			b := &blob{}
			mu.Lock()
			made = append(made, b)
			mu.Unlock()
			return b, nil
		}, cache.Wait(system.WaitForRoom()))
		if err != nil {
			return err
		}
		return l.Release()
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 4 {
		wg.Go(func() {
			for range 20 {
				if err := load(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 20 {
			sc, _, err := sys.Admit(ctx, resvAt("kv", 60, []string{gpu0, gpu1}[i%2]), system.WaitForRoom())
			if err == nil {
				err = sc.Exit(ctx)
			}
			if err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, c.Close(ctx))
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, made)
	for i, b := range made {
		assert.Equal(t, int32(1), b.closed.Load(), "value %d", i)
	}
	waitReserved(t, sys, map[string]int64{gpu0: 0, gpu1: 0})
}
