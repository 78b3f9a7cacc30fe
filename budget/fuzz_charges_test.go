package budget

import (
	"fmt"
	"slices"
	"strings"
)

// FuzzLedger's charge operations: an opcode byte b ≥ fzChargeOpsFrom (≥
// 128 in a charge-dense input: fzHarness.chargeFrom) is operation
// (b − chargeFrom) % fzChargeOps, with its argument bytes.
const fzChargeOpsFrom = 240

const (
	fzReserveCharge  = iota // name, owner, loc, bytes
	fzOfferCharge           // reservation, freq (b/5%2: as demotable, where its location spills)
	fzWithdrawCharge        // reservation
	fzEvictCharge           // reservation, loc (b%2: its own), failAt: a run of its reclaim
	fzDecideRoom            // owner, loc, bytes, settle: Decide room for a charge, run the plan
	fzOfferDemotable        // reservation, freq
	fzDemoteCharge          // reservation, loc (b%2: its own), to (b%4: its spill target, else loc), settle
	fzDecideSpill           // owner, loc, bytes, loc, bytes, requirement (b%2: one), handle, loc, settle
	fzChargeOps
)

// A settle byte b answers a run's charge steps: the owner of the charge of
// reclaim step failAt = b%4 − 1 refuses (a demotion's copy of a value
// fails), and the owner of a charge demoted at reclaim step dropAt =
// b/4%4 − 1 answers that its copy failed (dropped); every other step is
// confirmed (a charge demoted).
func (h *fzHarness) settle() (failAt, dropAt int) {
	b := h.r.next()
	return b%4 - 1, b/4%4 - 1
}

// fzOwner: two caches and a scope (not a cache: offers refused).
func (h *fzHarness) owner() string {
	return [...]string{CacheOwnerPrefix + "a#1", CacheOwnerPrefix + "b#1", "sc-x"}[h.r.next()%3]
}

// chargeStep applies one charge operation to the ledger and the model.
func (h *fzHarness) chargeStep(b int) (desc, merr string, lerr error) {
	c, m := h.c, h.m
	switch b % fzChargeOps {
	case fzReserveCharge:
		name, owner := fmt.Sprint("k", h.r.next()%4), h.owner()
		loc, n := h.loc(), h.bytes()
		desc = fmt.Sprintf("reserve charge %s of %s at %s %d", name, owner, loc, n)
		lerr = c.ReserveOwned(loc, name, n, owner)
		merr = m.Reserve(loc, name, n, owner)
		if lerr == nil {
			h.resv = append(h.resv, fzResv{name: name, owner: owner})
		}
	case fzOfferDemotable:
		rs, _ := pick(h, h.resv)
		freq := int64(h.r.next()%5) - 1
		desc = fmt.Sprintf("offer %s of %q as demotable freq %d", rs.name, rs.owner, freq)
		lerr = c.do("OfferDemotableCharge", mutation, func() error { return c.L.OfferDemotableCharge(rs.name, rs.owner, freq) })
		merr = m.Offer(rs.name, rs.owner, freq, true)
	case fzDemoteCharge:
		rs, _ := pick(h, h.resv)
		a := Action{Location: h.loc(), Owner: rs.owner, Charge: rs.name}
		info, ok := c.L.Charge(rs.name)
		if ok && h.r.next()%2 == 0 {
			a.Location = info.Location
		}
		a.To = h.loc()
		if t, spill := c.L.SpillTarget(info.Location); ok && spill && h.r.next()%4 != 0 {
			a.To = t
		}
		failAt, dropAt := h.settle()
		desc = fmt.Sprintf("demote %s to %s failAt=%d dropAt=%d", a, a.To, failAt, dropAt)
		p := Plan{Reclaim: []Action{a}}
		ex := c.Explain(p)
		ok, peaks := m.Explain(p)
		h.same("explain feasible ("+ex.Reason+") of "+desc, ex.Feasible, ok)
		h.same("explain peaks of "+desc, ex.PredictedPeakBytes, peaks)
		merr, lerr = h.runBoth(p, failAt, dropAt)
	case fzDecideRoom, fzDecideSpill:
		return h.decideRoom(b%fzChargeOps == fzDecideSpill)
	case fzOfferCharge, fzWithdrawCharge:
		rs, _ := pick(h, h.resv)
		if b%fzChargeOps == fzOfferCharge {
			fb := h.r.next()
			freq := int64(fb%5) - 1
			if info, ok := c.L.Charge(rs.name); ok && fb/5%2 == 1 {
				if _, spill := c.L.SpillTarget(info.Location); spill {
					desc = fmt.Sprintf("offer %s of %q as demotable freq %d", rs.name, rs.owner, freq)
					lerr = c.do("OfferDemotableCharge", mutation, func() error { return c.L.OfferDemotableCharge(rs.name, rs.owner, freq) })
					merr = m.Offer(rs.name, rs.owner, freq, true)
					break
				}
			}
			desc = fmt.Sprintf("offer %s of %q freq %d", rs.name, rs.owner, freq)
			lerr = c.do("OfferCharge", mutation, func() error { return c.L.OfferCharge(rs.name, rs.owner, freq) })
			merr = m.Offer(rs.name, rs.owner, freq, false)
		} else {
			desc = fmt.Sprintf("withdraw %s of %q", rs.name, rs.owner)
			lerr = c.do("WithdrawCharge", mutation, func() error { return c.L.WithdrawCharge(rs.name, rs.owner) })
			merr = m.Withdraw(rs.name, rs.owner)
		}
	case fzEvictCharge:
		rs, _ := pick(h, h.resv)
		a := Action{Location: h.loc(), Owner: rs.owner, Charge: rs.name}
		if info, ok := c.L.Charge(rs.name); ok && h.r.next()%2 == 0 {
			a.Location = info.Location
		}
		failAt := h.r.next()%3 - 1
		desc = fmt.Sprintf("evict %s failAt=%d", a, failAt)
		merr, lerr = h.runBoth(Plan{Reclaim: []Action{a}}, failAt, -1)
	}
	return desc, merr, lerr
}

