package cache_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// weights stands for model weights the application loads itself. Its
// Close is the release hook: the cache keeps the charge until it returns.
type weights struct {
	name  string
	queue atomic.Int64 // device work queued on these weights
}

func (w *weights) Close() error {
	fmt.Println("closing", w.name)
	return nil
}

// idleWeights: evictable only when no device work is queued.
func idleWeights(w *weights) bool { return w.queue.Load() == 0 }

func loadWeights(name string, resident int64) func(context.Context) (*weights, int64, error) {
	return func(context.Context) (*weights, int64, error) {
		fmt.Println("loading", name)
		return &weights{name: name}, resident, nil
	}
}

// startCacheExample starts a runtime with a 100-byte cuda:0 and a cache
// there.
func startCacheExample() (*system.System, *cache.Cache) {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"),
		system.Limit("cuda:0", 100),
	}}))
	if err != nil {
		log.Fatal(err)
	}
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "models"})
	if err != nil {
		log.Fatal(err)
	}
	return sys, c
}

func closeCacheExample(sys *system.System, c *cache.Cache) {
	ctx := context.Background()
	if err := c.Close(ctx); err != nil {
		log.Fatal(err)
	}
	if err := sys.Close(ctx); err != nil {
		log.Fatal(err)
	}
}

func ExampleNew() {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{Locations: []system.LocationConfig{system.Limit("cuda:0", 1<<30)}}))
	if err != nil {
		log.Fatal(err)
	}
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "models"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Location())
	_, err = cache.New(ctx, sys, cache.Options{Location: "cuda:7"})
	var ue *system.UnavailableError
	fmt.Println(errors.As(err, &ue))
	closeCacheExample(sys, c)
	// Output:
	// cuda:0
	// true
}

func ExampleLoad() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	// Reserve 60 bytes while loading; 50 stay resident.
	l, err := cache.Load(ctx, c, "llama/q4/cuda:0", 60, idleWeights, loadWeights("llama", 50))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Value().name, l.Bytes())
	// A second Load of the key is a hit: the loader does not run.
	again, err := cache.Load(ctx, c, "llama/q4/cuda:0", 60, idleWeights, loadWeights("llama", 50))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(again.Value() == l.Value())
	_ = again.Release()
	_ = l.Release()

	snap, _ := sys.Snapshot(ctx)
	loc, _ := snap.Location("cuda:0")
	fmt.Println(loc.ReservedBytes, loc.Reservations[0].Owner == c.Owner())
	// Output:
	// loading llama
	// llama 50
	// true
	// 50 true
	// closing llama
}

func ExampleLoad_eviction() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	a, _ := cache.Load(ctx, c, "a", 60, idleWeights, loadWeights("a", 60))
	// While a is leased there is no room for b and nothing to evict.
	_, err := cache.Load(ctx, c, "b", 60, idleWeights, loadWeights("b", 60))
	fmt.Println(errors.Is(err, system.ErrBusy))
	_ = a.Release()
	// Idle and unleased, a is evicted for b (after its Close returned).
	b, err := cache.Load(ctx, c, "b", 60, idleWeights, loadWeights("b", 60))
	if err != nil {
		log.Fatal(err)
	}
	_ = b.Release()
	st, _ := c.Statistics(ctx)
	fmt.Println(st.Evictions, st.ReservedBytes)
	// Output:
	// loading a
	// true
	// closing a
	// loading b
	// 1 60
	// closing b
}

func ExampleLoadBudgeted() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	// A budgeted value charges each of its allocations itself; its Close
	// (here the reservation's own) releases them.
	l, err := cache.LoadBudgeted(ctx, c, "kv-cache", nil, func(ctx context.Context, b *cache.MemoryBudget) (*cache.MemoryReservation, error) {
		return b.Reserve(ctx, 40)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Bytes(), l.Value().Bytes())
	// It may grow while leased.
	if err := l.Value().Resize(ctx, 70); err != nil {
		log.Fatal(err)
	}
	_ = l.Release()
	n, _ := c.Budget().ReservedBytes(ctx)
	fmt.Println(n)
	// Output:
	// 0 40
	// 70
}

