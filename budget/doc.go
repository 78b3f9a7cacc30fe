// Package budget is the ledger of residency: a pure, deterministic,
// single-threaded state machine that accounts every byte charged at every
// memory location and every protection on every materialization.
//
// It has no goroutines, no clocks and no I/O. A [Ledger] is not safe for
// concurrent use: the runtime (package actors) owns exactly one and feeds it
// one transition at a time. Every method either returns a typed error and
// leaves the state (and its version) exactly as it was, or commits and bumps
// the state version once per committed transition.
//
// # Locations
//
// A location is `pageable-host`, `pinned-host` or `cuda:N` (N a decimal
// integer ≥ 0, written without sign or leading zeros), optionally qualified
// with a node: `cuda:0@node-b`. The set of locations is fixed by [Config].
// Each has an optional strict budget, used bytes (every materialization's
// charge, entering ones and temporary reconstruction charges included),
// reserved bytes (named reservations) and a peak (the highest used+reserved
// ever seen). Admission of r bytes at a location succeeds when there is no
// budget or used+reserved+r <= budget; otherwise a [*BudgetError] reports
// the five figures as they were.
//
// Location order (snapshots, discard, explain) is: pageable-host,
// pinned-host, cuda:0, cuda:1, … (numeric), node-qualified names after
// unqualified ones, by node then the same order. The source preference of
// a transfer (which resident copy the bytes come from) is different:
// pinned-host, pageable-host, cuda:0, cuda:1, ….
//
// # Values and materializations
//
// A value has a name (unique among live values), a size in bytes (> 0), a
// replica mode (exclusive or replicable), and optionally a source: a source
// location where the value can be reconstructed by loading it into a
// temporary buffer. Every materialization of a value is charged exactly its
// size.
//
// A [Handle] carries the value's ID and name; IDs are never reused. Discard
// retires a handle and frees its name (so does a registration whose first
// materialization failed): a new registration under that name gets a new
// handle, [Ledger.Lookup] returns the new one, and the retired handle keeps
// answering [*UnavailableError] (discarded) everywhere; it never resolves
// to the new value. The ledger keeps no record of a retired value: an id
// at or below the highest one issued that is not live was retired, and
// that is the whole answer (O(1) memory however many values were retired;
// it no longer knows the retired value's name, so a retired id answers
// discarded whatever name the handle carries).
//
// A materialization moves through these states:
//
//	            admit place/copy/move          complete
//	(absent) ──────────────────────▶ entering ──────────▶ resident
//	    ▲                               │ fail                │
//	    └───────────────────────────────┘                     │
//	    ▲            complete (source removed)                │ admit move (as source)
//	    └──────────────────────────────────── leaving ◀───────┘
//	    ▲                                       │ fail: back to resident
//	    └──── evict / reclaim / discard (one commit, from resident)
//
// An entering materialization is charged from admission; the source of a
// transfer stays charged until the transfer completes (overlap); a
// reconstruction charges the value's size temporarily at the source
// location (unless the destination is the source location) until it
// completes or fails. Eviction is a single commit: the ledger releases the
// charge and hands back a [EffectFree]; the runtime carries frees out on the
// location's own serial queue before any later allocation there, so the
// physical device never holds more than the ledger admitted.
//
// # Two-phase transitions
//
// Place, copy and move are admitted first ([Ledger.Place], [Ledger.Copy],
// [Ledger.Move] return an [Admission] with the [Effect]s to carry out) and
// then completed ([Ledger.Complete]) or failed ([Ledger.Fail]). Versions:
// admission 1, completion 1, removal of a move's source 1, failure 1. Evict
// and discard commit at once (one version per removed materialization, one
// more for retiring a discarded handle) and return only free effects.
//
// # Protections
//
// A lease ([Ledger.Acquire]) needs a resident materialization and never
// places. Leases record consumer events; an event stays pending (protecting
// the materialization) until it is reaped with [Ledger.ReapEvent], even
// after the lease is released. Holds ([Ledger.Hold]) protect until
// released. A protected materialization (uses, holds or pending events > 0)
// cannot be evicted, reclaimed, moved away or discarded: [*InUseError].
//
// Discard removes every materialization at once, so it checks them all
// before removing any, protection first: the first protected
// materialization in location order is the [*InUseError], even when one
// earlier in location order is in flight (entering, leaving, or the source
// of a copy in flight), and even when the protected one is itself the
// source of a copy in flight. Only when none is protected is the first one
// in flight, in location order, an [*UnavailableError] (in flight).
//
// # Plans
//
// A [Plan] is reclaim → reservations → enter. [Ledger.Explain] simulates it
// on a copy of the figures without changing anything. [Ledger.StartRun]
// executes a plan step by step (the runtime carries out each step's effects
// between the steps), tracks the committed prefix and, on failure, returns
// a [*PlanExecutionError]; a failed scope entry also releases the
// reservations it admitted, and the leases it took when the failure came
// while taking them (a plain execute's reservations stay active, released
// by name). The error's partial report is taken after that cleanup: it
// lists every transition the run committed, in order, the releases
// included, and nothing committed by others between its steps. Completed
// reclaims and enters are never rolled back.
//
// A copy's source materialization is busy until the copy settles: it
// cannot be evicted, moved away or discarded meanwhile (an
// [*UnavailableError] saying so), so a stream never reads freed bytes.
//
// # Controller
//
// The ledger keeps the GreedyDual-with-frequency priority of every
// materialization (H = L(location) + freq(value)) and the inflation value L
// of every location; [Ledger.Decide] runs the bounded deterministic search
// (decide.go). Priorities: freq counts a value's completed placements and
// leases; a completion or lease sets H = L(location) + freq; a removal
// raises L(location) to the removed H. Integers only, no clocks.
//
// A [Request] lists requirements (a handle and its tiers of locations, in
// preference order) and reservations. The search is:
//
//  1. Enumerate assignments (one location per requirement) in lexicographic
//     order of the tier-index vector, the first requirement most
//     significant, and within one tier-index vector in lexicographic order
//     of the position-within-tier vector. Every assignment evaluated counts
//     one explored state.
//  2. Evaluate an assignment by replaying place() on paper, requirement by
//     requirement: an endpoint already resident adds nothing; an exclusive
//     value resident elsewhere moves (its materialization must be resident,
//     unprotected and not the source of a copy in flight); a replicable one
//     is copied from a resident materialization (an endpoint entered earlier
//     in the same plan counts); otherwise it is reconstructed, adding its
//     size at the destination and, temporarily, at its source location when
//     that differs. Reservations add their bytes. At each budgeted location
//     the shortfall is N = added − (budget − used − reserved).
//  3. For N > 0, choose victims among the candidates there (resident,
//     unprotected, not the source of a copy in flight, of no required
//     handle, and not the last resident copy of a value without a source,
//     and the idle cache entries' charges offered there: doc_cache.go),
//     ordered by ascending H, then last use, then id (values in
//     registration order, then charges in admission order): take the
//     first candidate c_k at which the running byte sum reaches N, then the
//     victims for N − bytes(c_k) among c_1…c_{k−1}. This is the least
//     valuable set: the smallest highest priority, then the smallest second
//     highest, and so on. No such k: the assignment is infeasible.
//  4. Finish the first tier-index vector with a feasible assignment and
//     return its best: the smallest descending-sorted list of victim
//     priorities (all locations), then fewest bytes transferred, fewest
//     evicted bytes, fewest evictions, then (only with [TieMostFree]) the
//     most free bytes (budget − used − reserved before the plan) at the
//     chosen locations, requirement by requirement, then the earliest
//     position vector. The tie-break never changes the explored states.
//  5. Build the plan (victims in reclaim, in location then candidate order;
//     the request's reservations; one enter per requirement, in requirement
//     order, without From so that execution picks the source as place()
//     does) and check it with Explain. Explain's final step checks that
//     every entered endpoint is resident in the final simulated state, so a
//     feasible explanation asserts every requirement's postcondition. If
//     the check fails the assignment is treated as infeasible and the same
//     positions are rescanned without it (this should not happen: the
//     shortfall sums every addition at a location, an upper bound of every
//     intermediate charge, and ignores the bytes a move frees).
//
// Spill targets ([LocationConfig].SpillTo) change no choice above: once
// the victims are chosen, build demotes, in victim order, each victim
// that is its value's only resident copy to its location's spill target
// when the target has room in the plan's final state (and when the
// demotion lands), or when the target can make that room by giving up
// victims of its own in its own candidate order (the spill cascade,
// listed before the demotion, each eviction's RoomFor naming it); its
// reclaim action carries To and its eviction [EvictionDemoted]. The rule, and what a failed demotion does, are in
// spill.go. An idle cache entry's charge offered as demotable
// ([Ledger.OfferDemotableCharge]) is demoted by the same rule, its
// eviction keeping [EvictionIdleCacheEntry] with To set; its owner makes
// the copy (charges_spill.go).
//
// The state limit (default [DefaultStateLimit]) counts as reached when
// explored states equal it and an assignment remains: before any feasible
// assignment that is a [*SearchLimitError]; after one, the best found so
// far with Exhaustive false. An exhausted search without a feasible
// assignment is a [*PlanError] whose reason lists the distinct blockers
// (budget shortfalls with location and bytes, and how many bytes there
// were protected, last copies, required or in flight; protected move
// sources; unrecoverable combinations).
//
// What keeps it fast without changing the result: every location keeps
// its candidates in candidate order in an index that the ledger updates on
// every mutation that changes a materialization's category or rank (its
// state, readers, protections, priority or last use, or the number of
// resident copies of a value without a source), together with the bytes
// there by category (in flight, protected, last copy, candidate), so
// Decide reads candidates in order, skipping the request's required
// values, only as deep as the largest shortfall needs, without looking at
// any other value: its cost grows with the victims it needs, not with the
// values resident (candindex.go). The recursive rule then costs one binary
// search over running sums per victim; victims are memoized per
// (location, shortfall), since the candidate list is fixed during one
// Decide. Victims are computed per location independently; only if the
// chosen sets would together remove every copy of a value without a
// source (two victims, two locations) are they recomputed location by
// location in location order, each location's list dropping what would
// become a last copy. Dropping candidates the rule did not select cannot
// change what it selects, so the two computations agree whenever there
// is no such conflict. Explain runs once per returned decision; its
// simulation (like every plan check) copies only the locations' figures
// and the values the plan names, never the value table.
//
// # Order of checks
//
// An operation with several problems reports the first, and changes
// nothing. Fields come first, in document order, each field checked whole
// before the next (malformed or unknown → [*InvalidInputError]; discarded,
// foreign or unconfigured → [*UnavailableError]):
//
//   - a plan: every reclaim action, then every reservation, then every
//     enter action, each list in order;
//   - a request: its name, then its requirements in order (each one's
//     handle, then its tiers' locations in order), then its reservations,
//     then its tie-break;
//   - an action: handle, location, from (a from on a reclaim action is
//     invalid input, checked in from's place);
//   - a reservation: name (empty, repeated within the plan or request, or
//     already active), bytes, location;
//   - a copy or move: handle, from, to; place, evict, acquire and hold:
//     handle, location.
//
// Rules come only after every field passed, in this order: replica mode
// (copy), a requirement or tier with no locations (any requirement of the
// request), an exclusive value required twice, residency (absent or in
// flight), protection, data loss, budget (the destination, then the
// source location). A plan's rules are met step by step in plan order, so
// its first failing step is the reason. A scope entry's stale-version
// check ([RunOptions.CheckVersion]) comes before everything, fields
// included. [Ledger.Explain] never fails on a plan's content: a plan whose
// fields fail validation is infeasible, its reason the validation error's
// message and its predicted peaks the current used+reserved of every
// location.
//
// # Shared budgets
//
// [Config].SharedBudgets groups locations that draw on one memory (an
// integrated GPU and the host): each group has a figure, and a group's
// charged bytes are the sum of used+reserved over its members. Every
// charge at a member must fit its location (as above) and then its group:
// charged+requested <= figure; a reconstruction whose destination and
// temporary are both members counts both charges at the group. A group's
// refusal is a [*BudgetError] with Shared set and the group's figures. The
// controller, after each assignment's location victims, computes each
// group's shortfall (in name order: its members' additions less the
// group's free bytes and the bytes of the victims already chosen at its
// members) and takes victims for it from the members' candidates merged in
// candidate order (then location order), by the same rule; a demotion is
// made only when its target's group has room for it too (sharedbudgets.go;
// docs/semantics.md, "Shared budgets").
//
// # Room held for waiters
//
// The runtime keeps callers that wait for room in a [WaitQueue] (classes,
// then arrival). A call that does not wait runs under [Ledger.WithHeld]
// with the queue's [WaitQueue.HeldAt], and a waiting call's try with
// [WaitQueue.HeldAhead] (the waiters ahead of it): a new charge at a
// location such a waiter names (or at a member of its shared budget) is refused
// with a [*WaitersAheadError] after the budget check, nothing changed;
// the controller treats such an assignment as infeasible and drops a
// victim instead of demoting it into held room (held.go;
// docs/semantics.md, "Waiting for room").
//
// # Errors
//
// Eight typed errors: [*BudgetError],
// [*PlanError], [*SearchLimitError], [*StaleStateError], [*InUseError],
// [*UnavailableError], [*PlanExecutionError], [*WaitersAheadError] (only
// under WithHeld; it matches errors.Is(err, ErrBusy)). SearchLimitError and
// StaleStateError match errors.Is(err, ErrPlan); PlanExecutionError does
// not. Bad input (unknown names, duplicate names, double release, events on
// released leases, malformed locations, sizes ≤ 0) is [*InvalidInputError],
// matching errors.Is(err, ErrInvalidInput). A cap over a group of
// reservations ([Ledger.ReserveCapped], such as the write pipeline's
// device clones and their landing buffers) refuses with its own [*CapError], never a BudgetError:
// no location refused anything.
package budget