// decideRoom decides room for a charge (with two, and maybe a
// requirement, when spill: so that demotions land where the plan also
// adds and removes), checks the decision's victims and demotion targets
// against the model's spill rule, and runs the plan on both.
func (h *fzHarness) decideRoom(spill bool) (desc, merr string, lerr error) {
	c, m := h.c, h.m
	h.names++
	spec := ReservationSpec{Name: fmt.Sprint("room", h.names), Owner: h.owner(), Location: h.offeredLoc()}
	spec.Bytes = h.roomBytes(spec.Location)
	req := Request{Name: "room", Reservations: []ReservationSpec{spec}}
	if spill {
		spec2 := ReservationSpec{Name: spec.Name + "b", Owner: spec.Owner, Location: h.loc(), Bytes: h.bytes()}
		req.Reservations = append(req.Reservations, spec2)
		if h.r.next()%2 == 1 {
			req.Requirements = []Requirement{{Handle: h.handle(), Tiers: [][]string{{h.loc()}}}}
		}
	}
	failAt, dropAt := h.settle()
	desc = fmt.Sprintf("decide %+v failAt=%d dropAt=%d", req, failAt, dropAt)
	v := c.L.Version()
	d, err := c.L.Decide(req, 0)
	h.same("decide is a read", c.L.Version(), v)
	if err != nil {
		return desc + " → not decided", "", nil
	}
	required := map[uint64]bool{}
	for _, r := range req.Requirements {
		required[r.Handle.ID] = true
	}
	want := m.decisionList(d, func(loc string) []Eviction { return refCandidates(c.L, loc, required) })
	h.same(fmt.Sprintf("reclaim list of %+v", d.Plan), len(d.Evictions), len(want))
	tos := make([]string, len(want))
	for i, e := range d.Evictions {
		w := want[i]
		tos[i] = w.To
		h.same(fmt.Sprintf("victim %d of %+v", i, d.Plan), fmt.Sprint(e.Handle.ID, e.Charge, e.Location, e.Bytes, e.RoomFor), fmt.Sprint(w.Handle.ID, w.Charge, w.Location, w.Bytes, w.RoomFor))
		if e.Charge != "" {
			info, ok := c.L.Charge(e.Charge)
			h.same("charge victim offered", ok && info.State == ChargeOffered && info.Owner == e.Owner, true)
			h.same("charge victim's kind", e.Kind, EvictionIdleCacheEntry)
		} else {
			h.same("value victim's kind", e.Kind == EvictionDemoted, e.To != "")
		}
		h.same(fmt.Sprintf("demotion target of victim %d (%s%s@%s) in %+v", i, e.Charge, e.Handle.Name, e.Location, d.Plan), e.To, tos[i])
		h.same("reclaim's to", d.Plan.Reclaim[i].To, e.To)
		h.same("reason says demoted", strings.Contains(e.Reason, "demoted to "+e.To), e.To != "")
	}
	desc += fmt.Sprintf(" plan %+v to %q", d.Plan, tos)
	// A decision's plan, demotions included, is feasible (the landing
	// condition keeps it so), and both explain it alike.
	ex := c.Explain(d.Plan)
	ok, peaks := m.Explain(d.Plan)
	h.same("decision's plan feasible under the model's explain: "+desc, ok, true)
	h.same("decision's explain feasible ("+ex.Reason+")", ex.Feasible, ok)
	h.same("decision's explain peaks", ex.PredictedPeakBytes, peaks)
	merr, lerr = h.runBoth(d.Plan, failAt, dropAt)
	if lerr == nil {
		for _, r := range req.Reservations {
			h.resv = append(h.resv, fzResv{name: r.Name, owner: r.Owner})
		}
	}
	return desc, merr, lerr
}

