package cache

import (
	"context"
	"errors"
	"sync/atomic"
	"weak"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// Idle entries as victims of the controller, in one order with the
// values at the cache's location (docs/cache.md, "Eviction"): the cache
// records the offer of an entry's charge when it goes idle and its
// withdrawal when a lease is taken, without a message; the runtime drains
// what it recorded (dropper.DrainOffers) before its next ledger step, so
// a decision sees the cache as of its start. A plan that evicts an
// offered charge asks the cache to drop it (dropper.DropCharge); a load
// that needs room asks the controller (admitCharge).

// offerSeq orders the changes of offers of every cache of the process:
// a drain commits them in this order.
var offerSeq atomic.Uint64

// markLocked records that e's offer changed (c.mu held): e joins the
// pending entries once, its order is now, and the runtime is told once
// per drain.
func (c *Cache) markLocked(e *cacheEntry) {
	e.seq = offerSeq.Add(1)
	c.pendLocked(e)
}

// touchLocked records that a lease was taken on e (a load settled, a
// hit; c.mu held): the runtime ranks its next offer as of this take
// (budget.Ledger.TouchCharge), so the cache's idle entries are victims
// least recently taken first, whatever the order of their releases.
func (c *Cache) touchLocked(e *cacheEntry) {
	e.takeSeq = offerSeq.Add(1) // after a withdrawal marked by the same take
	e.touched = true
	c.pendLocked(e)
}

// pendLocked puts e among the pending entries once and tells the
// runtime once per drain (c.mu held).
func (c *Cache) pendLocked(e *cacheEntry) {
	if !e.pending {
		e.pending = true
		c.pending = append(c.pending, e)
	}
	if !c.notified {
		c.notified = true
		c.rt.OffersPending(c.dropper)
	}
}

// offerLocked records the offer of e's charge when e is idle: ready and
// in the book, no lease, pin or keep-alive, not leaving, not meant to be
// offered yet, and its idle predicate true now (c.mu held; the predicate
// runs here, never on the runtime's goroutine). A budgeted entry offers
// its allocations (budgeted.go).
func (c *Cache) offerLocked(e *cacheEntry) bool {
	if c.closed || !e.chargedLocked() || e.wants || e.retiring.Load() || e.detached.Load() {
		return false
	}
	if it, st := c.book.Peek(e.key); st != budget.CacheReady || it != e {
		return false
	}
	return c.offerReadyLocked(e)
}

// offerReadyLocked is offerLocked for an entry known to be ready in the
// book and not leaving (c.mu held since that was checked).
func (c *Cache) offerReadyLocked(e *cacheEntry) bool {
	if c.closed || !e.chargedLocked() || e.wants {
		return false
	}
	if !e.evictable() {
		return false
	}
	e.wants = true
	c.markLocked(e)
	return true
}

// withdrawLocked records the withdrawal of e's offer (a lease was taken;
// c.mu held). Nothing when it was not meant to be offered.
func (c *Cache) withdrawLocked(e *cacheEntry) {
	if !e.wants {
		return
	}
	e.wants = false
	c.markLocked(e)
}

// offerIdle records the offer of every idle entry not meant to be offered
// yet (one whose predicate turned true since it was released): true when
// it recorded any (the next request to the runtime drains them).
func (c *Cache) offerIdle() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	offered := false
	for _, e := range c.byCharge {
		offered = c.offerLocked(e) || offered
	}
	return offered
}

// dropper is the cache's callback for the runtime (system.ChargeOwner).
// It refers to the cache weakly: the runtime's registry does not keep a
// cache alive.
type dropper struct{ c weak.Pointer[Cache] }

var _ system.ChargeOwner = dropper{}