func ExampleLease_Pin() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	l, _ := cache.Load(ctx, c, "corpus", 80, nil, loadWeights("corpus", 80))
	pin := l.Pin()
	_ = l.Release()
	_, err := c.Evict(ctx, "corpus")
	fmt.Println(errors.Is(err, system.ErrBusy))
	_ = pin.Release()
	ok, err := c.Evict(ctx, "corpus")
	fmt.Println(ok, err)
	// Output:
	// loading corpus
	// true
	// closing corpus
	// true <nil>
}

func ExampleLease_KeepAlive() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	l, _ := cache.Load(ctx, c, "m", 50, idleWeights, loadWeights("m", 50))
	keep := l.KeepAlive() // e.g. held by an output that aliases the weights
	clone := l.Clone()    // another request's lease
	_ = l.Release()
	_ = clone.Release()
	_, err := c.Evict(ctx, "m")
	fmt.Println(errors.Is(err, system.ErrBusy))
	_ = keep.Release()
	// Queued device work keeps it busy too, with no reference left.
	l, _ = cache.Load(ctx, c, "m", 50, idleWeights, loadWeights("m", 50))
	l.Value().queue.Add(1)
	_ = l.Release()
	_, err = c.Evict(ctx, "m")
	fmt.Println(errors.Is(err, system.ErrBusy))
	// Output:
	// loading m
	// true
	// true
	// closing m
}

func ExampleCache_Evict() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	l, _ := cache.Load(ctx, c, "m", 50, nil, loadWeights("m", 50))
	_, err := c.Evict(ctx, "m")
	fmt.Println("leased:", errors.Is(err, system.ErrBusy))
	_ = l.Release()
	ok, err := c.Evict(ctx, "m")
	fmt.Println("idle:", ok, err)
	ok, err = c.Evict(ctx, "m")
	fmt.Println("absent:", ok, err)
	// Output:
	// loading m
	// leased: true
	// closing m
	// idle: true <nil>
	// absent: false <nil>
}

func ExampleCache_Budget() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	b := c.Budget()
	scratch, _ := b.Reserve(ctx, 40)
	l, _ := cache.Load(ctx, c, "m", 60, nil, loadWeights("m", 50))
	n, _ := b.ReservedBytes(ctx)
	fmt.Println(n)
	_ = l.Release()
	// A reservation may evict idle entries, never another reservation.
	staging, err := b.Reserve(ctx, 60)
	fmt.Println(err)
	_, err = b.Reserve(ctx, 1)
	fmt.Println(errors.Is(err, system.ErrBusy))
	_ = staging.Release()
	_ = scratch.Release()
	// Output:
	// loading m
	// 90
	// closing m
	// <nil>
	// true
}

func ExampleMemoryBudget_Reserve() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	r, err := c.Budget().Reserve(ctx, 64)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Bytes())
	_ = r.Release()
	// More than the whole budget can never fit: a BudgetError at once.
	_, err = c.Budget().Reserve(ctx, 101)
	var be *system.BudgetError
	fmt.Println(errors.As(err, &be), be.BudgetBytes)
	// Output:
	// 64
	// true 100
}

func ExampleMemoryBudget_Cache() {
	ctx := context.Background()
	sys, c := startCacheExample()
	b := c.Budget()
	fmt.Println(b.Cache() == c)
	r, _ := b.Reserve(ctx, 30)
	_ = c.Close(ctx)
	// The cache is gone; its budget's ceiling is not.
	fmt.Println(b.Cache() == nil)
	_, err := b.Reserve(ctx, 71)
	fmt.Println(errors.Is(err, system.ErrBusy))
	_ = r.Release()
	_ = sys.Close(ctx)
	// Output:
	// true
	// true
	// true
}

