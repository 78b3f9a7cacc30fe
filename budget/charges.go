package budget

import "fmt"

// Offered charges: a cache's idle entries as the controller's candidates,
// in the same per-location candidate index as values (doc_cache.go,
// "Idle cache entries as victims").

// ChargeState is the state of an owned charge as a victim of the
// controller.
type ChargeState uint8

const (
	// ChargeNotOffered: the owner keeps the charge; never a victim.
	ChargeNotOffered ChargeState = iota
	// ChargeOffered: an idle cache entry, a candidate at its location.
	ChargeOffered
	// ChargeEvicting: a run's reclaim step asked the owner to drop it; its
	// bytes are still reserved until the owner answers.
	ChargeEvicting
)

// String is the state in snake case: "not_offered", "offered",
// "evicting".
func (s ChargeState) String() string {
	switch s {
	case ChargeNotOffered:
		return "not_offered"
	case ChargeOffered:
		return "offered"
	case ChargeEvicting:
		return "evicting"
	}
	return fmt.Sprintf("ChargeState(%d)", uint8(s))
}

// chargeIDBit marks a candidate that is an offered charge: its id is
// chargeIDBit | the reservation's sequence number. Value ids never reach
// it, so at equal priority and last use a value ranks before a charge,
// and charges among themselves in admission order.
const chargeIDBit = uint64(1) << 63

func isChargeID(id uint64) bool { return id&chargeIDBit != 0 }

// ChargeInfo is what the ledger knows of one active reservation as a
// charge (a read).
type ChargeInfo struct {
	Name     string
	Owner    string
	Location string
	Bytes    int64
	State    ChargeState
	// Priority (H) and LastUse (the version of the offer) while offered;
	// 0 otherwise.
	Priority int64
	LastUse  uint64
	// Demotable: offered as demotable ([Ledger.OfferDemotableCharge]).
	Demotable bool
}

// Charge returns the active reservation name as a charge; false when no
// reservation of that name is active. A read: no version.
func (l *Ledger) Charge(name string) (ChargeInfo, bool) {
	r, ok := l.reservations[name]
	if !ok {
		return ChargeInfo{}, false
	}
	out := ChargeInfo{Name: r.name, Owner: r.owner, Location: l.locs[r.loc].name, Bytes: r.bytes, State: r.state}
	if r.state == ChargeOffered {
		out.Priority, out.LastUse, out.Demotable = r.key.prio, r.key.lastUse, r.demote
	}
	return out, true
}

// ChargeBusyError: a charge cannot be offered, resized or evicted in its
// present state, or its owner refused to drop it (Refused: the entry
// became busy between the decision and the eviction; Cause is the
// owner's answer). It matches errors.Is(err, ErrBusy): decide again
// later.
type ChargeBusyError struct {
	Owner    string
	Charge   string
	Location string
	State    ChargeState // the charge's state at the refusal
	Refused  bool
	Cause    error
}

func (e *ChargeBusyError) Error() string {
	if e.Refused {
		return fmt.Sprintf("residency busy: %s refused to drop its charge %s at %s: %v", e.Owner, e.Charge, e.Location, e.Cause)
	}
	return fmt.Sprintf("residency busy: charge %s of %s at %s is %s", e.Charge, e.Owner, e.Location, e.State)
}

// Is matches ErrBusy.
func (e *ChargeBusyError) Is(target error) bool { return target == ErrBusy }

// Unwrap returns the owner's answer (Refused), or nil.
func (e *ChargeBusyError) Unwrap() error { return e.Cause }

func (l *Ledger) chargeBusy(r *reservation) *ChargeBusyError {
	return &ChargeBusyError{Owner: r.owner, Charge: r.name, Location: l.locs[r.loc].name, State: r.state}
}

// ownedCharge resolves an active charge of a cache owner.
func (l *Ledger) ownedCharge(name, owner string) (*reservation, error) {
	if len(owner) <= len(CacheOwnerPrefix) || owner[:len(CacheOwnerPrefix)] != CacheOwnerPrefix {
		return nil, invalidf("charge owner %q is not a cache (owner names start with %q)", owner, CacheOwnerPrefix)
	}
	r, ok := l.reservations[name]
	if !ok {
		return nil, invalidf("reservation %q is not active (already released or never made)", name)
	}
	if r.owner != owner {
		return nil, invalidf("reservation %q does not belong to %q", name, owner)
	}
	return r, nil
}