// DrainOffers hands the takes, offers and withdrawals recorded since the
// last drain to sink (on the runtime's goroutine; no user code runs): an
// entry taken since is touched (its charges rank as of now, in take
// order); an entry meant to be offered is offered, with its frequency
// (freq) (it was used since its last offer, or never offered); one not
// meant to be offered whose charge the ledger has offered is withdrawn;
// an entry leaving the cache, or whose offer came back to where the
// ledger has it, sends nothing.
func (d dropper) DrainOffers(sink system.OfferSink) {
	c := d.c.Value()
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drains++
	c.notified = false
	for i, e := range c.pending {
		c.pending[i] = nil
		e.pending = false
		leaving := c.closed || e.retiring.Load() || e.detached.Load()
		if e.touched {
			e.touched = false
			for _, ch := range e.charges() {
				if ch != "" && !leaving {
					sink.Touch(e.takeSeq, c.owner, ch)
				}
			}
		}
		switch {
		case leaving:
			// Leaving: its release settles the charge.
		case e.wants:
			e.offered = true
			if c.demotable(e) {
				sink.OfferDemotable(e.seq, c.owner, e.charge, c.freq(e))
				continue
			}
			for _, ch := range e.charges() {
				sink.Offer(e.seq, c.owner, ch, c.freq(e))
			}
		case e.offered:
			e.offered = false
			for _, ch := range e.charges() {
				sink.Withdraw(e.seq, c.owner, ch)
			}
		}
	}
	c.pending = c.pending[:0]
}

// freq is the frequency an offer of e carries: its use count when the
// cache ranks by frequency ([Options].Frequency), 1 otherwise (every
// entry was taken at least once), so that the cache's entries rank
// among themselves by their last take alone (c.mu held).
func (c *Cache) freq(e *cacheEntry) int64 {
	if c.frequency {
		return e.uses
	}
	return 1
}

// DropCharge drops the entry whose charge a plan evicts: an idle entry
// leaves the book, its value is closed, and settle(nil) lets the runtime
// release its charge; an entry that became busy (leased, pinned, kept
// alive, its predicate false) refuses with a *system.CacheBusyError. An
// entry already leaving by another way (Evict, expiry, the cap, Close)
// releases its charge itself: the answer waits for that, then confirms
// (the runtime then has nothing left to release).
func (d dropper) DropCharge(charge string, settle func(error)) {
	c := d.c.Value()
	if c == nil {
		settle(nil) // the cache is gone: nothing holds the value
		return
	}
	c.lockForDrop()
	c.dropLocked(charge, settle)
}

// lockForDrop takes c.mu for a drop or a demotion asked by the runtime.
func (c *Cache) lockForDrop() {
	c.mu.Lock()
	if h := c.dropHook; h != nil {
		c.mu.Unlock()
		h() // tests only: something happens between the decision and the drop
		c.mu.Lock()
	}
}

// dropLocked is DropCharge with c.mu held (released on return).
func (c *Cache) dropLocked(charge string, settle func(error)) {
	e := c.byCharge[charge]
	switch {
	case e == nil:
		c.mu.Unlock()
		settle(nil) // released already
		return
	case e.copyAt != "":
		c.dropCopyLocked(e, settle) // a demoted copy (spill.go)
		return
	case e.retiring.Load():
		c.mu.Unlock()
		<-e.released
		settle(nil)
		return
	case e.detached.Load():
		// Drained by Close: the cache releases it (its charge too) as soon
		// as nothing holds it.
		c.mu.Unlock()
		if e.refs.Load() != 0 {
			c.refuse(e, settle)
			return
		}
		<-e.released
		settle(nil)
		return
	default:
		if !c.leaveBookLocked(e, settle) {
			return
		}
	}
	c.busy++
	c.mu.Unlock()
	defer c.workDone()
	e.closeBox()
	settle(nil)
	e.unreserveCharges(charge) // a split entry's other parts
	e.gone()
}

