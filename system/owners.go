package system

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Owners is the runtime's side for an owner of charges: a component
// built on the runtime — the loader cache of package system/cache is
// one — that keeps named reservations under an owner name at one
// location (its charges), offers its idle ones to the controller as
// eviction victims in one order with the values there, and waits for
// room in the runtime's wait queue as Admit does. Get it with
// [System.Owners]; a component declares the subset it calls as an
// interface of its own (system/cache does).
//
// An owner name (a cache's is `cache "NAME"`) is unique in its runtime for
// the runtime's life ([Owners.Register]). The controller may pick an
// owner's idle charge as a victim: the owner records the offer of a
// charge when its entry goes idle and its withdrawal when a lease is
// taken, and says so ([Owners.OffersPending]); the runtime drains what it
// recorded ([ChargeOwner.DrainOffers]) before its next ledger step. A plan
// that evicts a charge calls the owner back ([ChargeOwner.DropCharge]).
// An owner's load that needs room asks the controller too
// ([Owners.Admit]). All methods are safe for concurrent use.
type Owners struct{ s *System }

// Owners returns the runtime's calls for owners of charges.
func (s *System) Owners() Owners { return Owners{s} }

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
	// location's spill target.
	OfferDemotable(seq uint64, owner, charge string, freq int64)
	Withdraw(seq uint64, owner, charge string)
	// Touch records that a lease was taken on the charge's entry (a load
	// settled, a hit): its next offer ranks it as of the touch, after
	// every charge touched before it.
	Touch(seq uint64, owner, charge string)
}

// ownerNames are the owner names claimed in a runtime: unique for its
// life (a closed cache's charges may outlive it under its name).
type ownerNames struct {
	mu    sync.Mutex
	names map[string]struct{}
	seq   atomic.Uint64
}

// Register claims owner, a ledger owner name, for the runtime's life,
// with co (nil: none) as the callback that drops its offered charges:
// false when another owner of this runtime has it.
func (o Owners) Register(owner string, co ChargeOwner) bool {
	n := &o.s.owners
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, taken := n.names[owner]; taken {
		return false
	}
	if n.names == nil {
		n.names = map[string]struct{}{}
	}
	n.names[owner] = struct{}{}
	if co != nil {
		o.s.eng.RegisterChargeOwner(owner, co)
	}
	return true
}

// OffersPending tells the runtime that the owner co (as registered)
// recorded offers or withdrawals of its charges (co.DrainOffers hands
// them over): the runtime drains them before its next ledger step. It
// never blocks and sends nothing. Only the owners that said so are
// drained, so an owner says it once per drain, after recording.
func (o Owners) OffersPending(co ChargeOwner) { o.s.eng.OffersPending(offerSource{co}) }

// offerSource is an owner's DrainOffers as the engine's OfferSource.
type offerSource struct{ co ChargeOwner }

func (d offerSource) DrainOffers(sink actors.OfferSink) { d.co.DrainOffers(sink) }

// Admit asks the controller for room for req (its reservations owned
// by an owner) and runs the plan, evicting values and offered charges
// as the decision says, in one step of the runtime. It returns the
// decision (the evidence) and the run's error. A reply that comes
// after ctx ended is handed back (its owned reservations released).
// The owner orders its calls against the wait queue itself
// ([Owners.WaitersAhead], [Owners.Wait]) at the locations req names: room
// held there for earlier waiters does not refuse this call. Room held
// elsewhere does: the plan drops a victim rather than demote it into a
// held spill target.
func (o Owners) Admit(ctx context.Context, req budget.Request) (budget.Decision, error) {
	s := o.s
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.Admit{Request: req, Ordered: true, ReplyTo: p}
	}, func(m any) {
		if r, ok := m.(*messages.RunReply); ok && r.Err == nil {
			for _, rs := range req.Reservations {
				s.root.Send(s.sup, &messages.OwnedUnreserve{Name: rs.Name, Owner: rs.Owner})
			}
		}
	})
	if err != nil {
		return budget.Decision{}, err
	}
	rep := r.(*messages.RunReply)
	var d budget.Decision
	if rep.Decision != nil {
		d = *rep.Decision
	}
	return d, rep.Err
}

// Seq returns a number unique in the runtime (1, 2, ...), for the
// names of owners the application did not name.
func (o Owners) Seq() uint64 { return o.s.owners.seq.Add(1) }

