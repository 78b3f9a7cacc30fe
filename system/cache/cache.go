package cache

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// Options configures [New].
type Options struct {
	// Location is the location whose budget the cache shares with every
	// other charge there (materializations, reservations, other caches).
	// Required.
	Location string
	// Locations are the other locations a split load ([LoadSplit]) may
	// place parts at (nil: only Location). Each must be configured; an
	// empty one, a repeat or Location itself is an
	// [*system.InvalidInputError]. Everything else the cache does
	// (Statistics, the memory budget) stays at Location.
	Locations []string
	// Name names the cache in its runtime: its owner name is `cache "NAME"`
	// ([Cache.Owner]) and its charges are `cache "NAME"/KEY#N` (snapshots,
	// the trace, the ledger's messages). A name is unique in its runtime
	// for the runtime's life, also after the cache's Close (its charges
	// may outlive it): a second cache with a name already used is an
	// [*system.InvalidInputError]. Empty (the default): the runtime names
	// it "cache#N", with the first N free in that runtime.
	Name string

	// Keep-alive and the entry cap (see cache_keepalive.go).

	// KeepAlive is how long an entry stays once nothing holds it, counted
	// from the release of its last lease, pin or keep-alive and reset by
	// every use: 0 unloads it as soon as it is idle, a negative duration
	// keeps it until it is evicted for room or on request. nil (the
	// default) is [KeepForever]: entries stay until evicted. A [Load]'s
	// [WithKeepAlive] replaces it for its entry.
	KeepAlive *time.Duration
	// Clock is the time source of keep-alive (nil: [RealClock]).
	Clock Clock
	// MaxEntries caps the cache's entries, ready and loading (0: no cap;
	// negative: [*system.InvalidInputError]). A load of a new key at the cap
	// evicts the least recently used idle entry first, or answers a
	// [*system.CacheBusyError] (MaxEntries set) if none is idle.
	MaxEntries int

	// Spill (nil: none) opts the cache's idle entries into demotion: when
	// the controller picks one as a victim for room and the spill target
	// of Location ([system.Options].Spill) has room, the entry is demoted
	// there through Spill.Demote instead of dropped, and the next load of
	// its key gets the copy ([Demoted]). Set without a spill target for
	// Location, or without Demote: [*system.InvalidInputError].
	Spill *Spill

	// Frequency ranks the cache's idle entries as victims by use count
	// first: an entry's offer to the controller carries how many leases
	// were taken on it (priority H = L + uses, as a value's), so an entry
	// hit often outlives a more recent one. false (the default): every
	// entry carries the same frequency and the least recently taken idle
	// entry goes first (the last lease taken — a load or a hit — counts,
	// not the order of releases). See docs/cache.md, "Eviction".
	Frequency bool
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
	rt     ownerRuntime // the runtime's seam for owners of charges
	loc    string
	owner  string         // ledger owner of every charge of this cache
	seq    *atomic.Uint64 // reservation names (shared with the budget, which must not point into the cache)
	budget *MemoryBudget

	// locs is every location the cache may use, Location's included, with
	// its figures at New (split.go). Only its budgets are read (fixed for
	// the runtime's life: the location's and its shared budget's), to
	// refuse bytes that can never fit before asking the ledger.
	locs map[string]budget.OwnerCharges

	mu        sync.Mutex // guards the fields below
	book      *budget.CacheBook[*cacheEntry]
	flights   map[*cacheFlight]struct{} // loads in flight
	reserving map[string]chan struct{}  // keys whose peak a caller is reserving; closed on its answer
	admitting map[string]int            // keys whose load asks the controller for room, and how many callers
	closed    bool
	busy      int             // reservations of loads, load and release goroutines running
	quiet     []chan struct{} // closed when busy drops to 0
	closeDone bool

	// closeTurn serializes Close (one token): a Close waiting for its
	// turn honours its context.
	closeTurn chan struct{}
	// life ends when Close begins (endLife): it ends the waits for room
	// of the cache's loads (waitRoom).
	life     context.Context
	endLife  context.CancelFunc
	closeErr error

	// detachedLive counts entries Close drained whose release has not
	// run yet (still leased, so still charged).
	detachedLive atomic.Int64

	ka cacheKeep // keep-alive, its clock and timer, the entry cap (cache_keepalive.go)

	// Offered charges (victims.go), guarded by mu. byCharge: ready
	// entries with a charge of their own, by charge, until their release
	// ends. pending: entries whose offer changed since the runtime's last
	// drain (each once); notified: the runtime was told since then.
	byCharge map[string]*cacheEntry
	pending  []*cacheEntry
	notified bool
	dropHook func() // tests only (export_test.go): runs as a drop starts
	drains   int    // tests only (export_test.go): the runtime's drains of this cache

	sp cacheSpill // demotion of idle entries (spill.go)

	dropper dropper // the cache's callback for the runtime, as registered (victims.go)

	frequency bool // Options.Frequency: offers carry use counts
}

