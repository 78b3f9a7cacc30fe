package cache_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// Spill of cache entries (spill.go): a cache that opts in has its idle
// entries demoted to the spill target of its location instead of
// dropped, and the next load of the key gets the copy.

const vpinned = "pinned-host"

// hostCopy is a demoted copy: the bytes of a blob, "on pinned host".
type hostCopy struct {
	from   *blob
	closed atomic.Int32
}

func (h *hostCopy) Close() error { h.closed.Add(1); return nil }

// spillRig is a runtime with cuda:0 (100 bytes) spilling to pinned-host
// (pinned bytes), and a cache at cuda:0 whose Demote is demote (nil: one
// that copies into a *hostCopy and records it).
type spillRig struct {
	sys    *system.System
	c      *cache.Cache
	copies []*hostCopy
	fail   atomic.Bool // Demote fails while set
	calls  atomic.Int32
}

func startSpill(t *testing.T, pinned int64) *spillRig {
	t.Helper()
	ctx := context.Background()
	r := &spillRig{}
	sys, err := startSoft(t, ctx, system.Options{
		Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit(vpinned, pinned), system.Limit(vgpu, 100)},
		Spill:     map[string]string{vgpu: vpinned},
	})
	require.NoError(t, err)
	r.sys = sys
	r.c, err = cache.New(ctx, sys, cache.Options{Location: vgpu, Name: "models", Spill: &cache.Spill{
		Demote: func(_ context.Context, _ string, v any) (any, error) {
			r.calls.Add(1)
			if r.fail.Load() {
				return nil, errors.New("pinned allocation failed")
			}
			h := &hostCopy{from: v.(*blob)}
			r.copies = append(r.copies, h)
			return h, nil
		},
	}})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, r.c.Close(ctx))
		assert.NoError(t, sys.Close(ctx))
	})
	return r
}

func (r *spillRig) reserved(t *testing.T, loc string) int64 {
	t.Helper()
	snap, err := r.sys.Snapshot(context.Background())
	require.NoError(t, err)
	rec, ok := snap.Location(loc)
	require.True(t, ok)
	return rec.ReservedBytes
}

// demoteA loads "a" (70 bytes), leaves it idle and has it demoted by a
// 60-byte admission at cuda:0 (whose scope then exits).
func (r *spillRig) demoteA(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	idleBlob(t, r.c, "a", 70)
	sc, _, err := r.sys.Admit(ctx, gpuResv("kv", 60))
	require.NoError(t, err)
	require.NoError(t, sc.Exit(ctx))
}

func (r *spillRig) stats(t *testing.T) cache.Stats {
	t.Helper()
	st, err := r.c.Statistics(context.Background())
	require.NoError(t, err)
	return st
}

func TestSpillRefusedWithoutTarget(t *testing.T) {
	ctx := context.Background()
	sys, _ := startVictims(t, 0) // no spill targets
	demote := func(context.Context, string, any) (any, error) { return nil, nil }
	_, err := cache.New(ctx, sys, cache.Options{Location: vgpu, Name: "s1", Spill: &cache.Spill{Demote: demote}})
	var ie *system.InvalidInputError
	require.ErrorAs(t, err, &ie)
	assert.Contains(t, err.Error(), "no spill target")
	_, err = cache.New(ctx, sys, cache.Options{Location: vgpu, Name: "s2", Spill: &cache.Spill{}})
	require.ErrorAs(t, err, &ie)
	assert.Contains(t, err.Error(), "Demote is nil")
	// A refused cache leaves its name free.
	c, err := cache.New(ctx, sys, cache.Options{Location: vgpu, Name: "s1"})
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
}

