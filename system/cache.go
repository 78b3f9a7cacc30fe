package system

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// CacheOptions configures [System.NewCache].
type CacheOptions struct {
	// Location is the location whose budget the cache shares with every
	// other charge there (materializations, reservations, other caches).
	// Required.
	Location string
	// Name appears in the names of the cache's reservations (snapshots,
	// trace). Default "cache".
	Name string
}

// Cache is a loader cache bound to the budget of one location: values the
// application loads itself (model weights, corpora, anything the runtime
// does not copy), each loaded once per key and shared by every caller,
// charged in the ledger as reservations owned by the cache. See the
// package documentation ("Loader cache") for the rules; [Load],
// [LoadBudgeted], [Cache.Evict], [Cache.Budget], [Cache.Statistics] and
// [Cache.Close] for the calls.
//
// All methods and functions on a Cache are safe for concurrent use.
type Cache struct {
	sys   *System
	loc   string
	owner string // ledger owner of every charge of this cache
	// The location's budget (fixed for the runtime's life), for refusing
	// a peak that can never fit before looking the key up.
	hasBudget   bool
	budgetBytes int64
	seq         *atomic.Uint64 // reservation names (shared with the budget, which must not point into the cache)
	budget      *MemoryBudget

	mu        sync.Mutex // guards the fields below
	book      *budget.CacheBook[*cacheEntry]
	flights   map[*cacheFlight]struct{} // loads in flight
	reserving map[string]chan struct{}  // keys whose peak a caller is reserving; closed on its answer
	closed    bool
	busy      int             // reservations of loads, load and release goroutines running
	quiet     []chan struct{} // closed when busy drops to 0
	closeDone bool

	closeMu  sync.Mutex // serializes Close
	closeErr error

	// detachedLive counts entries Close drained whose release has not
	// run yet (still leased, so still charged).
	detachedLive atomic.Int64
}

// cacheEntry is one key's value and charge.
type cacheEntry struct {
	c      *Cache
	key    string
	box    any   // *T: the value, typed
	bytes  int64 // declared resident bytes (0: budgeted)
	charge string
	idle   func(any) bool
	flight *cacheFlight // set while loading

	refs     atomic.Int64 // leases, pins and keep-alives
	detached atomic.Bool  // drained by Close: the last reference retires it
	retiring atomic.Bool  // its release has started (once)
	released chan struct{}
}

// cacheFlight is one load in flight, shared by every caller of its key.
type cacheFlight struct {
	done   chan struct{}
	cancel context.CancelFunc
	// Guarded by Cache.mu.
	waiters   int
	finished  bool
	abandoned bool
	closing   bool // Close canceled it: a failure is ErrCacheClosed
	// Set before done is closed.
	err error
}

var cacheSeq atomic.Uint64

// NewCache creates a loader cache bound to opts.Location's budget. Nothing
// is charged until a load or a memory budget reservation. Errors: an
// empty, malformed ([*InvalidInputError]) or unconfigured
// ([*UnavailableError]) location; [ErrClosed].
func (s *System) NewCache(ctx context.Context, opts CacheOptions) (*Cache, error) {
	if opts.Location == "" {
		return nil, &budget.InvalidInputError{Message: "cache: a location is required"}
	}
	name := opts.Name
	if name == "" {
		name = "cache"
	}
	c := &Cache{
		sys:       s,
		loc:       opts.Location,
		owner:     fmt.Sprintf("%s%s#%d", budget.CacheOwnerPrefix, name, cacheSeq.Add(1)),
		seq:       new(atomic.Uint64),
		book:      budget.NewCacheBook[*cacheEntry](),
		flights:   map[*cacheFlight]struct{}{},
		reserving: map[string]chan struct{}{},
	}
	c.budget = &MemoryBudget{sys: s, loc: c.loc, owner: c.owner, seq: c.seq, cache: weak.Make(c)}
	ch, err := c.charges(ctx)
	if err != nil {
		return nil, err
	}
	c.hasBudget, c.budgetBytes = ch.HasBudget, ch.BudgetBytes
	return c, nil
}

// Location returns the location whose budget the cache shares.
func (c *Cache) Location() string { return c.loc }

// Owner returns the owner name of the cache's reservations, as snapshots
// and the trace show it.
func (c *Cache) Owner() string { return c.owner }