// cacheEntry is one key's value and charge.
type cacheEntry struct {
	c      *Cache
	key    string
	box    any   // *T: the value, typed
	bytes  int64 // declared resident bytes (0: budgeted)
	charge string
	idle   func(any) bool
	flight *cacheFlight        // set while loading
	split  *splitLoad          // a split entry's parts and charges (charge is the first); nil otherwise
	copyAt string              // a demoted copy's location (spill.go); "" for an entry of the book
	allocs map[string]struct{} // a budgeted entry's allocations, its charges (budgeted.go; guarded by Cache.mu)

	refs     atomic.Int64 // leases, pins and keep-alives
	pins     atomic.Int64 // of refs, the pins (for Entries)
	keeps    atomic.Int64 // of refs, the keep-alives (for Entries)
	detached atomic.Bool  // drained by Close: the last reference retires it
	retiring atomic.Bool  // its release has started (once)
	released chan struct{}

	// Its record in the book (guarded by Cache.mu): hits and releases
	// step it without a lookup by key.
	slot budget.CacheSlot[*cacheEntry]

	// Guarded by Cache.mu.
	uses    int64  // leases taken: the freq of its offers
	wants   bool   // idle (checked as it went idle): its charge is to be offered
	offered bool   // the ledger has its charge offered (as of the last drain)
	pending bool   // in Cache.pending
	seq     uint64 // order of its last change of offer (offerSeq)
	takeSeq uint64 // order of its last take (offerSeq)
	touched bool   // taken since the runtime's last drain
	taken   bool   // a demoted copy held by a load of its key (spill.go)
}

// cacheFlight is one load in flight, shared by every caller of its key.
type cacheFlight struct {
	done   chan struct{}
	cancel context.CancelFunc
	// Guarded by Cache.mu.
	waiters   int
	finished  bool
	abandoned bool
	closing   bool // Close canceled it: a failure is system.ErrCacheClosed
	// Set before done is closed.
	err error
}

// New creates a loader cache of the runtime sys bound to opts.Location's
// budget. Nothing is charged until a load or a memory budget reservation.
// Errors: a nil sys, an empty or malformed location, a negative
// MaxEntries, a name another cache of sys has
// ([*system.InvalidInputError]); an unconfigured location
// ([*system.UnavailableError]); [system.ErrClosed].
func New(ctx context.Context, sys *system.System, opts Options) (*Cache, error) {
	if sys == nil {
		return nil, &budget.InvalidInputError{Message: "cache: the runtime is nil"}
	}
	if opts.Location == "" {
		return nil, &budget.InvalidInputError{Message: "cache: a location is required"}
	}
	ka, err := newCacheKeep(opts)
	if err != nil {
		return nil, err
	}
	var rt ownerRuntime = sys.Owners()
	c := &Cache{
		ka:        ka,
		rt:        rt,
		loc:       opts.Location,
		seq:       new(atomic.Uint64),
		book:      budget.NewCacheBook[*cacheEntry](),
		flights:   map[*cacheFlight]struct{}{},
		reserving: map[string]chan struct{}{},
		admitting: map[string]int{},
		byCharge:  map[string]*cacheEntry{},
		closeTurn: make(chan struct{}, 1),
		frequency: opts.Frequency,
	}
	c.life, c.endLife = context.WithCancel(context.Background())
	// The location is checked before the name is taken: a cache refused
	// for its location leaves its name free.
	ch, err := rt.Charges(ctx, c.loc, ownerName(opts.Name))
	if err != nil {
		return nil, err
	}
	if c.locs, err = allowedLocations(ctx, rt, opts, ch); err != nil {
		return nil, err
	}
	if c.sp, err = newSpill(opts, rt.SpillTarget); err != nil {
		return nil, err
	}
	c.dropper = dropper{weak.Make(c)}
	if c.owner, err = claimOwner(rt, opts.Name, c.dropper); err != nil {
		return nil, err
	}
	c.budget = &MemoryBudget{rt: rt, loc: c.loc, owner: c.owner, seq: c.seq, cache: weak.Make(c)}
	closeOnRuntimeClose(sys, c)
	return c, nil
}

