package cache

import (
	"slices"
	"weak"
)

// The allocations of a LoadBudgeted entry as its charges: the loader gets
// a memory budget bound to its entry, and every reservation made through
// it (while loading, and later as the value grows) is one of the entry's
// charges. When the entry goes idle they are offered to the controller
// together, like a split entry's parts; the controller may drop any one
// of them, which drops the entry: its value's Close releases the others.

// entryBudget returns the memory budget of e's loader: c's, with every
// reservation filed under e.
func (c *Cache) entryBudget(e *cacheEntry) *MemoryBudget {
	b := *c.budget
	b.entry = weak.Make(e)
	return &b
}

// loading says whether e's load is still in flight.
func (e *cacheEntry) loading() bool {
	e.c.mu.Lock()
	defer e.c.mu.Unlock()
	return e.flight != nil
}

// allocAdded files the reservation name, made through e's budget, under
// e: one of its charges, indexed while e is ready, offered with it.
func (e *cacheEntry) allocAdded(name string) {
	c := e.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.retiring.Load() || e.detached.Load() {
		return // leaving: its value's Close releases it
	}
	if e.allocs == nil {
		e.allocs = map[string]struct{}{}
	}
	e.allocs[name] = struct{}{}
	if e.flight == nil { // ready: a victim's charge from now
		c.byCharge[name] = e
		if e.wants {
			c.markLocked(e) // offered with the others at the next drain
		}
	}
}

// allocReleased forgets the reservation name of e (released).
func (e *cacheEntry) allocReleased(name string) {
	c := e.c
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(e.allocs, name)
	if c.byCharge[name] == e {
		delete(c.byCharge, name)
	}
}

// indexAllocsLocked files a ready budgeted entry under each of its
// allocations' charges (set), or removes it (c.mu held).
func (c *Cache) indexAllocsLocked(e *cacheEntry, set bool) {
	for n := range e.allocs {
		switch {
		case set:
			c.byCharge[n] = e
		case c.byCharge[n] == e:
			delete(c.byCharge, n)
		}
	}
}

// allocNames returns e's allocations' charges in name order (c.mu held).
func (e *cacheEntry) allocNames() []string {
	out := make([]string, 0, len(e.allocs))
	for n := range e.allocs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// chargedLocked says whether e has a charge to offer: its own, a split
// entry's parts, or a budgeted entry's allocations (c.mu held).
func (e *cacheEntry) chargedLocked() bool { return e.charge != "" || len(e.allocs) > 0 }
