package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// MemoryBudget is the allocation side of a [Cache]: reservations for
// memory the application owns (a model's workspace, a loader's scratch,
// the allocations of a [LoadBudgeted] value) under the same location
// budget. A reservation may evict idle entries of the cache, never another
// reservation.
//
// A MemoryBudget refers to its cache weakly: values that hold it (a
// budgeted model charging its own growth) do not keep the cache alive, and
// there is no cache → value → budget → cache ownership cycle. Once the
// cache is closed (or unreachable) [MemoryBudget.Cache] returns nil and
// reservations still work, under the same ceiling, without eviction.
//
// Safe for concurrent use.
type MemoryBudget struct {
	rt    ownerRuntime
	loc   string
	owner string
	seq   *atomic.Uint64
	cache weak.Pointer[Cache]
	entry weak.Pointer[cacheEntry] // the budgeted entry whose loader got it (budgeted.go); zero: none
}

// Cache returns the live cache of this budget, or nil once it is closed
// or no longer referenced.
func (b *MemoryBudget) Cache() *Cache {
	c := b.cache.Value()
	if c == nil {
		return nil
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil
	}
	return c
}

// Location returns the location whose budget this is.
func (b *MemoryBudget) Location() string { return b.loc }

// Reserve reserves bytes (≥ 0) before the caller allocates them. When the
// budget is short it asks the runtime's controller for room, as a load
// does: the plan may evict idle entries (of this cache and others) and
// unprotected values at the location, in one order, never a
// reservation. A zero-byte reservation is allowed and charges nothing (it
// is not recorded in the ledger). Release the reservation when the memory
// is freed — including every alias and queued use of it.
//
// Errors: bytes < 0 ([*system.InvalidInputError]); more than the whole budget
// ([*system.BudgetError]); short with nothing idle to evict ([*system.CacheBusyError],
// errors.Is [system.ErrBusy]); callers waiting for room at the location
// ahead of it (a [*system.CacheBusyError] with Waiters: it does not take
// the room they wait for, unless it is part of a load, see docs/cache.md);
// [system.ErrClosed]; ctx.Err() (nothing reserved).
// Versions: 1 (0 for zero bytes), plus those of the plan's evictions.
func (b *MemoryBudget) Reserve(ctx context.Context, bytes int64) (*MemoryReservation, error) {
	if bytes < 0 {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("memory budget: bytes must be ≥ 0, got %d", bytes)}
	}
	r := &MemoryReservation{b: b}
	if bytes == 0 {
		if err := b.rt.Refusal(ctx); err != nil {
			return nil, err
		}
		return r, nil
	}
	if err := b.heldUp(ctx); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%s/budget#%d", b.owner, b.seq.Add(1))
	if err := admitCharge(ctx, b.Cache(), b.rt, b.loc, b.owner, "", name, bytes); err != nil {
		return nil, err
	}
	r.name, r.bytes = name, bytes
	if e := b.entry.Value(); e != nil {
		r.entry = b.entry
		e.allocAdded(name)
	}
	return r, nil
}

// ReservedBytes returns what the cache and its budget charge at the
// location: resident entries, loads in flight and live reservations (the
// same figure as [Stats].ReservedBytes). Versions: 0.
func (b *MemoryBudget) ReservedBytes(ctx context.Context) (int64, error) {
	ch, err := b.rt.Charges(ctx, b.loc, b.owner)
	return ch.OwnedBytes, err
}

// heldUp refuses a reservation (or a growth) that would take room that
// callers waiting at the budget's location, or at another member of its
// shared budget, wait for: a [*system.CacheBusyError] with Waiters, as
// for a load that does not wait (docs/semantics.md, "Waiting for room").
// A reservation that is part of a load is not held up: one made with the
// context of a loader of the cache (a waiting load's turn, or a load that
// looked at the waiters before it started), or through the budget of a
// [LoadBudgeted] entry still loading.
func (b *MemoryBudget) heldUp(ctx context.Context) error {
	if c := b.cache.Value(); c != nil && inLoader(ctx, c, "") {
		return nil
	}
	if e := b.entry.Value(); e != nil && e.loading() {
		return nil
	}
	if n := b.rt.WaitersAhead(budget.WaitSpec{Name: "memory budget", Locations: []string{b.loc}}); n > 0 {
		return &system.CacheBusyError{Location: b.loc, Waiters: n}
	}
	return nil
}

func (b *MemoryBudget) admit(ctx context.Context, total int64, try func(context.Context) error) error {
	c := b.Cache()
	err := c.admit(ctx, "", total, try)
	if be, ok := err.(*system.CacheBusyError); ok && be.Location == "" {
		be.Location = b.loc
	}
	return err
}