// ownerName is the owner name in the ledger of a cache named name:
// `cache "NAME"` (the name Go-quoted). Its charges are named
// OWNER/KEY#N, its memory budget's reservations OWNER/budget#N.
func ownerName(name string) string { return budget.CacheOwnerPrefix + strconv.Quote(name) }

// claimOwner claims the owner name of a cache named name in its runtime;
// an empty name gets the first free "cache#N".
func claimOwner(rt ownerRuntime, name string, d dropper) (string, error) {
	if name != "" {
		if !rt.Register(ownerName(name), d) {
			return "", &budget.InvalidInputError{Message: fmt.Sprintf("cache name %q is taken: another cache of this runtime has it (names stay taken after Close)", name)}
		}
		return ownerName(name), nil
	}
	for {
		if o := ownerName(fmt.Sprintf("cache#%d", rt.Seq())); rt.Register(o, d) {
			return o, nil
		}
	}
}

// Location returns the location whose budget the cache shares.
func (c *Cache) Location() string { return c.loc }

// Owner returns the owner name of the cache's reservations, as snapshots
// and the trace show it: `cache "NAME"`, its name Go-quoted.
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
// runs and then shrinks the reservation to the resident bytes the loader
// reports, which must be > 0 and ≤ peak. When the budget is short it asks
// the runtime's controller for room: the plan may evict idle entries
// (this cache's and other caches', least recently taken first unless
// [Options].Frequency) and unprotected values at the location, in one
// order, all or nothing — a refused load evicts nothing. The loader's
// context is the load's own: it is not canceled when one caller gives
// up, only when every caller waiting for the load has (or the cache
// closes).
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
// an [*system.InvalidInputError] (pass the loader's context along for this to
// be seen).
//
// Errors: peak ≤ 0, an empty key, a nil loader, or a key resident with a
// value of another type, or a peak that would overflow the byte accounting
// of a location without a budget ([*system.InvalidInputError]); a peak larger than the
// whole budget ([*system.BudgetError], nothing evicted; checked before the
// lookup, so also for a resident key); a budget short with
// nothing idle to evict ([*system.CacheBusyError], errors.Is [system.ErrBusy]); a loader
// that failed, panicked or reported resident bytes ≤ 0 or above peak
// ([*system.CacheLoadError]: the reservation was released, a later Load retries);
// [system.ErrCacheClosed] (the cache is closed, or Close interrupted the load;
// it matches [system.ErrClosed]) or
// [system.ErrClosed] (the runtime is closed); ctx.Err() (the load carries on for
// the other callers).
//
// A refusal is always the caller's own: a load can be joined only once
// its peak is reserved. While a caller waits for the Close of the entries
// its plan evicts, the key is not loading: another caller whose peak fits
// loads it meanwhile, and the first, once admitted, gives its reservation
// back and takes a lease on that load.
//
// Options: [WithKeepAlive] sets the entry's keep-alive (replacing its own). With
// [Options].MaxEntries set, a load of a new key at the cap first
// evicts the least recently used idle entry (waiting for its release);
// with none idle it is a [*system.CacheBusyError] whose MaxEntries is the cap.
//
// Waiting for room: with [Wait] and a [system.WaitOption]
// ([system.WaitForRoom], [system.WaitClass], [system.WaitAllowBypass]) a
// [*system.CacheBusyError] does not return: the caller joins
// the runtime's wait queue (shared with [system.System.Admit], at the cache's
// location) and looks again, from the start, each time room may have
// been made — a lease, pin or keep-alive of a cache entry released, or an
// exit, release, eviction, discard or unreserve in the runtime. It
// returns a lease, another error, ctx.Err() (leaving nothing behind),
// or [system.ErrClosed] when the runtime closes; a full queue refuses at once
// with a [*system.QueueFullError] (errors.Is [system.ErrBusy]). A hit, or a key
// already loading, never queues. An entry whose idle function turns true on its own (device work
// finished) wakes no waiter until the next such event.
//
// Versions: a hit 0; a load 1, or 2 when the resident bytes are below
// peak; a failed load 2.
func Load[T any](ctx context.Context, c *Cache, key string, peak int64, idle func(T) bool, loader func(ctx context.Context) (T, int64, error), opts ...LoadOption) (Lease[T], error) {
	if loader == nil {
		return Lease[T]{}, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: loader is nil", key)}
	}
	if peak <= 0 {
		return Lease[T]{}, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: peak bytes must be positive, got %d", key, peak)}
	}
	return loadWaiting(ctx, c, key, peak, idle, loader, newLoadOptions(opts))
}

