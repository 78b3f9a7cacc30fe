package tests

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

func version(t *testing.T, sys *system.System) uint64 {
	t.Helper()
	v, err := sys.StateVersion(context.Background())
	require.NoError(t, err)
	return v
}

// The cache's charges are reservations owned by the cache at its location:
// snapshots list them, the trace records them, and each costs the
// versions budget/doc_cache.go states.
func TestCacheChargesAreOwnedReservationsWithTheirVersions(t *testing.T) {
	ctx := context.Background()
	sys, c := seedCache(t, 100)
	v0 := version(t, sys)

	a, err := cache.Load(ctx, c, "a", 40, nil, value("A", 30))
	require.NoError(t, err)
	assert.Equal(t, v0+2, version(t, sys), "reserve the peak, shrink to the resident bytes")
	s := snapshot(t, sys)
	r := loc(t, s, "cuda:0").Reservations
	require.Len(t, r, 1)
	assert.Equal(t, c.Owner(), r[0].Owner)
	assert.Equal(t, int64(30), r[0].Bytes)
	tr, err := sys.Trace(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"reserve", "resize"}, []string{tr[len(tr)-2].Kind, tr[len(tr)-1].Kind})

	// A user cannot release a cache's charge, and is told whose it is.
	err = sys.Unreserve(ctx, r[0].Name)
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	assert.ErrorContains(t, err, "is a charge of "+c.Owner()+"; only the cache releases it")

	lb, err := cache.Load(ctx, c, "b", 20, nil, value("B", 20))
	require.NoError(t, err)
	require.NoError(t, lb.Release())
	assert.Equal(t, v0+4, version(t, sys), "resident bytes equal to the peak: no shrink; the release offers the idle entry")

	hit, err := cache.Load(ctx, c, "a", 40, nil, unreachable[string](t))
	require.NoError(t, err)
	assert.Equal(t, "A", hit.Value())
	assert.Equal(t, v0+4, version(t, sys), "a hit on an entry that is not offered changes nothing in the ledger")

	_, err = cache.Load(ctx, c, "f", 10, nil, func(context.Context) (string, int64, error) { return "", 0, errors.New("no") })
	var le *system.CacheLoadError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "f", le.Key)
	assert.Equal(t, v0+6, version(t, sys), "a failed load: reservation and release")

	_, err = c.Statistics(ctx)
	require.NoError(t, err)
	assert.Equal(t, v0+6, version(t, sys), "statistics are a read")

	evicted, err := c.Evict(ctx, "b")
	require.NoError(t, err)
	assert.True(t, evicted)
	assert.Equal(t, v0+7, version(t, sys), "an eviction releases one charge")

	res, err := c.Budget().Reserve(ctx, 5)
	require.NoError(t, err)
	require.NoError(t, res.Resize(ctx, 8))
	require.NoError(t, res.Release())
	zero, err := c.Budget().Reserve(ctx, 0)
	require.NoError(t, err)
	require.NoError(t, zero.Release())
	assert.Equal(t, v0+10, version(t, sys), "reserve, resize, release; a zero-byte reservation is not recorded")

	require.NoError(t, hit.Release())
	require.NoError(t, a.Release())
	assert.ErrorIs(t, a.Release(), system.ErrInvalidInput, "released twice")
}