// offeredLoc decodes a location byte b for a decision: for b ≥ 128, when
// some charge is offered, the location of the (b%n)-th offered one (so
// that decisions find idle entries to evict), else as loc.
func (h *fzHarness) offeredLoc() string {
	b := h.r.next()
	var locs []string
	for _, rs := range h.resv {
		if info, ok := h.c.L.Charge(rs.name); ok && info.State == ChargeOffered && !slices.Contains(locs, info.Location) {
			locs = append(locs, info.Location)
		}
	}
	if b < 128 || len(locs) == 0 {
		return fzLoc(b)
	}
	return locs[b%len(locs)]
}

// roomBytes decodes a bytes byte b for a decision at loc: for 128 ≤ b <
// 250, when loc has a budget, a shortfall of 1 + b%8 bytes there (so that
// the decision evicts), else as bytes.
func (h *fzHarness) roomBytes(loc string) int64 {
	b := h.r.next()
	s := h.c.L.Snapshot()
	lr, ok := s.Location(loc)
	if b < 128 || b >= 250 || !ok || !lr.HasBudget {
		return fzBytes(b)
	}
	return max(lr.BudgetBytes-lr.UsedBytes-lr.ReservedBytes, 0) + 1 + int64(b%8)
}

// runBoth runs p as a plain execute on the ledger and the model; a
// demoted charge's new charge joins the reservations the operations pick
// from.
func (h *fzHarness) runBoth(p Plan, failAt, dropAt int) (string, error) {
	n, _, lerr := fzRunLedger(h.c, p, RunOptions{}, failAt, dropAt)
	res := h.m.Run(p, "", false, 0, failAt, dropAt)
	if lerr == nil && res.err == "" {
		h.same("run report length", n, res.report)
	}
	for _, a := range p.Reclaim {
		if a.Charge == "" || a.To == "" {
			continue
		}
		if i := h.m.findResv(refDemotedName(a.Charge, a.To)); i >= 0 && !slices.Contains(h.resv, fzResv{name: h.m.resv[i].name, owner: h.m.resv[i].owner}) {
			h.resv = append(h.resv, fzResv{name: h.m.resv[i].name, owner: h.m.resv[i].owner})
		}
	}
	return res.err, lerr
}

// fzSettleCharge answers a pending reclaim step that demotes a charge
// (false for any other step): refused at failAt, dropped at dropAt,
// demoted otherwise. The step's effect must name the new charge as the
// model does.
func fzSettleCharge(r *checkedRun, s Step, failAt, dropAt int) (bool, error) {
	if s.Phase != PhaseReclaim || len(s.Admission.Effects) != 1 {
		return false, nil
	}
	e := s.Admission.Effects[0]
	if e.Kind != EffectDropCharge || e.To == "" {
		return false, nil
	}
	if e.Demoted != refDemotedName(e.Charge, e.To) {
		return true, fmt.Errorf("demotion effect %+v: new charge %q", e, e.Demoted)
	}
	switch s.Index {
	case failAt:
		_, err := r.FailStep(errFzInjected)
		return true, err
	case dropAt:
		return true, r.CompleteDropped(errFzInjected)
	}
	_, err := r.Complete()
	return true, err
}

// ledgerCharges renders the ledger's charge state of every reservation
// the model holds active, as refModel.charges does.
func ledgerCharges(l *Ledger, m *refModel) []string {
	var out []string
	for _, r := range m.resv {
		if info, ok := l.Charge(r.name); ok {
			out = append(out, fmt.Sprintf("%s %s demotable=%v", r.name, info.State, info.Demotable))
		} else {
			out = append(out, r.name+" absent")
		}
	}
	return out
}