// Budget returns the cache's memory budget: reservations for allocations
// the application owns, under the same location budget, that may evict
// idle entries of this cache.
func (c *Cache) Budget() *MemoryBudget { return c.budget }

// ---- loading ---------------------------------------------------------------

// Load returns a lease on key's value, loading it first if it is not
// resident. Concurrent calls for one key share one load: the loader runs
// once and every caller gets the same value or the same error.
//
// A load reserves peak bytes at the cache's location before the loader
// runs — evicting idle entries, least recently used first, when the
// budget is short — and then shrinks the reservation to the resident bytes
// the loader reports, which must be > 0 and ≤ peak. The loader's context
// is the load's own: it is not canceled when one caller gives up, only
// when every caller waiting for the load has (or the cache closes).
//
// idle (nil: always idle) tells whether the value may be evicted once no
// lease, pin or keep-alive holds it; return false while device work that
// uses it is queued. It is evaluated under the cache's lock: keep it quick
// and do not call the cache from it. A value that implements
// interface{ Close() error } is closed when it leaves the cache (evicted,
// a load rolled back, the cache closed); its charge is released only after
// Close returns.
//
// A loader may load other keys of the cache with its context; one that
// would wait for its own load — loading its key again, directly or
// through the loaders it starts, or closing the cache — is refused with
// an [*InvalidInputError] (pass the loader's context along for this to
// be seen).
//
// Errors: peak ≤ 0, an empty key, a nil loader, or a key resident with a
// value of another type ([*InvalidInputError]); a peak larger than the
// whole budget ([*BudgetError], nothing evicted; checked before the
// lookup, so also for a resident key); a budget short with
// nothing idle to evict ([*CacheBusyError], errors.Is [ErrBusy]); a loader
// that failed, panicked or reported resident bytes ≤ 0 or above peak
// ([*CacheLoadError]: the reservation was released, a later Load retries);
// [ErrCacheClosed] (the cache is closed, or Close interrupted the load;
// it matches [ErrClosed]) or
// [ErrClosed] (the runtime is closed); ctx.Err() (the load carries on for
// the other callers).
//
// A refusal can come after evictions: making room evicts idle entries one
// at a time, least recently used first, retrying the reservation after
// each, so a [*CacheBusyError] may follow evictions that did happen (they
// are in the trace and in the statistics). A refusal is always the
// caller's own: a load can be joined only once its peak is reserved, and
// while a caller waits for the release of the entry it evicted, the key
// is not loading — another caller whose peak fits loads it, and the first
// joins that load when it looks again.
//
// Versions: a hit 0; a load 1, or 2 when the resident bytes are below
// peak; a failed load 2.
func Load[T any](ctx context.Context, c *Cache, key string, peak int64, idle func(T) bool, loader func(ctx context.Context) (T, int64, error)) (*CacheLease[T], error) {
	if loader == nil {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: loader is nil", key)}
	}
	if peak <= 0 {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: peak bytes must be positive, got %d", key, peak)}
	}
	return load(ctx, c, key, peak, idle, loader)
}

// LoadBudgeted is [Load] for a value whose storage is charged allocation by
// allocation: the loader receives the cache's [MemoryBudget] and reserves
// every allocation it owns through it (and keeps doing so when the value
// grows later, also while leased). The entry itself declares 0 bytes
// ([CacheLease.Bytes]); do not declare the same bytes again through Load.
// The value's Close must release its reservations.
//
// A loader that fails or panics must release what it reserved (defer the
// releases); the failure is a [*CacheLoadError] and a later call retries.
// Other errors and versions as for Load (the entry itself costs no
// version; each reservation costs its own).
func LoadBudgeted[T any](ctx context.Context, c *Cache, key string, idle func(T) bool, loader func(ctx context.Context, b *MemoryBudget) (T, error)) (*CacheLease[T], error) {
	if loader == nil {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: loader is nil", key)}
	}
	b := c.budget
	return load(ctx, c, key, 0, idle, func(ctx context.Context) (T, int64, error) {
		v, err := loader(ctx, b)
		return v, 0, err
	})
}

