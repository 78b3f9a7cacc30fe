// Package system is the public Go API of residency: a runtime that keeps
// values (model weights, KV-cache blocks, corpora, any byte buffers)
// resident across memory locations — pageable-host, pinned-host, cuda:N —
// under strict byte budgets.
//
// # Starting and stopping
//
// [Start] takes the fixed set of locations and their budgets ([Limit],
// [NoLimit]) and the device backend, which the caller always names: there
// is no default, so a program never runs on simulated devices by
// accident. Pass cu.New (build tag cuda) for real GPUs, or [SoftBackend]
// for the soft backend: an honest simulation of pinned memory and GPUs in
// ordinary Go memory, with real bytes, real asynchronous copies on
// goroutine streams and real events — no GPU needed. [System.Close] is
// idempotent: it refuses new calls with [ErrClosed], lets transfers in
// flight settle, reports (as an [*OutstandingError]) and releases leases,
// holds and events the application forgot, frees every buffer and stops
// every goroutine.
//
// # Values, places and transitions
//
// [System.Register] declares a value with a fixed size: either resident at
// a first location (with its bytes), or with a source location and a
// loader that reconstructs it. [System.Place], [System.Copy],
// [System.Move], [System.Evict] and [System.Discard] are direct
// transitions; each is admitted by the ledger (package budget) with every
// charge counted — destination, source/destination overlap during the
// transfer, temporary reconstruction buffer at the source location — and
// carried out only after admission. A refusal changes nothing.
//
// # Protection
//
// [System.Acquire] returns a [*Lease] on a resident materialization (it
// never places). Record the events of the streams that read the lease's
// buffer with [Lease.RecordEvent] before [Lease.Release]: the bytes stay
// protected until those events complete. [System.Hold] pins a
// materialization until released. A protected materialization cannot be
// evicted, moved away or discarded ([*InUseError]); the controller never
// picks it as a victim.
//
// # Admission
//
// [System.Admit] is the call to make under load: the controller decides
// where the request's values go (fallback tiers, victims chosen by value)
// and the decision is entered as a [*Scope] in the same step of the
// runtime, so it can never be stale. The [Decision] comes back as evidence
// (explored states, every eviction with its reason, the plan). Exit the
// scope when done; until then a lease protects every entered endpoint.
//
// # Plans, decisions and scopes
//
// A [Plan] is reclaim → reservations → enter. [System.Explain] simulates it
// (feasible, reason, predicted peak bytes per location). [System.Decide]
// asks the controller for a [Decision]: a bounded deterministic search
// over the request's fallback tiers whose result carries the expected
// state version, the explored states, every eviction with its reason, the
// plan and its explanation. [System.ScopeFor] turns a decision into a
// single-use [*Scope]: Enter checks the state version first
// ([*StaleStateError]), then reclaims, reserves, enters and leases every
// entered endpoint until Exit. This two-step path is for what-if use: with
// other callers committing in between, Enter is usually stale; use Admit.
// [System.Execute] runs a plan without a scope.
//
// # Errors
//
// Every failure is one of the typed errors of the ledger, re-exported
// here, with the structured fields a user needs to act: [*BudgetError],
// [*PlanError], [*SearchLimitError], [*StaleStateError], [*InUseError],
// [*UnavailableError], [*PlanExecutionError] (phase, failed action or
// reservation and index, the partial report of committed transitions, the
// cause) and [*InvalidInputError]. Use errors.As. SearchLimitError and
// StaleStateError also match errors.Is(err, ErrPlan); PlanExecutionError
// does not. [ErrBusy] matches the refusals that are about something in use
// or in flight ([*InUseError], an [*UnavailableError] in flight), never a
// [*BudgetError]: they may succeed once the protection ends.
//
// An allocation that takes longer than [Options].AllocTimeout fails its
// transfer with an [*AllocTimeoutError]; a buffer the device hands back
// late is freed before the charge is released, so device bytes never
// exceed admitted bytes. If the supervisor itself panics (a broken ledger
// invariant), the runtime stops: the caller, every waiting caller and every
// later caller get a [*FatalError], nothing more is admitted, and Close
// frees every device buffer.
//
// # Evidence
//
// [System.Snapshot] is one atomic, tensor-free copy of the state at one
// version ([System.StateVersion] reads just the version); [System.Trace] returns the bounded ring of committed
// transitions.
//
// # Concurrency and contexts
//
// A user imports this package alone: the ledger's types, constants and
// errors are re-exported here (and the device types of package cuda a
// caller meets: [Loader], [Event], [Buffer]).
//
// Every method is safe for concurrent use. One supervisor actor owns the
// ledger and serializes every state version; calls wait for its reply
// with the caller's context. When the context ends the call returns
// ctx.Err(); a transition already admitted still completes or fails
// inside the runtime, and a lease, hold or scope granted to a caller who
// stopped waiting is handed back. The lease hot path (Acquire,
// Lease.Release, ReleaseByID) sends no message: the caller runs its step
// itself when its turn comes, and a call whose context ends while it
// waits for its turn has done nothing.
package system
