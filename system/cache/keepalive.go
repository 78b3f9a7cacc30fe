package cache

import (
	"context"
	"fmt"
	"time"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// Keep-alive, evict-when-idle and the entry cap of a loader cache: the
// runtime side. The decisions (what is due, what a cap evicts) are
// budget.CacheBook's; here are the clock, its one timer and the hooks the
// load path calls (all with Cache.mu held, named ...Locked).

// KeepForever is the keep-alive of an entry that never expires (any
// negative duration means the same): it stays until it is evicted for
// room, on request, or by the cache's Close. It is the default.
const KeepForever = budget.CacheKeepForever

// cacheKeep is a cache's keep-alive configuration and timer.
type cacheKeep struct {
	clock      Clock
	keepAlive  time.Duration // of a new entry
	maxEntries int
	// Guarded by Cache.mu.
	timer    ClockTimer // fires at timerAt; nil: none
	timerAt  time.Time
	timerGen uint64 // a callback of an older timer does nothing
}

// newCacheKeep validates the keep-alive options of opts.
func newCacheKeep(opts Options) (cacheKeep, error) {
	k := cacheKeep{clock: opts.Clock, keepAlive: KeepForever, maxEntries: opts.MaxEntries}
	if k.clock == nil {
		k.clock = RealClock{}
	}
	if opts.KeepAlive != nil {
		k.keepAlive = max(*opts.KeepAlive, KeepForever)
	}
	if opts.MaxEntries < 0 {
		return k, &budget.InvalidInputError{Message: fmt.Sprintf("cache: MaxEntries must be ≥ 0 (0: no cap), got %d", opts.MaxEntries)}
	}
	return k, nil
}

// LoadOption is an option of [Load] and [LoadBudgeted]: [WithKeepAlive],
// or [Wait] with the runtime's wait options.
type LoadOption interface {
	applyLoad(loadOptions) loadOptions // by value: a hit allocates nothing for its options
}

type loadOptions struct {
	keepAlive    time.Duration
	hasKeepAlive bool
	wait         system.WaitConfig // waiting for room (Wait)
	split        *splitLoad        // LoadSplit's parts (split.go); nil otherwise
	// held: a call that does not wait, held up as a waiter of heldClass
	// at its locations would be: one that needs room is refused while
	// waiters ahead of it are queued.
	held      bool
	heldClass int
	// LoadOn (anywhere.go): noEvict reserves only what fits as it is;
	// tie orders the locations of a tier.
	noEvict bool
	tie     Tie
}

func newLoadOptions(opts []LoadOption) loadOptions {
	var o loadOptions
	for _, f := range opts {
		if f != nil {
			o = f.applyLoad(o)
		}
	}
	return o
}

// WithKeepAlive sets the entry's keep-alive to d, replacing its own,
// longer or shorter (negative: [KeepForever]; 0: unload as soon as
// nothing holds it), as a server adopts each request's keep-alive. It
// applies whether the load hits, joins a load in flight or loads; of
// several requests the last to take the entry sets it. It works whatever
// the cache's own keep-alive ([Options].KeepAlive, whose default nil is
// KeepForever): that is only the keep-alive of an entry whose load had no
// WithKeepAlive.
func WithKeepAlive(d time.Duration) LoadOption { return keepAliveOption(d) }

// keepAliveOption is [WithKeepAlive]'s option.
type keepAliveOption time.Duration

func (d keepAliveOption) applyLoad(o loadOptions) loadOptions {
	o.keepAlive, o.hasKeepAlive = time.Duration(d), true
	return o
}

// Wait makes a load wait for room in the runtime's wait queue, as the
// options say ([system.WaitForRoom], [system.WaitClass],
// [system.WaitAllowBypass]); see [Load], "Waiting for room". Without a
// non-nil option it changes nothing.
func Wait(opts ...system.WaitOption) LoadOption { return waitOption(opts) }

// waitOption is [Wait]'s option.
type waitOption []system.WaitOption

func (w waitOption) applyLoad(o loadOptions) loadOptions {
	wc := o.wait
	for _, f := range w {
		if f != nil {
			f(&wc)
		}
	}
	o.wait = wc
	return o
}

// ---- hooks of the load path (Cache.mu held) -----------------------------------

// usedLocked: a caller took a lease on the ready entry e.
func (c *Cache) usedLocked(e *cacheEntry, o loadOptions) {
	now := c.ka.clock.Now()
	if o.hasKeepAlive {
		_ = c.book.SetKeepAlive(e.key, o.keepAlive) // the request's replaces the entry's
	}
	_ = c.book.UseSlot(e.slot, now)
	c.sweepLocked(now)
}

// startedLocked: a load of key started; the entry's keep-alive is the
// load's option, or the cache's.
func (c *Cache) startedLocked(key string, o loadOptions) {
	d := c.ka.keepAlive
	if o.hasKeepAlive {
		d = o.keepAlive
	}
	_ = c.book.SetKeepAlive(key, d)
	c.sweepLocked(c.ka.clock.Now())
}

// joinedLocked: a caller joins the load of key in flight.
func (c *Cache) joinedLocked(key string, o loadOptions) {
	if o.hasKeepAlive {
		_ = c.book.SetKeepAlive(key, o.keepAlive)
	}
}

// settledLocked: e's load finished and its waiters hold it.
func (c *Cache) settledLocked(e *cacheEntry) {
	now := c.ka.clock.Now()
	_ = c.book.Use(e.key, now)
	if e.refs.Load() == 0 { // every caller gave up: idle from now
		_ = c.book.Idle(e.key, now)
	}
	c.sweepLocked(now)
	if e.refs.Load() == 0 {
		c.offerLocked(e)
	}
}

// pendingKeysLocked counts the keys whose load is reserving its peak or
// asking the controller for room (c.mu held): each may become an entry.
func (c *Cache) pendingKeysLocked() int {
	n := len(c.reserving)
	for k := range c.admitting {
		if _, ok := c.reserving[k]; !ok {
			n++
		}
	}
	return n
}

// capRoomLocked makes room under the cache's entry cap for a load of key
// (absent and not being reserved). Returns as reserveLoad: c.mu held if
// neither again nor err, released otherwise. At the cap it evicts the
// least recently used evictable entry and waits for its release (again:
// look again); with nothing evictable it answers a [*system.CacheBusyError]
// whose MaxEntries is the cap.
func (c *Cache) capRoomLocked(ctx context.Context, key string) (again bool, err error) {
	_, e, out := c.book.MakeCapRoom(c.ka.maxEntries, c.pendingKeysLocked(), (*cacheEntry).evictable)
	switch out {
	case budget.CapFits:
		return false, nil
	case budget.CapFull:
		c.mu.Unlock()
		return false, &system.CacheBusyError{Key: key, Location: c.loc, MaxEntries: c.ka.maxEntries}
	}
	c.startReleaseLocked(e)
	c.armTimerLocked(c.ka.clock.Now())
	c.mu.Unlock()
	select {
	case <-e.released:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// ---- expiry --------------------------------------------------------------------

// idled: e's last lease, pin or keep-alive was released (e not drained by
// Close). Its keep-alive counts from now; a due entry goes.
func (e *cacheEntry) idled() {
	c := e.c
	c.mu.Lock()
	if c.closed || e.refs.Load() != 0 {
		c.mu.Unlock()
		return // taken again meanwhile (a Load holds c.mu to take it)
	}
	if e.slot.State() != budget.CacheReady {
		c.mu.Unlock()
		return // evicted meanwhile
	}
	now := c.ka.clock.Now()
	_ = c.book.IdleSlot(e.slot, now)
	c.sweepLocked(now)
	if !e.retiring.Load() { // after the sweep: an entry due is leaving
		c.offerReadyLocked(e) // ready: checked above, under the same lock
	}
	c.mu.Unlock()
}

// sweepLocked evicts every due entry the book finds evictable at now
// (their releases run on their own goroutines, as any eviction's) and
// sets the timer for the next expiry.
func (c *Cache) sweepLocked(now time.Time) {
	if c.closed {
		return
	}
	for _, d := range c.book.Due(now, (*cacheEntry).evictable) {
		c.startReleaseLocked(d.Item)
	}
	c.armTimerLocked(now)
}

// startReleaseLocked starts the release of an entry the book let go.
func (c *Cache) startReleaseLocked(e *cacheEntry) {
	c.busy++
	e.retiring.Store(true)
	go func() {
		defer c.workDone()
		e.release()
	}()
}

// armTimerLocked keeps one timer set for the book's earliest expiry: a
// timer due no later is kept (when it fires it sets the next one), an
// earlier expiry replaces it, no expiry stops it.
func (c *Cache) armTimerLocked(now time.Time) {
	next, ok := c.book.NextExpiry()
	if !ok {
		c.stopTimerLocked()
		return
	}
	if c.ka.timer != nil && !c.ka.timerAt.After(next) {
		return
	}
	c.stopTimerLocked()
	gen := c.ka.timerGen
	c.ka.timer = c.ka.clock.AfterFunc(next.Sub(now), func() { c.expire(gen) })
	c.ka.timerAt = next
}

func (c *Cache) stopTimerLocked() {
	if c.ka.timer != nil {
		c.ka.timer.Stop()
		c.ka.timer = nil
	}
	c.ka.timerGen++
}

// expire is the timer's callback.
func (c *Cache) expire(gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || gen != c.ka.timerGen {
		return
	}
	c.ka.timer = nil
	c.sweepLocked(c.ka.clock.Now())
}

// ---- evict when idle, evict idle, entries -------------------------------------------

// EvictWhenIdle marks key's entry to leave the cache as soon as it is
// idle: at once if nothing holds it and its idle predicate says so,
// otherwise when its last lease, pin or keep-alive is released (an entry
// still loading: once its callers release it). An entry whose predicate
// says busy at that moment goes at the next cache operation that finds
// it idle (the cache never polls the predicate). It does not wait: done
// is closed once the entry has left the cache — its value closed and its
// charge released, or its load failed — so a caller may wait for a busy
// victim with its own context. found is false (done nil) when the key has
// no entry. A Load of the key before the entry leaves still hits it (and
// does not clear the mark). Errors: [system.ErrCacheClosed]; ctx.Err() (nothing
// marked). Versions: 1 when the entry leaves (the release of its charge).
func (c *Cache) EvictWhenIdle(ctx context.Context, key string) (done <-chan struct{}, found bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, false, c.closedErr()
	}
	e, st := c.book.Peek(key)
	if st == budget.CacheAbsent {
		return nil, false, nil
	}
	c.book.MarkEvictWhenIdle(key)
	c.sweepLocked(c.ka.clock.Now())
	return e.released, true, nil
}

// EvictIdle evicts every entry that nothing holds and whose idle
// predicate says so, without closing the cache, and returns how many
// once their values are closed and their charges released. Loading and
// held entries stay. If ctx ends while the releases run, it returns the
// count and ctx.Err(), and the releases finish on their own. Errors:
// [system.ErrCacheClosed]. Versions: 1 per entry.
func (c *Cache) EvictIdle(ctx context.Context) (int, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, c.closedErr()
	}
	out := c.book.EvictAll((*cacheEntry).evictable)
	for _, e := range out {
		c.startReleaseLocked(e)
	}
	c.armTimerLocked(c.ka.clock.Now())
	c.mu.Unlock()
	for _, e := range out {
		select {
		case <-e.released:
		case <-ctx.Done():
			return len(out), ctx.Err()
		}
	}
	return len(out), nil
}

// EntryState is the state of a cache entry ([Entry].State).
type EntryState int

const (
	// EntryLoading: its load is in flight.
	EntryLoading EntryState = iota + 1
	// EntryReady: it is resident.
	EntryReady
)

// String is "loading" or "ready".
func (s EntryState) String() string {
	switch s {
	case EntryLoading:
		return "loading"
	case EntryReady:
		return "ready"
	}
	return "absent"
}

// entryState is the book's state as an entry's.
func entryState(s budget.CacheState) EntryState {
	if s == budget.CacheReady {
		return EntryReady
	}
	return EntryLoading
}

// Entry describes one entry of a cache ([Cache.Entries]).
type Entry struct {
	Key string
	// State is [EntryLoading] or [EntryReady].
	State EntryState
	// Bytes are the declared resident bytes (0 while loading, and for a
	// [LoadBudgeted] value).
	Bytes int64
	// Leases, Pins and KeepAlives count the references that hold it.
	Leases, Pins, KeepAlives int
	// LastUse is when a caller last took it or its last holder let it go
	// (zero while it loads).
	LastUse time.Time
	// KeepAlive is its keep-alive (negative: [KeepForever]; 0: unload
	// when idle).
	KeepAlive time.Duration
	// Expiry is when it leaves if nobody uses it before: zero while it is
	// held or loading, or kept forever. The keep-alive counts from the
	// release of its last holder.
	Expiry time.Time
	// EvictWhenIdle: marked to leave once idle ([Cache.EvictWhenIdle]).
	EvictWhenIdle bool
	// Parts are a [LoadSplit] entry's parts (Bytes is their sum); nil
	// for any other entry.
	Parts []Part
}

// Entries returns the cache's entries, ready and loading, ordered by key:
// a snapshot under the cache's lock (no runtime round trip; entries
// drained by Close are not listed). Reading changes nothing: an entry
// past its expiry is listed until its eviction runs.
func (c *Cache) Entries() []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	book := c.book.Entries()
	out := make([]Entry, 0, len(book))
	for _, b := range book {
		e := b.Item
		x := Entry{Key: b.Key, State: entryState(b.State), LastUse: b.LastUse, KeepAlive: b.KeepAlive, Expiry: b.Expiry, EvictWhenIdle: b.EvictWhenIdle, Parts: e.partsOf()}
		if b.State == budget.CacheReady {
			// Written before the entry became ready, under this lock.
			x.Bytes = e.bytes
			refs, pins, keeps := e.refs.Load(), e.pins.Load(), e.keeps.Load()
			x.Pins, x.KeepAlives = int(pins), int(keeps)
			x.Leases = int(max(refs-pins-keeps, 0))
		}
		out = append(out, x)
	}
	return out
}
