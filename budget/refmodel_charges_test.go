package budget

// The reference model's charges: offers, withdrawals and the two-phase
// eviction of an offered charge by a run (see refmodel_test.go and
// doc_cache.go). The model keeps no candidate order: FuzzLedger compares
// states and errors; the order has its own tests (charges_test.go).

import (
	"fmt"
	"strings"
)

func refChargeBusy(charge string, state ChargeState, refused bool) string {
	return fmt.Sprintf("charge_busy{%s %s refused=%v}", charge, state, refused)
}

func refCacheOwner(owner string) bool {
	return len(owner) > len(CacheOwnerPrefix) && strings.HasPrefix(owner, CacheOwnerPrefix)
}

// charge resolves an active charge of a cache owner.
func (m *refModel) charge(name, owner string) (*refResv, string) {
	if !refCacheOwner(owner) {
		return nil, refInvalid()
	}
	i := m.findResv(name)
	if i < 0 || m.resv[i].owner != owner {
		return nil, refInvalid()
	}
	return &m.resv[i], ""
}

// Offer offers the charge; as demotable (refmodel_charges_spill_test.go)
// only when its location has a spill target.
func (m *refModel) Offer(name, owner string, freq int64, demote bool) string {
	r, e := m.charge(name, owner)
	if e != "" {
		return e
	}
	if freq < 0 {
		return refInvalid()
	}
	if demote && m.spillOf(r.loc) == "" {
		return refInvalid()
	}
	if r.state == ChargeEvicting {
		return refChargeBusy(name, r.state, false)
	}
	r.state, r.demote = ChargeOffered, demote
	m.bump()
	return ""
}

func (m *refModel) Withdraw(name, owner string) string {
	r, e := m.charge(name, owner)
	if e != "" {
		return e
	}
	if r.state == ChargeOffered {
		r.state = ChargeNotOffered
		m.bump()
	}
	return ""
}

// validateCharge validates an action that names a charge: a To (a
// demotion) names another configured location.
func (m *refModel) validateCharge(a Action, reclaim bool) string {
	if a.Charge == "" || !reclaim || !a.Handle.IsZero() || a.Handle.Name != "" || a.From != "" {
		return refInvalid()
	}
	if e := m.checkLoc(a.Location); e != "" {
		return e
	}
	if a.To != "" {
		if e := m.validateTo(a, true); e != "" {
			return e
		}
	}
	if !refCacheOwner(a.Owner) {
		return refInvalid()
	}
	return ""
}

// checkChargeEvict: active, the owner's, at the location, offered.
func (m *refModel) checkChargeEvict(a Action) string {
	i := m.findResv(a.Charge)
	if i < 0 || m.resv[i].owner != a.Owner || m.resv[i].loc != a.Location {
		return refInvalid()
	}
	if m.resv[i].state != ChargeOffered {
		return refChargeBusy(a.Charge, m.resv[i].state, false)
	}
	return ""
}

// runChargeEviction is a run's reclaim step for a charge, settled at once
// by s: evicting (1 version), then confirmed (released, 1 version) or
// refused (not offered, 1 version, the step's error). A demotion (To)
// first admits the new charge (1 version, refmodel_charges_spill_test.go);
// dropped or refused, the new charge is released (1 version) before the
// old one is settled (dropped: released as confirmed).
func (m *refModel) runChargeEviction(a Action, s refSettle) string {
	if e := m.checkChargeEvict(a); e != "" {
		return e
	}
	if a.To != "" {
		if e := m.admitDemoted(a); e != "" {
			return e
		}
		m.bump()
	}
	i := m.findResv(a.Charge)
	m.resv[i].state = ChargeEvicting
	m.bump()
	if a.To != "" && s != refSettleDone {
		j := m.findResv(refDemotedName(a.Charge, a.To))
		m.resv = append(m.resv[:j], m.resv[j+1:]...)
		m.bump()
		i = m.findResv(a.Charge)
	}
	if s == refSettleRefused {
		m.resv[i].state = ChargeNotOffered
		m.bump()
		return refChargeBusy(a.Charge, ChargeNotOffered, true)
	}
	m.resv = append(m.resv[:i], m.resv[i+1:]...)
	m.bump()
	return ""
}

// charges renders every active reservation's charge state (and, when
// offered, whether as demotable).
func (m *refModel) charges() []string {
	var out []string
	for _, r := range m.resv {
		out = append(out, fmt.Sprintf("%s %s demotable=%v", r.name, r.state, r.state == ChargeOffered && r.demote))
	}
	return out
}
