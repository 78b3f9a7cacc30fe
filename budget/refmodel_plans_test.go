package budget

// The reference model's plans: validation, explain and runs (see
// refmodel_test.go).

import "fmt"

// ---- plans -------------------------------------------------------------------

// validate checks every handle and location of a plan (reclaim, then
// reservations, then enter), as the ledger does before simulating.
func (m *refModel) validate(p Plan) string {
	action := func(a Action, reclaim bool) string {
		if a.Charge != "" || a.Owner != "" {
			return m.validateCharge(a, reclaim)
		}
		if _, e := m.resolve(a.Handle); e != "" {
			return e
		}
		if e := m.checkLoc(a.Location); e != "" {
			return e
		}
		if a.From != "" {
			if reclaim {
				return refInvalid()
			}
			if e := m.checkLoc(a.From); e != "" {
				return e
			}
		}
		if a.To != "" {
			return m.validateTo(a, reclaim)
		}
		return ""
	}
	for _, a := range p.Reclaim {
		if e := action(a, true); e != "" {
			return e
		}
	}
	seen := map[string]bool{}
	for _, r := range p.Reservations {
		if r.Name == "" || seen[r.Name] || m.findResv(r.Name) >= 0 || r.Bytes <= 0 {
			return refInvalid()
		}
		seen[r.Name] = true
		if e := m.checkLoc(r.Location); e != "" {
			return e
		}
	}
	for _, a := range p.Enter {
		if e := action(a, false); e != "" {
			return e
		}
	}
	return ""
}

// enter admits one enter action: without From a place; with From a copy
// (replicable) or a move (exclusive) from that resident materialization.
func (m *refModel) enter(a Action) (refAdm, string) {
	v, e := m.resolve(a.Handle)
	if e != "" {
		return refAdm{}, e
	}
	if a.From == "" {
		return m.place(v, a.Location)
	}
	if e := m.residentAt(v, a.From); e != "" {
		return refAdm{}, e
	}
	if st, ok := v.state[a.Location]; ok {
		if st != Resident {
			return refAdm{}, refUnavailable(v.name, a.Location, UnavailableInFlight)
		}
		if v.replicable {
			return refAdm{}, ""
		}
	}
	if a.From == a.Location {
		return refAdm{}, ""
	}
	if v.replicable {
		if e := m.admit(a.Location, v.bytes); e != "" {
			return refAdm{}, e
		}
		return m.newXfer(&refXfer{value: v.id, dest: a.Location, from: a.From}), ""
	}
	return m.move(v, a.From, a.Location)
}

// Explain simulates p on a copy: feasible, and the predicted peaks (from
// the current used+reserved). On a validation error the peaks are the
// current figures.
func (m *refModel) Explain(p Plan) (bool, map[string]int64) {
	current := map[string]int64{}
	for _, l := range m.locs {
		current[l.name] = m.used(l.name) + m.reserved(l.name)
	}
	if m.validate(p) != "" {
		return false, current
	}
	c := m.clone()
	c.peak = current
	ok := c.simulate(p) == ""
	return ok, c.peak
}

// simulate runs p on m (a clone) and returns why it is infeasible: the
// first failing step's error, or "final" when an enter's endpoint is not
// resident at the end ("" when feasible).
func (m *refModel) simulate(p Plan) string {
	for _, a := range p.Reclaim {
		if a.Charge != "" {
			if !m.simulateCharge(a) {
				return "charge"
			}
			continue
		}
		v, _ := m.resolve(a.Handle)
		if a.To != "" {
			if e := m.demotion(v, a, false); e != "" {
				return e
			}
			continue
		}
		if e := m.evict(v, a.Location); e != "" {
			return e
		}
	}
	for _, r := range p.Reservations {
		if e := m.Reserve(r.Location, r.Name, r.Bytes, "plan"); e != "" {
			return e
		}
	}
	for _, a := range p.Enter {
		adm, e := m.enter(a)
		if e != "" {
			return e
		}
		if adm.id > 0 {
			m.Complete(adm.id)
		}
	}
	for _, a := range p.Enter {
		v, _ := m.resolve(a.Handle)
		if v.state[a.Location] != Resident {
			return "final"
		}
	}
	return ""
}

