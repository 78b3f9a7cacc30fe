package diagnose

import (
	"fmt"
	"sort"
	"strings"

	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system"
)

// ---- step 5 ----------------------------------------------------------------

func (g *diag) orderedPeaks(m map[string]int64) []LocationBytes {
	var out []LocationBytes
	done := map[string]bool{}
	for _, lr := range g.ev.Snapshot.Locations {
		if b, ok := m[lr.Location]; ok {
			out = append(out, LocationBytes{lr.Location, b})
			done[lr.Location] = true
		}
	}
	var rest []string
	for k := range m {
		if !done[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		out = append(out, LocationBytes{k, m[k]})
	}
	return out
}

func actions(as []system.Action) string {
	if len(as) == 0 {
		return "none"
	}
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = a.String()
	}
	return strings.Join(ss, ", ")
}

func reservations(rs []system.ReservationSpec) string {
	if len(rs) == 0 {
		return "none"
	}
	ss := make([]string, len(rs))
	for i, r := range rs {
		ss[i] = r.String()
	}
	return strings.Join(ss, ", ")
}

func (g *diag) search(x *system.SearchLimitError) {
	d, ex := g.ev.Decision, g.ev.Explanation
	if x == nil && d == nil && ex == nil {
		return
	}
	se := &SearchEvidence{}
	g.d.Search = se
	if x != nil {
		se.RequestName, se.StateLimit, se.ExploredStates, se.Detail = x.RequestName, x.StateLimit, x.ExploredStates, x.Detail
		g.add(5, stepDecision, Finding{What: "search limit of request " + x.RequestName, Figures: []Figure{
			fig("request_name", x.RequestName), fig("state_limit", x.StateLimit), fig("explored_states", x.ExploredStates), fig("detail", x.Detail)},
			Verdict: fmt.Sprintf("inconclusive: the search evaluated %d assignment(s), its bound, without finding a feasible one; this is not a proof that none exists. Simplify the request's tiers, or raise the state limit only once the request and its fallbacks are meant to be that wide", x.ExploredStates)})
	}
	if d != nil {
		se.RequestName, se.ExploredStates, se.Exhaustive = d.RequestName, d.ExploredStates, d.Exhaustive
		se.ExpectedStateVersion, se.Evictions = d.ExpectedStateVersion, d.Evictions
		p := d.Plan
		se.Plan = &p
		se.Feasible, se.Reason = d.Explanation.Feasible, d.Explanation.Reason
		se.PredictedPeaks = g.orderedPeaks(d.Explanation.PredictedPeakBytes)
		f := Finding{What: "decision for request " + d.RequestName, Figures: []Figure{
			fig("expected_state_version", d.ExpectedStateVersion), fig("explored_states", d.ExploredStates), fig("exhaustive", d.Exhaustive),
			fig("plan.reclaim", actions(p.Reclaim)), fig("plan.reservations", reservations(p.Reservations)), fig("plan.enter", actions(p.Enter))}}
		for i, e := range d.Evictions {
			f.Figures = append(f.Figures, Figure{Name: fmt.Sprintf("eviction %d", i), Value: fmt.Sprintf("%s at %s, %s: %s", e.Handle.Name, e.Location, jsonline.BytesText(e.Bytes), e.Reason)})
		}
		f.Verdict = "explored_states counts search work, not evictions; each eviction names the location it frees, its bytes and why it was chosen"
		if !d.Exhaustive {
			f.Verdict += "; the search was cut short by its limit after a feasible assignment, so this is the best one seen, not necessarily the best"
		}
		g.add(5, stepDecision, f)
		pf, _ := g.peakFinding("predicted peaks of the decision's plan", se.PredictedPeaks)
		g.add(5, stepDecision, pf)
	}
	if ex != nil {
		se.Feasible, se.Reason = ex.Feasible, ex.Reason
		se.PredictedPeaks = g.orderedPeaks(ex.PredictedPeakBytes)
		f := Finding{What: "explanation of the plan", Figures: []Figure{fig("feasible", ex.Feasible), fig("reason", orDash(ex.Reason))}}
		if ex.Feasible {
			f.Verdict = "feasible on the state it was explained on"
		} else {
			f.Verdict = "infeasible: " + ex.Reason
		}
		pf, over := g.peakFinding("predicted peaks of the plan", se.PredictedPeaks)
		if !ex.Feasible && !over {
			pf.Verdict = "within budget up to the refused step; the peaks do not include the step that was refused"
		}
		g.add(5, stepDecision, f, pf)
	}
}