// fzSpillSeeds are FuzzLedger's seeds for demotable charges: cuda:0
// (budget 19) spills to pinned-host (budget 25, or 5: full, or 13: room
// for one of two victims); an entry k0 of 10 bytes at cuda:0 offered as
// demotable; room decided for 16 bytes there: its owner confirms
// (demoted), its copy fails (dropped) or it refuses; a target without
// room; a plan that also fills the target (fits, then one byte too
// many); two victims of which only the first fits; a user's demotion
// (explained, then run) to the spill target and to another location.
func fzSpillSeeds() [][]byte {
	const c = fzChargeOpsFrom
	k0 := func(pinned byte) []byte {
		return []byte{0, pinned, 215, 0, 5, c + fzReserveCharge, 0, 0, 2, 9, c + fzOfferDemotable, 0, 1}
	}
	with := func(base []byte, ops ...byte) []byte { return append(base, ops...) }
	var out [][]byte
	for _, settle := range []byte{0, 4, 1} { // demoted, dropped, refused
		out = append(out, with(k0(21), c+fzDecideRoom, 1, 2, 15, settle,
			c+fzOfferDemotable, 1, 1, c+fzOfferCharge, 1, 1, c+fzWithdrawCharge, 0))
	}
	out = append(out,
		with(k0(1), c+fzDecideRoom, 1, 2, 15, 0),
		with(k0(21), c+fzDecideSpill, 1, 2, 15, 1, 14, 0, 0),
		with(k0(21), c+fzDecideSpill, 1, 2, 15, 1, 15, 0, 4),
		with(k0(9), c+fzReserveCharge, 1, 0, 2, 5, c+fzOfferDemotable, 1, 1, c+fzDecideRoom, 1, 2, 15, 0),
		with(k0(21), c+fzDemoteCharge, 0, 0, 0, 0, 0, 0, c+fzDemoteCharge, 0, 0, 0, 0, 1, 0),
		with(k0(21), c+fzDemoteCharge, 0, 0, 0, 0, 1, 4, c+fzEvictCharge, 0, 0, 0, 0),
	)
	// The spill cascade: pinned-host (budget 13) holds an idle entry k1 of
	// 6 bytes, so k0's demotion (10) lacks 3 bytes there: k1 makes room
	// (dropped, or, with pinned-host spilling to pageable-host, demoted
	// there), then k0 is demoted.
	out = append(out,
		with(k0(9), c+fzReserveCharge, 1, 0, 1, 5, c+fzOfferCharge, 1, 1, c+fzDecideRoom, 1, 2, 15, 0),
		with(k0(209), c+fzReserveCharge, 1, 0, 1, 5, c+fzOfferDemotable, 1, 1, c+fzDecideRoom, 1, 2, 15, 0),
		with(k0(209), c+fzReserveCharge, 1, 0, 1, 5, c+fzOfferDemotable, 1, 1, c+fzDecideRoom, 1, 2, 15, 4))
	// cuda:0 (budget 13) spills to cuda:1 (budget 25), which comes after
	// it: k0 (10 bytes) and k2 (2) at cuda:0 and k1 (16) at cuda:1 are the
	// victims; after the plan cuda:1 would have room for k0 (16 − 16 + 10
	// + 10 ≤ 25), but not when the demotion lands, before k1 is removed
	// (16 + 10 > 25): k0 is dropped, k2 (16 + 2 ≤ 25) demoted.
	out = append(out, []byte{0, 0, 129, 21, 5, c + fzReserveCharge, 0, 0, 2, 9, c + fzOfferDemotable, 0, 1,
		c + fzReserveCharge, 1, 0, 3, 15, c + fzOfferCharge, 1, 1, c + fzReserveCharge, 2, 0, 2, 1, c + fzOfferDemotable, 2, 1,
		c + fzDecideSpill, 1, 2, 11, 3, 9, 0, 0})
	// Charge-dense (byte 4 ≥ 128): a value v0 at cuda:0 required at
	// cuda:1 while room is decided at cuda:0 and pinned-host.
	out = append(out, []byte{0, 21, 215, 0, 133, fzRegisterSrc, 1, 5, 0, 0, fzPlaceDone, 0, 2,
		128 + fzReserveCharge, 0, 0, 2, 6, 128 + fzOfferDemotable, 0, 1,
		128 + fzDecideSpill, 1, 2, 12, 1, 3, 1, 0, 3, 0})
	return out
}
