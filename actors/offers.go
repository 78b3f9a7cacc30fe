package actors

import (
	"cmp"
	"slices"
)

// Lazy offers: a loader cache records the offers and withdrawals of its
// charges (an entry gone idle, a lease taken) where it keeps its entries,
// without a message, and names itself pending ([Engine.OffersPending]).
// The supervisor drains the pending offers of every source named since
// its last drain into the ledger (drainOffers) before it handles anything else — any message, any
// direct lease step — so every decision, admission, reservation, read and
// lease sees the cache's state as of its start, and an offer's stamp (its
// version) comes before every later ledger step, as the message it
// replaces did. A lease and a release of one entry between two ledger
// steps cost nothing; their net change costs one version at the drain.
//
// A drain runs no user code: the idle predicate is evaluated by the cache
// when the entry goes idle, on the releasing goroutine.

// OfferSink takes a source's pending offers and withdrawals. seq orders
// them across sources: each one's last change, in the order the changes
// were made.
type OfferSink interface {
	Offer(seq uint64, owner, charge string, freq int64)
	// OfferDemotable is Offer for a charge its owner can demote to its
	// location's spill target ([ChargeDemoter]).
	OfferDemotable(seq uint64, owner, charge string, freq int64)
	Withdraw(seq uint64, owner, charge string)
	// Touch records that a lease was taken on the charge's entry: its
	// next offer ranks it as of the touch (budget.Ledger.TouchCharge).
	Touch(seq uint64, owner, charge string)
}

// OfferSource is an owner of charges that records its offers and
// withdrawals and hands them over when the supervisor drains it.
type OfferSource interface {
	// DrainOffers hands every pending offer and withdrawal to sink, once,
	// and forgets them. It runs on the supervisor's goroutine: it must be
	// quick, must not block and must not call the runtime.
	DrainOffers(sink OfferSink)
}

// OffersPending tells the supervisor that src has pending offers: it
// drains them before its next step. Call it after recording them; once
// per drain is enough (a source named twice is drained twice, the second
// time finding nothing). Only the sources named since the last drain are
// drained, so the cost of a drain does not grow with the number of
// sources a runtime ever had.
func (e *Engine) OffersPending(src OfferSource) {
	o := &e.owners
	o.mu.Lock()
	o.waiting = append(o.waiting, src)
	o.mu.Unlock()
	o.pending.Store(true)
}

// chargeOp is one drained offer or withdrawal.
type chargeOp struct {
	seq           uint64
	owner, charge string
	freq          int64
	withdraw      bool
	demote        bool
	touch         bool
}

// offerBuffer collects a drain's operations (the supervisor's only; its
// storage is reused).
type offerBuffer struct{ ops []chargeOp }

func (b *offerBuffer) Offer(seq uint64, owner, charge string, freq int64) {
	b.ops = append(b.ops, chargeOp{seq: seq, owner: owner, charge: charge, freq: freq})
}

func (b *offerBuffer) OfferDemotable(seq uint64, owner, charge string, freq int64) {
	b.ops = append(b.ops, chargeOp{seq: seq, owner: owner, charge: charge, freq: freq, demote: true})
}

func (b *offerBuffer) Withdraw(seq uint64, owner, charge string) {
	b.ops = append(b.ops, chargeOp{seq: seq, owner: owner, charge: charge, withdraw: true})
}

func (b *offerBuffer) Touch(seq uint64, owner, charge string) {
	b.ops = append(b.ops, chargeOp{seq: seq, owner: owner, charge: charge, touch: true})
}

// drainOffers commits the pending offers and withdrawals of every source
// to the ledger, in the order of the changes that made them. A refusal (a
// charge released meanwhile, or being evicted: the drop's answer settles
// it) changes nothing and is dropped, as the owner's state settles it.
func (s *supervisor) drainOffers() {
	o := &s.eng.owners
	if !o.pending.Load() {
		return
	}
	o.pending.Store(false)
	o.mu.Lock()
	srcs := o.waiting
	o.waiting = o.draining[:0]
	o.mu.Unlock()
	b := &o.buf
	for i, src := range srcs {
		src.DrainOffers(b)
		srcs[i] = nil // keep no source alive
	}
	o.draining = srcs
	slices.SortStableFunc(b.ops, func(x, y chargeOp) int { return cmp.Compare(x.seq, y.seq) })
	for i, op := range b.ops {
		switch {
		case op.touch:
			_ = s.ledger.TouchCharge(op.charge, op.owner)
		case op.withdraw:
			_ = s.ledger.WithdrawCharge(op.charge, op.owner)
		case op.demote:
			_ = s.ledger.OfferDemotableCharge(op.charge, op.owner, op.freq)
		default:
			_ = s.ledger.OfferCharge(op.charge, op.owner, op.freq)
		}
		b.ops[i] = chargeOp{} // keep no names alive
	}
	b.ops = b.ops[:0]
}
