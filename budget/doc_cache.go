// # Loader cache
//
// The runtime's loader cache (system.Cache) keeps values that the
// application loads itself — model weights, corpora, anything whose bytes
// the runtime does not copy — under the budget of one location, beside
// every other charge there. The ledger sees the cache as an owner of named
// reservations at that location, and nothing else:
//
//   - a load in flight is one owned reservation of its peak bytes, admitted
//     like any reservation (used + reserved + peak ≤ budget);
//   - when the loader reports the bytes that stay resident, the same
//     reservation shrinks to them ([Ledger.ResizeOwned]; shrinking is always
//     admitted), so the value is charged exactly its resident bytes;
//   - a reservation made through the cache's memory budget (for an
//     allocation the application owns) is another owned reservation, and may
//     grow or shrink the same way (growth is admitted like a new charge of
//     the difference);
//   - eviction, a failed load and the end of a value release the
//     reservation ([Ledger.UnreserveOwned]).
//
// A snapshot therefore lists every cache charge (name, bytes, owner) in its
// location's reservations, and every admission at that location — a
// placement, a scope's reservation, another cache — counts them.
// [Ledger.OwnerCharges] sums one owner's reservations at a location (a
// read). Because the reservations are owned, Unreserve refuses them: only
// the cache releases its charges. Closing the runtime releases them all,
// like every other reservation.
//
// What the ledger does not see: which keys are loading or ready, their
// leases, pins and keep-alives, whether their values are idle, and their
// recency. Those live with the cache, in process, because the cache's hit
// path (a lease on a resident key) must not wait for the supervisor and
// because idleness is the application's answer (a predicate over its own
// value, such as "no device work queued"). [CacheBook] holds the
// bookkeeping part of that state as pure code: loading and ready keys, the
// least-recently-used order of ready keys, victim choice and the eviction
// count. The caller answers, per entry and at the moment of the choice,
// whether it may be evicted (no lease, pin or keep-alive, and idle).
//
// Victims: when an admission at the location is refused with a
// [*BudgetError] and the request could fit the budget at all, the cache
// evicts the least recently used evictable ready entry, waits until its
// release work has finished and its reservation is released, and asks
// again; loading entries are never victims. One victim at a time, as
// the application's own allocations (charged separately) may be what an
// entry frees. No evictable entry: the cache answers busy (errors.Is
// ErrBusy), never a plain budget refusal, because the charges in the way
// may go; a request larger than the whole budget is the ledger's
// [*BudgetError] at once, with nothing evicted.
//
// Versions (each committed ledger change is one, as everywhere): a cache
// hit 0; a load that misses 1 for the reservation of its peak, plus 1 for
// the shrink when the resident bytes are below the peak; a failed load
// (error, panic, resident bytes above the peak or zero) 2, the reservation
// and its release; a refused reservation 0. An eviction or the end of a
// value 1 (the release of its charge, after its release work). A memory
// budget reservation 1 and its release 1 (a zero-byte reservation is not
// recorded: 0); a resize 1 (0 when the size does not change). Statistics
// 0. A budgeted load's own entry has no charge: its allocations are
// memory budget reservations, each with its own versions.
package budget
