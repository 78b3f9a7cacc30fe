package tests

// The loader cache of the system checker: every call that names the cache
// API is in this file (the cache is moving to package system/cache).

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// scCacheVal is a loaded value; its id tells loads apart.
type scCacheVal struct {
	id     int64
	closed atomic.Bool
	c      *scCache
}

func (v *scCacheVal) Close() error {
	if !v.closed.CompareAndSwap(false, true) {
		v.c.rd.fail("cache value %d closed twice", v.id)
	}
	v.c.closes.Add(1)
	return nil
}

type scCache struct {
	rd      *scRound
	c       *cache.Cache
	ids     atomic.Int64
	made    atomic.Int64 // values the loaders returned
	closes  atomic.Int64
	loads   atomic.Int64 // calls
	waiting atomic.Int64 // loads that asked to wait for room
}

type scCacheHeld struct {
	l   cache.Lease[*scCacheVal]
	key string
}

func newSCCache(t *testing.T, r *scRound) *scCache {
	c, err := cache.New(context.Background(), r.sys, cache.Options{Location: "cuda:1", Name: "sc", MaxEntries: 6})
	require.NoError(t, err)
	return &scCache{rd: r, c: c}
}

func (c *scCache) step(w *scWorker) {
	switch n := w.r.IntN(100); {
	case n < 55:
		c.load(w)
	case n < 85:
		if len(w.cache) > 0 {
			i := w.r.IntN(len(w.cache))
			x := w.cache[i]
			w.cache = append(w.cache[:i], w.cache[i+1:]...)
			c.release(w, x)
		}
	default:
		key := fmt.Sprintf("k%d", w.r.IntN(10))
		ctx, cancel := w.ctxAny()
		call := c.rd.chist.now()
		removed, err := c.c.Evict(ctx, key)
		cancel()
		res := scClassify(err)
		if res == resRefused && !errors.Is(err, system.ErrBusy) {
			c.rd.fail("worker %d: cache evict %s: %T: %v", w.id, key, err, err)
		}
		w.calls++
		c.rd.chist.add(w.id, call, cmInput{op: "evict", key: key}, cmOutput{res: res, removed: removed}, res == resUnknown)
	}
}

// load loads a key; its loader fails now and then, or reports bytes out
// of range; a fifth of the loads wait for room (with a deadline).
func (c *scCache) load(w *scWorker) {
	key := fmt.Sprintf("k%d", w.r.IntN(10))
	peak := int64(1024 * (1 + w.r.IntN(6)))
	resident := peak - int64(w.r.IntN(int(peak/2)))
	fail := w.r.IntN(10)
	loader := func(context.Context) (*scCacheVal, int64, error) {
		if fail == 0 {
			return nil, 0, fmt.Errorf("injected loader failure")
		}
		v := &scCacheVal{id: c.ids.Add(1), c: c}
		c.made.Add(1)
		if fail == 1 {
			return v, peak + 1, nil // out of range: rolled back, closed
		}
		return v, resident, nil
	}
	ctx, cancel := w.ctxAny()
	var opts []cache.LoadOption
	if w.r.IntN(5) == 0 {
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), time.Duration(1+w.r.IntN(5))*time.Millisecond)
		opts = append(opts, cache.Wait(system.WaitForRoom()))
		c.waiting.Add(1)
	}
	defer cancel()
	call := c.rd.chist.now()
	l, err := cache.Load(ctx, c.c, key, peak, nil, loader, opts...)
	w.calls++
	c.loads.Add(1)
	out := cmOutput{res: scClassify(err)}
	var le *system.CacheLoadError
	switch {
	case err == nil:
		out.id = l.Value().id
		w.cache = append(w.cache, scCacheHeld{l: l, key: key})
	case out.res == resUnknown, errors.Is(err, system.ErrBusy), errors.As(err, &le):
		out.res = scClassify(err)
		if out.res != resUnknown {
			out.res = resRefused
		}
	default:
		c.rd.fail("worker %d: load %s: %T: %v", w.id, key, err, err)
	}
	c.rd.chist.add(w.id, call, cmInput{op: "load", key: key}, out, out.res == resUnknown)
}

func (c *scCache) release(w *scWorker, x scCacheHeld) {
	id := x.l.Value().id
	call := c.rd.chist.now()
	err := x.l.Release()
	w.calls++
	if err != nil {
		c.rd.fail("worker %d: release cache lease on %s: %v", w.id, x.key, err)
		return
	}
	c.rd.chist.add(w.id, call, cmInput{op: "release", key: x.key, id: id}, cmOutput{res: resOK}, false)
}

func (c *scCache) finish(w *scWorker) {
	for _, x := range w.cache {
		c.release(w, x)
	}
	w.cache = nil
}

// close closes the cache: every value a loader returned has been closed
// exactly once, and the cache charges nothing.
func (c *scCache) close(t *testing.T) {
	ctx := context.Background()
	require.NoError(t, c.c.Close(ctx), "cache close")
	st, err := c.c.Statistics(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.ReservedBytes, "the closed cache still charges bytes: %+v", st)
	assert.Equal(t, c.made.Load(), c.closes.Load(), "every value a loader returned is closed once the cache is closed")
	t.Logf("syscheck: cache: %d loads (%d waiting for room), %d values made, %d evictions", c.loads.Load(), c.waiting.Load(), c.made.Load(), st.Evictions)
}