// LoadBudgeted is [Load] for a value whose storage is charged allocation by
// allocation: the loader receives a [MemoryBudget] of the cache bound to
// the entry and reserves every allocation it owns through it (and keeps
// doing so when the value grows later, also while leased). Those
// reservations are the entry's charges: once it is idle they are offered
// to the controller together, and an eviction of any of them drops the
// entry (its value's Close releases them). The entry itself declares 0 bytes
// ([Lease.Bytes]); do not declare the same bytes again through Load.
// The value's Close must release its reservations.
//
// A loader that fails or panics must release what it reserved (defer the
// releases); the failure is a [*system.CacheLoadError] and a later call retries.
// Other errors, versions, keep-alive and waiting (opts) as for Load (the
// entry itself costs no version; each reservation costs its own). A
// loader refused by its memory budget should return the [*system.CacheBusyError]
// it got (wrapped or not) for the caller to wait.
func LoadBudgeted[T any](ctx context.Context, c *Cache, key string, idle func(T) bool, loader func(ctx context.Context, b *MemoryBudget) (T, error), opts ...LoadOption) (Lease[T], error) {
	if loader == nil {
		return Lease[T]{}, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: loader is nil", key)}
	}
	return loadWaiting(ctx, c, key, 0, idle, func(ctx context.Context) (T, int64, error) {
		b := c.budget
		if l := loadingOf(ctx); l != nil && l.c == c && l.entry != nil {
			b = c.entryBudget(l.entry) // its reservations are the entry's charges
		}
		v, err := loader(ctx, b)
		return v, 0, err
	}, newLoadOptions(opts))
}

