package cache

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/budget"
)

// Lease is a lease on a cached value: while any lease, [Pin] or
// [KeepAlive] of an entry is held, the entry is never evicted. A
// lease may outlive its cache (see [Cache.Close]). Release it when done;
// Go has no destructors, so a forgotten lease keeps the entry and its
// charge until the runtime closes.
//
// A Lease is a small value, not a pointer: a hit allocates nothing.
// Copies of a lease are the same lease: releasing one releases it, and
// a Release through another copy afterwards is a double release. The
// zero Lease (what a load that fails returns) is no lease: its Release
// is an [*system.InvalidInputError], Value returns T's zero value, Key ""
// and Bytes 0.
//
// Value returns the value the loader produced. For values that are
// mutated or must not be copied, cache a pointer type.
type Lease[T any] struct {
	e   *cacheEntry
	p   *T
	r   *leaseRec // whether it is released: while r's generation is gen, it is not
	gen uint64
}

// leaseRec records whether the lease that holds it (and every copy of
// that lease) is released: the lease is held while the record's
// generation is the lease's. Release moves the generation on and hands
// the record back to leaseRecs, for a later lease with the new
// generation, so that a stale copy's Release or Clone still sees a
// released lease.
type leaseRec struct{ gen atomic.Uint64 }

var leaseRecs = sync.Pool{New: func() any { return new(leaseRec) }}

func newLease[T any](e *cacheEntry, p *T) Lease[T] {
	r := leaseRecs.Get().(*leaseRec)
	return Lease[T]{e: e, p: p, r: r, gen: r.gen.Load()}
}

// Value returns the cached value. It stays valid while the lease (or a
// pin or keep-alive of the entry) is held.
func (l Lease[T]) Value() T {
	if l.p == nil {
		var zero T
		return zero
	}
	return *l.p
}

// Key returns the entry's key.
func (l Lease[T]) Key() string {
	if l.e == nil {
		return ""
	}
	return l.e.key
}

// Bytes returns the declared resident bytes: what the loader of [Load]
// reported, 0 for [LoadBudgeted] (whose allocations are charged one by
// one through the memory budget).
func (l Lease[T]) Bytes() int64 {
	if l.e == nil {
		return 0
	}
	return l.e.bytes
}

// Clone returns another lease on the same entry, released on its own.
// Cloning a released lease (or the zero Lease) panics (a use after
// release).
func (l Lease[T]) Clone() Lease[T] {
	l.ref("Clone")
	return newLease(l.e, l.p)
}

// Pin returns a pin that keeps the entry resident after this lease (and
// every other) is released, until the pin is released. Pinning a
// released lease (or the zero Lease) panics.
func (l Lease[T]) Pin() *Pin {
	l.ref("Pin")
	l.e.pins.Add(1)
	return &Pin{cacheRef{e: l.e, kind: &l.e.pins}}
}

// KeepAlive returns an untyped reference that keeps the entry resident,
// for an owner that outlives the request (an output that aliases the
// value, work queued on a stream). Release it when that owner is done.
// Calling it on a released lease (or the zero Lease) panics.
func (l Lease[T]) KeepAlive() *KeepAlive {
	l.ref("KeepAlive")
	l.e.keeps.Add(1)
	return &KeepAlive{cacheRef{e: l.e, kind: &l.e.keeps}}
}

func (l Lease[T]) ref(what string) {
	if l.r == nil || l.r.gen.Load() != l.gen {
		panic(fmt.Sprintf("residency: %s of a released cache lease (key %q)", what, l.Key()))
	}
	l.e.refs.Add(1)
}

// Release releases the lease. Releasing twice (through any copy) is an
// [*system.InvalidInputError], as is releasing the zero Lease.
// It does not block, except when the cache was closed and this was the
// entry's last reference: then it returns after the value's Close and the
// release of its charge.
func (l Lease[T]) Release() error {
	if l.r == nil {
		return &budget.InvalidInputError{Message: "cache lease is the zero Lease: it holds nothing (a lease comes from a load)"}
	}
	if !l.r.gen.CompareAndSwap(l.gen, l.gen+1) {
		return &budget.InvalidInputError{Message: fmt.Sprintf("cache lease on %q was already released", l.e.key)}
	}
	leaseRecs.Put(l.r)
	l.e.unref()
	l.e.c.rt.RoomMade() // an entry may have become evictable: wake waiters
	return nil
}

// cacheRef is a pin or keep-alive.
type cacheRef struct {
	e        *cacheEntry
	kind     *atomic.Int64 // the entry's count of pins or of keep-alives
	released atomic.Bool
}

func (r *cacheRef) release(what string) error {
	if !r.released.CompareAndSwap(false, true) {
		return &budget.InvalidInputError{Message: fmt.Sprintf("cache %s on %q was already released", what, r.e.key)}
	}
	r.kind.Add(-1)
	r.e.unref()
	r.e.c.rt.RoomMade()
	return nil
}

// Pin keeps a cache entry resident after its leases are released.
type Pin struct{ cacheRef }

// Release releases the pin: once nothing else holds the entry and it is
// idle, it may be evicted. Twice: [*system.InvalidInputError]. Blocking as
// [Lease.Release].
func (p *Pin) Release() error { return p.release("pin") }

// KeepAlive keeps a cache entry resident for an owner outside the
// request (see [Lease.KeepAlive]).
type KeepAlive struct{ cacheRef }

// Release releases the keep-alive. Twice: [*system.InvalidInputError]. Blocking
// as [Lease.Release].
func (k *KeepAlive) Release() error { return k.release("keep-alive") }