// The cache shares its location's budget with every other charge there:
// materializations count against its loads, and its entries against them.
func TestCacheSharesItsLocationBudgetWithMaterializations(t *testing.T) {
	ctx := context.Background()
	sys, c := seedCache(t, 100)
	h := register(t, sys, system.Value{Name: "w", Bytes: 60, At: "cuda:0"})
	_, err := cache.Load(ctx, c, "a", 50, nil, value(1, 50))
	var busy *system.CacheBusyError
	require.ErrorAs(t, err, &busy, "the cache has nothing to evict for the materialization's bytes")
	assert.Equal(t, "a", busy.Key)
	assert.Equal(t, int64(60), busy.Refusal.UsedBytes)
	var be *system.BudgetError
	assert.False(t, errors.As(err, &be), "busy is never a BudgetError")

	require.NoError(t, sys.Discard(ctx, h))
	a, err := cache.Load(ctx, c, "a", 50, nil, value(1, 50))
	require.NoError(t, err)
	require.NoError(t, a.Release())
	_, err = sys.Register(ctx, system.Value{Name: "x", Bytes: 60, At: "cuda:0"})
	require.ErrorAs(t, err, &be, "the cache's entry counts for a placement")
	assert.Equal(t, int64(50), be.ReservedBytes)

	// A peak larger than the whole budget never fits: a BudgetError, nothing evicted.
	_, err = cache.Load(ctx, c, "huge", 101, nil, value(1, 1))
	require.ErrorAs(t, err, &be)
	assert.Equal(t, uint64(0), stats(t, c).Evictions)
	assert.Equal(t, 1, stats(t, c).Resources)
}

// One caller giving up does not cancel a load others wait for; the loader
// runs once and the others get its value.
func TestCacheCallerGivingUpLeavesTheSharedLoadToOthers(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	gate := make(chan struct{})
	entered := make(chan struct{})
	var runs atomic.Int32
	var loaderCanceled atomic.Bool
	loader := func(lctx context.Context) (int, int64, error) {
		runs.Add(1)
		close(entered)
		<-gate
		loaderCanceled.Store(lctx.Err() != nil)
		return 7, 10, nil
	}
	actx, cancel := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() {
		_, err := cache.Load(actx, c, "k", 10, nil, loader)
		aDone <- err
	}()
	<-entered
	type res struct {
		l   cache.Lease[int]
		err error
	}
	bDone := make(chan res, 1)
	bStarted := make(chan struct{})
	go func() {
		close(bStarted)
		l, err := cache.Load(ctx, c, "k", 10, nil, loader)
		bDone <- res{l, err}
	}()
	<-bStarted
	cancel()
	assert.ErrorIs(t, <-aDone, context.Canceled)
	close(gate)
	b := <-bDone
	require.NoError(t, b.err)
	assert.Equal(t, 7, b.l.Value())
	assert.Equal(t, int32(1), runs.Load())
	assert.False(t, loaderCanceled.Load(), "the load's context survived one caller giving up")
	require.NoError(t, b.l.Release())
}

// A load that every caller gave up on is canceled and rolled back; the
// next Load waits for it to settle and loads afresh.
func TestCacheLoadNobodyWaitsForIsCanceledAndRetried(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	entered := make(chan struct{})
	actx, cancel := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() {
		_, err := cache.Load(actx, c, "k", 10, nil, func(lctx context.Context) (int, int64, error) {
			close(entered)
			<-lctx.Done() // canceled once nobody waits
			return 0, 0, lctx.Err()
		})
		aDone <- err
	}()
	<-entered
	cancel()
	assert.ErrorIs(t, <-aDone, context.Canceled)
	l, err := cache.Load(ctx, c, "k", 10, nil, value(2, 10))
	require.NoError(t, err)
	assert.Equal(t, 2, l.Value())
	assert.Equal(t, int64(10), stats(t, c).ReservedBytes, "the abandoned load's reservation was released")
	require.NoError(t, l.Release())
}

// blocking is a value whose Close waits for the test.
type blocking struct {
	started chan struct{}
	gate    chan struct{}
}

func (b *blocking) Close() error {
	close(b.started)
	<-b.gate
	return nil
}

