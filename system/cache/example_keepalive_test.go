package cache_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sort"
	"sync"
	"time"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// manualClock is a cache.Clock that moves only when advanced (tests and
// examples never sleep). Advance runs the timers it passes.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	c    *manualClock
	at   time.Time
	f    func()
	done bool
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) cache.ClockTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*manualTimer
	for _, t := range c.timers {
		if !t.done && !t.at.After(c.now) {
			t.done = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		t.f()
	}
}

// startKeepExample starts a runtime with a 100-byte cuda:0 and a cache
// there with the given options.
func startKeepExample(opts cache.Options) (*system.System, *cache.Cache) {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"),
		system.Limit("cuda:0", 100),
	}}))
	if err != nil {
		log.Fatal(err)
	}
	opts.Location = "cuda:0"
	c, err := cache.New(ctx, sys, opts)
	if err != nil {
		log.Fatal(err)
	}
	return sys, c
}

func keys(c *cache.Cache) []string {
	var out []string
	for _, e := range c.Entries() {
		out = append(out, e.Key)
	}
	return out
}

func plain(name string, bytes int64) func(context.Context) (string, int64, error) {
	return func(context.Context) (string, int64, error) { return name, bytes, nil }
}

// An entry unloads five minutes after its last release, unless it is
// used again; the clock is a manual one so that the example does not wait.
func ExampleOptions_keepAlive() {
	ctx := context.Background()
	clock := &manualClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	sys, c := startKeepExample(cache.Options{KeepAlive: new(5 * time.Minute), Clock: clock})
	defer closeCacheExample(sys, c)

	l, _ := cache.Load(ctx, c, "m", 40, nil, plain("m", 40))
	_ = l.Release()
	e := c.Entries()[0]
	fmt.Println(e.Key, "expires at", e.Expiry.Format(time.TimeOnly))
	clock.Advance(4 * time.Minute)
	fmt.Println("after 4 min:", keys(c))
	clock.Advance(time.Minute)
	fmt.Println("after 5 min:", keys(c))
	st, _ := c.Statistics(ctx)
	fmt.Println("expirations:", st.Expirations)
	// Output:
	// m expires at 00:05:00
	// after 4 min: [m]
	// after 5 min: []
	// expirations: 1
}

// A request asks for a longer keep-alive than the cache's default.
func ExampleWithKeepAlive() {
	ctx := context.Background()
	clock := &manualClock{}
	sys, c := startKeepExample(cache.Options{KeepAlive: new(time.Minute), Clock: clock})
	defer closeCacheExample(sys, c)

	l, _ := cache.Load(ctx, c, "m", 40, nil, plain("m", 40), cache.WithKeepAlive(time.Hour))
	_ = l.Release()
	fmt.Println(c.Entries()[0].KeepAlive)
	clock.Advance(30 * time.Minute)
	fmt.Println(keys(c))
	// Output:
	// 1h0m0s
	// [m]
}

// A busy model is chosen as the victim and leaves when its request ends.
func ExampleCache_EvictWhenIdle() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	l, _ := cache.Load(ctx, c, "m", 50, nil, loadWeights("m", 50))
	done, found, _ := c.EvictWhenIdle(ctx, "m")
	fmt.Println("found:", found, "entries:", keys(c))
	_ = l.Release() // the request ends: m goes
	<-done
	fmt.Println("entries:", keys(c))
	// Output:
	// loading m
	// found: true entries: [m]
	// closing m
	// entries: []
}

func ExampleCache_EvictIdle() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	a, _ := cache.Load(ctx, c, "a", 20, nil, plain("a", 20))
	b, _ := cache.Load(ctx, c, "b", 20, nil, plain("b", 20))
	_ = a.Release() // b stays leased
	n, err := c.EvictIdle(ctx)
	fmt.Println(n, err, keys(c))
	_ = b.Release()
	// Output:
	// 1 <nil> [b]
}

func ExampleCache_Entries() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	b, _ := cache.Load(ctx, c, "b", 30, nil, plain("b", 30))
	pin := b.Pin()
	a, _ := cache.Load(ctx, c, "a", 20, nil, plain("a", 20))
	_ = a.Release()
	for _, e := range c.Entries() {
		keep := e.KeepAlive.String()
		if e.KeepAlive < 0 {
			keep = "forever"
		}
		fmt.Printf("%s %s %d bytes, %d leases, %d pins, keep-alive %s\n", e.Key, e.State, e.Bytes, e.Leases, e.Pins, keep)
	}
	_ = b.Release()
	_ = pin.Release()
	// Output:
	// a ready 20 bytes, 0 leases, 0 pins, keep-alive forever
	// b ready 30 bytes, 1 leases, 1 pins, keep-alive forever
}

// At most two models at once: a third evicts the least recently used idle
// one, or is refused while both are in use.
func ExampleOptions_maxEntries() {
	ctx := context.Background()
	sys, c := startKeepExample(cache.Options{MaxEntries: 2})
	defer closeCacheExample(sys, c)

	a, _ := cache.Load(ctx, c, "a", 10, nil, plain("a", 10))
	b, _ := cache.Load(ctx, c, "b", 10, nil, plain("b", 10))
	_, err := cache.Load(ctx, c, "c", 10, nil, plain("c", 10))
	var busy *system.CacheBusyError
	fmt.Println("both leased:", errors.As(err, &busy), busy.MaxEntries)
	_ = a.Release()
	l, err := cache.Load(ctx, c, "c", 10, nil, plain("c", 10))
	fmt.Println(err, keys(c))
	_ = l.Release()
	_ = b.Release()
	// Output:
	// both leased: true 2
	// <nil> [b c]
}