func ExampleMemoryReservation_Resize() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	ws, _ := c.Budget().Reserve(ctx, 10)
	if err := ws.Resize(ctx, 30); err != nil { // the workspace grows
		log.Fatal(err)
	}
	n, _ := c.Budget().ReservedBytes(ctx)
	fmt.Println(ws.Bytes(), n)
	_ = ws.Release()
	// Output:
	// 30 30
}

func ExampleCache_Statistics() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	l, _ := cache.Load(ctx, c, "m", 60, nil, loadWeights("m", 45))
	_ = l.Release()
	st, err := c.Statistics(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("budget %d, reserved %d, resources %d, evictions %d\n", st.BudgetBytes, st.ReservedBytes, st.Resources, st.Evictions)
	// Output:
	// loading m
	// budget 100, reserved 45, resources 1, evictions 0
	// closing m
}

func ExampleCache_Close() {
	ctx := context.Background()
	sys, c := startCacheExample()
	idle, _ := cache.Load(ctx, c, "idle", 30, nil, loadWeights("idle", 30))
	_ = idle.Release()
	held, _ := cache.Load(ctx, c, "held", 30, nil, loadWeights("held", 30))

	fmt.Println("close")
	_ = c.Close(ctx) // closes idle now; held when its last lease goes
	_, err := cache.Load(ctx, c, "x", 1, nil, loadWeights("x", 1))
	fmt.Println(errors.Is(err, system.ErrClosed))
	fmt.Println("release")
	_ = held.Release()
	_ = sys.Close(ctx)
	// Output:
	// loading idle
	// loading held
	// close
	// closing idle
	// true
	// release
	// closing held
}

func ExampleLoad_loaderFailed() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	_, err := cache.Load(ctx, c, "m", 60, nil, func(context.Context) (*weights, int64, error) {
		panic("corrupt file")
	})
	var le *system.CacheLoadError
	fmt.Println(errors.As(err, &le), le.Key, le.Panic)
	// Rolled back: nothing charged, and the next Load tries again.
	st, _ := c.Statistics(ctx)
	fmt.Println(st.ReservedBytes, st.Resources)
	l, err := cache.Load(ctx, c, "m", 60, nil, loadWeights("m", 60))
	fmt.Println(err)
	_ = l.Release()
	// Output:
	// true m corrupt file
	// 0 0
	// loading m
	// <nil>
	// closing m
}

func ExampleLoad_busy() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)

	l, _ := cache.Load(ctx, c, "big", 90, nil, loadWeights("big", 90))
	_, err := cache.Load(ctx, c, "small", 20, nil, loadWeights("small", 20))
	var busy *system.CacheBusyError
	if errors.As(err, &busy) {
		fmt.Println(busy.Key, busy.Refusal.RequestedBytes, busy.Refusal.ReservedBytes)
	}
	_ = l.Release()
	// Output:
	// loading big
	// small 20 90
	// closing big
}

// A load with Wait(system.WaitForRoom()) waits in the runtime's queue
// while every entry is leased; the release of a lease lets it evict the
// idle entry and load.
func ExampleWait() {
	ctx := context.Background()
	sys, c := startCacheExample()
	defer closeCacheExample(sys, c)
	bytes := func(n int64) func(context.Context) ([]byte, int64, error) {
		return func(context.Context) ([]byte, int64, error) { return make([]byte, n), n, nil }
	}
	a, err := cache.Load(ctx, c, "model-a", 60, nil, bytes(60))
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error)
	go func() {
		b, err := cache.Load(ctx, c, "model-b", 60, nil, bytes(60), cache.Wait(system.WaitForRoom()))
		if err == nil {
			fmt.Println("model-b loaded")
			err = b.Release()
		}
		done <- err
	}()
	fmt.Println("model-a released")
	if err := a.Release(); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// model-a released
	// model-b loaded
}
