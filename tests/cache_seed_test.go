package tests

// Go twins of the tests of seed 001 (the byte-budgeted loader cache): the
// same scenarios and assertions, on a runtime whose cuda:0 budget plays the
// seed's ceiling. Go has no destructors, so where the seed drops a guard
// the twin releases it explicitly, and a value's drop is its Close.

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// seedCache starts a runtime whose cuda:0 has budget bytes and opens a
// cache there; both close when the test ends (cache first).
func seedCache(t *testing.T, budget int64) (*system.System, *cache.Cache) {
	t.Helper()
	sys := start(t, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", budget)}})
	c, err := cache.New(context.Background(), sys, cache.Options{Location: "cuda:0", Name: "seed"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return sys, c
}

func stats(t *testing.T, c *cache.Cache) cache.Stats {
	t.Helper()
	s, err := c.Statistics(context.Background())
	require.NoError(t, err)
	return s
}

func reservedBytes(t *testing.T, b *cache.MemoryBudget) int64 {
	t.Helper()
	n, err := b.ReservedBytes(context.Background())
	require.NoError(t, err)
	return n
}

func always[T any](T) bool { return true }

// unreachable is a loader that must not run (the key is resident).
func unreachable[T any](t *testing.T) func(context.Context) (T, int64, error) {
	return func(context.Context) (T, int64, error) {
		t.Error("the loader of a resident key ran")
		var zero T
		return zero, 0, errors.New("unreachable")
	}
}

func value[T any](v T, bytes int64) func(context.Context) (T, int64, error) {
	return func(context.Context) (T, int64, error) { return v, bytes, nil }
}

// budgetedModel owns its allocations' reservations; closing it releases
// them (the seed's Mutex<Vec<MemoryReservation>> dropped).
type budgetedModel struct {
	mu     sync.Mutex
	res    []*cache.MemoryReservation
	closed *atomic.Bool // set by Close (nil: not watched)
}

func (m *budgetedModel) add(r *cache.MemoryReservation) {
	m.mu.Lock()
	m.res = append(m.res, r)
	m.mu.Unlock()
}

func (m *budgetedModel) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var first error
	for _, r := range m.res {
		if err := r.Release(); err != nil && first == nil {
			first = err
		}
	}
	m.res = nil
	if m.closed != nil {
		m.closed.Store(true)
	}
	return first
}

func TestBudgetedUnitsGrowWithoutDoubleChargingAndEvictOnlyWhenIdle(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	b := c.Budget()
	model, err := cache.LoadBudgeted(ctx, c, "model", always[*budgetedModel], func(ctx context.Context, b *cache.MemoryBudget) (*budgetedModel, error) {
		r, err := b.Reserve(ctx, 40)
		if err != nil {
			return nil, err
		}
		return &budgetedModel{res: []*cache.MemoryReservation{r}}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, int64(0), model.Bytes())
	grown, err := b.Reserve(ctx, 50)
	require.NoError(t, err)
	model.Value().add(grown)
	assert.Equal(t, int64(90), reservedBytes(t, b))
	_, err = c.Evict(ctx, "model")
	assert.Error(t, err)
	pin := model.Pin()
	require.NoError(t, model.Release())
	_, err = b.Reserve(ctx, 11)
	assert.Error(t, err)
	require.NoError(t, pin.Release())
	other, err := b.Reserve(ctx, 100)
	require.NoError(t, err)
	assert.Equal(t, 0, stats(t, c).Resources)
	require.NoError(t, other.Release())
	assert.Equal(t, int64(0), reservedBytes(t, b))
	evicted, err := c.Evict(ctx, "model")
	require.NoError(t, err)
	assert.False(t, evicted)
}

func TestBudgetedLoaderFailureAndPanicReleaseAllocationsAndAllowRetry(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: []system.LocationConfig{system.Limit("cuda:0", 64)}})
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0"})
	require.NoError(t, err)
	for _, panics := range []bool{false, true} {
		_, err := cache.LoadBudgeted(ctx, c, "model", always[*cache.MemoryReservation], func(ctx context.Context, b *cache.MemoryBudget) (*cache.MemoryReservation, error) {
			held, err := b.Reserve(ctx, 64)
			if err != nil {
				return nil, err
			}
			defer held.Release()
			if panics {
				panic("injected loader panic")
			}
			return nil, errors.New("injected loader failure")
		})
		assert.Error(t, err)
		var le *system.CacheLoadError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, panics, le.Panic != nil)
		assert.Equal(t, int64(0), stats(t, c).ReservedBytes)
		assert.Equal(t, 0, stats(t, c).Resources)
	}
	model, err := cache.LoadBudgeted(ctx, c, "model", always[*cache.MemoryReservation], func(ctx context.Context, b *cache.MemoryBudget) (*cache.MemoryReservation, error) {
		return b.Reserve(ctx, 64)
	})
	require.NoError(t, err)
	require.NoError(t, model.Release())
	evicted, err := c.Evict(ctx, "model")
	require.NoError(t, err)
	assert.True(t, evicted)
	assert.Equal(t, int64(0), stats(t, c).ReservedBytes)
	assert.NotNil(t, c.Budget().Cache())
	b := c.Budget()
	require.NoError(t, c.Close(ctx))
	assert.Nil(t, b.Cache())
}