// A slow release runs outside the cache's lock: hits on other keys,
// statistics and other loads go on while it runs, and its charge stays
// until it returns.
func TestCacheSlowReleaseDoesNotBlockUnrelatedLookups(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	slow := &blocking{started: make(chan struct{}), gate: make(chan struct{})}
	l, err := cache.Load(ctx, c, "slow", 40, nil, value(slow, 40))
	require.NoError(t, err)
	require.NoError(t, l.Release())
	other, err := cache.Load(ctx, c, "other", 10, nil, value(1, 10))
	require.NoError(t, err)
	require.NoError(t, other.Release())

	evicted := make(chan error, 1)
	go func() {
		_, err := c.Evict(ctx, "slow")
		evicted <- err
	}()
	<-slow.started
	hit, err := cache.Load(ctx, c, "other", 10, nil, unreachable[int](t))
	require.NoError(t, err)
	require.NoError(t, hit.Release())
	assert.Equal(t, int64(50), stats(t, c).ReservedBytes, "the slow value is still charged")
	fresh, err := cache.Load(ctx, c, "fresh", 10, nil, value(3, 10))
	require.NoError(t, err)
	require.NoError(t, fresh.Release())
	select {
	case err := <-evicted:
		t.Fatalf("Evict returned (%v) before the value's Close did", err)
	default:
	}
	close(slow.gate)
	require.NoError(t, <-evicted)
	assert.Equal(t, int64(20), stats(t, c).ReservedBytes)
}

// closer counts its Close calls.
type closer struct{ n atomic.Int32 }

func (c *closer) Close() error { c.n.Add(1); return nil }

// Close releases idle entries at once and held ones at their last
// release; afterwards loads and evictions are refused, and the budget
// still enforces the ceiling.
func TestCacheCloseReleasesIdleEntriesNowAndHeldOnesAtTheirLastRelease(t *testing.T) {
	ctx := context.Background()
	sys, c := seedCache(t, 100)
	held, idle := &closer{}, &closer{}
	lh, err := cache.Load(ctx, c, "held", 30, nil, value(held, 30))
	require.NoError(t, err)
	li, err := cache.Load(ctx, c, "idle", 20, func(*closer) bool { return false }, value(idle, 20))
	require.NoError(t, err)
	require.NoError(t, li.Release())
	keep := lh.KeepAlive()
	clone := lh.Clone()
	require.NoError(t, lh.Release())

	require.NoError(t, c.Close(ctx))
	require.NoError(t, c.Close(ctx), "idempotent")
	assert.Equal(t, int32(1), idle.n.Load(), "an unheld entry is released at Close, idle or not")
	assert.Equal(t, int32(0), held.n.Load())
	assert.Equal(t, int64(30), stats(t, c).ReservedBytes)
	assert.Equal(t, 1, stats(t, c).Resources, "the held entry is still counted while it is charged")

	_, err = cache.Load(ctx, c, "new", 1, nil, value(1, 1))
	assert.ErrorIs(t, err, system.ErrClosed)
	_, err = c.Evict(ctx, "held")
	assert.ErrorIs(t, err, system.ErrClosed)

	require.NoError(t, clone.Release())
	assert.Equal(t, int32(0), held.n.Load(), "the keep-alive still holds it")
	require.NoError(t, keep.Release())
	assert.Equal(t, int32(1), held.n.Load(), "released at its last reference, before Release returned")
	assert.Equal(t, int64(0), stats(t, c).ReservedBytes)
	assert.Equal(t, 0, stats(t, c).Resources)
	assert.ErrorIs(t, keep.Release(), system.ErrInvalidInput)
	l := loc(t, snapshot(t, sys), "cuda:0")
	assert.Zero(t, l.UsedBytes+l.ReservedBytes)
}

// A caller of another type sharing a load gets an error; the load's own
// callers are unaffected.
func TestCacheKeyOfAnotherTypeWhileLoading(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	gate := make(chan struct{})
	entered := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		l, err := cache.Load(ctx, c, "k", 10, nil, func(context.Context) (int, int64, error) {
			close(entered)
			<-gate
			return 5, 10, nil
		})
		if err == nil {
			err = l.Release()
		}
		done <- err
	}()
	<-entered
	wrong := make(chan error, 1)
	go func() {
		_, err := cache.Load(ctx, c, "k", 10, nil, unreachable[string](t))
		wrong <- err
	}()
	// The wrong-typed caller either joined the flight or will find the
	// entry ready: both answers are the same error.
	close(gate)
	assert.ErrorIs(t, <-wrong, system.ErrInvalidInput)
	require.NoError(t, <-done)
	evicted, err := c.Evict(ctx, "k")
	require.NoError(t, err)
	assert.True(t, evicted, "the wrong-typed caller holds no reference")
}

func TestCacheRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	sys, c := seedCache(t, 100)
	_, err := cache.Load(ctx, c, "", 1, nil, value(1, 1))
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	_, err = cache.Load(ctx, c, "k", 0, nil, value(1, 1))
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	_, err = cache.Load[int](ctx, c, "k", 1, nil, nil)
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	_, err = cache.LoadBudgeted[int](ctx, c, "k", nil, nil)
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	_, err = c.Budget().Reserve(ctx, -1)
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	_, err = cache.New(ctx, sys, cache.Options{})
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	_, err = cache.New(ctx, sys, cache.Options{Location: "gpu:0"})
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	_, err = cache.New(ctx, sys, cache.Options{Location: "cuda:3"})
	var ue *system.UnavailableError
	assert.ErrorAs(t, err, &ue)
	l, err := cache.Load(ctx, c, "k", 10, nil, value(1, 0))
	var le *system.CacheLoadError
	require.ErrorAs(t, err, &le, "zero resident bytes")
	assert.ErrorIs(t, err, system.ErrInvalidInput)
	assert.Zero(t, l, "no lease")
	assert.Equal(t, int64(0), stats(t, c).ReservedBytes)
}

// A memory budget reservation grows in place, evicting idle entries for
// it; a budgeted value grows while leased.
func TestCacheMemoryReservationGrowsByEvictingIdleEntries(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	a, err := cache.Load(ctx, c, "a", 60, nil, value(1, 60))
	require.NoError(t, err)
	require.NoError(t, a.Release())
	r, err := c.Budget().Reserve(ctx, 30)
	require.NoError(t, err)
	require.NoError(t, r.Resize(ctx, 70))
	assert.Equal(t, int64(70), r.Bytes())
	assert.Equal(t, uint64(1), stats(t, c).Evictions)
	err = r.Resize(ctx, 101)
	var be *system.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, int64(70), r.Bytes(), "a refused resize changes nothing")
	require.NoError(t, r.Resize(ctx, 10))
	assert.Equal(t, int64(10), stats(t, c).ReservedBytes)
	require.NoError(t, r.Release())
	assert.ErrorIs(t, r.Resize(ctx, 5), system.ErrInvalidInput)
}

// Contexts bound every wait: a caller whose context ends while a victim
// is released returns at once; the release finishes on its own.
func TestCacheEvictHonoursItsContext(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	slow := &blocking{started: make(chan struct{}), gate: make(chan struct{})}
	l, err := cache.Load(ctx, c, "slow", 40, nil, value(slow, 40))
	require.NoError(t, err)
	require.NoError(t, l.Release())
	cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	go func() { <-slow.started; <-cctx.Done(); close(slow.gate) }()
	evicted, err := c.Evict(cctx, "slow")
	assert.True(t, evicted)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// A loader that returns a value together with an
// error fails the load, and the value it returned is closed before its
// charge is released (for LoadBudgeted too); a nil value is not closed.
func TestCacheLoaderValueReturnedWithAnErrorIsClosed(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	v := &closer{}
	_, err := cache.Load(ctx, c, "k", 10, nil, func(context.Context) (*closer, int64, error) {
		return v, 10, errors.New("half loaded")
	})
	var le *system.CacheLoadError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, int32(1), v.n.Load(), "the returned value was closed")
	assert.Equal(t, int64(0), stats(t, c).ReservedBytes)
	assert.Equal(t, 0, stats(t, c).Resources)

	bv := &closer{}
	_, err = cache.LoadBudgeted(ctx, c, "b", nil, func(context.Context, *cache.MemoryBudget) (*closer, error) {
		return bv, errors.New("half loaded")
	})
	require.ErrorAs(t, err, &le)
	assert.Equal(t, int32(1), bv.n.Load(), "the returned budgeted value was closed")

	_, err = cache.Load(ctx, c, "nil", 10, nil, func(context.Context) (*closer, int64, error) {
		return nil, 0, errors.New("nothing")
	})
	require.ErrorAs(t, err, &le, "a nil value is not closed (its Close would dereference nil)")

	l, err := cache.Load(ctx, c, "k", 10, nil, value(&closer{}, 10))
	require.NoError(t, err, "the next load retries")
	require.NoError(t, l.Release())
}