// OfferCharge offers owner's charge name as an eviction candidate: its
// cache entry is idle (ready, no lease, no pin, idle predicate true). The
// charge ranks at its location with the values there by one rule:
// priority H = L(location) + freq (freq ≥ 0: the owner's use count of the
// entry, as a value's completed placements and leases), then last use
// (this offer's version), then a stable id (values before charges, then
// charges in admission order). An offered charge is offered again with
// a new stamp. A charge touched ([Ledger.TouchCharge]) ranks by its last
// touch instead: H = L as of the touch + freq, last use the touch's
// version, then touch order. 1 version.
//
// Errors (nothing changed): invalid input (an owner that is not a cache's,
// a charge not active or of another owner, freq < 0),
// [*ChargeBusyError] (the charge is evicting).
func (l *Ledger) OfferCharge(name, owner string, freq int64) error {
	return l.offerCharge(name, owner, freq, false)
}

func (l *Ledger) offerCharge(name, owner string, freq int64, demote bool) error {
	r, err := l.ownedCharge(name, owner)
	if err != nil {
		return err
	}
	if freq < 0 {
		return invalidf("charge %q: freq must be ≥ 0, got %d", name, freq)
	}
	if demote && l.locs[r.loc].spill < 0 {
		return invalidf("charge %s cannot be offered as demotable: %s has no spill target", l.shownName(name), l.locs[r.loc].name)
	}
	if r.state == ChargeEvicting {
		return l.chargeBusy(r)
	}
	l.unofferIndex(r)
	r.state, r.demote = ChargeOffered, demote
	v := l.commitDetail("offer_charge", nil, r.loc, r.bytes, traceDetail{kind: detailReservation, text: name})
	prio := l.locs[r.loc].inflation + freq
	if r.taken.set { // ranked by the last take (cache_charges.go)
		prio, v = r.taken.prio+freq, r.taken.version
	}
	r.key = candidate{prio: prio, lastUse: v, id: chargeIDBit | r.seq, bytes: r.bytes}
	l.offerIndex(r)
	return nil
}

// WithdrawCharge withdraws the offer of owner's charge name (a lease was
// taken on its entry): 1 version. A charge that is not offered, or that
// is evicting (the owner's answer to the eviction settles it), changes
// nothing: 0 versions, no error.
//
// Errors (nothing changed): invalid input (an owner that is not a
// cache's, a charge not active or of another owner).
func (l *Ledger) WithdrawCharge(name, owner string) error {
	r, err := l.ownedCharge(name, owner)
	if err != nil {
		return err
	}
	if r.state != ChargeOffered {
		return nil
	}
	l.unofferIndex(r)
	r.state = ChargeNotOffered
	l.commitDetail("withdraw_charge", nil, r.loc, r.bytes, traceDetail{kind: detailReservation, text: name})
	return nil
}

// offerIndex adds the offered charge r to its location's candidates.
func (l *Ledger) offerIndex(r *reservation) {
	if l.sim || r.state != ChargeOffered {
		return
	}
	lc := &l.locs[r.loc]
	lc.cands.insert(r.key)
	lc.catBytes[catCandidate] += r.key.bytes
	if l.charges == nil {
		l.charges = map[uint64]*reservation{}
	}
	l.charges[r.key.id] = r
}

// unofferIndex removes r from its location's candidates (if it is there).
func (l *Ledger) unofferIndex(r *reservation) {
	if l.sim || r.state != ChargeOffered {
		return
	}
	lc := &l.locs[r.loc]
	lc.cands.remove(r.key)
	lc.catBytes[catCandidate] -= r.key.bytes
	delete(l.charges, r.key.id)
}

// checkChargeEvict validates the eviction of charge a.Charge of a.Owner
// at a.Location: active, the owner's, there, offered.
func (l *Ledger) checkChargeEvict(a Action, lookup map[string]*reservation) (*reservation, error) {
	r, ok := lookup[a.Charge]
	if !ok {
		return nil, invalidf("reclaim of charge %q: it is not active (already released or never made)", a.Charge)
	}
	if r.owner != a.Owner {
		return nil, invalidf("reclaim of charge %q: it belongs to %q, not %q", a.Charge, r.owner, a.Owner)
	}
	if l.locs[r.loc].name != a.Location {
		return nil, invalidf("reclaim of charge %q: it is at %s, not %s", a.Charge, l.locs[r.loc].name, a.Location)
	}
	if r.state != ChargeOffered {
		return nil, l.chargeBusy(r)
	}
	return r, nil
}

