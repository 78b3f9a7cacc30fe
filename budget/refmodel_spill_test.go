package budget

// The reference model's demotions (a reclaim with To), written from the
// rule in docs/semantics.md ("Spill"): a move in the reclaim phase with
// the move's checks and charges; a failed copy drops the value's
// materialization instead, as a plain reclaim, unless that would lose
// data.

// refDemotionLost: the demotion's copy failed and dropping the source
// would lose data; the run fails.
const refDemotionLost = "demotion-lost"

// validateTo checks an action's To, after its handle, location and from:
// only a reclaim may carry one, and it must be a configured location other
// than the action's own.
func (m *refModel) validateTo(a Action, reclaim bool) string {
	if !reclaim {
		return refInvalid()
	}
	if e := m.checkLoc(a.To); e != "" {
		return e
	}
	if a.To == a.Location {
		return refInvalid()
	}
	return ""
}

// demotion carries out a demotion of v (resident at a.Location) to a.To:
// admitted as a move and completed, or, when failCopy, failed and the
// source dropped as a plain reclaim.
func (m *refModel) demotion(v *refValue, a Action, failCopy bool) string {
	if e := m.residentAt(v, a.Location); e != "" {
		return e
	}
	adm, e := m.move(v, a.Location, a.To)
	if e != "" || adm.id == 0 {
		return e
	}
	if !failCopy {
		m.Complete(adm.id)
		return ""
	}
	m.Fail(adm.id)
	if m.evict(v, a.Location) != "" {
		return refDemotionLost
	}
	return ""
}
