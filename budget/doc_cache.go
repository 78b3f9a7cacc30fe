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
//
// # Idle cache entries as victims
//
// A cache's charge may also be a victim of the controller, ranked with
// the values at its location by one rule. An owned charge (owner starting
// with [CacheOwnerPrefix]) is in one of three states ([ChargeState]):
//
//	not offered ──OfferCharge──▶ offered ──a run's reclaim step──▶ evicting
//	     ▲  ◀──WithdrawCharge──────┘                                  │
//	     └──────────── the owner refuses (Run.FailStep) ◀─────────────┤
//	                   the owner confirms (Run.Complete) ──▶ released ◀┘
//
// In words:
//
//   - not offered (a new charge's state): the owner keeps it. A loading
//     entry, a leased or pinned one, or one whose idle predicate is false
//     is never offered. The controller never chooses it.
//   - offered ([Ledger.OfferCharge], 1 version): the entry is idle (ready,
//     no lease, no pin, idle predicate true). The charge is a candidate at
//     its location with priority H = L(location) + freq, freq being the
//     owner's use count of the entry, exactly the formula of a value's
//     materialization, and with the offer's version as its last use. An
//     offer of an offered charge stamps it again (1 version).
//     [Ledger.WithdrawCharge] (a lease was taken) makes it not offered
//     again (1 version; 0 when it was not offered).
//   - evicting: a run's reclaim step for the charge (an [Action] with
//     Charge and Owner) admitted it (1 version). Its bytes stay reserved;
//     it cannot be offered or resized ([*ChargeBusyError]); a withdrawal
//     changes nothing (0 versions: the owner's answer settles it). The
//     step is pending, and its one effect, [EffectDropCharge], names the
//     owner and the charge: the runtime asks the owner to drop the entry.
//     The owner confirms ([Run.Complete]: the charge is released, 1
//     version, its location's L rises to its H as for any removal) or
//     refuses because the entry became busy in between ([Run.FailStep]:
//     the charge is not offered again, 1 version, and the run fails with a
//     [*PlanExecutionError] whose cause is a [*ChargeBusyError] with
//     Refused set; errors.Is(err, ErrBusy) holds, and the caller decides
//     again). When the owner released the charge meanwhile (its cache
//     closed), the answer commits nothing more: a confirmation completes
//     the step, a refusal still fails the run.
//
// A reservation that a cache load needs goes through the same
// controller: a [Request] whose [ReservationSpec] has Owner set asks for
// a plan that makes room for it (evicting unprotected values and other
// offered charges) and then admits it as that owner's charge, as
// [Ledger.ReserveOwned] would. A failed scope entry does not release such
// a reservation, and [Run.Reservations] does not list it: it belongs to
// its owner, which releases it.
package budget
