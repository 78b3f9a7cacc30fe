package budget

// A run's reclaim step that evicts an offered charge: two-phase, like a
// value's transfer (doc_cache.go, "Idle cache entries as victims").

// nextChargeEviction admits reclaim step i, the eviction of an offered
// charge: the charge becomes evicting (1 version) and the step is pending
// with one EffectDropCharge for its owner.
func (r *Run) nextChargeEviction(i int, a Action) (Step, bool, error) {
	var res, demoted *reservation
	var e error
	r.l.recordInto(&r.report, func() {
		if _, e = r.l.location(a.Location); e != nil {
			return
		}
		if res, e = r.l.checkChargeEvict(a, r.l.reservations); e != nil {
			return
		}
		if a.To != "" {
			// A demotion (charges_spill.go): the new charge first, so that
			// a refusal at the target changes nothing.
			if demoted, e = r.l.admitDemotedCharge(res, a); e != nil {
				return
			}
		}
		r.l.unofferIndex(res)
		res.state = ChargeEvicting
		r.l.commitDetail("evict_charge", nil, res.loc, res.bytes, traceDetail{kind: detailReservation, text: res.name})
	})
	if e != nil {
		return Step{}, false, r.fail(e, &a, i, nil, -1)
	}
	r.l.nextAdmission++
	r.pending, r.charge, r.demoted = r.l.nextAdmission, res, demoted
	eff := Effect{Kind: EffectDropCharge, Location: a.Location, Bytes: res.bytes, Owner: res.owner, Charge: res.name}
	if demoted != nil {
		eff.To, eff.Demoted = a.To, demoted.name
	}
	return Step{Phase: PhaseReclaim, Index: i, Admission: Admission{ID: r.pending, Pending: true, Effects: []Effect{eff}}}, true, nil
}

// live reports whether the pending charge is still the active, evicting
// reservation (its owner may have released it meanwhile, and a new one
// may carry its name).
func (r *Run) live(res *reservation) bool {
	return r.l.reservations[res.name] == res && res.state == ChargeEvicting
}

// completeCharge settles the pending charge eviction as confirmed: the
// charge is released (1 version; none when its owner released it
// meanwhile) and its location's L rises to its priority. A demotion's new
// charge stays: the owner keeps the entry there.
func (r *Run) completeCharge() {
	res := r.charge
	r.charge, r.demoted = nil, nil
	if !r.live(res) {
		return
	}
	lc := &r.l.locs[res.loc]
	if res.key.prio > lc.inflation {
		lc.inflation = res.key.prio
	}
	r.l.recordInto(&r.report, func() { _ = r.l.unreserve(res.name, res.owner) })
}

// failCharge settles the pending charge eviction as refused by its owner:
// the charge is not offered again (1 version; none when its owner
// released it meanwhile) and the run fails with a *ChargeBusyError
// (Refused) as its cause.
func (r *Run) failCharge(cause error) error {
	r.releaseDemoted()
	res := r.charge
	r.charge = nil
	if r.live(res) {
		r.l.recordInto(&r.report, func() {
			res.state = ChargeNotOffered
			r.l.commitDetail("refuse_charge", nil, res.loc, res.bytes, traceDetail{kind: detailReservation, text: res.name})
		})
	}
	busy := r.l.chargeBusy(res)
	busy.Refused, busy.Cause = true, cause
	i := r.index - 1
	a := r.plan.Reclaim[i]
	return r.fail(busy, &a, i, nil, -1)
}