func TestSpillDemotesIdleEntryThenWarmStarts(t *testing.T) {
	ctx := context.Background()
	r := startSpill(t, 1000)
	a := idleBlob(t, r.c, "a", 70)

	// Room for a 60-byte reservation: the idle entry is the victim, and
	// it is demoted, not dropped.
	sc, d, err := r.sys.Admit(ctx, gpuResv("kv", 60))
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	ev := d.Evictions[0]
	assert.Equal(t, budget.EvictionIdleCacheEntry, ev.Kind)
	assert.Equal(t, vpinned, ev.To)
	assert.Contains(t, ev.Reason, "demoted to pinned-host")
	assert.Equal(t, vpinned, d.Plan.Reclaim[0].To)
	require.Len(t, r.copies, 1)
	assert.Same(t, a, r.copies[0].from, "Demote got the entry's value")
	assert.Equal(t, int32(1), a.closed.Load(), "the value at cuda:0 is closed once copied")
	assert.Zero(t, r.copies[0].closed.Load())
	assert.Equal(t, int64(70), r.reserved(t, vpinned), "the copy is charged at the spill target")
	st := r.stats(t)
	assert.Equal(t, 1, st.Demoted)
	assert.Equal(t, int64(70), st.DemotedBytes)
	assert.Equal(t, uint64(1), st.Demotions)
	assert.Zero(t, st.ReservedBytes, "nothing of the cache is left at cuda:0")
	require.NoError(t, sc.Exit(ctx))

	// The next load of "a" gets the copy: a warm start.
	var warm *hostCopy
	l, err := cache.Load(ctx, r.c, "a", 70, blobIdle, func(ctx context.Context) (*blob, int64, error) {
		h, ok := cache.Demoted[*hostCopy](ctx)
		require.True(t, ok)
		_, wrongType := cache.Demoted[*blob](ctx)
		assert.False(t, wrongType)
		warm = h
		return &blob{}, 70, nil
	})
	require.NoError(t, err)
	assert.Same(t, r.copies[0], warm)
	assert.Equal(t, int32(1), warm.closed.Load(), "the copy is let go once the load succeeded")
	assert.Zero(t, r.reserved(t, vpinned))
	st = r.stats(t)
	assert.Zero(t, st.Demoted)
	assert.Equal(t, uint64(1), st.WarmStarts)
	require.NoError(t, l.Release())

	// A load of another key sees no copy.
	lb, err := cache.Load(ctx, r.c, "b", 10, nil, func(ctx context.Context) (int, int64, error) {
		_, ok := cache.Demoted[*hostCopy](ctx)
		assert.False(t, ok)
		return 1, 10, nil
	})
	require.NoError(t, err)
	require.NoError(t, lb.Release())
	_, ok := cache.Demoted[any](ctx)
	assert.False(t, ok, "outside a loader there is no copy")
}

func TestSpillTargetFullDrops(t *testing.T) {
	ctx := context.Background()
	r := startSpill(t, 50) // 70 bytes never fit
	a := idleBlob(t, r.c, "a", 70)
	sc, d, err := r.sys.Admit(ctx, gpuResv("kv", 60))
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	assert.Empty(t, d.Evictions[0].To)
	assert.Contains(t, d.Evictions[0].Reason, "dropped by its owner")
	assert.Zero(t, r.calls.Load(), "no Demote for a drop")
	assert.Equal(t, int32(1), a.closed.Load())
	assert.Zero(t, r.reserved(t, vpinned))
	require.NoError(t, sc.Exit(ctx))
}

func TestSpillDemoteFailureDropsTheEntry(t *testing.T) {
	ctx := context.Background()
	r := startSpill(t, 1000)
	a := idleBlob(t, r.c, "a", 70)
	r.fail.Store(true)
	sc, d, err := r.sys.Admit(ctx, gpuResv("kv", 60))
	require.NoError(t, err, "a failed demotion drops the entry; the admission goes on")
	require.Len(t, d.Evictions, 1)
	assert.Equal(t, vpinned, d.Evictions[0].To, "the decision said demoted")
	assert.Equal(t, int32(1), a.closed.Load())
	assert.Zero(t, r.reserved(t, vpinned), "nothing is left charged at the target")
	st := r.stats(t)
	assert.Zero(t, st.Demoted)
	assert.Equal(t, uint64(1), st.DemotionFailures)
	assert.Zero(t, st.Demotions)
	assert.Zero(t, st.ReservedBytes)
	snap, err := r.sys.Snapshot(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(60), gpuRecord(t, snap).ReservedBytes, "only the admitted reservation")
	require.NoError(t, sc.Exit(ctx))
}

func TestSpillCopyIsAVictimAtTheTarget(t *testing.T) {
	ctx := context.Background()
	r := startSpill(t, 100)
	r.demoteA(t)
	require.Len(t, r.copies, 1)
	// Room at pinned-host: the idle copy is dropped there (a copy is
	// never demoted further).
	sc, d, err := r.sys.Admit(ctx, system.Request{Name: "host", Reservations: []system.ReservationSpec{{Name: "h", Location: vpinned, Bytes: 50}}})
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	assert.Equal(t, budget.EvictionIdleCacheEntry, d.Evictions[0].Kind)
	assert.Empty(t, d.Evictions[0].To)
	assert.Equal(t, int32(1), r.copies[0].closed.Load())
	assert.Zero(t, r.stats(t).Demoted)
	assert.Equal(t, int64(50), r.reserved(t, vpinned))
	require.NoError(t, sc.Exit(ctx))
}