// load is Load, LoadBudgeted (peak 0) and LoadSplit (peak 0, o.split).
//
// Seed 001's reservation rule: a load's peak is reserved before its
// flight exists, so a caller that finds the key loading joins a load
// whose reservation is already made and never inherits another caller's
// refusal. The
// reservation is one ledger call made while the key is marked as being
// reserved (later callers of the key wait for its answer, then look
// again); a refusal leaves the key absent while the caller waits for the
// release of the idle entry it evicts, so that meanwhile another caller
// whose peak fits loads the key, and this one joins that load when it
// looks again.
func load[T any](ctx context.Context, c *Cache, key string, peak int64, idle func(T) bool, loader func(context.Context) (T, int64, error), o loadOptions) (Lease[T], error) {
	if key == "" {
		return Lease[T]{}, &budget.InvalidInputError{Message: "cache key is empty"}
	}
	var specs []budget.ReservationSpec // this caller's reservations, named once for all its attempts
	charge := ""                       // the entry's charge (a split entry's first)
	for {
		if err := c.rt.Refusal(ctx); err != nil {
			return Lease[T]{}, err
		}
		if c.locs[c.loc].TooLarge(peak) != nil {
			// Seed 001's peak rule: the peak is checked before the
			// lookup, so a peak that can never fit is refused, resident
			// or not.
			if c.isClosed() {
				return Lease[T]{}, c.closedErr()
			}
			return Lease[T]{}, c.tooLarge(ctx, peak)
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return Lease[T]{}, c.closedErr()
		}
		e, state := c.book.Get(key)
		switch state {
		case budget.CacheReady:
			p, ok := e.box.(*T)
			if !ok {
				c.mu.Unlock()
				return Lease[T]{}, typeError[T](key, e.box)
			}
			e.refs.Add(1)
			e.uses++
			c.withdrawLocked(e) // recorded; drained before the next ledger step
			c.touchLocked(e)
			c.usedLocked(e, o) // keep-alive hook
			c.mu.Unlock()
			return newLease(e, p), nil
		case budget.CacheLoading:
			c.joinedLocked(key, o) // keep-alive hook
			l, again, err := joinLoad[T](ctx, c, e, key)
			if again {
				continue
			}
			return l, err
		}
		if w, ok := c.reserving[key]; ok {
			// Another caller is asking the ledger for this key's peak:
			// wait for its answer (one round trip), then look again.
			c.mu.Unlock()
			select {
			case <-w:
				continue
			case <-ctx.Done():
				return Lease[T]{}, ctx.Err()
			}
		}
		if o.held {
			// A call that needs room does not pass the waiters it would
			// queue behind (a miss: its spec costs nothing on a hit).
			spec := budget.WaitSpec{Name: key, Class: o.heldClass, Locations: o.split.waitLocations(c.loc)}
			if n := c.rt.WaitersAhead(spec); n > 0 {
				c.mu.Unlock()
				return Lease[T]{}, &system.CacheBusyError{Key: key, Location: spec.Locations[0], Waiters: n}
			}
		}
		if again, err := c.capRoomLocked(ctx, key); again || err != nil { // entry cap hook
			if err != nil {
				return Lease[T]{}, err
			}
			continue
		}
		c.busy++ // the reservation, then the load goroutine
		if specs == nil {
			if specs = c.loadSpecs(key, peak, o.split); specs != nil {
				charge = specs[0].Name
			}
		}
		if specs != nil {
			// Still absent when it returns: no other caller loaded the
			// key meanwhile.
			if again, err := c.reserveLoad(ctx, key, specs, o.noEvict); again || err != nil {
				if err != nil {
					return Lease[T]{}, err
				}
				continue
			}
		}
		return startLoad(ctx, c, key, charge, peak, idle, loader, o)
	}
}

// startLoad starts the load of key, absent, whose charge is reserved
// (c.mu held; released on return), and waits for it as its first caller.
func startLoad[T any](ctx context.Context, c *Cache, key, charge string, peak int64, idle func(T) bool, loader func(context.Context) (T, int64, error), o loadOptions) (Lease[T], error) {
	e := &cacheEntry{c: c, key: key, charge: charge, split: o.split, released: make(chan struct{})}
	if idle != nil {
		e.idle = func(box any) bool { return idle(*box.(*T)) }
	}
	warm := c.takeCopyLocked(key) // a demoted copy for the loader (spill.go)
	lctx, cancel := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), loadingKey{}, &loading{c: c, key: key, outer: loadingOf(ctx), warm: warm, entry: e}))
	f := &cacheFlight{done: make(chan struct{}), cancel: cancel, waiters: 1}
	e.flight = f
	var err error
	if e.slot, err = c.book.StartLoadSlot(key, e); err != nil {
		c.mu.Unlock()
		cancel()
		panic(err) // the key was absent a moment ago, under the same lock
	}
	c.flights[f] = struct{}{}
	c.startedLocked(key, o) // keep-alive hook
	c.mu.Unlock()
	go runLoad(lctx, c, e, f, peak, loader)
	return await[T](ctx, c, e, f)
}

