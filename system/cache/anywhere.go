package cache

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// Loading where there is room: one entry whose charge goes to whichever
// of several locations has room (a model on either GPU, else pinned host
// memory), chosen by the cache, with one waiter slot for all of them.

// Tie orders the locations of one tier of [LoadOn] ([WithTie]).
type Tie int

const (
	// TieFirstListed tries a tier's locations in the order listed.
	TieFirstListed Tie = iota
	// TieMostFree tries the location with the most free bytes first (the
	// figures as the load starts, every owner's charges counted).
	TieMostFree
)

// WithTie sets how [LoadOn] orders the locations of each tier (default
// [TieFirstListed]). Other loads ignore it.
func WithTie(t Tie) LoadOption { return tieOption(t) }

type tieOption Tie

func (t tieOption) applyLoad(o loadOptions) loadOptions {
	o.tie = Tie(t)
	return o
}

// LoadOn is [Load] onto any of several locations: the entry's bytes are
// charged at one location of tiers, which the cache picks — tier by tier,
// a location where bytes fit as they are first, then one where the
// controller can make room (evicting offered idle entries and unprotected
// values there, all or nothing, as for Load); within a tier in the
// order [WithTie] says. The loader is told the location picked, and the
// lease's [Lease.Parts] name it. There is no peak: bytes are the resident
// bytes, charged for as long as the entry is resident.
//
// A hit returns the resident entry wherever it is (the key names what
// differs). With [Wait] a load refused at every location waits in the
// runtime's queue once, at all its locations, and is tried again, whole,
// whenever room may have been made at any of them.
//
// Every location must be the cache's [Options].Location or one of its
// [Options].Locations, listed once. Errors: empty tiers or a bad location,
// bytes ≤ 0, an empty key, a nil loader, an unknown [Tie]
// ([*system.InvalidInputError], nothing changed);
// bytes larger than the whole budget of every location
// ([*system.BudgetError]); every location short with nothing idle to evict
// ([*system.CacheBusyError] for the last one tried); the rest as for Load.
// Versions as for a split load of one part.
func LoadOn[T any](ctx context.Context, c *Cache, key string, tiers [][]string, bytes int64, idle func(T) bool, loader func(ctx context.Context, loc string) (T, error), opts ...LoadOption) (Lease[T], error) {
	all, err := c.checkTiers(key, tiers, bytes)
	if err != nil {
		return Lease[T]{}, err
	}
	if loader == nil {
		return Lease[T]{}, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: loader is nil", key)}
	}
	if err := c.rt.Refusal(ctx); err != nil {
		return Lease[T]{}, err
	}
	if c.isClosed() {
		return Lease[T]{}, c.closedErr()
	}
	lo := newLoadOptions(opts)
	if lo.tie != TieFirstListed && lo.tie != TieMostFree {
		return Lease[T]{}, &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: unknown tie %d (TieFirstListed or TieMostFree)", key, lo.tie)}
	}
	wc := lo.wait
	lo.wait = system.WaitConfig{} // each try is one; waiting is LoadOn's
	var fitsSomewhere bool
	for _, loc := range all {
		if c.locs[loc].TooLarge(bytes) == nil {
			fitsSomewhere = true
		}
	}
	if !fitsSomewhere {
		return Lease[T]{}, c.tooLargeAt(ctx, all[0], bytes)
	}
	if !wc.Wait {
		return loadOnce(ctx, c, key, tiers, bytes, idle, loader, lo, wc.Class)
	}
	spec := budget.WaitSpec{Name: key, Class: wc.Class, Locations: all, AllowBypass: wc.Bypass}
	var l Lease[T]
	err = c.waitRoom(ctx, spec, wc.Notify, func() (bool, error) {
		l, err = loadOnce(ctx, c, key, tiers, bytes, idle, loader, lo, -1)
		return !cacheWaitable(err), err
	})
	if err != nil {
		return Lease[T]{}, err
	}
	return l, nil
}

// loadOnce is one try of LoadOn over every tier. class ≥ 0: a call that
// does not wait, held up by the waiters of that class or higher at a
// location; -1: a waiter's turn (the queue decides).
func loadOnce[T any](ctx context.Context, c *Cache, key string, tiers [][]string, bytes int64, idle func(T) bool, loader func(context.Context, string) (T, error), lo loadOptions, class int) (Lease[T], error) {
	var last error
	for _, tier := range tiers {
		locs := c.orderTier(ctx, tier, lo.tie)
		for _, noEvict := range []bool{true, false} { // room as it is first, then made
			for _, loc := range locs {
				if c.locs[loc].TooLarge(bytes) != nil {
					continue
				}
				o := lo
				o.split = &splitLoad{parts: []Part{{Location: loc, Bytes: bytes}}, total: bytes}
				o.noEvict = noEvict
				o.held, o.heldClass = class >= 0, class
				l, err := load(ctx, c, key, 0, idle, func(ctx context.Context) (T, int64, error) {
					v, err := loader(ctx, loc)
					return v, bytes, err
				}, o)
				if err == nil || !cacheWaitable(err) {
					return l, err
				}
				last = err
			}
		}
	}
	return Lease[T]{}, last
}

// checkTiers validates LoadOn's tiers and bytes; it returns every
// location, in order.
func (c *Cache) checkTiers(key string, tiers [][]string, bytes int64) ([]string, error) {
	bad := func(format string, args ...any) error {
		return &budget.InvalidInputError{Message: fmt.Sprintf("cache key %q: ", key) + fmt.Sprintf(format, args...)}
	}
	switch {
	case key == "":
		return nil, &budget.InvalidInputError{Message: "cache key is empty"}
	case bytes <= 0:
		return nil, bad("bytes must be positive, got %d", bytes)
	}
	var all []string
	for i, tier := range tiers {
		if len(tier) == 0 {
			return nil, bad("tier %d is empty", i)
		}
		for _, loc := range tier {
			if _, ok := c.locs[loc]; !ok {
				return nil, bad("the cache may not use location %q (its Location is %s; Options.Locations lists the others)", loc, c.loc)
			}
			if slices.Contains(all, loc) {
				return nil, bad("location %s is listed twice", loc)
			}
			all = append(all, loc)
		}
	}
	if len(all) == 0 {
		return nil, bad("no tiers: name at least one location")
	}
	return all, nil
}

// orderTier orders a tier's locations as tie says: most free bytes first
// (one read of each location's figures; a read that fails keeps the
// location last) or as listed.
func (c *Cache) orderTier(ctx context.Context, tier []string, tie Tie) []string {
	out := slices.Clone(tier)
	if tie != TieMostFree || len(out) < 2 {
		return out
	}
	free := make(map[string]int64, len(out))
	for _, loc := range out {
		ch, err := c.rt.Charges(ctx, loc, c.owner)
		if err != nil {
			free[loc] = -1
			continue
		}
		free[loc] = ch.FreeBytes()
	}
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(free[b], free[a]) })
	return out
}