// SpillTarget returns loc's spill target (Options.Spill), if any.
func (o Owners) SpillTarget(loc string) (string, bool) {
	to, ok := o.s.spill[loc]
	return to, ok
}

// Charges returns loc's figures and what owner's reservations charge
// there (a read: no version). Errors: an unknown or malformed
// location, ErrClosed, ctx.Err().
func (o Owners) Charges(ctx context.Context, loc, owner string) (budget.OwnerCharges, error) {
	r, err := o.s.call(ctx, func(p *actor.PID) any {
		return &messages.OwnerChargesRequest{Location: loc, Owner: owner, ReplyTo: p}
	}, nil)
	if err != nil {
		return budget.OwnerCharges{}, err
	}
	rep := r.(*messages.OwnerChargesReply)
	return rep.Charges, rep.Err
}

// Reserve admits a reservation of bytes at loc named name and owned
// by owner (1 version). A reply that comes after ctx ended is
// released at once. Errors: the ledger's (*system.BudgetError,
// invalid input), the runtime's (ErrClosed), ctx.Err().
func (o Owners) Reserve(ctx context.Context, loc, owner, name string, bytes int64) error {
	s := o.s
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.OwnedReserve{Location: loc, Name: name, Owner: owner, Bytes: bytes, ReplyTo: p}
	}, func(m any) {
		if r, ok := m.(*messages.Reply); ok && r.Err == nil {
			s.root.Send(s.sup, &messages.OwnedUnreserve{Name: name, Owner: owner})
		}
	})
	if err != nil {
		return err
	}
	return r.(*messages.Reply).Err
}

// Resize sets the bytes of owner's reservation name: shrinking is
// always admitted, growing like a reservation of the difference.
func (o Owners) Resize(ctx context.Context, owner, name string, bytes int64) error {
	return o.s.callErr(ctx, func(p *actor.PID) any {
		return &messages.OwnedResize{Name: name, Owner: owner, Bytes: bytes, ReplyTo: p}
	})
}

// Unreserve releases owner's reservation name; it never gives up (a
// charge must follow its value). After the runtime closed there is
// nothing to release: nil. A failure is also logged.
func (o Owners) Unreserve(owner, name string) error {
	err := o.s.callErr(context.Background(), func(p *actor.PID) any {
		return &messages.OwnedUnreserve{Name: name, Owner: owner, ReplyTo: p}
	})
	if errors.Is(err, ErrClosed) {
		return nil
	}
	if err != nil {
		o.s.log.Error().Err(err).Str("reservation", name).Msg("cache: releasing a charge failed")
	}
	return err
}

// Refusal is the runtime's refusal of any call now (fatal, closed),
// or ctx.Err(); nil when a call may go ahead.
func (o Owners) Refusal(ctx context.Context) error { return o.s.refusal(ctx) }

// Wait calls try at once, unless waiters ahead of spec hold it up
// (budget.WaitQueue.Ahead); if that try is refused (not done), or
// was not made, it queues the caller described by spec in the
// runtime's wait queue and calls try on each of its turns until try
// reports done, ctx ends (ctx.Err()) or the runtime closes
// (ErrClosed). A full queue refuses at once (*budget.QueueFullError).
// notify (nil: none) is told when it is queued and after each
// refused turn.
func (o Owners) Wait(ctx context.Context, spec budget.WaitSpec, notify func(budget.WaitState), try func() (bool, error)) error {
	return o.s.room.wait(ctx, spec, notify, false, func(budget.WaitID) (bool, error) { return try() })
}

// WaitersAhead returns how many callers waiting for room hold up a
// new call described by spec (budget.WaitQueue.Ahead): a call that
// needs room does not take it ahead of them.
func (o Owners) WaitersAhead(spec budget.WaitSpec) int { return o.s.room.ahead(spec) }

// RoomMade tells the wait queue that room may have been made outside
// the ledger (an owner's idle state became evictable). Never blocks.
func (o Owners) RoomMade() { o.s.room.signal() }

// LoadFailed writes the runtime's loader_failed event for a load of
// key by owner at loc (peak bytes) that failed with err, when err is
// a *system.CacheLoadError (anything else is not a loader's failure).
func (o Owners) LoadFailed(owner, loc, key string, peak int64, err error) {
	o.s.events.cacheLoadFailed(owner, loc, key, peak, err)
}

// Log is the runtime's logger (Options.Logger).
func (o Owners) Log() *zerolog.Logger { return &o.s.log }