// checkChargeAction validates a reclaim action that names a charge
// (planValues): no handle, no From, a To that names another configured
// location (a demotion, charges_spill.go), a cache owner; the charge
// itself is checked when the step runs (or is simulated).
func (l *Ledger) checkChargeAction(a Action, what string, i int) error {
	if a.Charge == "" {
		return invalidf("%s %d (%s): an owner without a charge", what, i, a)
	}
	if what != "reclaim" {
		return invalidf("%s %d (%s): only a reclaim may name a charge", what, i, a)
	}
	if !a.Handle.IsZero() || a.Handle.Name != "" || a.From != "" {
		return invalidf("reclaim %d (%s): a charge's reclaim names no handle or from", i, a)
	}
	if _, err := l.location(a.Location); err != nil {
		return err
	}
	if a.To != "" {
		if err := l.checkDemotionField(a, i); err != nil {
			return err
		}
	}
	if len(a.Owner) <= len(CacheOwnerPrefix) || a.Owner[:len(CacheOwnerPrefix)] != CacheOwnerPrefix {
		return invalidf("reclaim %d (%s): owner %q is not a cache", i, a, a.Owner)
	}
	return nil
}

// simEvictCharge simulates the eviction of a charge on a simulation
// clone: the parent's charge, offered, not already evicted by this plan.
func (l *Ledger) simEvictCharge(a Action) error {
	r, err := l.checkChargeEvict(a, l.parentReservations)
	if err != nil {
		return err
	}
	if l.simDropped[r] {
		return invalidf("reclaim of charge %q: the plan evicts it twice", a.Charge)
	}
	if l.simDropped == nil {
		l.simDropped = map[*reservation]bool{}
	}
	if a.To != "" {
		if err := l.simDemoteCharge(r, a); err != nil {
			return err
		}
	}
	l.simDropped[r] = true
	l.locs[r.loc].reserved -= r.bytes
	return nil
}

// checkCharges verifies the offered charges against the reservations:
// every offered charge is active and indexed under its key, every
// indexed charge is offered; it returns the offered bytes by location
// (CheckInvariants adds them to the candidates' bytes).
func (l *Ledger) checkCharges() ([]int64, map[candidate]bool, error) {
	bytes := make([]int64, len(l.locs))
	keys := map[candidate]bool{}
	offered := 0
	for name, r := range l.reservations {
		if r.name != name {
			return nil, nil, fmt.Errorf("reservation %s listed as %s", r.name, name)
		}
		if r.state != ChargeNotOffered && r.owner == "" {
			return nil, nil, fmt.Errorf("reservation %s without owner is %s", name, r.state)
		}
		if r.state != ChargeOffered {
			continue
		}
		offered++
		if l.charges[r.key.id] != r || r.key.bytes != r.bytes || r.key.id != chargeIDBit|r.seq {
			return nil, nil, fmt.Errorf("offered charge %s is not indexed as %+v", name, r.key)
		}
		bytes[r.loc] += r.bytes
		keys[r.key] = true
	}
	if offered != len(l.charges) {
		return nil, nil, fmt.Errorf("%d charges indexed, %d offered (offered ⊆ active)", len(l.charges), offered)
	}
	return bytes, keys, nil
}

// chargeReclaim is the reclaim action and the eviction record of victim
// vc, an offered charge at the location named loc.
// to names its spill target when it is demoted ("" when it is dropped).
func (d *decider) chargeReclaim(vc victim, loc, to string) (Action, Eviction) {
	r := d.l.charges[vc.c.id]
	a := Action{Location: loc, Owner: r.owner, Charge: r.name, To: to}
	what := "dropped by its owner"
	if to != "" {
		what = "demoted to " + to + " by its owner"
	}
	e := Eviction{Location: loc, Bytes: vc.c.bytes, Kind: EvictionIdleCacheEntry, Owner: r.owner, Charge: r.name, To: to,
		Reason: fmt.Sprintf("idle cache entry %s of %s, least valuable: priority H=%d (last use v%d) among the lowest at %s; %s to free %d bytes of the %d-byte shortfall for request %q",
			r.name, r.owner, vc.c.prio, vc.c.lastUse, loc, what, vc.c.bytes, vc.n, d.req.Name)}
	return a, e
}
