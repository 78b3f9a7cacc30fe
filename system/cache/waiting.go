package cache

import (
	"context"
	"errors"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// Loads that wait for room in the runtime's wait queue (docs/cache.md,
// "Waiting for room").

// loadWaiting is load, waiting for room in the runtime's wait queue when
// opts ask for it and the load is refused as busy. A call that waits is
// tried first and queued only after a refusal (or at once when earlier
// waiters at its locations hold it up); a call that does not wait and
// needs room is refused while such waiters are queued (load).
func loadWaiting[T any](ctx context.Context, c *Cache, key string, peak int64, idle func(T) bool, loader func(context.Context) (T, int64, error), lo loadOptions) (Lease[T], error) {
	wc := lo.wait
	if !wc.Wait {
		lo.held = true // class 0
		return load(ctx, c, key, peak, idle, loader, lo)
	}
	spec := budget.WaitSpec{Name: key, Class: wc.Class, Locations: lo.split.waitLocations(c.loc), AllowBypass: wc.Bypass}
	if c.present(key) {
		// A hit or a load in flight needs no room: it never queues. (A
		// key that left meanwhile is refused as busy and queues below.)
		l, err := load(ctx, c, key, peak, idle, loader, lo)
		if !cacheWaitable(err) {
			return l, err
		}
	}
	if err := c.rt.Refusal(ctx); err != nil {
		return Lease[T]{}, err
	}
	var l Lease[T]
	var err error
	err = c.waitRoom(ctx, spec, wc.Notify, func() (bool, error) {
		l, err = load(ctx, c, key, peak, idle, loader, lo)
		return !cacheWaitable(err), err
	})
	if err != nil {
		return Lease[T]{}, err
	}
	return l, nil
}

// waitRoom is the runtime's wait for room of one of c's loads (each turn
// is try). The cache's Close ends it with [system.ErrCacheClosed], and
// waits for it to leave the runtime's queue (it counts as the cache's
// work, like a load in flight).
func (c *Cache) waitRoom(ctx context.Context, spec budget.WaitSpec, notify func(system.WaitState), try func() (bool, error)) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.closedErr()
	}
	c.busy++
	c.mu.Unlock()
	defer c.workDone()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.life, cancel)()
	err := c.rt.Wait(wctx, spec, notify, try)
	if errors.Is(err, context.Canceled) && ctx.Err() == nil && c.life.Err() != nil {
		return c.closedErr() // ended by Close, not by the caller
	}
	return err
}

// present says whether key is resident or loading.
func (c *Cache) present(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, state := c.book.Get(key)
	return state == budget.CacheReady || state == budget.CacheLoading
}

// cacheWaitable says whether a load's refusal may turn into a lease once
// room is made: the cache found nothing idle to evict, or the loader of a
// budgeted load did.
func cacheWaitable(err error) bool {
	var cb *system.CacheBusyError
	return errors.As(err, &cb)
}