// joinLoad joins the load in flight of key (c.mu held; released on
// return). again: the load was abandoned and has settled, look again.
func joinLoad[T any](ctx context.Context, c *Cache, e *cacheEntry, key string) (l Lease[T], again bool, err error) {
	f := e.flight
	if f.abandoned {
		// Everyone who waited for it gave up and its context is canceled:
		// wait for it to settle, then look again.
		c.mu.Unlock()
		select {
		case <-f.done:
			return Lease[T]{}, true, nil
		case <-ctx.Done():
			return Lease[T]{}, false, ctx.Err()
		}
	}
	if inLoader(ctx, c, key) {
		c.mu.Unlock()
		return Lease[T]{}, false, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q is loaded by a loader that is itself loading it: it would wait for itself", key)}
	}
	f.waiters++
	c.mu.Unlock()
	l, err = await[T](ctx, c, e, f)
	return l, false, err
}

// reserveLoad reserves a load's peak (a split load's parts: all or none)
// for key (c.mu held on entry; on return held if neither again nor err,
// released otherwise). First it reserves without evicting anything,
// while the key is marked as being reserved (one round trip: later
// callers of the key wait for its answer, then look again). If that is
// refused it asks the controller for room (admitCharges: evicting
// unprotected values and offered idle entries, this cache's and other
// caches', in one order) with the key unmarked, so that while this
// caller waits for its victims' Close another caller of the key whose
// peak fits loads it. Admitted, it finds the key still absent (nil, c.mu
// held) or loaded meanwhile: it gives its reservation back and looks
// again (again). A refusal is a *system.CacheBusyError, or another error.
// noEvict: no request for room, the refusal to reserve is the answer. A
// split load of several parts asks the controller at once, all parts in
// one request, with the key marked throughout.
func (c *Cache) reserveLoad(ctx context.Context, key string, specs []budget.ReservationSpec, noEvict bool) (again bool, err error) {
	w := make(chan struct{})
	c.reserving[key] = w
	c.mu.Unlock()
	if len(specs) > 1 {
		// A split load's parts are one request, so that no part is
		// ever reserved while another cannot be: marked throughout.
		err = admitCharges(ctx, c, c.rt, key, specs)
	} else {
		err = c.reserveNow(ctx, specs)
	}
	c.mu.Lock()
	delete(c.reserving, key)
	close(w)
	var be *system.BudgetError
	if errors.As(err, &be) && noEvict {
		err = &system.CacheBusyError{Key: key, Location: be.Location, Refusal: be} // asked not to evict
	} else if errors.As(err, &be) && len(specs) == 1 && !c.closed {
		c.admitting[key]++ // counted against the entry cap meanwhile
		c.mu.Unlock()
		err = admitCharges(ctx, c, c.rt, key, specs)
		c.mu.Lock()
		if c.admitting[key]--; c.admitting[key] == 0 {
			delete(c.admitting, key)
		}
	}
	if err == nil && !c.closed {
		if _, st := c.book.Peek(key); st == budget.CacheAbsent {
			return false, nil
		}
		// Another caller loaded the key while this one made room.
		c.mu.Unlock()
		for _, s := range specs {
			c.unreserve(s.Name)
		}
		c.workDone()
		return true, nil
	}
	closed := c.closed
	c.mu.Unlock()
	if err == nil {
		for _, s := range specs {
			c.unreserve(s.Name) // admitted as the cache closed
		}
	}
	c.workDone()
	if closed {
		return false, c.closedErr()
	}
	return false, err
}

// reserveNow reserves a load's one charge as the budget is, evicting
// nothing (a refusal is the ledger's *system.BudgetError).
func (c *Cache) reserveNow(ctx context.Context, specs []budget.ReservationSpec) error {
	s := specs[0]
	return c.rt.Reserve(ctx, s.Location, s.Owner, s.Name, s.Bytes)
}

