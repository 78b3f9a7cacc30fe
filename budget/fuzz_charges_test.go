package budget

import "fmt"

// FuzzLedger's charge operations: an opcode byte b ≥ fzChargeOpsFrom is
// operation (b − fzChargeOpsFrom) % fzChargeOps, with its argument bytes.
const fzChargeOpsFrom = 240

const (
	fzReserveCharge  = iota // name, owner, loc, bytes
	fzOfferCharge           // reservation, freq
	fzWithdrawCharge        // reservation
	fzEvictCharge           // reservation, loc (b%2: its own), failAt: a run of its reclaim
	fzDecideRoom            // owner, loc, bytes, failAt: Decide room for a charge, run the plan
	fzChargeOps
)

// fzOwner: two caches and a scope (not a cache: offers refused).
func (h *fzHarness) owner() string {
	return [...]string{CacheOwnerPrefix + "a#1", CacheOwnerPrefix + "b#1", "sc-x"}[h.r.next()%3]
}

// chargeStep applies one charge operation to the ledger and the model.
func (h *fzHarness) chargeStep(b int) (desc string, lerr error, merr string) {
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
	case fzOfferCharge, fzWithdrawCharge:
		rs, _ := pick(h, h.resv)
		if b%fzChargeOps == fzOfferCharge {
			freq := int64(h.r.next()%5) - 1
			desc = fmt.Sprintf("offer %s of %q freq %d", rs.name, rs.owner, freq)
			lerr = c.do("OfferCharge", mutation, func() error { return c.L.OfferCharge(rs.name, rs.owner, freq) })
			merr = m.Offer(rs.name, rs.owner, freq)
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
		lerr, merr = h.runBoth(Plan{Reclaim: []Action{a}}, failAt)
	case fzDecideRoom:
		h.names++
		spec := ReservationSpec{Name: fmt.Sprint("room", h.names), Owner: h.owner(), Location: h.loc(), Bytes: h.bytes()}
		failAt := h.r.next()%4 - 1
		desc = fmt.Sprintf("decide room %+v failAt=%d", spec, failAt)
		v := c.L.Version()
		d, err := c.L.Decide(Request{Name: "room", Reservations: []ReservationSpec{spec}}, 0)
		h.same("decide is a read", c.L.Version(), v)
		if err != nil {
			return desc + " → not decided", nil, ""
		}
		for _, e := range d.Evictions {
			if e.Kind == EvictionIdleCacheEntry {
				info, ok := c.L.Charge(e.Charge)
				h.same("charge victim offered", ok && info.State == ChargeOffered && info.Owner == e.Owner, true)
			}
		}
		desc += fmt.Sprintf(" plan %+v", d.Plan)
		lerr, merr = h.runBoth(d.Plan, failAt)
		if lerr == nil {
			h.resv = append(h.resv, fzResv{name: spec.Name, owner: spec.Owner})
		}
	}
	return desc, lerr, merr
}

// runBoth runs p as a plain execute on the ledger and the model.
func (h *fzHarness) runBoth(p Plan, failAt int) (error, string) {
	n, _, lerr := fzRunLedger(h.c, p, RunOptions{}, failAt)
	res := h.m.Run(p, "", false, 0, failAt)
	if lerr == nil && res.err == "" {
		h.same("run report length", n, res.report)
	}
	return lerr, res.err
}

// ledgerCharges renders the ledger's charge state of every reservation
// the model holds active, as refModel.charges does.
func ledgerCharges(l *Ledger, m *refModel) []string {
	var out []string
	for _, r := range m.resv {
		if info, ok := l.Charge(r.name); ok {
			out = append(out, fmt.Sprintf("%s %s", r.name, info.State))
		} else {
			out = append(out, r.name+" absent")
		}
	}
	return out
}
