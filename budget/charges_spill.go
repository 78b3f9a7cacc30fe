package budget

// Demotion of an idle cache entry's charge (spill, applied to charges).
//
// An owner that can keep a copy of its entry at its location's spill
// target (a cache that opted in: a model's weights on pinned host are a
// warm start) offers the charge as demotable ([Ledger.OfferDemotableCharge]).
// The controller treats it exactly as the spill rule treats a value's
// only materialization (spill.go): victims, explored states and
// tie-breaks are unchanged; then, in victim order, a demotable charge is
// demoted to its location's spill target T when T has room in the plan's
// final state by the same rule (the spill cascade included); otherwise
// it is dropped as before. The decision's eviction record keeps Kind
// [EvictionIdleCacheEntry] and gains To; its reclaim action carries To.
//
// A run's reclaim step that demotes a charge is the eviction of the
// charge (it becomes evicting, 1 version) together with the admission of
// the owner's new charge at T, named `CHARGE→T`, same bytes, not offered
// (1 version): while the owner copies, both are charged, like a move's
// source and destination. The step is pending with one EffectDropCharge
// whose To and Demoted name T and the new charge. The owner answers:
//
//   - demoted ([Run.Complete]): the old charge is released (its
//     location's L rises to its H); the new one stays, the owner's to
//     offer once its copy is in place;
//   - dropped ([Run.CompleteDropped]): the copy failed, the owner dropped
//     the entry: both charges are released and the run goes on, exactly
//     as without spill;
//   - refused ([Run.FailStep]): the entry became busy: the new charge is
//     released, the old one is not offered again, and the run fails with
//     a [*ChargeBusyError] (Refused).
//
// Never half-moved, never charged twice: at every point the entry's bytes
// are charged where its copies are.

// OfferDemotableCharge is [Ledger.OfferCharge] for a charge its owner can
// demote: the controller may demote it to its location's spill target
// instead of dropping it (charges_spill.go). An offer made by OfferCharge
// is not demotable. 1 version.
//
// Errors (nothing changed): those of OfferCharge, and invalid input when
// the charge's location has no spill target.
func (l *Ledger) OfferDemotableCharge(name, owner string, freq int64) error {
	return l.offerCharge(name, owner, freq, true)
}

// demotedName is the name of the owner's new charge at t when charge r is
// demoted there.
func (l *Ledger) demotedName(r *reservation, t int) string {
	return r.name + "→" + l.locs[t].name
}

// chargeDemotable reports whether the offered charge r may be demoted to
// t now: offered as demotable, t its location's spill target, and the
// new charge's name free.
func (l *Ledger) chargeDemotable(r *reservation, t int) bool {
	if r == nil || !r.demote || t < 0 || l.locs[r.loc].spill != t {
		return false
	}
	name := l.demotedName(r, t)
	return l.reservations[name] == nil && l.parentReservations[name] == nil
}

// checkChargeDemotion validates the demotion of charge r to the location
// a.To (a reclaim action with Charge and To): offered as demotable, to
// its location's spill target, the new charge's name free. It returns
// the target's index.
func (l *Ledger) checkChargeDemotion(r *reservation, a Action) (int, error) {
	t, err := l.location(a.To)
	if err != nil {
		return 0, err
	}
	if !r.demote {
		return 0, invalidf("reclaim of charge %s: its owner did not offer it as demotable (to %s)", l.shownName(r.name), a.To)
	}
	if s := l.locs[r.loc].spill; s != t {
		return 0, invalidf("reclaim of charge %s: a charge may be demoted only to its location's spill target, not %s", l.shownName(r.name), a.To)
	}
	if name := l.demotedName(r, t); l.reservations[name] != nil || l.parentReservations[name] != nil {
		return 0, invalidf("reclaim of charge %s: its demoted charge %s is already active", l.shownName(r.name), name)
	}
	return t, nil
}

// simDemoteCharge simulates the new charge of a demotion of r (reclaim
// action a) on a simulation clone: T must admit its bytes now.
func (l *Ledger) simDemoteCharge(r *reservation, a Action) error {
	t, err := l.checkChargeDemotion(r, a)
	if err != nil {
		return err
	}
	if err := l.admits(t, r.bytes); err != nil {
		return err
	}
	lc := &l.locs[t]
	lc.reserved += r.bytes
	if c := lc.used + lc.reserved; c > lc.peak {
		lc.peak = c
	}
	l.notePeak(t)
	return nil
}

// admitDemotedCharge admits the owner's new charge at the spill target of
// the demotion of res (reclaim action a), before res becomes evicting.
func (l *Ledger) admitDemotedCharge(res *reservation, a Action) (*reservation, error) {
	t, err := l.checkChargeDemotion(res, a)
	if err != nil {
		return nil, err
	}
	name := l.demotedName(res, t)
	if err := l.reserve(a.To, name, res.bytes, res.owner); err != nil {
		return nil, err
	}
	return l.reservations[name], nil
}

// releaseDemoted releases the pending demotion's new charge, unless its
// owner released it meanwhile.
func (r *Run) releaseDemoted() {
	d := r.demoted
	r.demoted = nil
	if d == nil || r.l.reservations[d.name] != d {
		return
	}
	r.l.recordInto(&r.report, func() { _ = r.l.unreserve(d.name, d.owner) })
}

// CompleteDropped settles the pending demotion of a charge (an
// EffectDropCharge with To) as dropped: the owner's copy failed and it
// dropped the entry. Both charges are released (the old one as a
// confirmed eviction: its location's L rises) and the run goes on, as
// without spill. cause is the copy's failure, for the caller's logs.
// Errors: invalid input when no charge demotion is pending.
func (r *Run) CompleteDropped(cause error) error {
	if r.pending == 0 || r.charge == nil || r.demoted == nil {
		return invalidf("no charge demotion is pending")
	}
	_ = cause
	r.pending = 0
	r.releaseDemoted()
	r.completeCharge()
	return nil
}