// load is Load and LoadBudgeted (peak 0).
//
// As in the seed, a load's peak is reserved before its flight exists: a
// caller that finds the key loading joins a load whose reservation is
// already made, so it never inherits another caller's refusal. The
// reservation is one ledger call made while the key is marked as being
// reserved (later callers of the key wait for its answer, then look
// again); a refusal leaves the key absent while the caller waits for the
// release of the idle entry it evicts, so that meanwhile another caller
// whose peak fits loads the key, and this one joins that load when it
// looks again.
func load[T any](ctx context.Context, c *Cache, key string, peak int64, idle func(T) bool, loader func(context.Context) (T, int64, error)) (*CacheLease[T], error) {
	if key == "" {
		return nil, &budget.InvalidInputError{Message: "cache key is empty"}
	}
	charge := "" // the name of this caller's reservation, made once for all its attempts
	for {
		if err := c.sys.refusal(ctx); err != nil {
			return nil, err
		}
		if c.hasBudget && peak > c.budgetBytes {
			// As in the seed, the peak is checked before the lookup: a
			// peak that can never fit is refused, resident or not.
			if c.isClosed() {
				return nil, c.closedErr()
			}
			return nil, c.tooLarge(ctx, peak)
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, c.closedErr()
		}
		e, state := c.book.Get(key)
		switch state {
		case budget.CacheReady:
			p, ok := e.box.(*T)
			if !ok {
				c.mu.Unlock()
				return nil, typeError[T](key, e.box)
			}
			e.refs.Add(1)
			c.mu.Unlock()
			return &CacheLease[T]{e: e, p: p}, nil
		case budget.CacheLoading:
			f := e.flight
			if f.abandoned {
				// Everyone who waited for it gave up and its context is
				// canceled: wait for it to settle, then look again.
				c.mu.Unlock()
				select {
				case <-f.done:
					continue
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			if inLoader(ctx, c, key) {
				c.mu.Unlock()
				return nil, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q is loaded by a loader that is itself loading it: it would wait for itself", key)}
			}
			f.waiters++
			c.mu.Unlock()
			return await[T](ctx, c, e, f)
		}
		if w, ok := c.reserving[key]; ok {
			// Another caller is asking the ledger for this key's peak:
			// wait for its answer (one round trip), then look again.
			c.mu.Unlock()
			select {
			case <-w:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		c.busy++ // the reservation, then the load goroutine
		if peak > 0 {
			w := make(chan struct{})
			c.reserving[key] = w
			c.mu.Unlock()
			if charge == "" {
				charge = c.chargeName(key)
			}
			err := c.reserve(ctx, charge, peak)
			c.mu.Lock()
			delete(c.reserving, key)
			close(w)
			if err != nil || c.closed {
				closed := c.closed
				c.mu.Unlock()
				if err == nil {
					c.unreserve(charge) // admitted as the cache closed
				}
				c.workDone()
				if closed {
					return nil, c.closedErr()
				}
				if err := c.makeRoom(ctx, key, peak, err); err != nil {
					return nil, err
				}
				continue
			}
		}
		// Still absent: the mark kept every other caller of the key out.
		e = &cacheEntry{c: c, key: key, charge: charge, released: make(chan struct{})}
		if idle != nil {
			e.idle = func(box any) bool { return idle(*box.(*T)) }
		}
		lctx, cancel := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), loadingKey{}, &loading{c: c, key: key, outer: loadingOf(ctx)}))
		f := &cacheFlight{done: make(chan struct{}), cancel: cancel, waiters: 1}
		e.flight = f
		if err := c.book.StartLoad(key, e); err != nil {
			c.mu.Unlock()
			cancel()
			panic(err) // the key was absent a moment ago, under the same lock
		}
		c.flights[f] = struct{}{}
		c.mu.Unlock()
		go runLoad(lctx, c, e, f, peak, loader)
		return await[T](ctx, c, e, f)
	}
}

// makeRoom answers a load's refused reservation: it evicts the least
// recently used idle entry and waits for its release (nil: look again),
// or returns the refusal (a [*CacheBusyError] when nothing is left to
// evict, ErrCacheClosed once the cache closed, ctx.Err()).
func (c *Cache) makeRoom(ctx context.Context, key string, peak int64, refusal error) error {
	var be *BudgetError
	if !errors.As(refusal, &be) || peak > be.BudgetBytes {
		return refusal
	}
	v := c.victim()
	if v == nil {
		if c.isClosed() {
			return c.closedErr()
		}
		return &CacheBusyError{Key: key, Location: be.Location, Refusal: be}
	}
	select {
	case <-v.released:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loading marks a loader's context: the key it loads, and the loads
// whose loaders started it (a loader that loads another key), so that a
// call that would wait for one of them — its own load — is refused
// instead of waiting forever.
type loading struct {
	c     *Cache
	key   string
	outer *loading
}

type loadingKey struct{}

func loadingOf(ctx context.Context) *loading {
	l, _ := ctx.Value(loadingKey{}).(*loading)
	return l
}

// inLoader says whether ctx is (derived from) the context of a loader of
// key in c, directly or through loaders it started; key "" matches any
// key of c.
func inLoader(ctx context.Context, c *Cache, key string) bool {
	for l := loadingOf(ctx); l != nil; l = l.outer {
		if l.c == c && (key == "" || l.key == key) {
			return true
		}
	}
	return false
}

// await waits for a shared load. A caller that gives up leaves the load
// to the others; the last one to give up cancels it.
func await[T any](ctx context.Context, c *Cache, e *cacheEntry, f *cacheFlight) (*CacheLease[T], error) {
	select {
	case <-f.done:
	case <-ctx.Done():
		c.mu.Lock()
		if !f.finished {
			f.waiters--
			if f.waiters == 0 {
				f.abandoned = true
				f.cancel()
			}
			c.mu.Unlock()
			return nil, ctx.Err()
		}
		c.mu.Unlock()
		// Finished meanwhile: this caller's share is already counted.
	}
	if f.err != nil {
		return nil, f.err
	}
	p, ok := e.box.(*T)
	if !ok {
		e.unref()
		return nil, typeError[T](e.key, e.box)
	}
	return &CacheLease[T]{e: e, p: p}, nil
}

func typeError[T any](key string, box any) error {
	have := reflect.TypeOf(box).Elem()
	return &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q holds a %s, not a %s", key, have, reflect.TypeFor[T]())}
}

// runLoad runs the loader of a load whose peak is reserved (e.charge),
// shrinks the charge and settles the flight.
func runLoad[T any](ctx context.Context, c *Cache, e *cacheEntry, f *cacheFlight, peak int64, loader func(context.Context) (T, int64, error)) {
	defer c.workDone()
	defer f.cancel()
	v, n, err := callLoader(ctx, e.key, loader)
	switch {
	case err != nil:
		// A value returned together with an error is not kept.
	case peak > 0 && (n <= 0 || n > peak):
		err = &CacheLoadError{Key: e.key, Cause: &budget.InvalidInputError{Message: fmt.Sprintf("loader reported %d resident bytes; want > 0 and ≤ the peak %d", n, peak)}}
	case peak > 0 && n < peak:
		err = c.resize(e.charge, n)
	}
	if err != nil {
		// Whatever the loader returned is closed before its charge is
		// released (a panic returned nothing; nor does a nil value).
		if !isZero(v) {
			closeValue(c, e.key, any(v))
		}
		if e.charge != "" {
			c.unreserve(e.charge)
		}
		c.settle(e, f, err)
		return
	}
	e.box, e.bytes = &v, n
	c.settle(e, f, nil)
}

// isZero says whether v is its type's zero value (a nil pointer, a nil
// interface): nothing to close.
func isZero[T any](v T) bool { return reflect.ValueOf(&v).Elem().IsZero() }

// callLoader runs the loader, turning an error or a panic into a
// *CacheLoadError.
func callLoader[T any](ctx context.Context, key string, loader func(context.Context) (T, int64, error)) (v T, n int64, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &CacheLoadError{Key: key, Panic: r, Stack: string(debug.Stack())}
		}
	}()
	v, n, err = loader(ctx)
	if err != nil {
		err = &CacheLoadError{Key: key, Cause: err}
	}
	return v, n, err
}

// settle ends a flight: the entry becomes ready (every waiter holds a
// reference) or leaves the book.
func (c *Cache) settle(e *cacheEntry, f *cacheFlight, err error) {
	c.mu.Lock()
	if err != nil && f.closing {
		// Its context was canceled by Close, not by any caller: its
		// callers, whose contexts are live, are told the cache closed.
		err = ErrCacheClosed
	}
	delete(c.flights, f)
	f.finished, f.err = true, err
	e.flight = nil
	if err != nil {
		_ = c.book.AbortLoad(e.key)
	} else {
		e.refs.Add(int64(f.waiters))
		_ = c.book.FinishLoad(e.key, e)
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
		var be *BudgetError
		if !errors.As(err, &be) {
			return err
		}
		if total > be.BudgetBytes {
			return err // it can never fit: nothing to evict for it
		}
		e := c.victim()
		if e == nil {
			return &CacheBusyError{Key: key, Location: be.Location, Refusal: be}
		}
		select {
		case <-e.released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// victim takes the least recently used evictable entry out of the book
// and starts its release. nil: none (or the cache is closed or nil).
func (c *Cache) victim() *cacheEntry {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	_, e, ok := c.book.Victim((*cacheEntry).evictable)
	if !ok {
		c.mu.Unlock()
		return nil
	}
	c.busy++
	c.mu.Unlock()
	e.retiring.Store(true)
	go func() {
		defer c.workDone()
		e.release()
	}()
	return e
}

// release closes the value, then releases its charge; released is closed
// once both are done.
func (e *cacheEntry) release() {
	if e.box != nil {
		closeValue(e.c, e.key, reflect.ValueOf(e.box).Elem().Interface())
	}
	if e.charge != "" {
		e.c.unreserve(e.charge)
	}
	if e.detached.Load() {
		e.c.detachedLive.Add(-1)
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
			c.sys.log.Error().Str("cache", c.owner).Str("key", key).Interface("panic", r).Msg("cached value's Close panicked; its charge is released")
		}
	}()
	if err := cl.Close(); err != nil {
		c.sys.log.Warn().Err(err).Str("cache", c.owner).Str("key", key).Msg("cached value's Close failed; its charge is released")
	}
}

// Evict removes key's entry if it is idle and neither leased, pinned, kept
// alive nor loading, and returns once its value is closed and its charge
// released (true). An absent key: false, nil. Otherwise a
// [*CacheBusyError] (errors.Is [ErrBusy]) and nothing changes. If ctx ends
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
		return false, &CacheBusyError{Key: key, Location: c.loc}
	}
	c.busy++
	c.mu.Unlock()
	e.retiring.Store(true)
	go func() {
		defer c.workDone()
		e.release()
	}()
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

// Close closes the cache: new loads and evictions get [ErrClosed]; loads
// in flight have their context canceled and are waited for; every entry
// that no lease, pin or keep-alive holds is released (its value closed,
// then its charge released), whether idle or not — a value's Close must
// wait for its own device work. An entry still held is released when its
// last lease, pin or keep-alive is. Reservations of the memory budget stay
// until their holders release them: the budget's ceiling outlives the
// cache. Close returns once all of that is done, or ctx.Err() (call it
// again to keep waiting). Idempotent once it returned nil. Called with
// the context of one of the cache's loaders it would wait for itself:
// [*InvalidInputError], nothing done.
func (c *Cache) Close(ctx context.Context) error {
	if inLoader(ctx, c, "") {
		return &budget.InvalidInputError{Message: "Close of a cache called from one of its loaders: it would wait for itself"}
	}
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	c.mu.Lock()
	if c.closeDone {
		c.mu.Unlock()
		return c.closeErr
	}
	c.closed = true
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
	c.mu.Lock()
	c.closeDone = true
	c.mu.Unlock()
	return nil
}

// ---- statistics --------------------------------------------------------------

// CacheStats is a cache's accounting at one moment.
type CacheStats struct {
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
	// Evictions counts entries evicted, for capacity or by Evict.
	Evictions uint64
	// LocationUsedBytes and LocationReservedBytes are the location's
	// figures, every owner's charges included.
	LocationUsedBytes     int64
	LocationReservedBytes int64
}

// Statistics returns the cache's figures: one round trip to the runtime
// for the charges (it never waits for a load), the entry counts from the
// cache. Versions: 0.
func (c *Cache) Statistics(ctx context.Context) (CacheStats, error) {
	ch, err := c.charges(ctx)
	if err != nil {
		return CacheStats{}, err
	}
	c.mu.Lock()
	n, ev := c.book.Len()+int(c.detachedLive.Load()), c.book.Evictions()
	c.mu.Unlock()
	return CacheStats{
		Location: ch.Location, HasBudget: ch.HasBudget, BudgetBytes: ch.BudgetBytes,
		ReservedBytes: ch.OwnedBytes, Resources: n, Evictions: ev,
		LocationUsedBytes: ch.UsedBytes, LocationReservedBytes: ch.ReservedBytes,
	}, nil
}

// ---- the ledger side -----------------------------------------------------------

func (c *Cache) chargeName(key string) string {
	return fmt.Sprintf("%s/%s#%d", c.owner, key, c.seq.Add(1))
}

func (c *Cache) charges(ctx context.Context) (budget.OwnerCharges, error) {
	return ownerCharges(ctx, c.sys, c.loc, c.owner)
}

func ownerCharges(ctx context.Context, s *System, loc, owner string) (budget.OwnerCharges, error) {
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.CacheCharges{Location: loc, Owner: owner, ReplyTo: p}
	}, nil)
	if err != nil {
		return budget.OwnerCharges{}, err
	}
	rep := r.(*messages.CacheChargesReply)
	return rep.Charges, rep.Err
}

