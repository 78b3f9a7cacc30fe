// Package cache is the loader cache of a residency runtime (package
// system): values the application loads itself and the runtime does not
// copy — model weights, corpora, compiled kernels — loaded once per key,
// shared by every caller, and charged under one location's budget.
//
// [New] creates a [Cache] of a runtime bound to one location's budget.
// Everything the cache charges is a reservation owned by the cache at that
// location, so it appears in [system.System.Snapshot] and the trace (owner
// [Cache.Owner], `cache "NAME"`; charges `cache "NAME"/KEY#N`, see
// [Options].Name) and shares the budget with every materialization and
// reservation there. The cache's errors ([*system.CacheBusyError],
// [*system.CacheLoadError], [system.ErrCacheClosed]) are package system's,
// classified by [system.ErrorClass] with every other error.
//
// [Load] returns a typed [Lease] on a key's value (a small value: a hit
// allocates nothing). On a miss it reserves the load's peak bytes before
// the loader runs and shrinks the reservation to the resident bytes the
// loader reports. Concurrent
// calls for a key share one load and one outcome. A loader that fails,
// panics, or reports resident bytes ≤ 0 or above its peak is rolled back
// ([*system.CacheLoadError]); the next call retries. [LoadBudgeted] is for
// values that charge each allocation themselves through the cache's
// [MemoryBudget] and may grow while leased.
// [LoadSplit] loads one value whose bytes lie over several locations (a
// model split over two GPUs; [Options].Locations): its parts are reserved
// all or nothing, and the entry leaves as one. [LoadOn] loads a value
// onto whichever of several locations has room (tiers, as Admit takes),
// the cache picking the location.
//
// Eviction: a cache's idle entries and the runtime's values at a
// location share one victim order. An idle entry is offered to the
// runtime's controller, so [system.System.Admit] (and any decision) may
// evict it, and a load that needs room asks the controller, which may
// evict unprotected values and idle entries of any cache there, by one
// priority rule (docs/semantics.md, "Cache entries and values share one
// victim order"); each such eviction is in the decision's evidence.
// Among a cache's idle entries the least recently taken (loaded or hit)
// goes first, whatever its use count and whatever order the leases were
// released in ([Options].Frequency opts into use counts). A refused load
// evicts nothing. Entries of [LoadBudgeted] are offered with the
// allocations their loader's budget made.
//
// An entry is evicted only when no [Lease], [*Pin] or
// [*KeepAlive] holds it and its idle predicate says so (return false
// while device work that reads it is queued). A value implementing
// interface{ Close() error } is closed when it leaves the cache, and its
// charge is released only after Close returns; a slow Close blocks neither
// lookups nor loads of other keys. [Cache.Evict] removes an idle entry on
// request. When the budget is short and nothing is evictable, the answer
// is a [*system.CacheBusyError] (errors.Is [system.ErrBusy]); a request larger than the
// whole budget is a [*system.BudgetError]. A location in a shared budget
// ([system.Options].SharedBudgets) is bounded by both figures: its whole
// budget is the smaller of its own and the group's, and a busy refusal
// names the one that is short (Refusal.Shared set for the group).
//
// Waiting: with [Wait] and the runtime's wait options a load that finds
// the budget short waits in the runtime's queue, shared with
// [system.System.Admit], instead of answering busy; it is tried first,
// and it never takes room an earlier waiter of its class waits for.
//
// Keep-alive ([Options].KeepAlive, [WithKeepAlive]; time from
// [Options].Clock) unloads an entry once it has been idle that long
// (default: [KeepForever]); [Cache.EvictWhenIdle] makes an entry leave at
// its last release; [Cache.EvictIdle] evicts every idle entry;
// [Options].MaxEntries caps the entries; [Cache.Entries] lists them.
//
// [Cache.Budget] gives the [MemoryBudget]: reservations for memory the
// application owns, under the same budget, which may evict idle entries
// but never another reservation. It refers to its cache weakly (no
// cache ↔ value ↔ budget cycle), and its ceiling still holds after
// [Cache.Close]. [Cache.Statistics] reports the budget, the cache's
// charged bytes, its entries and its evictions.
//
// Versions: a hit costs none (the cache's leases are not ledger
// mutations); a load 1 (2 when it shrinks), a failed load 2, an eviction
// or the end of a value 1, a memory reservation 1 and its release 1; the
// offers and withdrawals of idle entries 1 per change the runtime drains
// before its next ledger step (a lease taken and released in between
// costs none). The
// ledger side is described in package budget ("Loader cache"). Close
// caches before the runtime: [system.System.Close] releases their charges but
// cannot run their values' Close.
package cache