// A closed cache's refusal says that the cache is
// closed, not the runtime; a Load that Close interrupts returns
// ErrCacheClosed to a caller whose own context is live, never "context
// canceled" — whether its loader was running or it waited for an
// eviction.
func TestCacheLoadInterruptedByCloseSaysTheCacheClosed(t *testing.T) {
	ctx := context.Background()
	assert.ErrorIs(t, system.ErrCacheClosed, system.ErrClosed)
	assert.NotContains(t, system.ErrCacheClosed.Error(), "system")

	sys, c := seedCache(t, 100)
	// A loader that runs until its context is canceled.
	entered := make(chan struct{})
	running := make(chan error, 1)
	go func() {
		_, err := cache.Load(ctx, c, "k", 10, nil, func(lctx context.Context) (int, int64, error) {
			close(entered)
			<-lctx.Done()
			return 0, 0, lctx.Err()
		})
		running <- err
	}()
	<-entered
	// A load waiting for the release of the value it evicts.
	slow := &blocking{started: make(chan struct{}), gate: make(chan struct{})}
	l, err := cache.Load(ctx, c, "slow", 90, nil, value(slow, 90))
	require.NoError(t, err)
	require.NoError(t, l.Release())
	evicting := make(chan error, 1)
	go func() {
		_, err := cache.Load(ctx, c, "big", 80, nil, value(1, 80))
		evicting <- err
	}()
	<-slow.started
	closed := make(chan error, 1)
	go func() { closed <- c.Close(ctx) }()
	for c.Budget().Cache() != nil { // Close has begun
		runtime.Gosched()
	}
	close(slow.gate)
	for _, ch := range []chan error{running, evicting} {
		err := <-ch
		assert.ErrorIs(t, err, system.ErrCacheClosed)
		assert.NotErrorIs(t, err, context.Canceled)
	}
	require.NoError(t, <-closed)
	_, err = cache.Load(ctx, c, "k", 10, nil, value(1, 10))
	assert.ErrorIs(t, err, system.ErrCacheClosed)
	assert.Equal(t, "residency: cache is closed", err.Error())
	l2 := loc(t, snapshot(t, sys), "cuda:0")
	assert.Zero(t, l2.UsedBytes+l2.ReservedBytes)
}

// Seed 001's peak rule: a peak above the whole budget is
// refused before the key is looked up, so also when the key is resident:
// a BudgetError with the caller's peak, no loader, no eviction, and the
// entry's recency untouched.
func TestCachePeakAboveTheBudgetIsRefusedEvenWhenResident(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	for _, k := range []string{"a", "b"} {
		l, err := cache.Load(ctx, c, k, 40, nil, value(k, 40))
		require.NoError(t, err)
		require.NoError(t, l.Release())
	}
	_, err := cache.Load(ctx, c, "a", 101, nil, unreachable[string](t))
	var be *system.BudgetError
	require.ErrorAs(t, err, &be, "a resident key with a peak above the budget")
	assert.Equal(t, int64(101), be.RequestedBytes)
	assert.Equal(t, int64(100), be.BudgetBytes)
	assert.Equal(t, int64(80), be.ReservedBytes)
	assert.Equal(t, uint64(0), stats(t, c).Evictions)
	// "a" is still the least recently used entry: a load that needs room
	// evicts it, not "b".
	l, err := cache.Load(ctx, c, "c", 30, nil, value("c", 30))
	require.NoError(t, err)
	require.NoError(t, l.Release())
	hit, err := cache.Load(ctx, c, "b", 40, nil, unreachable[string](t))
	require.NoError(t, err, "b stayed")
	require.NoError(t, hit.Release())
	evicted, err := c.Evict(ctx, "a")
	require.NoError(t, err)
	assert.False(t, evicted, "a was the victim")
}