// refRunResult is what a whole run (StartRun, every step, Finish) gives.
type refRunResult struct {
	err    string // "" or the error form; a PlanExecutionError is "exec{…}"
	report int    // transitions committed by the run (its cleanup included)
	leases []int  // scope leases, in enter order
}

// Run executes p as the ledger's StartRun/Next/Complete/Finish would with
// nothing else happening between steps; the enter step failAt (−1: none)
// fails after admission, and so does the reclaim step failAt when it is a
// demotion; the owner of the charge of reclaim step failAt refuses its
// eviction, and the owner of a charge demoted at reclaim step dropAt
// (−1: none; not failAt) answers that its copy failed.
func (m *refModel) Run(p Plan, scope string, checkVersion bool, expected uint64, failAt, dropAt int) refRunResult {
	if checkVersion && expected != m.version {
		return refRunResult{err: refStale(expected, m.version)}
	}
	if e := m.validate(p); e != "" {
		return refRunResult{err: e}
	}
	if e := m.clone().simulate(p); e != "" {
		if refIsHeld(e) {
			return refRunResult{err: e} // busy, not infeasible
		}
		return refRunResult{err: refPlan()}
	}
	var report []uint64
	m.report = &report
	var admitted []string
	phase := func(p string) string {
		if scope == "" {
			return PhaseExecute
		}
		return p
	}
	fail := func(ph string, a *Action, ai int, r *ReservationSpec, ri int, cause string) refRunResult {
		if scope != "" { // a failed scope entry releases its reservations; execute's stay
			for i := len(admitted) - 1; i >= 0; i-- {
				m.Unreserve(admitted[i], scope)
			}
		}
		// The partial report lists every committed transition, the
		// releases of the cleanup included.
		m.report = nil
		n := len(report)
		return refRunResult{err: refExec(phase(ph), a, ai, r, ri, n, cause), report: n}
	}
	for i, a := range p.Reclaim {
		if a.Charge != "" {
			settle := refSettleDone
			switch {
			case i == failAt:
				settle = refSettleRefused
			case i == dropAt:
				settle = refSettleDropped
			}
			if e := m.runChargeEviction(a, settle); e != "" {
				return fail(PhaseReclaim, &a, i, nil, -1, e)
			}
			continue
		}
		v, e := m.resolve(a.Handle)
		switch {
		case e == "" && a.To != "":
			// A demotion; the reclaim step failAt fails its copy.
			if e = m.demotion(v, a, i == failAt); e == refDemotionLost {
				e = "injected"
			}
		case e == "":
			e = m.evict(v, a.Location)
		}
		if e != "" {
			return fail(PhaseReclaim, &a, i, nil, -1, e)
		}
	}
	for i, r := range p.Reservations {
		owner := scope
		if r.Owner != "" {
			owner = r.Owner
		}
		if e := m.Reserve(r.Location, r.Name, r.Bytes, owner); e != "" {
			return fail(PhaseReserve, nil, -1, &r, i, e)
		}
		if r.Owner == "" {
			admitted = append(admitted, r.Name)
		}
	}
	for i, a := range p.Enter {
		adm, e := m.enter(a)
		if e != "" {
			return fail(PhaseEnter, &a, i, nil, -1, e)
		}
		if adm.id > 0 {
			if i == failAt {
				m.Fail(adm.id)
				return fail(PhaseEnter, &a, i, nil, -1, "injected")
			}
			m.Complete(adm.id)
		}
	}
	var leases []int
	if scope != "" {
		for _, a := range p.Enter {
			id, e := m.Acquire(a.Handle, a.Location)
			if e != "" {
				panic("reference model: scope lease failed after a feasible plan: " + e)
			}
			leases = append(leases, id)
		}
	}
	m.report = nil
	return refRunResult{report: len(report), leases: leases}
}

func refExec(phase string, a *Action, ai int, r *ReservationSpec, ri int, report int, cause string) string {
	act, res := "-", "-"
	if a != nil {
		act = fmt.Sprintf("%s@%s<%s", a.Handle.Name, a.Location, a.From)
		if a.To != "" {
			act += ">" + a.To
		}
	}
	if r != nil {
		res = fmt.Sprintf("%s@%s:%d", r.Name, r.Location, r.Bytes)
	}
	return fmt.Sprintf("exec{%s action=%s/%d reservation=%s/%d report=%d cause=%s}", phase, act, ai, res, ri, report, cause)
}