func (c *Cache) reserve(ctx context.Context, name string, bytes int64) error {
	return reserveOwned(ctx, c.sys, c.loc, c.owner, name, bytes)
}

// reserveOwned admits an owned reservation. A reply that comes after the
// caller gave up is released at once (nobody holds it).
func reserveOwned(ctx context.Context, s *System, loc, owner, name string, bytes int64) error {
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.CacheReserve{Location: loc, Name: name, Owner: owner, Bytes: bytes, ReplyTo: p}
	}, func(m any) {
		if r, ok := m.(*messages.Reply); ok && r.Err == nil {
			s.root.Send(s.sup, &messages.CacheUnreserve{Name: name, Owner: owner})
		}
	})
	if err != nil {
		return err
	}
	return r.(*messages.Reply).Err
}

// resize and unreserve never give up: a charge must follow its value.
func (c *Cache) resize(name string, bytes int64) error {
	return resizeOwned(context.Background(), c.sys, c.owner, name, bytes)
}

func resizeOwned(ctx context.Context, s *System, owner, name string, bytes int64) error {
	return s.callErr(ctx, func(p *actor.PID) any {
		return &messages.CacheResize{Name: name, Owner: owner, Bytes: bytes, ReplyTo: p}
	})
}

func (c *Cache) unreserve(name string) {
	unreserveOwned(c.sys, c.owner, name)
}

