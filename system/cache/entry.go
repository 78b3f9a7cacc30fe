package cache

import (
	"context"
	"errors"
	"reflect"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// The life of a cache entry after its load: settling, releases, eviction
// and the cache's close.

// settle ends a flight: the entry becomes ready (every waiter holds a
// reference) or leaves the book.
func (c *Cache) settle(e *cacheEntry, f *cacheFlight, err error) {
	c.mu.Lock()
	if err != nil && f.closing {
		// Its context was canceled by Close, not by any caller: its
		// callers, whose contexts are live, are told the cache closed.
		err = system.ErrCacheClosed
	}
	delete(c.flights, f)
	f.finished, f.err = true, err
	e.flight = nil
	if err != nil {
		_ = c.book.AbortLoad(e.key)
		close(e.released) // it never was resident: EvictWhenIdle's wait ends
	} else {
		e.refs.Add(int64(f.waiters))
		e.uses += int64(f.waiters)
		_ = c.book.FinishLoad(e.key, e)
		if e.charge != "" {
			c.byCharge[e.charge] = e
			c.indexPartsLocked(e, true)
		}
		c.indexAllocsLocked(e, true)
		c.touchLocked(e) // taken by its callers
		c.settledLocked(e)
	}
	c.mu.Unlock()
	close(f.done)
}

// ---- eviction and release --------------------------------------------------

// evictable: no lease, pin or keep-alive, and idle. Called under c.mu.
func (e *cacheEntry) evictable() bool {
	if e.refs.Load() != 0 {
		return false
	}
	if e.idle == nil {
		return true
	}
	ok := false
	func() {
		defer func() { _ = recover() }() // a panicking predicate means busy
		ok = e.idle(e.box)
	}()
	return ok
}

// admit runs try (an admission at the cache's location of a charge that
// will hold total bytes) until it is admitted, evicting one idle entry per
// refusal. c may be nil (the cache is gone): no eviction.
func (c *Cache) admit(ctx context.Context, key string, total int64, try func(context.Context) error) error {
	for {
		err := try(ctx)
		var be *system.BudgetError
		if !errors.As(err, &be) {
			return err
		}
		if be.NeverFits(total) {
			return err // it can never fit: nothing to evict for it
		}
		e := c.victim((*cacheEntry).evictable)
		if e == nil {
			return &system.CacheBusyError{Key: key, Location: be.Location, Refusal: be}
		}
		select {
		case <-e.released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// victim takes the least recently used entry for which evictable holds
// out of the book and starts its release. nil: none (or the cache is
// closed or nil).
func (c *Cache) victim(evictable func(*cacheEntry) bool) *cacheEntry {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	_, e, ok := c.book.Victim(evictable)
	if !ok {
		c.mu.Unlock()
		return nil
	}
	c.startReleaseLocked(e)
	c.mu.Unlock()
	return e
}

// release closes the value, then releases its charge; released is closed
// once both are done.
func (e *cacheEntry) release() {
	e.closeBox()
	e.unreserveCharges("")
	e.gone()
}

// closeBox closes the entry's value, if it has one.
func (e *cacheEntry) closeBox() {
	if e.box != nil {
		closeValue(e.c, e.key, reflect.ValueOf(e.box).Elem().Interface())
	}
}

// gone ends the entry's release once its charge is released (by the
// cache, or by the runtime when the controller dropped it).
func (e *cacheEntry) gone() {
	c := e.c
	c.mu.Lock()
	if e.charge != "" && c.byCharge[e.charge] == e {
		delete(c.byCharge, e.charge)
	}
	c.indexPartsLocked(e, false)
	c.indexAllocsLocked(e, false)
	c.mu.Unlock()
	if e.detached.Load() {
		c.detachedLive.Add(-1)
	}
	close(e.released)
}

// unref drops one reference; the last one of an entry that Close drained
// retires it (on this goroutine: the caller's Release returns after the
// value's release work).
func (e *cacheEntry) unref() {
	n := e.refs.Add(-1)
	if n < 0 {
		panic("residency: cache entry released more often than referenced")
	}
	if n == 0 && e.detached.Load() && e.retiring.CompareAndSwap(false, true) {
		e.release()
		return
	}
	if n == 0 && !e.detached.Load() {
		e.idled() // its keep-alive starts; an entry due goes
	}
}

// closeValue runs a value's Close, if it has one. A panic or an error is
// logged: the charge is released all the same.
func closeValue(c *Cache, key string, v any) {
	cl, ok := v.(interface{ Close() error })
	if !ok {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			c.rt.Log().Error().Str("cache", c.owner).Str("key", key).Interface("panic", r).Msg("cached value's Close panicked; its charge is released")
		}
	}()
	if err := cl.Close(); err != nil {
		c.rt.Log().Warn().Err(err).Str("cache", c.owner).Str("key", key).Msg("cached value's Close failed; its charge is released")
	}
}

// Evict removes key's entry if it is idle and neither leased, pinned, kept
// alive nor loading, and returns once its value is closed and its charge
// released (true). An absent key: false, nil. Otherwise a
// [*system.CacheBusyError] (errors.Is [system.ErrBusy]) and nothing changes. If ctx ends
// while the release runs, Evict returns ctx.Err() and the release
// finishes on its own. Versions: 1 (the release of the charge).
func (c *Cache) Evict(ctx context.Context, key string) (bool, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false, c.closedErr()
	}
	e, out := c.book.Evict(key, (*cacheEntry).evictable)
	switch out {
	case budget.EvictAbsent:
		c.mu.Unlock()
		return false, nil
	case budget.EvictBusy:
		c.mu.Unlock()
		return false, &system.CacheBusyError{Key: key, Location: c.loc}
	}
	c.startReleaseLocked(e)
	c.sweepLocked(c.ka.clock.Now())
	c.mu.Unlock()
	select {
	case <-e.released:
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

func (c *Cache) workDone() {
	c.mu.Lock()
	c.busy--
	if c.busy == 0 {
		for _, ch := range c.quiet {
			close(ch)
		}
		c.quiet = nil
	}
	c.mu.Unlock()
}

// waitQuiet waits until no load or release goroutine runs.
func (c *Cache) waitQuiet(ctx context.Context) error {
	c.mu.Lock()
	if c.busy == 0 {
		c.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	c.quiet = append(c.quiet, ch)
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the cache: new loads and evictions get [system.ErrClosed]; loads
// in flight have their context canceled and are waited for, and so are
// loads waiting for room (they return [system.ErrCacheClosed]); every entry
// that no lease, pin or keep-alive holds is released (its value closed,
// then its charge released), whether idle or not — a value's Close must
// wait for its own device work. An entry still held is released when its
// last lease, pin or keep-alive is. Reservations of the memory budget stay
// until their holders release them: the budget's ceiling outlives the
// cache. Close returns once all of that is done, or ctx.Err() (call it
// again to keep waiting), also while it waits for another Close under
// way. Idempotent once it returned nil. Called with
// the context of one of the cache's loaders it would wait for itself:
// [*system.InvalidInputError], nothing done.
func (c *Cache) Close(ctx context.Context) error {
	if inLoader(ctx, c, "") {
		return &budget.InvalidInputError{Message: "Close of a cache called from one of its loaders: it would wait for itself"}
	}
	select {
	case c.closeTurn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err() // another Close is under way; nothing done
	}
	defer func() { <-c.closeTurn }()
	c.mu.Lock()
	if c.closeDone {
		c.mu.Unlock()
		return c.closeErr
	}
	c.closed = true
	c.endLife()         // loads waiting for room leave the queue (waitRoom)
	c.stopTimerLocked() // no expiry after Close
	if c.sp.stop != nil {
		c.sp.stop() // a Demote under way is told (spill.go)
	}
	for f := range c.flights {
		f.closing = true
		f.cancel()
	}
	c.mu.Unlock()
	if err := c.waitQuiet(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	drained := c.book.Drain()
	c.busy += len(drained)
	c.mu.Unlock()
	for _, e := range drained {
		c.detachedLive.Add(1) // before detached: its release decrements
		e.detached.Store(true)
		go func() {
			defer c.workDone()
			if e.refs.Load() == 0 && e.retiring.CompareAndSwap(false, true) {
				e.release()
			}
		}()
	}
	if err := c.waitQuiet(ctx); err != nil {
		return err
	}
	c.releaseCopies() // no load runs any more: no copy is taken
	c.mu.Lock()
	c.closeDone = true
	c.mu.Unlock()
	return nil
}

// ---- statistics --------------------------------------------------------------

// Stats is a cache's accounting at one moment.
type Stats struct {
	// Location and its budget (HasBudget false: no limit, no eviction for
	// capacity).
	Location    string
	HasBudget   bool
	BudgetBytes int64
	// ReservedBytes is what this cache charges there: resident entries'
	// bytes, the peaks of loads in flight, and its memory budget's
	// reservations (also those that outlive a closed cache).
	ReservedBytes int64
	// Resources counts ready and loading entries, and, after Close, the
	// entries still leased (charged until their last lease is released).
	Resources int
	// Evictions counts entries evicted: for room, for the entry cap, by
	// Evict, EvictIdle or EvictWhenIdle, or because their keep-alive ran
	// out.
	Evictions uint64
	// Expirations counts, of Evictions, the entries whose keep-alive ran
	// out, a keep-alive of 0 included (such an entry is unloaded as soon
	// as it is idle, and counted here).
	Expirations uint64
	// LocationUsedBytes and LocationReservedBytes are the location's
	// figures, every owner's charges included.
	LocationUsedBytes     int64
	LocationReservedBytes int64
	// Spill ([Options].Spill): Demoted counts the demoted copies kept now
	// at the spill target and DemotedBytes their bytes (charged there, not
	// in ReservedBytes); Demotions the entries demoted, DemotionFailures
	// those whose Demote failed (dropped), WarmStarts the loads handed a
	// demoted copy ([Demoted]).
	Demoted          int
	DemotedBytes     int64
	Demotions        uint64
	DemotionFailures uint64
	WarmStarts       uint64
}
