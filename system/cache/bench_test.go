package cache_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// The cache hit path — a lease on a resident key and its release — with
// 1 and 8 callers, side by side with the usual Go baseline: a
// mutex-guarded map in front of a singleflight.Group. The baseline does
// less (no lease count, no recency order, no type check, no budget); the
// ratio is what those cost on a hit. cache-fixed-clock is the cache with
// a clock that never moves (the same work but for reading the time).
// Run with:
//
//	go test -run '^$' -bench 'CacheHit' -benchmem -count 5 ./system/cache/

const benchKeys = 64

var benchKeyNames = func() []string {
	out := make([]string, benchKeys)
	for i := range out {
		out[i] = fmt.Sprintf("model-%02d", i)
	}
	return out
}()

type benchModel struct{ id int }

// fixedClock is a clock that never moves and never fires: the cache's
// hit path without the cost of reading the time.
type fixedClock struct{}

var fixedTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (fixedClock) Now() time.Time { return fixedTime }
func (fixedClock) AfterFunc(time.Duration, func()) cache.ClockTimer {
	return stoppedTimer{}
}

type stoppedTimer struct{}

func (stoppedTimer) Stop() bool { return false }

func benchCache(b *testing.B, clock cache.Clock) (*system.System, *cache.Cache) {
	b.Helper()
	ctx := context.Background()
	sys, err := startSoft(b, ctx, system.Options{Locations: []system.LocationConfig{system.Limit("cuda:0", 1<<30)}})
	if err != nil {
		b.Fatal(err)
	}
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	for i, k := range benchKeyNames {
		l, err := cache.Load(ctx, c, k, 1<<20, nil, func(context.Context) (*benchModel, int64, error) { return &benchModel{id: i}, 1 << 20, nil })
		if err != nil {
			b.Fatal(err)
		}
		_ = l.Release()
	}
	return sys, c
}

// baseline is the singleflight + mutex-guarded map cache.
type baseline struct {
	mu sync.Mutex
	m  map[string]*benchModel
	sf singleflight.Group
}

func (c *baseline) get(key string, load func() (*benchModel, error)) (*benchModel, error) {
	c.mu.Lock()
	v, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	r, err, _ := c.sf.Do(key, func() (any, error) {
		v, err := load()
		if err == nil {
			c.mu.Lock()
			c.m[key] = v
			c.mu.Unlock()
		}
		return v, err
	})
	if err != nil {
		return nil, err
	}
	return r.(*benchModel), nil
}

func newBaseline(b *testing.B) *baseline {
	c := &baseline{m: map[string]*benchModel{}}
	for i, k := range benchKeyNames {
		if _, err := c.get(k, func() (*benchModel, error) { return &benchModel{id: i}, nil }); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// callers runs body with n goroutines in total (RunParallel's parallelism
// is per GOMAXPROCS), each with its own key sequence.
func callers(b *testing.B, n int, body func(i int)) {
	if n == 1 {
		for i := 0; b.Loop(); i++ {
			body(i)
		}
	} else {
		p := max(1, n/runtime.GOMAXPROCS(0))
		b.SetParallelism(p)
		var seq atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(1)) * 17
			for pb.Next() {
				body(i)
				i++
			}
		})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func BenchmarkCacheHit(b *testing.B) {
	for _, n := range []int{1, 8} {
		// The baseline first, then the cache in the same run: the cache's
		// x-singleflight is the baseline's ns/op over its own (1 = as
		// fast; the target is ≥ 0.5).
		var base float64
		b.Run(fmt.Sprintf("singleflight+map/callers=%d", n), func(b *testing.B) {
			c := newBaseline(b)
			miss := func() (*benchModel, error) { panic("a hit ran the loader") }
			b.ResetTimer()
			callers(b, n, func(i int) {
				v, err := c.get(benchKeyNames[i%benchKeys], miss)
				if err != nil || v == nil {
					b.Error("miss")
				}
			})
			base = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
		b.Run(fmt.Sprintf("cache/callers=%d", n), func(b *testing.B) { benchHits(b, n, nil, base) })
		// The same with a clock that never moves: what the rest of the
		// path costs without the two reads of the time (the entry's last
		// use on the hit, its keep-alive on the release).
		b.Run(fmt.Sprintf("cache-fixed-clock/callers=%d", n), func(b *testing.B) { benchHits(b, n, fixedClock{}, base) })
	}
}

// benchHits is one cache hit sub-benchmark: n callers lease and release
// resident keys; base is the baseline's ns/op of the same run.
func benchHits(b *testing.B, n int, clock cache.Clock, base float64) {
	sys, c := benchCache(b, clock)
	ctx := context.Background()
	miss := func(context.Context) (*benchModel, int64, error) { panic("a hit ran the loader") }
	b.ResetTimer()
	callers(b, n, func(i int) {
		l, err := cache.Load(ctx, c, benchKeyNames[i%benchKeys], 1<<20, nil, miss)
		if err != nil {
			b.Error(err)
			return
		}
		if l.Value() == nil {
			b.Error("nil value")
		}
		_ = l.Release()
	})
	b.StopTimer()
	if base > 0 {
		b.ReportMetric(base/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "x-singleflight")
	}
	_ = c.Close(ctx)
	_ = sys.Close(ctx)
}
