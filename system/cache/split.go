package cache

import (
	"context"
	"fmt"
	"slices"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// Split entries: one key whose value lies over several locations (a model
// split over two GPUs, or partly on the host). Each part is a charge of
// its own at its location, all owned by the cache; they are reserved in
// one request to the controller (all or nothing), offered and withdrawn
// together, and leave together (docs/cache.md, "One value over several
// locations").

// Part is one location's share of a split entry ([LoadSplit]): Bytes
// charged at Location for as long as the entry is resident.
type Part struct {
	Location string
	Bytes    int64
}

// allowedLocations checks opts.Locations, the locations a split load may
// use besides opts.Location (whose figures are ch), and returns the
// budget of every allowed location, opts.Location's included.
func allowedLocations(ctx context.Context, rt ownerRuntime, opts Options, ch budget.OwnerCharges) (map[string]budget.OwnerCharges, error) {
	out := map[string]budget.OwnerCharges{opts.Location: ch}
	for i, loc := range opts.Locations {
		switch _, dup := out[loc]; {
		case loc == "":
			return nil, &budget.InvalidInputError{Message: fmt.Sprintf("cache: Locations[%d] is empty", i)}
		case loc == opts.Location:
			return nil, &budget.InvalidInputError{Message: fmt.Sprintf("cache: Locations[%d] is %s, the cache's Location (list only the other locations a split load may use)", i, loc)}
		case dup:
			return nil, &budget.InvalidInputError{Message: fmt.Sprintf("cache: Locations lists %s twice", loc)}
		}
		lc, err := rt.Charges(ctx, loc, ownerName(opts.Name))
		if err != nil {
			return nil, err
		}
		out[loc] = lc
	}
	return out, nil
}

// splitLoad is the parts of one caller's split load and, once the load
// reserves, their charge names (made once for all its attempts). An entry
// loaded by it keeps it: parts and names never change after.
type splitLoad struct {
	parts []Part
	names []string
	total int64
}

// LoadSplit is [Load] for a value whose bytes lie over several locations:
// a model whose layers are split over cuda:0 and cuda:1, or kept partly
// on the host. Each [Part] charges its Bytes at its Location for as long
// as the entry is resident; there is no peak to shrink from, so the
// loader returns the value only.
//
// The parts are reserved in one request to the controller before the
// loader runs: all of them or none. The controller may make room at any
// of the locations as for [Load] (evicting unprotected values and offered
// idle entries); a refusal leaves nothing reserved anywhere and is a
// [*system.CacheBusyError] whose Location is a location that is short.
// With [Wait] the load waits for room at all its locations at once.
//
// The entry is one entry: one key, one value, one set of leases, pins and
// keep-alives, listed once by [Cache.Entries] with its parts. It leaves
// as one: when the controller drops any of its charges to make room, or
// [Cache.Evict], [Cache.EvictIdle], keep-alive, the entry cap or
// [Cache.Close] removes it, the value is closed once and every part's
// charge is released. (A charge the controller drops is released by its
// plan, which goes on once the value is closed; the cache releases the
// other parts right after, waking waiters at their locations.) While idle,
// every part is offered as a victim at its location; the first lease
// withdraws them all, and a part whose drop the cache refused (the entry
// became busy) takes the others' offers with it until the entry is idle
// again.
//
// A hit returns the resident entry whatever parts it was loaded with (as
// Load ignores its peak on a hit); the key names what differs.
//
// Errors: no parts, a part with an empty location, a location the cache
// may not use ([Options].Location and [Options].Locations), a location
// listed twice, bytes ≤ 0, an empty key or a nil loader
// ([*system.InvalidInputError], nothing changed); a part larger than its
// location's whole budget, or parts at the members of a shared budget
// ([system.Options].SharedBudgets) above its figure together
// ([*system.BudgetError], checked before the lookup); the rest as for
// Load. Versions: a hit 0; a load 1 per part; a
// failed load 2 per part.
func LoadSplit[T any](ctx context.Context, c *Cache, key string, parts []Part, idle func(T) bool, loader func(ctx context.Context) (T, error), opts ...LoadOption) (Lease[T], error) {
	sl, err := c.checkParts(key, parts)
	if err != nil {
		return Lease[T]{}, err
	}
	if loader == nil {
		return Lease[T]{}, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: loader is nil", key)}
	}
	if key == "" {
		return Lease[T]{}, &budget.InvalidInputError{Message: "cache key is empty"}
	}
	if err := c.rt.Refusal(ctx); err != nil {
		return Lease[T]{}, err
	}
	if c.isClosed() {
		return Lease[T]{}, c.closedErr()
	}
	specs := make([]budget.ReservationSpec, len(sl.parts))
	for i, p := range sl.parts {
		specs[i] = budget.ReservationSpec{Location: p.Location, Bytes: p.Bytes, Owner: c.owner}
	}
	if _, never := budget.Refusal(specs, c.locs); never {
		// A part above its location's budget, or parts above their shared
		// budget's figure together: refused with the figures now.
		_, err := busyRefusals(ctx, c.rt, key, specs)
		return Lease[T]{}, err
	}
	lo := newLoadOptions(opts)
	lo.split = sl
	total := sl.total
	return loadWaiting(ctx, c, key, 0, idle, func(ctx context.Context) (T, int64, error) {
		v, err := loader(ctx)
		return v, total, err
	}, lo)
}

// checkParts validates a split load's parts (a copy is kept).
func (c *Cache) checkParts(key string, parts []Part) (*splitLoad, error) {
	bad := func(format string, args ...any) error {
		return &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: ", key) + fmt.Sprintf(format, args...)}
	}
	if len(parts) == 0 {
		return nil, bad("a split load needs at least one part")
	}
	sl := &splitLoad{parts: slices.Clone(parts)}
	seen := make(map[string]bool, len(parts))
	for i, p := range parts {
		switch _, ok := c.locs[p.Location]; {
		case p.Location == "":
			return nil, bad("part %d has no location", i)
		case !ok:
			return nil, bad("part %d: the cache may not use location %q (its Location is %s; Options.Locations lists the others)", i, p.Location, c.loc)
		case seen[p.Location]:
			return nil, bad("location %s has two parts (give one part per location)", p.Location)
		case p.Bytes <= 0:
			return nil, bad("part %d at %s: bytes must be positive, got %d", i, p.Location, p.Bytes)
		}
		seen[p.Location] = true
		sl.total += p.Bytes
	}
	return sl, nil
}

// tooLargeAt is the refusal of bytes that can never fit at loc (more
// than its whole budget or its shared budget's figure), with loc's
// figures now.
func (c *Cache) tooLargeAt(ctx context.Context, loc string, bytes int64) error {
	ch, err := c.rt.Charges(ctx, loc, c.owner)
	if err != nil {
		return err
	}
	if be := ch.TooLarge(bytes); be != nil {
		return be
	}
	return ch.Short(bytes) // not reached: budgets are fixed
}

// loadSpecs is the reservations of a load of key: its peak at the cache's
// location, or one per part of a split load (named once for all the
// caller's attempts). nil: nothing to reserve (a budgeted load).
func (c *Cache) loadSpecs(key string, peak int64, sl *splitLoad) []budget.ReservationSpec {
	if sl == nil {
		if peak <= 0 {
			return nil
		}
		return []budget.ReservationSpec{{Name: c.chargeName(key), Location: c.loc, Bytes: peak, Owner: c.owner}}
	}
	if sl.names == nil {
		for _, p := range sl.parts {
			sl.names = append(sl.names, c.partChargeName(key, p.Location))
		}
	}
	specs := make([]budget.ReservationSpec, len(sl.parts))
	for i, p := range sl.parts {
		specs[i] = budget.ReservationSpec{Name: sl.names[i], Location: p.Location, Bytes: p.Bytes, Owner: c.owner}
	}
	return specs
}

// partChargeName names a split entry's part at loc: OWNER/KEY@LOC#N.
func (c *Cache) partChargeName(key, loc string) string {
	return fmt.Sprintf("%s/%s@%s#%d", c.owner, key, loc, c.seq.Add(1))
}

// waitLocations is where a load waits for room: every part's location,
// or the cache's.
func (sl *splitLoad) waitLocations(loc string) []string {
	if sl == nil {
		return []string{loc}
	}
	out := make([]string, len(sl.parts))
	for i, p := range sl.parts {
		out[i] = p.Location
	}
	return out
}

// ---- the hooks of a split entry's life -------------------------------------------

// charges returns e's charges: its own, then a split entry's other
// parts'; a budgeted entry's allocations (c.mu held).
func (e *cacheEntry) charges() []string {
	if e.charge == "" && e.split == nil {
		return e.allocNames() // a budgeted entry's allocations (budgeted.go)
	}
	if e.split == nil {
		return []string{e.charge}
	}
	return e.split.names
}

// indexPartsLocked files a ready split entry under every part's charge
// after its first (set), or removes it (c.mu held).
func (c *Cache) indexPartsLocked(e *cacheEntry, set bool) {
	if e.split == nil {
		return
	}
	for _, n := range e.split.names[1:] {
		switch {
		case set:
			c.byCharge[n] = e
		case c.byCharge[n] == e:
			delete(c.byCharge, n)
		}
	}
}

// unreserveCharges releases every charge of e but except ("" none): the
// controller releases the charge it dropped, the cache the others.
func (e *cacheEntry) unreserveCharges(except string) {
	if e.split == nil {
		if e.charge != "" && e.charge != except {
			e.c.unreserve(e.charge)
		}
		return
	}
	for _, n := range e.split.names {
		if n != except {
			e.c.unreserve(n)
		}
	}
}

// partsOf returns a copy of e's parts (nil: not split).
func (e *cacheEntry) partsOf() []Part {
	if e.split == nil {
		return nil
	}
	return slices.Clone(e.split.parts)
}

// Parts returns the parts of a [LoadSplit] entry, in the order they were
// given (nil for an entry of [Load] or [LoadBudgeted]). [Lease.Bytes] is
// their sum.
func (l Lease[T]) Parts() []Part {
	if l.e == nil {
		return nil
	}
	return l.e.partsOf()
}

// busyRefusals is busyRefusal over a request's reservations, admitted
// together (budget.Refusal): a *system.BudgetError for parts that can
// never fit, a *system.CacheBusyError for the first location (or shared
// budget) that has no room for its part now, or, when there is room for
// every part now, again (decide again) with a CacheBusyError at the
// first part's location to give up with.
func busyRefusals(ctx context.Context, rt ownerRuntime, key string, specs []budget.ReservationSpec) (again bool, err error) {
	at := make(map[string]budget.OwnerCharges, len(specs))
	for _, s := range specs {
		ch, err := rt.Charges(ctx, s.Location, s.Owner)
		if err != nil {
			return false, err
		}
		if !ch.HasBudget {
			if err := budget.AccountingOverflow(ch.Location, ch.UsedBytes, ch.ReservedBytes, s.Bytes); err != nil {
				return false, err // no budget to be short of: one rule with the ledger's
			}
		}
		at[s.Location] = ch
	}
	be, never := budget.Refusal(specs, at)
	switch {
	case never:
		return false, be
	case be != nil:
		return false, &system.CacheBusyError{Key: key, Location: be.Location, Refusal: be}
	}
	s := specs[0]
	ch := at[s.Location]
	return true, &system.CacheBusyError{Key: key, Location: s.Location, Refusal: &system.BudgetError{Location: ch.Location, BudgetBytes: ch.BudgetBytes, UsedBytes: ch.UsedBytes, ReservedBytes: ch.ReservedBytes, RequestedBytes: s.Bytes}}
}