func TestAllocationsAndLoadersShareACeilingAndIdleEviction(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	b := c.Budget()
	scratch, err := b.Reserve(ctx, 40)
	require.NoError(t, err)
	model, err := cache.Load(ctx, c, "model", 60, always[uint8], value[uint8](1, 50))
	require.NoError(t, err)
	assert.Equal(t, int64(90), reservedBytes(t, b))
	_, err = b.Reserve(ctx, 11)
	assert.ErrorIs(t, err, system.ErrBusy)
	require.NoError(t, model.Release())
	staging, err := b.Reserve(ctx, 60)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), stats(t, c).Evictions)
	assert.Equal(t, int64(100), stats(t, c).ReservedBytes)
	_, err = cache.Load(ctx, c, "other", 1, always[uint8], value[uint8](2, 1))
	assert.Error(t, err)
	require.NoError(t, staging.Release())
	require.NoError(t, scratch.Release())
	assert.Equal(t, int64(0), reservedBytes(t, b))
	_, err = b.Reserve(ctx, 101)
	assert.Error(t, err)
	zero, err := b.Reserve(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(0), zero.Bytes())
}

func TestBudgetOwnersDoNotCycleAndSurviveRegistryTeardown(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: []system.LocationConfig{system.Limit("cuda:0", 64)}})
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0"})
	require.NoError(t, err)
	registry := weak.Make(c)
	b := c.Budget()
	scratch, err := b.Reserve(ctx, 16)
	require.NoError(t, err)
	func() { // the lease, like the seed's temporary, is gone after this
		owner, err := cache.Load(ctx, c, "owner", 32, always[*cache.MemoryBudget], func(context.Context) (*cache.MemoryBudget, int64, error) {
			return b, 32, nil
		})
		require.NoError(t, err)
		require.NoError(t, owner.Release())
	}()
	assert.Equal(t, int64(48), reservedBytes(t, b))
	require.NoError(t, c.Close(ctx))
	c = nil
	runtime.GC()
	assert.Nil(t, registry.Value(), "the budget (held by a cached value) must not keep the cache alive")
	assert.Nil(t, b.Cache())
	assert.Equal(t, int64(16), reservedBytes(t, b))
	tail, err := b.Reserve(ctx, 48)
	require.NoError(t, err)
	_, err = b.Reserve(ctx, 1)
	assert.Error(t, err)
	require.NoError(t, scratch.Release())
	require.NoError(t, tail.Release())
	assert.Equal(t, int64(0), reservedBytes(t, b))
}

func TestConcurrentReservationsCannotOversubscribe(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 64)
	b := c.Budget()
	var reserved, checked, done sync.WaitGroup
	reserved.Add(8)
	checked.Add(8)
	done.Add(8)
	for range 8 {
		go func() {
			defer done.Done()
			held, err := b.Reserve(ctx, 8)
			reserved.Done()
			if !assert.NoError(t, err) {
				checked.Done()
				return
			}
			reserved.Wait()
			n, err := b.ReservedBytes(ctx)
			assert.NoError(t, err)
			assert.Equal(t, int64(64), n)
			_, err = b.Reserve(ctx, 1)
			assert.Error(t, err)
			checked.Done()
			checked.Wait()
			assert.NoError(t, held.Release())
		}()
	}
	done.Wait()
	assert.Equal(t, int64(0), reservedBytes(t, b))
}

