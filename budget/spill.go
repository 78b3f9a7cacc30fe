package budget

// Spill: demotion instead of drop.
//
// A location may name a spill target ([LocationConfig].SpillTo): another
// configured location. A plan's reclaim action with To is a demotion: a
// move of the materialization at Location to To, carried out in the
// reclaim phase with the move's charges (the destination charged from
// admission, the source until completion) and the move's versions (admit,
// complete, remove the source). Explain simulates it like any other step;
// users may write demotions in their own plans.
//
// Decide chooses the assignment and its victims exactly as without spill
// targets (victims, explored states and tie-breaks do not depend on
// them). Then, in victim order, a victim whose value has no other
// resident materialization (and none at T) is demoted to its location's
// spill target T when T has room, both in the plan's final state and
// when the demotion lands (it lacks short(T) ≤ 0 bytes):
//
//	final:   used(T) + reserved(T) − bytes of the victims removed at T
//	           + the plan's own additions at T (destinations, temporary
//	             reconstruction charges, reservations)
//	           + the demotions into T listed earlier + its bytes − budget(T)
//	landing: used(T) + reserved(T) − bytes of the victims at T listed
//	           earlier + the demotions into T listed earlier + its bytes
//	           − budget(T)
//	short(T) = max(final, landing); 0 when T has no budget
//
// The spill cascade: when short(T) > 0, T gives up victims of its own to
// cover it. They are T's candidates in candidate order (idle, unprotected,
// not required by the request, never the last copy of a value without a
// source), less every victim the plan already has and the other copies
// of values with a victim anywhere in the plan, chosen by the victim rule
// (the least valuable set for short(T) bytes). If they cannot cover
// short(T), none is taken and the victim is dropped. Otherwise each of
// them, in candidate order, is itself demoted along T's spill target by
// this same rule or dropped, and the victim is demoted. No location gives
// up victims twice in one chain (the request's victim's location and
// every target that made room for it), so a cascade ends. Every victim's
// bytes count as removed at its location from the moment it is chosen.
//
// The plan's reclaim list keeps the request's victims in victim order
// (location order: pageable-host, pinned-host, cuda:0, …); the victims
// T gives up, each preceded by the victims its own demotion needed, come
// just before the demotion they make room for. Their eviction records
// say so: RoomFor is the position of that demotion, and the reason ends
// "at T to make room for the demotion of V from L (reclaim N)". A
// demoted victim's record carries To and the kind [EvictionDemoted].
//
// The landing condition is what keeps a plan feasible under Explain when
// T comes after the victim's location in location order (cuda:0 →
// cuda:1): the request's victims at T listed later are still there when
// the demotion lands. When T comes before it (cuda:N → pinned-host,
// pinned-host → pageable-host), every request's victim at T is gone
// by then and the final condition is the one that binds.
//
// A demotion whose copy fails leaves the value dropped, exactly as a
// plain reclaim would have: [Run.FailStep] settles the failed move (the
// destination's charge released, the source resident again) and then
// removes the source as a reclaim, so the value is never half-moved and
// never charged twice. Only when that removal would lose data (a user's
// demotion of the last copy of a value without a source; the controller
// never demotes such a value, which is never a candidate) does the run
// fail, with phase reclaim and the copy's failure as the cause.

// configureSpill resolves the configured spill targets. Errors
// ([*InvalidInputError], the ledger is not built): a malformed target, a
// target that is not a configured location, a target equal to its own
// location.
func (l *Ledger) configureSpill(cfg []LocationConfig) error {
	for _, lc := range cfg {
		if lc.SpillTo == "" {
			continue
		}
		if _, err := ParseLocation(lc.SpillTo); err != nil {
			return invalidf("spill target of %s: %v", lc.Name, err)
		}
		t, ok := l.locIndex[lc.SpillTo]
		if !ok {
			return invalidf("spill target %s of %s is not a configured location (both ends of a spill target must be configured)", lc.SpillTo, lc.Name)
		}
		if lc.SpillTo == lc.Name {
			return invalidf("spill target of %s is %s itself (a spill target must differ from its location)", lc.Name, lc.SpillTo)
		}
		l.locs[l.locIndex[lc.Name]].spill = t
	}
	return nil
}