func TestSpillFailedLoadKeepsTheCopy(t *testing.T) {
	ctx := context.Background()
	r := startSpill(t, 1000)
	r.demoteA(t)
	_, err := cache.Load(ctx, r.c, "a", 70, blobIdle, func(ctx context.Context) (*blob, int64, error) {
		_, ok := cache.Demoted[*hostCopy](ctx)
		require.True(t, ok)
		return nil, 0, errors.New("disk gone")
	})
	var le *system.CacheLoadError
	require.ErrorAs(t, err, &le)
	assert.Zero(t, r.copies[0].closed.Load(), "kept for a later load")
	assert.Equal(t, 1, r.stats(t).Demoted)
	assert.Equal(t, int64(70), r.reserved(t, vpinned))
	// Offered again: a later load still gets it.
	l, err := cache.Load(ctx, r.c, "a", 70, blobIdle, func(ctx context.Context) (*blob, int64, error) {
		_, ok := cache.Demoted[*hostCopy](ctx)
		assert.True(t, ok)
		return &blob{}, 70, nil
	})
	require.NoError(t, err)
	require.NoError(t, l.Release())
	assert.Equal(t, uint64(2), r.stats(t).WarmStarts)
}

func TestSpillCloseReleasesCopies(t *testing.T) {
	ctx := context.Background()
	r := startSpill(t, 1000)
	r.demoteA(t)
	require.NoError(t, r.c.Close(ctx))
	assert.Equal(t, int32(1), r.copies[0].closed.Load())
	assert.Zero(t, r.reserved(t, vpinned))
}

func TestSpillBusyEntryIsNotDemoted(t *testing.T) {
	ctx := context.Background()
	r := startSpill(t, 1000)
	l, _, err := loadBlob(ctx, r.c, "a", 70)
	require.NoError(t, err)
	_, _, err = r.sys.Admit(ctx, gpuResv("kv", 60))
	var pe *budget.PlanError
	require.ErrorAs(t, err, &pe, "a leased entry is never a victim")
	assert.Zero(t, r.calls.Load())
	require.NoError(t, l.Release())
}

func TestSpillCloseCancelsDemote(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{
		Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit(vpinned, 1000), system.Limit(vgpu, 100)},
		Spill:     map[string]string{vgpu: vpinned},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sys.Close(ctx)) })
	entered := make(chan struct{})
	c, err := cache.New(ctx, sys, cache.Options{Location: vgpu, Name: "slow", Spill: &cache.Spill{
		Demote: func(ctx context.Context, _ string, _ any) (any, error) {
			close(entered)
			<-ctx.Done() // a copy that only Close ends
			return nil, ctx.Err()
		},
	}})
	require.NoError(t, err)
	a := idleBlob(t, c, "a", 70)
	admitted := make(chan error, 1)
	go func() {
		sc, _, err := sys.Admit(ctx, gpuResv("kv", 60))
		if err == nil {
			err = sc.Exit(ctx)
		}
		admitted <- err
	}()
	<-entered
	require.NoError(t, c.Close(ctx), "Close cancels the Demote under way and waits for it")
	require.NoError(t, <-admitted, "the entry is dropped and the admission goes on")
	assert.Equal(t, int32(1), a.closed.Load())
	snap, err := sys.Snapshot(ctx)
	require.NoError(t, err)
	rec, ok := snap.Location(vpinned)
	require.True(t, ok)
	assert.Zero(t, rec.ReservedBytes)
}

