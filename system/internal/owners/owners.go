// Package owners is the seam between package system and the owners of
// charges built on top of it: today the loader cache (package
// system/cache). It is internal so that the runtime's public API stays
// the core one (Start, System, leases, holds, scopes, admission, waiting,
// events) while an owner outside package system can still do what the
// runtime does for its own charges.
//
// An owner is a name in the ledger (a cache's is `cache "NAME"`), unique
// in its runtime for the runtime's life, under which it keeps named
// reservations — its charges — at one location. Through [Runtime] it
// reserves them (a refusal is a *system.BudgetError; making room from its
// own idle state is the owner's business), resizes and releases them,
// reads its figures, waits for room in the runtime's wait queue (shared
// with System.Admit), wakes that queue when it made room, and writes its
// events and logs where the runtime does.
//
// Package system installs the one implementation at init ([Set]); an
// owner gets it with [Of] from the *system.System it was given.
//
// The controller (package budget) may pick an owner's idle charge as an
// eviction victim, in one order with the values at its location: the
// owner records the offer of a charge when its entry goes idle and its
// withdrawal when a lease is taken, and says so ([Runtime.OffersPending]);
// the runtime drains what it recorded ([ChargeOwner.DrainOffers]) before
// its next ledger step. A plan that evicts a charge calls the owner back
// ([ChargeOwner.DropCharge]). Both are handed over at [Runtime.Register]. An owner's load that needs room asks the
// controller too ([Runtime.Admit]).
package owners

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/budget"
)

// Runtime is what package system offers an owner of charges. All methods
// are safe for concurrent use.
type Runtime interface {
	// Register claims owner, a ledger owner name, for the runtime's life,
	// with o (nil: none) as the callback that drops its offered charges:
	// false when another owner of this runtime has it.
	Register(owner string, o ChargeOwner) bool
	// OffersPending tells the runtime that the owner co (as registered)
	// recorded offers or withdrawals of its charges (co.DrainOffers hands
	// them over): the runtime drains them before its next ledger step. It
	// never blocks and sends nothing. Only the owners that said so are
	// drained, so an owner says it once per drain, after recording.
	OffersPending(co ChargeOwner)
	// Admit asks the controller for room for req (its reservations owned
	// by an owner) and runs the plan, evicting values and offered charges
	// as the decision says, in one step of the runtime. It returns the
	// decision (the evidence) and the run's error. A reply that comes
	// after ctx ended is handed back (its owned reservations released).
	Admit(ctx context.Context, req budget.Request) (budget.Decision, error)
	// Seq returns a number unique in the runtime (1, 2, ...), for the
	// names of owners the application did not name.
	Seq() uint64
	// SpillTarget returns loc's spill target (Options.Spill), if any.
	SpillTarget(loc string) (string, bool)
	// Reserve admits a reservation of bytes at loc named name and owned
	// by owner (1 version). A reply that comes after ctx ended is
	// released at once. Errors: the ledger's (*system.BudgetError,
	// invalid input), the runtime's (ErrClosed), ctx.Err().
	Reserve(ctx context.Context, loc, owner, name string, bytes int64) error
	// Resize sets the bytes of owner's reservation name: shrinking is
	// always admitted, growing like a reservation of the difference.
	Resize(ctx context.Context, owner, name string, bytes int64) error
	// Unreserve releases owner's reservation name; it never gives up (a
	// charge must follow its value). After the runtime closed there is
	// nothing to release: nil. A failure is also logged.
	Unreserve(owner, name string) error
	// Charges returns loc's figures and what owner's reservations charge
	// there (a read: no version). Errors: an unknown or malformed
	// location, ErrClosed, ctx.Err().
	Charges(ctx context.Context, loc, owner string) (budget.OwnerCharges, error)
	// Refusal is the runtime's refusal of any call now (fatal, closed),
	// or ctx.Err(); nil when a call may go ahead.
	Refusal(ctx context.Context) error
	// Wait calls try at once, unless waiters ahead of spec hold it up
	// (budget.WaitQueue.Ahead); if that try is refused (not done), or
	// was not made, it queues the caller described by spec in the
	// runtime's wait queue and calls try on each of its turns until try
	// reports done, ctx ends (ctx.Err()) or the runtime closes
	// (ErrClosed). A full queue refuses at once (*budget.QueueFullError).
	// notify (nil: none) is told when it is queued and after each
	// refused turn.
	Wait(ctx context.Context, spec budget.WaitSpec, notify func(budget.WaitState), try func() (done bool, err error)) error
	// WaitersAhead returns how many callers waiting for room hold up a
	// new call described by spec (budget.WaitQueue.Ahead): a call that
	// needs room does not take it ahead of them.
	WaitersAhead(spec budget.WaitSpec) int
	// RoomMade tells the wait queue that room may have been made outside
	// the ledger (an owner's idle state became evictable). Never blocks.
	RoomMade()
	// LoadFailed writes the runtime's loader_failed event for a load of
	// key by owner at loc (peak bytes) that failed with err, when err is
	// a *system.CacheLoadError (anything else is not a loader's failure).
	LoadFailed(owner, loc, key string, peak int64, err error)
	// Log is the runtime's logger (Options.Logger).
	Log() *zerolog.Logger
}