// loading marks a loader's context: the key it loads, and the loads
// whose loaders started it (a loader that loads another key), so that a
// call that would wait for one of them — its own load — is refused
// instead of waiting forever.
type loading struct {
	c     *Cache
	key   string
	outer *loading
	warm  *cacheEntry // the key's demoted copy, taken for this load (spill.go)
	entry *cacheEntry // the entry being loaded
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
func await[T any](ctx context.Context, c *Cache, e *cacheEntry, f *cacheFlight) (Lease[T], error) {
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
			return Lease[T]{}, ctx.Err()
		}
		c.mu.Unlock()
		// Finished meanwhile: this caller's share is already counted.
	}
	if f.err != nil {
		return Lease[T]{}, f.err
	}
	p, ok := e.box.(*T)
	if !ok {
		e.unref()
		return Lease[T]{}, typeError[T](e.key, e.box)
	}
	return newLease(e, p), nil
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
		err = &system.CacheLoadError{Key: e.key, Cause: &budget.InvalidInputError{Message: fmt.Sprintf("loader reported %d resident bytes; want > 0 and ≤ the peak %d", n, peak)}}
	case peak > 0 && n < peak:
		err = c.resize(e.charge, n)
	}
	if err == nil && c.interrupted(f) {
		// Close canceled the load's context: the value is not kept,
		// whether or not the loader heeded the cancellation, and its
		// callers are told the cache closed (settle).
		err = system.ErrCacheClosed
	}
	if l := loadingOf(ctx); l != nil && l.c == c && l.key == e.key {
		c.settleCopy(l.warm, err == nil) // before the entry is ready: one copy of a key at a time
	}
	if err != nil {
		c.rt.LoadFailed(c.owner, c.loc, e.key, peak, err)
		// Whatever the loader returned is closed before its charge is
		// released (a panic returned nothing; nor does a nil value).
		if !isZero(v) {
			closeValue(c, e.key, any(v))
		}
		e.unreserveCharges("")
		c.settle(e, f, err)
		return
	}
	e.box, e.bytes = &v, n
	c.settle(e, f, nil)
}

// interrupted says whether the cache's Close canceled f's load.
func (c *Cache) interrupted(f *cacheFlight) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return f.closing
}

// isZero says whether v is its type's zero value (a nil pointer, a nil
// interface): nothing to close.
func isZero[T any](v T) bool { return reflect.ValueOf(&v).Elem().IsZero() }

// callLoader runs the loader, turning an error, a panic or a
// runtime.Goexit (see guarded) into a *system.CacheLoadError.
func callLoader[T any](ctx context.Context, key string, loader func(context.Context) (T, int64, error)) (v T, n int64, err error) {
	if panicked, r, stack := guarded(func() { v, n, err = loader(ctx) }); panicked {
		var zero T
		return zero, 0, &system.CacheLoadError{Key: key, Panic: r, Stack: stack}
	}
	if err != nil {
		err = &system.CacheLoadError{Key: key, Cause: err}
	}
	return v, n, err
}

// Statistics returns the cache's figures: one round trip to the runtime
// for the charges (it never waits for a load), the entry counts from the
// cache. Versions: 0.
func (c *Cache) Statistics(ctx context.Context) (Stats, error) {
	ch, err := c.charges(ctx)
	if err != nil {
		return Stats{}, err
	}
	c.mu.Lock()
	n, ev, ex := c.book.Len()+int(c.detachedLive.Load()), c.book.Evictions(), c.book.Expirations()
	sp := c.sp
	d, db := len(sp.copies), int64(0)
	for _, cp := range sp.copies {
		db += cp.bytes
	}
	c.mu.Unlock()
	return Stats{
		Location: ch.Location, HasBudget: ch.HasBudget, BudgetBytes: ch.BudgetBytes,
		ReservedBytes: ch.OwnedBytes, Resources: n, Evictions: ev, Expirations: ex,
		LocationUsedBytes: ch.UsedBytes, LocationReservedBytes: ch.ReservedBytes,
		Demoted: d, DemotedBytes: db, Demotions: sp.demotions, DemotionFailures: sp.failures, WarmStarts: sp.warm,
	}, nil
}
