package actors

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Offered charges: a loader cache's idle entries as victims of the
// controller (budget/doc_cache.go, "Idle cache entries as victims").
//
// The cache offers a charge when its entry goes idle and withdraws the
// offer when a lease is taken: recorded by the cache and drained before
// each supervisor step (offers.go). A run's reclaim step that evicts an offered charge is pending
// with one EffectDropCharge: the supervisor hands it to the charge's
// owner (registered with [Engine.RegisterChargeOwner]) on a goroutine of
// its own — the owner's work (its idle predicate, the value's Close) is
// user code and never runs on the supervisor's goroutine — and the owner
// answers through settle, which sends a ChargeDropped and waits until the
// supervisor settled the step: confirmed, the run completes the step (the
// ledger releases the charge) and goes on; refused, the run fails with a
// *budget.ChargeBusyError.

// ChargeOwner is the owner of charges the controller may evict.
type ChargeOwner interface {
	// DropCharge asks the owner to drop the entry whose charge is charge.
	// It runs on a goroutine of its own. The owner calls settle exactly
	// once: nil once the entry has left it (its value closed; the owner
	// must not release the charge itself: settling releases it), or the
	// reason it refuses (the entry became busy). settle returns once the
	// supervisor has settled the step. An owner that returns without
	// settling is taken to refuse.
	DropCharge(charge string, settle func(refusal error))
}

// ChargeDemoter is a ChargeOwner that can keep a copy of its entry at its
// location's spill target: it offers its charges as demotable, and a run
// that demotes one (an EffectDropCharge with To) calls DemoteCharge
// instead of DropCharge (budget/charges_spill.go).
type ChargeDemoter interface {
	ChargeOwner
	// DemoteCharge asks the owner to move the entry whose charge is
	// charge to the location to, where its new charge demoted is already
	// admitted. It runs on a goroutine of its own. The owner calls settle
	// exactly once: (nil, nil) once the entry's copy is at to under
	// demoted and the entry has left charge's location (the owner
	// releases neither charge itself); (nil, dropped) when its copy
	// failed and it dropped the entry instead (both charges are then
	// released by the runtime); (refusal, nil) when the entry became busy
	// (it stays where it was). An owner that returns without settling is
	// taken to refuse.
	DemoteCharge(charge, to, demoted string, settle func(refusal, dropped error))
}

// chargeOwners maps owner names to their ChargeOwner, and holds the
// sources of lazy offers (offers.go).
type chargeOwners struct {
	mu sync.Mutex
	m  map[string]ChargeOwner

	pending  atomic.Bool   // a source has offers to drain
	waiting  []OfferSource // the sources named since the last drain (under mu)
	draining []OfferSource // the last drain's list, reused (the supervisor's)
	buf      offerBuffer   // the supervisor's drain buffer
}

// RegisterChargeOwner makes o the owner called back for the offered
// charges of owner. A later registration of the same name replaces it.
func (e *Engine) RegisterChargeOwner(owner string, o ChargeOwner) {
	e.owners.mu.Lock()
	defer e.owners.mu.Unlock()
	if e.owners.m == nil {
		e.owners.m = map[string]ChargeOwner{}
	}
	e.owners.m[owner] = o
}

func (e *Engine) chargeOwner(owner string) ChargeOwner {
	e.owners.mu.Lock()
	defer e.owners.mu.Unlock()
	return e.owners.m[owner]
}

// NoChargeOwnerError is the refusal of a charge's eviction whose owner
// registered no callback: nobody can drop its entry.
type NoChargeOwnerError struct{ Owner string }

func (e *NoChargeOwnerError) Error() string {
	return fmt.Sprintf("no owner %s is registered to drop its charges", e.Owner)
}

// errNoAnswer: the owner returned from DropCharge without settling.
var errNoAnswer = errors.New("the owner returned without dropping the entry")

// dropCharge hands the pending step id, the eviction of an offered
// charge (effect e), to the charge's owner on a goroutine of its own.
func (s *supervisor) dropCharge(id budget.AdmissionID, e budget.Effect) {
	eng := s.eng
	o := eng.chargeOwner(e.Owner)
	to := eng.Supervisor
	kind := "drop cache entry"
	if e.To != "" {
		kind = "demote cache entry"
	}
	op := eng.ops.begin(RunningOp{Kind: kind, Value: e.Charge, Location: e.Location}, false)
	eng.watchers.add()
	go func() {
		defer eng.watchers.done()
		defer eng.endOp(op)
		var once sync.Once
		answer := func(refusal, dropped error) {
			once.Do(func() {
				// After the runtime stopped (a drop abandoned at close)
				// nothing is left to settle.
				if eng.ctx.Err() != nil {
					return
				}
				f := actor.NewFuture(eng.System, eng.allocTimeout+30*time.Second)
				eng.root.Send(to, &messages.ChargeDropped{Admission: id, Err: refusal, Dropped: dropped, ReplyTo: f.PID()})
				_ = eng.awaitFuture(eng.ctx, f)
			})
		}
		settle := func(refusal error) { answer(refusal, nil) }
		defer func() {
			if r := recover(); r != nil {
				settle(fmt.Errorf("the owner's DropCharge panicked: %v", r))
			}
		}()
		switch d, demoter := o.(ChargeDemoter); {
		case o == nil:
			settle(&NoChargeOwnerError{Owner: e.Owner})
			return
		case e.To != "" && demoter:
			d.DemoteCharge(e.Charge, e.To, e.Demoted, answer)
		case e.To != "":
			// An owner that cannot demote drops the entry: as without spill.
			o.DropCharge(e.Charge, func(refusal error) {
				if refusal != nil {
					answer(refusal, nil)
					return
				}
				answer(nil, errNoDemoter)
			})
		default:
			o.DropCharge(e.Charge, settle)
		}
		settle(errNoAnswer)
	}()
}

// errNoDemoter: a demotion's owner cannot demote; it dropped the entry.
var errNoDemoter = errors.New("the owner cannot demote its charges: the entry was dropped")

// chargeDropped settles a pending charge eviction with its owner's
// answer and acknowledges it.
func (s *supervisor) chargeDropped(m *messages.ChargeDropped) {
	op, ok := s.pending[m.Admission]
	if !ok || op.run == nil {
		s.send(m.ReplyTo, &messages.Reply{Version: s.ledger.Version()})
		return
	}
	s.handling, s.hooked = op.request, false
	if m.Err == nil && m.Dropped != nil {
		// A demotion whose copy failed: the entry was dropped (both charges
		// released), and the run goes on as without spill.
		s.eng.log.Warn().Err(m.Dropped).Str("effect", op.effect.String()).Msg("demotion of a cache entry failed; the entry was dropped")
		if err := op.run.run.CompleteDropped(m.Dropped); err != nil {
			s.replyRun(op.run, &messages.RunReply{Err: err})
		} else {
			s.advance(op.run)
		}
	} else if m.Err == nil {
		if _, err := op.run.run.Complete(); err != nil {
			s.replyRun(op.run, &messages.RunReply{Err: err})
		} else {
			s.advance(op.run)
		}
	} else {
		s.eng.log.Debug().Err(m.Err).Str("effect", op.effect.String()).Msg("owner refused to drop its charge")
		_, err := op.run.run.FailStep(m.Err)
		s.replyRun(op.run, &messages.RunReply{Err: err})
	}
	delete(s.pending, m.Admission)
	s.send(m.ReplyTo, &messages.Reply{Version: s.ledger.Version()})
	s.maybeFinishShutdown()
}