// leaveBookLocked takes the ready entry e out of the book for a drop or a
// demotion the runtime asked for: false when it became busy since its
// offer (refused; c.mu released).
func (c *Cache) leaveBookLocked(e *cacheEntry, settle func(error)) bool {
	if _, out := c.book.Evict(e.key, (*cacheEntry).evictable); out != budget.Evicted {
		// The ledger no longer offers its charge; the entry is offered
		// again once idle. A split entry's other parts are still offered:
		// the next drain withdraws them (withdrawing a charge again
		// changes nothing).
		e.wants = false
		if len(e.charges()) > 1 && e.offered {
			c.markLocked(e)
		} else {
			e.offered = false
		}
		c.mu.Unlock()
		c.refuse(e, settle)
		return false
	}
	e.retiring.Store(true)
	c.armTimerLocked(c.ka.clock.Now())
	return true
}

// refuse refuses the drop of e, busy since its offer. Its waiting
// caller decides again on its next turn: the refusal wakes the queue
// (other victims may do), and e is offered again once it is idle.
func (c *Cache) refuse(e *cacheEntry, settle func(error)) {
	settle(&system.CacheBusyError{Key: e.key, Location: c.loc})
	// The runtime has settled the refusal: the ledger no longer offers the
	// charge. An offer recorded meanwhile (the entry went idle again, a
	// failed load gave a copy back) was drained while the charge was
	// evicting, and dropped: record it again, or the entry would stay out
	// of the controller's reach while the cache counts it as offered.
	c.mu.Lock()
	if e.wants && !c.closed {
		c.markLocked(e)
	}
	c.mu.Unlock()
	c.rt.RoomMade()
}

// admitCharge asks the controller for bytes at the cache's location as
// the cache's charge name: the plan may evict unprotected values and
// offered charges (this cache's and others'), in one order. A refusal
// that room could lift is a *system.CacheBusyError once no idle entry of
// the cache is left to offer; a run that met a concurrent change while a
// drop was pending decides again. c may be nil (a memory budget whose
// cache is gone).
func admitCharge(ctx context.Context, c *Cache, rt ownerRuntime, loc, owner, key, name string, bytes int64) error {
	return admitCharges(ctx, c, rt, key, []budget.ReservationSpec{{Name: name, Location: loc, Bytes: bytes, Owner: owner}})
}

// admitCharges is admitCharge for the reservations of one load (a split
// load's parts, possibly at several locations), admitted all or none.
func admitCharges(ctx context.Context, c *Cache, rt ownerRuntime, key string, specs []budget.ReservationSpec) error {
	req := budget.Request{Name: specs[0].Name, Reservations: specs}
	for raced := 0; ; {
		_, err := rt.Admit(ctx, req)
		var pe *budget.PlanError
		var xe *budget.PlanExecutionError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &xe) && raced < maxRaces:
			// The run met a change made while one of its drops was
			// pending (an entry became busy, or left its cache another
			// way; the room was taken by another charge): nothing of the
			// request is admitted; decide again.
			raced++
			continue
		case errors.As(err, &pe) || errors.Is(err, system.ErrBusy):
			if c.offerIdle() {
				continue
			}
			again, err := busyRefusals(ctx, rt, key, specs)
			if again && raced < maxRaces {
				raced++ // room was made since the decision: decide again
				continue
			}
			// A budgeted entry has no charge of its own to offer (its
			// value's reservations are the budget's): short of room (not
			// a request that can never fit), the cache evicts its idle
			// ones itself, least recently used first, and asks again.
			if _, short := err.(*system.CacheBusyError); short {
				if e := c.victim(idleBudgeted); e != nil {
					select {
					case <-e.released:
						continue
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
			return err
		}
		return err
	}
}

// idleBudgeted: an evictable entry of LoadBudgeted (no charge of its own,
// so never offered to the controller).
func idleBudgeted(e *cacheEntry) bool { return e.charge == "" && e.evictable() }

// maxRaces bounds the decisions again after runs that met concurrent
// changes (each is another caller's progress, so this is rarely reached).
const maxRaces = 16