// A plan drops a demoted copy while a load holds it (the load took it
// after the decision): the drop is refused, whatever the load does
// meanwhile. The load fails at once, so it settles the copy (offered
// again) as the drop looks at it: the drop must not read the copy's
// state outside the cache's lock (a data race under -race), nor take the
// copy's release for a way out that never comes (the admission would
// wait forever).
func TestSpillDropOfTakenCopy(t *testing.T) {
	ctx := context.Background()
	r := startSpill(t, 100)
	for i := range 40 {
		r.demoteA(t)
		require.Equal(t, 1, r.stats(t).Demoted, "round %d", i)

		loaded := make(chan error, 1)
		cache.SetDropHook(r.c, func() {
			cache.SetDropHook(r.c, nil)
			entered := make(chan struct{})
			go func() {
				_, err := cache.Load(ctx, r.c, "a", 70, blobIdle, func(context.Context) (*blob, int64, error) {
					close(entered)
					for range i % 20 { // fail a little later each round: at some point, as the drop looks at the copy
						runtime.Gosched()
					}
					return nil, 0, errors.New("disk gone")
				})
				loaded <- err
			}()
			<-entered // the copy is taken; the load fails now, as the drop goes on
		})
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		sc, _, err := r.sys.Admit(actx, system.Request{Name: "host", Reservations: []system.ReservationSpec{{Name: "h", Location: vpinned, Bytes: 50}}})
		cancel()
		var xe *budget.PlanExecutionError
		if err != nil {
			require.ErrorAs(t, err, &xe, "round %d: the drop of the taken copy is refused", i)
		} else {
			require.NoError(t, sc.Exit(ctx)) // the load settled first: the copy was dropped
		}
		require.Error(t, <-loaded)
		// Whatever happened, the copy is gone, or offered again once the
		// refusal is settled (never stuck out of the controller's reach):
		// an admission that waits for room drops it.
		actx, cancel = context.WithTimeout(ctx, 10*time.Second)
		sc, _, err = r.sys.Admit(actx, system.Request{Name: "host", Reservations: []system.ReservationSpec{{Name: "h", Location: vpinned, Bytes: 50}}}, system.WaitForRoom())
		cancel()
		require.NoError(t, err, "round %d", i)
		require.NoError(t, sc.Exit(ctx))
		require.Zero(t, r.stats(t).Demoted, "round %d", i)
	}
}

// TestSpillNewCopyLeavesATakenCopyToItsLoad: a key's entry is demoted
// while a load of the key holds the key's older copy (possible when the
// entry was loaded cold while its predecessor's Demote ran). Filing the
// new copy must not close the one the loader is using; that load lets
// it go when it ends.
func TestSpillNewCopyLeavesATakenCopyToItsLoad(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{
		Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit(vpinned, 1000), system.Limit(vgpu, 100)},
		Spill:     map[string]string{vgpu: vpinned},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sys.Close(ctx)) })
	entered := make(chan struct{}, 2)
	gate := make(chan struct{})
	var copies []*hostCopy
	c, err := cache.New(ctx, sys, cache.Options{Location: vgpu, Name: "m", Spill: &cache.Spill{
		Demote: func(_ context.Context, _ string, v any) (any, error) {
			entered <- struct{}{}
			<-gate
			h := &hostCopy{from: v.(*blob)}
			copies = append(copies, h)
			return h, nil
		},
	}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close(ctx)) })
	// demoteWhile demotes the idle entry of "k" through an admission and
	// runs during while its Demote waits. The admission itself may fail
	// after the demotion (during reloaded the key's bytes).
	demoteWhile := func(during func()) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if sc, _, err := sys.Admit(ctx, gpuResv("kv", 85)); err == nil {
				assert.NoError(t, sc.Exit(ctx))
			}
		}()
		<-entered
		during()
		gate <- struct{}{}
		<-done
	}
	idleBlob(t, c, "k", 20)
	// First demotion: meanwhile "k" loads cold (no copy filed yet).
	demoteWhile(func() { idleBlob(t, c, "k", 20) })
	require.Len(t, copies, 1)
	// Second demotion: meanwhile a load of "k" takes the first copy and
	// is still using it when the second copy is filed.
	using, finish := make(chan *hostCopy), make(chan struct{})
	loaded := make(chan error, 1)
	load := func() {
		l, err := cache.Load(ctx, c, "k", 20, blobIdle, func(ctx context.Context) (*blob, int64, error) {
			h, _ := cache.Demoted[*hostCopy](ctx)
			using <- h
			<-finish
			return &blob{}, 20, nil
		})
		if err == nil {
			err = l.Release()
		}
		loaded <- err
	}
	var held *hostCopy
	demoteWhile(func() {
		go load() // "k" is out of the book: a new load, which takes the first copy
		held = <-using
	})
	require.Same(t, copies[0], held, "the load holds the first copy")
	require.Len(t, copies, 2)
	assert.Zero(t, held.closed.Load(), "the copy a loader holds is not closed under it")
	close(finish)
	require.NoError(t, <-loaded)
	assert.Equal(t, int32(1), held.closed.Load(), "its load let it go when it succeeded")
	assert.Zero(t, copies[1].closed.Load(), "the second copy stays")
}
