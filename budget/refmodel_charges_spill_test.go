package budget

// The reference model's demotion of an idle cache entry's charge, written
// from the rule (the spill rule applied to charges: docs/semantics.md
// "Spill", the file comments of spill.go and charges_spill.go), sharing
// no code with the ledger:
//
//   - an owner offers a charge as demotable only when its location has a
//     spill target;
//   - a reclaim of a charge with To demotes it: To must be its location's
//     spill target, the charge offered as demotable, and the new charge
//     "NAME→To" not active; the new charge (same bytes, same owner, not
//     offered) is admitted at To before the old one becomes evicting;
//   - the owner settles it as demoted (the old released), dropped (both
//     released) or refused (the new released, the old not offered, the
//     run fails);
//   - a decision demotes a victim (value or demotable charge), in victim
//     order, when its location's spill target has room in the plan's
//     final state and when the demotion lands.

import "strings"

// refSettle is the owner's answer to a charge's eviction step.
type refSettle int

const (
	refSettleDone    refSettle = iota // confirmed: dropped, or demoted when a demotion
	refSettleDropped                  // a demotion whose copy failed: dropped (a plain eviction: confirmed)
	refSettleRefused                  // the entry became busy
)

// spillOf is loc's spill target ("" none).
func (m *refModel) spillOf(loc string) string {
	if i := m.locIndex(loc); i >= 0 {
		return m.locs[i].spill
	}
	return ""
}

// demotedName names the owner's new charge at to.
func refDemotedName(charge, to string) string { return charge + "→" + to }

// checkChargeDemotion: the charge (active, checked by checkChargeEvict)
// offered as demotable, a.To its location's spill target, the new
// charge's name free.
func (m *refModel) checkChargeDemotion(a Action) string {
	r := m.resv[m.findResv(a.Charge)]
	if !r.demote || m.spillOf(r.loc) != a.To || m.findResv(refDemotedName(r.name, a.To)) >= 0 {
		return refInvalid()
	}
	return ""
}

// admitDemoted admits the new charge of the demotion a at a.To (the
// version is the caller's).
func (m *refModel) admitDemoted(a Action) string {
	if e := m.checkChargeDemotion(a); e != "" {
		return e
	}
	r := m.resv[m.findResv(a.Charge)]
	if e := m.admit(a.To, r.bytes); e != "" {
		return e
	}
	m.resv = append(m.resv, refResv{name: refDemotedName(r.name, a.To), loc: a.To, bytes: r.bytes, owner: r.owner})
	return ""
}

// simulateCharge is Explain's step for a charge's reclaim: the new charge
// first when it is a demotion, then the old one released.
func (m *refModel) simulateCharge(a Action) bool {
	if m.checkChargeEvict(a) != "" {
		return false
	}
	if a.To != "" {
		if m.admitDemoted(a) != "" {
			return false
		}
		m.notePeaks()
	}
	i := m.findResv(a.Charge)
	m.resv = append(m.resv[:i], m.resv[i+1:]...)
	return true
}

// decisionList applies the spill rule (refSpill, the cascade included)
// on the model's current state to the request's own victims of a
// decision (those with RoomFor 0, in victim order) and returns the
// reclaim list the decision must have: each victim's To ("" when it is
// dropped) and, before a demotion that needs room, the victims its target
// gives up (RoomFor set). A value is demoted when it has no other
// resident materialization and none at all at the target; a charge when
// its owner offered it as demotable and its new charge's name is free.
// Room at T: used + reserved − every victim at T + the plan's additions
// at T + earlier demotions into T + its bytes ≤ budget (final state), and
// used + reserved − the victims at T listed before it + earlier
// demotions into T + its bytes ≤ budget (when it lands). cands reads a
// location's candidates in candidate order (the model keeps no
// priorities).
func (m *refModel) decisionList(d Decision, cands func(loc string) []Eviction) []Eviction {
	in := refSpillIn{
		hasBudget: func(loc string) bool { return m.locs[m.locIndex(loc)].hasBudget },
		budget:    func(loc string) int64 { return m.locs[m.locIndex(loc)].budget },
		charged:   func(loc string) int64 { return m.used(loc) + m.reserved(loc) },
		spill:     m.spillOf,
		adds:      m.planAdditions(d.Plan),
		demotable: m.victimDemotable,
		cands:     cands,
		group: func(t string) ([]string, int64, bool) {
			if g := m.groupOf(t); g != nil {
				return g.locs, g.bytes, true
			}
			return nil, 0, false
		},
	}
	var victims []Eviction
	for _, e := range d.Evictions {
		if e.RoomFor == 0 {
			victims = append(victims, Eviction{Handle: e.Handle, Location: e.Location, Bytes: e.Bytes, Owner: e.Owner, Charge: e.Charge})
		}
	}
	return refSpill(in, victims)
}

func (m *refModel) victimDemotable(e Eviction, t string) bool {
	if e.Charge != "" {
		i := m.findResv(e.Charge)
		return i >= 0 && m.resv[i].demote && m.resv[i].state == ChargeOffered && m.findResv(refDemotedName(e.Charge, t)) < 0
	}
	v := m.value(e.Handle.ID)
	if _, atT := v.state[t]; atT {
		return false
	}
	for loc, s := range v.state {
		if loc != e.Location && s == Resident {
			return false
		}
	}
	return true
}

// planAdditions: what a decision's plan adds at each location: each
// entered value not already resident there (nor entered earlier) its
// bytes, and, when no copy of it is resident (nor entered earlier), its
// bytes again at its source as the reconstruction's temporary charge
// (unless the source is the destination); each reservation its bytes.
func (m *refModel) planAdditions(p Plan) map[string]int64 {
	adds := map[string]int64{}
	entered := map[string]bool{}
	enteredVal := map[uint64]bool{}
	for _, a := range p.Enter {
		v := m.value(a.Handle.ID)
		key := strings.Join([]string{v.name, a.Location}, "@")
		if st, ok := v.state[a.Location]; (ok && st == Resident) || entered[key] {
			continue
		}
		copyable := enteredVal[v.id]
		for _, s := range v.state {
			copyable = copyable || s == Resident
		}
		entered[key], enteredVal[v.id] = true, true
		adds[a.Location] += v.bytes
		if !copyable && v.source != a.Location {
			adds[v.source] += v.bytes
		}
	}
	for _, r := range p.Reservations {
		adds[r.Location] += r.Bytes
	}
	return adds
}