// ChargeOwner drops an owner's offered charges when a plan evicts them,
// and hands over the offers and withdrawals it recorded.
type ChargeOwner interface {
	// DropCharge runs on a goroutine of its own, never the runtime's.
	// The owner calls settle exactly once: nil once the entry whose
	// charge is charge has left it (its value closed; the owner does not
	// release the charge: settling does), or why it refuses (the entry
	// became busy since its offer). settle returns once the runtime
	// settled the plan's step.
	DropCharge(charge string, settle func(refusal error))
	// DemoteCharge is DropCharge for a charge the owner offered as
	// demotable (OfferSink.OfferDemotable) and a plan demotes: the owner
	// keeps a copy of the entry at to, under the charge demoted (already
	// admitted there, same bytes), and drops it at its location. settle
	// exactly once: (nil, nil) demoted; (nil, err) its copy failed and
	// the entry was dropped (the runtime releases both charges); (refusal,
	// nil) the entry became busy and stays. On a goroutine of its own.
	DemoteCharge(charge, to, demoted string, settle func(refusal, dropped error))
	// DrainOffers hands every offer and withdrawal recorded since the
	// last drain to sink, once, in the order of the changes that made
	// them (seq: a number that grows with each change, comparable across
	// owners), and forgets them. It runs on the runtime's goroutine: no
	// user code, no blocking, no call into the runtime.
	DrainOffers(sink OfferSink)
}

// OfferSink takes an owner's drained offers and withdrawals.
type OfferSink interface {
	Offer(seq uint64, owner, charge string, freq int64)
	// OfferDemotable is Offer for a charge the owner can demote to its
	// location's spill target (ChargeDemoter).
	OfferDemotable(seq uint64, owner, charge string, freq int64)
	Withdraw(seq uint64, owner, charge string)
	// Touch records that a lease was taken on the charge's entry (a load
	// settled, a hit): its next offer ranks it as of the touch, after
	// every charge touched before it.
	Touch(seq uint64, owner, charge string)
}

// WaitConfig is what a system.WaitOption sets: whether to wait for room,
// in which priority class, and whether later waiters may bypass it. An
// owner applies the options itself (system.WaitOption is a func of
// *WaitConfig) and builds its budget.WaitSpec from the result.
type WaitConfig struct {
	Wait   bool
	Class  int
	Bypass bool
	// Notify (nil: none) is told each time the caller is queued or a try
	// of it is refused while it waits.
	Notify func(budget.WaitState)
}

var of func(sys any) Runtime

// Set installs the implementation (package system, at init).
func Set(f func(sys any) Runtime) { of = f }

// Of returns the runtime of sys, a *system.System; nil for a nil one.
func Of(sys any) Runtime { return of(sys) }