// A caller never inherits a refusal that its own
// request would not cause. A loads k with a peak that cannot fit even
// with every idle entry evicted; B asks for k with a peak that fits now.
// The controller refuses A at once and evicts nothing for it (a decision
// is whole or nothing); B, which waits for A's answer if it comes while
// A asks, then looks again and loads k itself. A either is refused for
// its own peak or, coming after B, joins B's load.
func TestCacheJoinerNeverInheritsAnotherCallersRefusal(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	y, err := cache.Load(ctx, c, "y", 50, nil, value("y", 50))
	require.NoError(t, err) // leased: never a victim
	slow := &blocking{started: make(chan struct{}), gate: make(chan struct{})}
	x, err := cache.Load(ctx, c, "x", 20, nil, value(slow, 20))
	require.NoError(t, err)
	require.NoError(t, x.Release())

	type res struct {
		l   cache.Lease[string]
		err error
	}
	aDone, bDone := make(chan res, 1), make(chan res, 1)
	go func() {
		l, err := cache.Load(ctx, c, "k", 90, nil, func(context.Context) (string, int64, error) {
			t.Error("A's loader ran: its peak never fits")
			return "A", 90, nil
		})
		aDone <- res{l, err}
	}()
	go func() {
		l, err := cache.Load(ctx, c, "k", 30, nil, value("B", 30))
		bDone <- res{l, err}
	}()
	b := <-bDone
	require.NoError(t, b.err, "B's 30 bytes fit: its own request causes no refusal")
	assert.Equal(t, "B", b.l.Value())
	a := <-aDone
	if a.err != nil {
		var busy *system.CacheBusyError
		require.ErrorAs(t, a.err, &busy, "A is refused for its own peak")
	} else {
		assert.Equal(t, "B", a.l.Value(), "A joined B's load")
		require.NoError(t, a.l.Release())
	}
	select {
	case <-slow.started:
		t.Fatal("x was evicted for a request that never fits")
	default:
	}
	close(slow.gate)
	assert.Equal(t, int64(100), stats(t, c).ReservedBytes)
	require.NoError(t, b.l.Release())
	require.NoError(t, y.Release())
}

// Growing a budgeted value's reservation while the
// value is idle may evict that very value, whose Close releases the
// reservation being resized. No call may wait on itself: Resize (with a
// context that never ends) returns, saying the reservation was released.
func TestCacheResizeThatEvictsItsOwnValueDoesNotWaitOnItself(t *testing.T) {
	ctx := context.Background()
	_, c := seedCache(t, 100)
	model, err := cache.LoadBudgeted(ctx, c, "model", nil, func(ctx context.Context, b *cache.MemoryBudget) (*budgetedModel, error) {
		r, err := b.Reserve(ctx, 40)
		if err != nil {
			return nil, err
		}
		return &budgetedModel{res: []*cache.MemoryReservation{r}}, nil
	})
	require.NoError(t, err)
	r := model.Value().res[0]
	require.NoError(t, model.Release()) // idle: the only victim there is
	scratch, err := c.Budget().Reserve(ctx, 30)
	require.NoError(t, err)
	defer func() { require.NoError(t, scratch.Release()) }()

	// With context.Background() a Resize that waits on itself never
	// returns; this context ends it after 10 s so that such a Resize
	// fails the test (with DeadlineExceeded) instead of hanging it.
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = r.Resize(rctx, 80)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "Resize waited on its own value's release")
	require.ErrorIs(t, err, system.ErrInvalidInput, "40 → 80 bytes with 30 more held: the model is evicted for it")
	assert.Contains(t, err.Error(), "released while it was being resized")
	assert.Equal(t, int64(0), r.Bytes())
	assert.Equal(t, int64(30), stats(t, c).ReservedBytes)
	assert.Equal(t, uint64(1), stats(t, c).Evictions)
}

