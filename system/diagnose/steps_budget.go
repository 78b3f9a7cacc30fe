package diagnose

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system"
)

// ---- step 3 ----------------------------------------------------------------

func (g *diag) budget(x *system.BudgetError) {
	b := &BudgetArithmetic{Location: x.Location, BudgetBytes: x.BudgetBytes, UsedBytes: x.UsedBytes, ReservedBytes: x.ReservedBytes, RequestedBytes: x.RequestedBytes}
	cur := new(big.Int).Add(big.NewInt(x.UsedBytes), big.NewInt(x.ReservedBytes))
	peak := new(big.Int).Add(cur, big.NewInt(x.RequestedBytes))
	miss := new(big.Int).Sub(peak, big.NewInt(x.BudgetBytes))
	var ok1, ok2, ok3 bool
	b.CurrentCharged, ok1 = sat64(cur)
	b.NewPeak, ok2 = sat64(peak)
	b.MissingBytes, ok3 = sat64(miss)
	verdict := fmt.Sprintf("refused: %s is %s bytes short", x.Location, miss)
	if !ok1 || !ok2 || !ok3 {
		verdict += " (these sums are beyond the int64 range: no runtime reports such figures; the evidence was edited or is corrupt)"
	}
	b.Charge, b.ChargeReason = g.chargeKind(x)
	if lr, ok := g.ev.Snapshot.Location(x.Location); ok {
		b.Now = &lr
	}
	g.d.Budget = b
	g.add(3, stepBudget,
		Finding{What: "the refusal's five fields", Figures: []Figure{
			fig("location", x.Location), bytesFig("budget_bytes", x.BudgetBytes), bytesFig("used_bytes", x.UsedBytes),
			bytesFig("reserved_bytes", x.ReservedBytes), bytesFig("requested_bytes", x.RequestedBytes)}},
		Finding{What: "admission at " + x.Location, Figures: []Figure{
			{Name: "current charged", Value: fmt.Sprintf("used + reserved = %d + %d = %s B", x.UsedBytes, x.ReservedBytes, cur)},
			{Name: "new peak", Value: fmt.Sprintf("current charged + requested = %s + %d = %s B", cur, x.RequestedBytes, peak)},
			{Name: "admissible", Value: fmt.Sprintf("new peak %s <= budget %d: %t", peak, x.BudgetBytes, peak.Cmp(big.NewInt(x.BudgetBytes)) <= 0)},
			{Name: "missing headroom", Value: fmt.Sprintf("new peak − budget = %s − %d = %s B", peak, x.BudgetBytes, miss)},
		}, Verdict: verdict},
		Finding{What: "what the requested charge is", Figures: []Figure{fig("kind", b.Charge)}, Verdict: b.ChargeReason},
	)
	if b.Now != nil {
		f := Finding{What: x.Location + " in the snapshot", Figures: locFigures(*b.Now)}
		head := bigDiff(b.Now.BudgetBytes, b.Now.UsedBytes, b.Now.ReservedBytes)
		if req := big.NewInt(x.RequestedBytes); head.Cmp(req) >= 0 {
			f.Verdict = fmt.Sprintf("now %s bytes free, enough for the %d requested: the state changed after the refusal", head, x.RequestedBytes)
			if g.nested {
				f.Verdict += " (the failed run's cleanup, or calls after it)"
			}
		} else {
			f.Verdict = fmt.Sprintf("now %s bytes free: still %s short of the %d requested", head, new(big.Int).Sub(req, head), x.RequestedBytes)
		}
		g.add(3, stepBudget, f)
	}
	if dev, ok := g.ev.Devices[x.Location]; ok {
		f := Finding{What: "NVML observation of " + x.Location + " (diagnostic, not admission evidence)", Figures: []Figure{
			fig("device", dev.Name), fig("uuid", dev.UUID), bytesFig("total", dev.TotalBytes), bytesFig("free", dev.FreeBytes), bytesFig("used", dev.UsedBytes)}}
		switch {
		case x.BudgetBytes > dev.TotalBytes:
			f.Verdict = fmt.Sprintf("the budget (%s) is above the device's total memory (%s): the configuration promises bytes the device does not have", jsonline.BytesText(x.BudgetBytes), jsonline.BytesText(dev.TotalBytes))
		case dev.FreeBytes >= x.RequestedBytes:
			f.Verdict = fmt.Sprintf("the device reports %s free, but admission is by the budget, which is short: raise the budget or free charges, not the device", jsonline.BytesText(dev.FreeBytes))
		default:
			f.Verdict = fmt.Sprintf("the device itself reports only %s free (other processes or driver reservations): raising the budget would not help", jsonline.BytesText(dev.FreeBytes))
		}
		g.add(3, stepBudget, f)
	}
}