// ErrCacheClosed is returned by calls on a closed cache (the runtime may
// still be running): loads and evictions after [Cache.Close], and a load
// that Close interrupted. errors.Is(err, [ErrClosed]) also holds.
var ErrCacheClosed error = cacheClosedError{}

type cacheClosedError struct{}

func (cacheClosedError) Error() string { return "residency: cache is closed" }

// Is matches [ErrClosed].
func (cacheClosedError) Is(target error) bool { return target == ErrClosed }

func (c *Cache) closedErr() error { return ErrCacheClosed }

func (c *Cache) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// tooLarge is the refusal of a request larger than the whole budget, with
// the location's figures now.
func (c *Cache) tooLarge(ctx context.Context, bytes int64) error {
	ch, err := c.charges(ctx)
	if err != nil {
		return err
	}
	return &BudgetError{Location: ch.Location, BudgetBytes: ch.BudgetBytes, UsedBytes: ch.UsedBytes, ReservedBytes: ch.ReservedBytes, RequestedBytes: bytes}
}

// unreserveOwned releases an owned reservation. After the runtime closed
// there is nothing to release (Close released every reservation).
func unreserveOwned(s *System, owner, name string) error {
	err := s.callErr(context.Background(), func(p *actor.PID) any {
		return &messages.CacheUnreserve{Name: name, Owner: owner, ReplyTo: p}
	})
	if errors.Is(err, ErrClosed) {
		return nil
	}
	if err != nil {
		s.log.Error().Err(err).Str("reservation", name).Msg("cache: releasing a charge failed")
	}
	return err
}