// MemoryReservation is a charge for memory the application owns. Keep it
// until that memory is really gone, then Release it. It does not belong to
// the cache: closing the cache leaves it in place.
type MemoryReservation struct {
	b        *MemoryBudget
	mu       sync.Mutex // serializes the ledger calls of Resize and Release
	name     string     // "" for a zero-byte reservation
	bytes    int64
	released bool
	entry    weak.Pointer[cacheEntry] // the budgeted entry it is a charge of (zero: none)
}

// Bytes returns the reserved bytes (0 once released).
func (r *MemoryReservation) Bytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes
}

// Name returns the reservation's name in snapshots and the trace ("" for
// a zero-byte reservation).
func (r *MemoryReservation) Name() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.name
}

// Resize changes the reservation to bytes (> 0), for memory that grows or
// shrinks in place. Shrinking is always admitted; growing is admitted like
// a reservation of the difference, evicting idle cache entries as
// [MemoryBudget.Reserve] does (and refused, as it is, while callers wait
// for room ahead of it). On error nothing changed. A zero-byte
// reservation cannot be resized (reserve anew). Versions: 1 (0 when the
// size does not change), plus 1 per eviction.
//
// Resize holds no lock of the reservation while it waits for an evicted
// entry's release, so that release may itself release this reservation
// (a budgeted value evicted, with its allocations, to make room for its
// own growth): Resize then fails with an [*system.InvalidInputError] saying the
// reservation was released meanwhile, and never waits on itself. An
// allocation of a [LoadBudgeted] value that a plan is evicting (nothing
// held the value) is a [*system.CacheBusyError] without Refusal until the
// value is leaving, then that InvalidInputError.
func (r *MemoryReservation) Resize(ctx context.Context, bytes int64) error {
	r.mu.Lock()
	switch {
	case r.released:
		r.mu.Unlock()
		return &budget.InvalidInputError{Message: fmt.Sprintf("memory reservation %q was released", r.name)}
	case r.name == "":
		r.mu.Unlock()
		return &budget.InvalidInputError{Message: "a zero-byte memory reservation cannot be resized; reserve anew"}
	case bytes <= 0:
		r.mu.Unlock()
		return &budget.InvalidInputError{Message: fmt.Sprintf("memory reservation %q: bytes must be positive, got %d (release it instead)", r.name, bytes)}
	case bytes == r.bytes:
		r.mu.Unlock()
		return nil
	}
	grows := bytes > r.bytes
	r.mu.Unlock()
	b := r.b
	if grows {
		if err := b.heldUp(ctx); err != nil {
			return err
		}
	}
	for {
		err := r.resizeOnce(ctx, bytes)
		var cb *budget.ChargeBusyError
		e := r.entry.Value()
		if e == nil || !errors.As(err, &cb) || cb.Charge != r.name {
			return err
		}
		// A plan is evicting the budgeted entry this is an allocation
		// of. Once the entry is leaving, its value's Close releases this
		// reservation: wait for that, then answer as for a reservation
		// released meanwhile. Before, the eviction may still be refused
		// (the entry taken again): busy, try again.
		if !e.retiring.Load() {
			return &system.CacheBusyError{Location: b.loc}
		}
		select {
		case <-e.released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// resizeOnce is one admission of Resize.
func (r *MemoryReservation) resizeOnce(ctx context.Context, bytes int64) error {
	b := r.b
	// Each attempt is one ledger call under the reservation's lock (its
	// outcome must be known to keep Bytes right, so it is not abandoned
	// midway); only the waits for evictions between attempts honour ctx,
	// and they hold no lock.
	return b.admit(ctx, bytes, func(context.Context) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		switch {
		case r.released:
			return &budget.InvalidInputError{Message: fmt.Sprintf("memory reservation %q was released while it was being resized", r.name)}
		case bytes == r.bytes:
			return nil
		}
		if err := b.rt.Resize(context.WithoutCancel(ctx), b.owner, r.name, bytes); err != nil {
			return err
		}
		r.bytes = bytes
		return nil
	})
}

// Release releases the reservation (1 version; 0 for zero bytes). Twice:
// [*system.InvalidInputError]. It does not take a context: the charge is released
// whatever the caller's state (after the runtime closed there is nothing
// left to release).
func (r *MemoryReservation) Release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return &budget.InvalidInputError{Message: fmt.Sprintf("memory reservation %q was already released", r.name)}
	}
	r.released = true
	if r.name != "" {
		err := r.b.rt.Unreserve(r.b.owner, r.name)
		if e := r.entry.Value(); e != nil {
			e.allocReleased(r.name)
		}
		if err != nil {
			return err
		}
	}
	r.bytes = 0
	return nil
}

// Close is Release, so that a reservation (or a value holding one) can be
// a cached value whose release hook frees its charge.
func (r *MemoryReservation) Close() error { return r.Release() }