// retiring is native storage whose release blocks until the test lets it
// finish (the seed's Drop that waits on a channel).
type retiring struct {
	started chan<- struct{}
	release <-chan struct{}
}

func (r *retiring) Close() error {
	r.started <- struct{}{}
	<-r.release
	return nil
}

func TestRetiringNativeStorageRemainsChargedUntilItsDestructorFinishes(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 64)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	old, err := cache.Load(ctx, c, "old", 64, always[*retiring], value(&retiring{started: started, release: release}, 64))
	require.NoError(t, err)
	require.NoError(t, old.Release())

	type result struct {
		lease cache.Lease[uint8]
		err   error
	}
	loading := make(chan result, 1)
	go func() {
		l, err := cache.Load(ctx, c, "new", 64, always[uint8], value[uint8](1, 64))
		loading <- result{l, err}
	}()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the old value's release never started")
	}
	assert.Equal(t, int64(64), stats(t, c).ReservedBytes)
	_, err = cache.Load(ctx, c, "other", 1, always[uint8], value[uint8](2, 1))
	assert.ErrorIs(t, err, system.ErrBusy)
	close(release)
	r := <-loading
	require.NoError(t, r.err)
	assert.Equal(t, uint8(1), r.lease.Value())
	require.NoError(t, r.lease.Release())
}

func TestLeasesPinsAndExportedWorkPreventEviction(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	model, err := cache.Load(ctx, c, "one", 70, func(v *atomic.Int64) bool { return v.Load() == 0 }, value(new(atomic.Int64), 60))
	require.NoError(t, err)
	pin := model.Pin()
	require.NoError(t, model.Release())
	_, err = cache.Load(ctx, c, "two", 50, always[uint8], value[uint8](2, 50))
	assert.ErrorIs(t, err, system.ErrBusy)
	require.NoError(t, pin.Release())
	model, err = cache.Load(ctx, c, "one", 70, always[*atomic.Int64], unreachable[*atomic.Int64](t))
	require.NoError(t, err)
	model.Value().Store(1)
	require.NoError(t, model.Release())
	_, err = cache.Load(ctx, c, "two", 50, always[uint8], value[uint8](2, 50))
	assert.ErrorIs(t, err, system.ErrBusy)
	again, err := cache.Load(ctx, c, "one", 70, always[*atomic.Int64], unreachable[*atomic.Int64](t))
	require.NoError(t, err)
	again.Value().Store(0)
	require.NoError(t, again.Release())
	second, err := cache.Load(ctx, c, "two", 50, always[uint8], value[uint8](2, 50))
	require.NoError(t, err)
	assert.Equal(t, uint8(2), second.Value())
	assert.Equal(t, uint64(1), stats(t, c).Evictions)
	assert.Equal(t, int64(50), stats(t, c).ReservedBytes)
	require.NoError(t, second.Release())
}

func TestFailedLoadsRollbackAndConcurrentLoadsShareOneReservation(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 64)
	_, err := cache.Load(ctx, c, "a", 64, always[int], func(context.Context) (int, int64, error) {
		return 0, 0, errors.New("injected")
	})
	assert.Error(t, err)
	assert.Equal(t, int64(0), stats(t, c).ReservedBytes)
	_, err = cache.Load(ctx, c, "a", 64, always[int], value(1, 65))
	assert.Error(t, err)

	var ready, done sync.WaitGroup
	ready.Add(8)
	done.Add(8)
	startLine := make(chan struct{})
	var calls atomic.Int64
	for range 8 {
		go func() {
			defer done.Done()
			ready.Done()
			<-startLine
			l, err := cache.Load(ctx, c, "a", 64, always[int], func(context.Context) (int, int64, error) {
				calls.Add(1)
				return 9, 32, nil
			})
			if assert.NoError(t, err) {
				assert.Equal(t, 9, l.Value())
				assert.NoError(t, l.Release())
			}
		}()
	}
	ready.Wait()
	close(startLine)
	done.Wait()
	assert.Equal(t, int64(1), calls.Load())
	assert.Equal(t, int64(32), stats(t, c).ReservedBytes)
	_, err = cache.Load(ctx, c, "a", 64, always[uint8], unreachable[uint8](t))
	assert.Error(t, err)
}