// SpillTarget returns loc's spill target, if it has one.
func (l *Ledger) SpillTarget(loc string) (string, bool) {
	i, ok := l.locIndex[loc]
	if !ok || l.locs[i].spill < 0 {
		return "", false
	}
	return l.locs[l.locs[i].spill].name, true
}

// SpillTargets returns every configured spill target (location → target);
// nil when there is none.
func (l *Ledger) SpillTargets() map[string]string {
	var out map[string]string
	for i := range l.locs {
		if t := l.locs[i].spill; t >= 0 {
			if out == nil {
				out = map[string]string{}
			}
			out[l.locs[i].name] = l.locs[t].name
		}
	}
	return out
}

func (l *Ledger) hasSpill() bool {
	for i := range l.locs {
		if l.locs[i].spill >= 0 {
			return true
		}
	}
	return false
}

// demote admits the demotion of v's materialization at loc to t: a move.
// Errors (nothing changed): Unavailable (not resident at loc, in flight,
// the source of a copy in flight), InUse (protected), BudgetError at t.
// A replicable value already resident at t needs no transfer: the
// materialization at loc is removed at once (1 version).
func (l *Ledger) demote(v *value, loc, t int) (Admission, error) {
	if _, err := l.residentMat(v, loc, "demotion source"); err != nil {
		return Admission{}, err
	}
	return l.move(v, loc, t)
}

// checkDemotionField validates a reclaim action's To (after its handle
// and location): a malformed or unconfigured location, or To equal to
// Location.
func (l *Ledger) checkDemotionField(a Action, i int) error {
	if _, err := l.location(a.To); err != nil {
		return err
	}
	if a.To == a.Location {
		return invalidf("reclaim %d (%s): a demotion's to must differ from its location", i, a)
	}
	return nil
}

// ---- runs --------------------------------------------------------------------

// nextDemotion admits reclaim step i, a demotion.
func (r *Run) nextDemotion(i int, a Action) (Step, bool, error) {
	var adm Admission
	var e error
	r.l.recordInto(&r.report, func() {
		var v *value
		if v, e = r.l.value(a.Handle); e != nil {
			return
		}
		var loc, t int
		if loc, e = r.l.location(a.Location); e != nil {
			return
		}
		if t, e = r.l.location(a.To); e != nil {
			return
		}
		adm, e = r.l.demote(v, loc, t)
	})
	if e != nil {
		return Step{}, false, r.fail(e, &a, i, nil, -1)
	}
	if adm.Pending {
		r.pending = adm.ID
	}
	return Step{Phase: PhaseReclaim, Index: i, Admission: adm}, true, nil
}

// failDemotion settles the pending demotion (reclaim step i) as failed
// and drops the value's materialization at its location instead, as a
// plain reclaim; it returns the free effect. When dropping it would lose
// data, the run fails with cause.
func (r *Run) failDemotion(id AdmissionID, cause error) ([]Effect, error) {
	i := r.index - 1
	a := r.plan.Reclaim[i]
	var effects []Effect
	var e error
	r.l.recordInto(&r.report, func() {
		_ = r.l.Fail(id, cause)
		v, err := r.l.value(a.Handle)
		if err != nil {
			e = err
			return
		}
		loc := r.l.locIndex[a.Location]
		m, err := r.l.checkEvict(v, loc)
		if err != nil {
			e = err
			return
		}
		r.l.removeMatDetail(v, m, RemovalReclaim, "reclaim (demotion to "+a.To+" failed: dropped)")
		effects = []Effect{r.l.freeEffect(v, loc)}
	})
	if e != nil {
		return nil, r.fail(cause, &a, i, nil, -1)
	}
	return effects, nil
}