// No call waits on itself: a loader that loads its own key through its
// context (directly, or through the loader of another key it loads), or
// closes its cache, is refused instead of waiting for its own load.
func TestCacheLoaderThatWouldWaitForItselfIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, c := seedCache(t, 100)
	var inner error
	_, err := cache.Load(ctx, c, "a", 10, nil, func(lctx context.Context) (int, int64, error) {
		_, inner = cache.Load(lctx, c, "a", 10, nil, value(2, 10))
		return 1, 10, nil
	})
	require.NoError(t, err)
	assert.ErrorIs(t, inner, system.ErrInvalidInput, "a loader loading its own key")
	assert.ErrorContains(t, inner, "it would wait for itself")

	_, err = cache.Load(ctx, c, "x", 10, nil, func(lctx context.Context) (int, int64, error) {
		l, err := cache.Load(lctx, c, "y", 10, nil, func(lctx2 context.Context) (int, int64, error) {
			_, inner = cache.Load(lctx2, c, "x", 10, nil, value(3, 10))
			return 2, 10, nil
		})
		if err != nil {
			return 0, 0, err
		}
		return l.Value(), 10, l.Release()
	})
	require.NoError(t, err, "a loader may load other keys")
	assert.ErrorIs(t, inner, system.ErrInvalidInput, "x → y → x")

	_, err = cache.Load(ctx, c, "z", 10, nil, func(lctx context.Context) (int, int64, error) {
		inner = c.Close(lctx)
		return 1, 10, nil
	})
	require.NoError(t, err)
	assert.ErrorIs(t, inner, system.ErrInvalidInput, "a loader closing its cache")
	require.NoError(t, ctx.Err(), "nothing waited for its deadline")
}

// A Close that waits behind another Close honours its own context: the
// first Close waits for a loader that ignores its canceled context; a
// second Close whose context ends returns ctx.Err() at once instead of
// waiting for the first, and changes nothing. The first still finishes
// once the loader returns.
func TestCacheCloseWaitingBehindAnotherCloseHonoursItsContext(t *testing.T) {
	ctx := context.Background()
	sys, c := seedCache(t, 100)
	entered, canceled, gate := make(chan struct{}), make(chan struct{}), make(chan struct{})
	loaded := make(chan error, 1)
	go func() {
		_, err := cache.Load(ctx, c, "stuck", 10, nil, func(lctx context.Context) (int, int64, error) {
			close(entered)
			<-lctx.Done() // Close canceled the load…
			close(canceled)
			<-gate // …but the loader returns only when the test lets it
			return 0, 0, lctx.Err()
		})
		loaded <- err
	}()
	<-entered
	first := make(chan error, 1)
	go func() { first <- c.Close(ctx) }()
	<-canceled // the first Close holds the close and waits for the loader

	cctx, cancel := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() { second <- c.Close(cctx) }()
	cancel()
	// A Close that ignored its context would wait for the loader, which
	// the test releases only below: the guard fails the test instead of
	// hanging it.
	guard := time.NewTimer(10 * time.Second)
	defer guard.Stop()
	select {
	case err := <-second:
		require.ErrorIs(t, err, context.Canceled)
	case <-guard.C:
		close(gate)
		t.Fatal("the second Close waited for the first one past its context's end")
	}
	select {
	case err := <-first:
		t.Fatalf("the first Close returned (%v) before its loader did", err)
	default:
	}
	close(gate)
	require.NoError(t, <-first)
	assert.ErrorIs(t, <-loaded, system.ErrCacheClosed)
	require.NoError(t, c.Close(ctx), "idempotent")
	l := loc(t, snapshot(t, sys), "cuda:0")
	assert.Zero(t, l.UsedBytes+l.ReservedBytes)
}