// peakFinding lists the predicted peaks against their budgets; over: some
// peak is over its budget.
func (g *diag) peakFinding(what string, peaks []LocationBytes) (f Finding, over bool) {
	f = Finding{What: what}
	var overAt []string
	for _, p := range peaks {
		lr, ok := g.ev.Snapshot.Location(p.Location)
		v := jsonline.BytesText(p.Bytes)
		if ok && lr.HasBudget {
			v += " of budget " + jsonline.BytesText(lr.BudgetBytes)
			if p.Bytes > lr.BudgetBytes {
				overAt = append(overAt, p.Location)
			}
		}
		f.Figures = append(f.Figures, Figure{Name: p.Location, Value: v})
	}
	if len(overAt) > 0 {
		f.Verdict = "over budget at " + strings.Join(overAt, ", ")
	} else {
		f.Verdict = "every predicted peak is within its budget (reclaim before reservations, overlap and temporary charges included)"
	}
	return f, len(overAt) > 0
}

// ---- step 6 ----------------------------------------------------------------

func (g *diag) stale(x *system.StaleStateError) {
	st := &StaleRange{ExpectedVersion: x.ExpectedVersion, ActualVersion: x.ActualVersion}
	for _, t := range g.ev.Trace {
		if t.Version > x.ExpectedVersion && t.Version <= x.ActualVersion {
			st.Intervening = append(st.Intervening, t)
		}
	}
	var gap uint64
	if x.ActualVersion > x.ExpectedVersion {
		gap = x.ActualVersion - x.ExpectedVersion
	}
	st.Missing = gap - uint64(len(st.Intervening))
	st.Covered = st.Missing == 0
	g.d.Stale = st
	g.add(6, stepStale, Finding{What: "version gap", Figures: []Figure{
		fig("expected_version", x.ExpectedVersion), fig("actual_version", x.ActualVersion), fig("intervening transitions", gap)},
		Verdict: "detected before any reclaim, reservation or entry: the stale scope changed nothing"})
	// Mark the transitions that touch the decision's plan.
	touch := map[string]bool{}
	p := g.ev.plan()
	if p != nil {
		for _, a := range append(append([]system.Action(nil), p.Reclaim...), p.Enter...) {
			touch[a.Handle.Name] = true
			touch["@"+a.Location] = true
		}
		for _, r := range p.Reservations {
			touch["@"+r.Location] = true
		}
	}
	f := Finding{What: fmt.Sprintf("transitions v%d–v%d in the trace", x.ExpectedVersion+1, x.ActualVersion)}
	var touched int
	for _, t := range st.Intervening {
		v := transitionText(t)
		if touch[t.Handle] || touch["@"+t.Location] {
			v += "   ← touches the plan"
			touched++
		}
		f.Figures = append(f.Figures, Figure{Name: fmt.Sprintf("v%d", t.Version), Value: v})
	}
	oldest, newest := traceEnds(g.ev.Trace)
	switch {
	case st.Covered:
		f.Verdict = fmt.Sprintf("covered: the trace holds all %d; these are the changes (ownership, placement, reservation, protection or event reaping) the decision did not see", gap)
	case len(g.ev.Trace) == 0:
		f.Verdict = "not covered: the trace is empty (disabled); the intervening changes cannot be named"
	default:
		f.Verdict = fmt.Sprintf("not covered: the trace holds v%d–v%d (a ring of %d) and has dropped %d of the %d; raise the trace capacity to keep them", oldest, newest, len(g.ev.Trace), st.Missing, gap)
	}
	if p != nil {
		switch touched {
		case 0:
			f.Verdict += "; none touches a value or location of the plan"
		case 1:
			f.Verdict += "; 1 of them touches a value or location of the plan: its victims, room or endpoints may no longer be what the decision assumed"
		default:
			f.Verdict += fmt.Sprintf("; %d of them touch a value or location of the plan: its victims, room or endpoints may no longer be what the decision assumed", touched)
		}
	}
	g.add(6, stepStale, f, Finding{What: "what to do",
		Verdict: "if the request still stands, decide again and review the new evidence (victims and peaks may differ); do not retry the old decision blindly. Under concurrent callers, Admit decides and enters in one step and is never stale"})
}
