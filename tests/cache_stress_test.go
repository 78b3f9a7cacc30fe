package tests

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// stressItem is a cached value of the cache stress test.
type stressItem struct {
	key    int
	closed atomic.Int32
	closes *atomic.Int64
}

func (v *stressItem) Close() error {
	if v.closed.Add(1) != 1 {
		return fmt.Errorf("value of key %d closed twice", v.key)
	}
	v.closes.Add(1)
	return nil
}

// The cache under load: 16 goroutines × 5,000 loads over 64 keys, 10% of
// the loader runs failing and 1% panicking, with explicit evictions and
// memory budget reservations mixed in, while another goroutine checks the
// ledger's invariants (budget never exceeded) on snapshot after snapshot.
// Checked: a key never has two loaders at once, and a loader never runs
// for a key while a lease of the key's previous value is held (a key is
// loaded at most once per residency); a leased value is never closed;
// after the cache's Close every value was closed exactly once and the
// location is back to zero bytes; after the runtime's Close no goroutine
// is left (goleak, TestMain).
func TestCacheStress(t *testing.T) {
	const (
		workers = 16
		keys    = 64
		budget  = 2000
	)
	loads := 5000
	if testing.Short() {
		loads = 500
	}
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", budget)}, TraceCapacity: 16})
	require.NoError(t, err)
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "stress"})
	require.NoError(t, err)

	peak := func(k int) int64 { return int64(40 + (k%8)*10) }
	resident := func(k int) int64 { return peak(k) - int64(k%3)*5 }

	var (
		loading    [keys]atomic.Int32 // loaders running per key
		held       [keys]atomic.Int32 // leases held by workers per key
		violations atomic.Int64
		loaderRuns atomic.Int64
		loadedOK   atomic.Int64
		failures   atomic.Int64
		panics     atomic.Int64
		closes     atomic.Int64
		busy       atomic.Int64
		hits       atomic.Int64
		evicts     atomic.Int64
		reserves   atomic.Int64
		snapshots  atomic.Int64
		mu         sync.Mutex
		problems   []string
	)
	problem := func(format string, args ...any) {
		violations.Add(1)
		mu.Lock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}

	stop := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Add(1)
	go func() {
		defer watcher.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := sys.Snapshot(ctx)
			if err != nil {
				problem("snapshot: %v", err)
				return
			}
			if err := checkInvariants(s); err != nil {
				problem("invariants: %v", err)
			}
			snapshots.Add(1)
		}
	}()

	began := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 8))
			for range loads {
				k := r.IntN(keys)
				key := fmt.Sprintf("k%02d", k)
				switch x := r.IntN(100); {
				case x == 0:
					if _, err := c.Evict(ctx, key); err != nil && !errors.Is(err, system.ErrBusy) {
						problem("evict %s: %v", key, err)
					}
					evicts.Add(1)
					continue
				case x <= 2:
					res, err := c.Budget().Reserve(ctx, 50)
					if err != nil {
						if !errors.Is(err, system.ErrBusy) {
							problem("reserve: %v", err)
						}
						continue
					}
					reserves.Add(1)
					if err := res.Release(); err != nil {
						problem("release reservation: %v", err)
					}
					continue
				}
				fail := r.IntN(100) < 10
				boom := !fail && r.IntN(100) < 1
				ran := false
				l, err := cache.Load(ctx, c, key, peak(k), func(*stressItem) bool { return true }, func(context.Context) (*stressItem, int64, error) {
					ran = true
					loaderRuns.Add(1)
					if loading[k].Add(1) != 1 {
						problem("key %s: two loaders at once", key)
					}
					defer loading[k].Add(-1)
					if n := held[k].Load(); n != 0 {
						problem("key %s loaded again while %d leases of its value are held", key, n)
					}
					switch {
					case fail:
						failures.Add(1)
						return nil, 0, errors.New("injected failure")
					case boom:
						panics.Add(1)
						panic("injected panic")
					}
					loadedOK.Add(1)
					return &stressItem{key: k, closes: &closes}, resident(k), nil
				})
				if err != nil {
					var le *system.CacheLoadError
					switch {
					case errors.Is(err, system.ErrBusy):
						busy.Add(1)
					case errors.As(err, &le):
					default:
						problem("load %s: %v", key, err)
					}
					continue
				}
				if !ran {
					hits.Add(1)
				}
				held[k].Add(1)
				v := l.Value()
				if v.key != k || v.closed.Load() != 0 || l.Bytes() != resident(k) {
					problem("key %s: lease on %+v (bytes %d), closed %d", key, v.key, l.Bytes(), v.closed.Load())
				}
				var pin *cache.Pin
				if r.IntN(10) == 0 {
					pin = l.Pin()
				}
				held[k].Add(-1)
				if err := l.Release(); err != nil {
					problem("release: %v", err)
				}
				if pin != nil {
					if err := pin.Release(); err != nil {
						problem("unpin: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	close(stop)
	watcher.Wait()

	st, err := c.Statistics(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
	s := snapshot(t, sys)
	l := loc(t, s, "cuda:0")
	assert.Zero(t, l.UsedBytes+l.ReservedBytes, "bytes left after the cache closed")
	assert.Empty(t, l.Reservations)
	assert.Equal(t, loadedOK.Load(), closes.Load(), "every loaded value closed exactly once")
	assert.Zero(t, violations.Load(), "%v", problems)
	t.Logf("%d workers × %d loads over %d keys in %v: %d hits, %d loader runs (%d failed, %d panicked), %d busy, %d evictions, %d explicit evict calls, %d budget reservations, %d snapshots checked, peak %d of %d bytes",
		workers, loads, keys, elapsed.Round(time.Millisecond), hits.Load(), loaderRuns.Load(), failures.Load(), panics.Load(), busy.Load(), st.Evictions, evicts.Load(), reserves.Load(), snapshots.Load(), l.PeakBytes, budget)
	require.NoError(t, sys.Close(ctx))
}