// chargeKind works out what the refused charge was for: the operation when
// known, otherwise the snapshot's candidates.
func (g *diag) chargeKind(x *system.BudgetError) (ChargeKind, string) {
	o, s := g.ev.Op, g.ev.Snapshot
	if o.Kind == "reserve" || o.Reservation != "" {
		return ChargeReservation, fmt.Sprintf("the call reserved %d bytes at %s as a named reservation; reservations and materializations share the budget", x.RequestedBytes, x.Location)
	}
	if o.Handle.Name != "" && o.Location != "" {
		v, live := s.Value(o.Handle.Name)
		switch {
		case x.Location == o.Location:
			why := fmt.Sprintf("%s is the destination of %s: a new materialization charged the value's fixed %d bytes from admission on", x.Location, o.Handle.Name, x.RequestedBytes)
			if live && len(v.Materializations) > 0 {
				why += fmt.Sprintf("; its copy at %s stays charged too until the transfer completes (overlap), but that charge is at %s, not here", v.Materializations[0].Location, v.Materializations[0].Location)
			} else if live && v.HasSource && v.SourceLocation != x.Location {
				why += fmt.Sprintf("; the reconstruction's temporary buffer at %s is a separate charge there", v.SourceLocation)
			}
			return ChargeMaterialization, why
		case live && v.HasSource && v.SourceLocation == x.Location:
			return ChargeTemporary, fmt.Sprintf("%s is %s's source location and the destination is %s: a reconstruction loads the value into a temporary buffer of %d bytes at %s before copying it to %s. Raising %s's budget does not help; %s needs the headroom",
				x.Location, o.Handle.Name, o.Location, x.RequestedBytes, x.Location, o.Location, o.Location, x.Location)
		}
		return ChargeUnknown, fmt.Sprintf("%s is neither the destination %s nor the value's source location", x.Location, o.Location)
	}
	// No operation given: list the snapshot's candidates.
	var temp, mat []string
	for _, v := range s.Values {
		if v.Bytes != x.RequestedBytes {
			continue
		}
		if v.HasSource && v.SourceLocation == x.Location && !hasResident(v) {
			temp = append(temp, v.Handle.Name)
		}
		if matAt(s, v.Handle.Name, x.Location) == nil {
			mat = append(mat, v.Handle.Name)
		}
	}
	why := "the error does not say which call it refused; give Evidence.Op."
	if len(temp) > 0 {
		why += fmt.Sprintf(" A temporary reconstruction charge fits %s (source %s, no resident copy).", strings.Join(temp, ", "), x.Location)
	}
	if len(mat) > 0 {
		why += fmt.Sprintf(" A new materialization at %s fits %s.", x.Location, strings.Join(mat, ", "))
	}
	if len(temp) == 0 && len(mat) == 0 {
		why += fmt.Sprintf(" No live value charges %d bytes: most likely a reservation.", x.RequestedBytes)
	}
	return ChargeUnknown, why
}

func hasResident(v system.ValueRecord) bool {
	for _, m := range v.Materializations {
		if m.State == system.Resident {
			return true
		}
	}
	return false
}

// locations lists every budgeted location's figures (a plan error).
func (g *diag) locations() {
	for _, lr := range g.ev.Snapshot.Locations {
		if !lr.HasBudget {
			continue
		}
		f := Finding{What: lr.Location, Figures: locFigures(lr)}
		if p, ok := g.ev.peaks()[lr.Location]; ok {
			f.Figures = append(f.Figures, bytesFig("predicted peak", p))
			if p > lr.BudgetBytes {
				f.Verdict = fmt.Sprintf("the plan's predicted peak is %d bytes over the budget", p-lr.BudgetBytes)
			} else if g.ev.infeasible() {
				f.Verdict = "the predicted peak up to the refused step fits; the refused step itself does not (see the explanation's reason)"
			} else {
				f.Verdict = "the predicted peak fits"
			}
		}
		g.add(3, stepBudget, f)
	}
}

// infeasible reports an explanation that stopped at a refused step: its
// predicted peaks cover only the steps before it.
func (ev Evidence) infeasible() bool {
	return ev.Explanation != nil && !ev.Explanation.Feasible
}

func (ev Evidence) peaks() map[string]int64 {
	switch {
	case ev.Explanation != nil:
		return ev.Explanation.PredictedPeakBytes
	case ev.Decision != nil:
		return ev.Decision.Explanation.PredictedPeakBytes
	}
	return nil
}
