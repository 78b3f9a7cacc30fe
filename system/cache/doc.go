// # Loader cache
//
// [system.System.NewCache] creates a [Cache] bound to one location's budget, for
// values the application loads itself and the runtime does not copy:
// model weights, corpora, compiled kernels. Everything the cache charges
// is a reservation owned by the cache at that location, so it appears in
// [system.System.Snapshot] (with the cache's [Cache.Owner]) and shares the
// budget with every materialization and reservation there.
//
// [Load] returns a typed [*Lease] on a key's value. On a miss it
// reserves the load's peak bytes before the loader runs (evicting idle
// entries, least recently used first, if the budget is short) and shrinks
// the reservation to the resident bytes the loader reports. Concurrent
// calls for a key share one load and one outcome. A loader that fails,
// panics, or reports resident bytes ≤ 0 or above its peak is rolled back
// ([*system.CacheLoadError]); the next call retries. [LoadBudgeted] is for
// values that charge each allocation themselves through the cache's
// [MemoryBudget] and may grow while leased.
//
// An entry is evicted only when no [*Lease], [*Pin] or
// [*KeepAlive] holds it and its idle predicate says so (return false
// while device work that reads it is queued). A value implementing
// interface{ Close() error } is closed when it leaves the cache, and its
// charge is released only after Close returns; a slow Close blocks neither
// lookups nor loads of other keys. [Cache.Evict] removes an idle entry on
// request. When the budget is short and nothing is evictable, the answer
// is a [*system.CacheBusyError] (errors.Is [system.ErrBusy]); a request larger than the
// whole budget is a [*system.BudgetError].
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
// or the end of a value 1, a memory reservation 1 and its release 1. The
// ledger side is described in package budget ("Loader cache"). Close
// caches before the runtime: [system.System.Close] releases their charges but
// cannot run their values' Close.
package cache
