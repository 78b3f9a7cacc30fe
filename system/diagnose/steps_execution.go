package diagnose

import (
	"errors"
	"fmt"

	"github.com/residency-go/residency/system"
)

// ---- step 7 ----------------------------------------------------------------

func (g *diag) execution(x *system.PlanExecutionError) {
	o := &ExecutionOutcome{Phase: x.Phase, FailedAction: x.FailedAction, FailedActionIndex: x.FailedActionIndex,
		FailedReservation: x.FailedReservation, FailedReservationIndex: x.FailedReservationIndex, Committed: x.PartialReport.Transitions}
	g.d.Execution = o
	f := Finding{What: "where it failed", Figures: []Figure{fig("phase", x.Phase)}}
	switch {
	case x.FailedAction != nil:
		f.Figures = append(f.Figures, fig("failed_action", x.FailedAction.String()), fig("failed_action_index", x.FailedActionIndex))
	case x.FailedReservation != nil:
		f.Figures = append(f.Figures, fig("failed_reservation", x.FailedReservation.String()), fig("failed_reservation_index", x.FailedReservationIndex))
	default:
		f.Figures = append(f.Figures, fig("failed step", "none named"))
	}
	f.Verdict = phaseMeaning(x.Phase)
	g.add(7, stepExecution, f)

	rep := Finding{What: "partial report (committed transitions)"}
	if len(o.Committed) == 0 {
		rep.Verdict = "nothing was committed"
	}
	for _, t := range o.Committed {
		rep.Figures = append(rep.Figures, Figure{Name: fmt.Sprintf("v%d", t.Version), Value: transitionText(t)})
	}
	g.add(7, stepExecution, rep)

	o.Kept, o.Cleaned, o.FailedStep = g.sortCommitted(x)
	kept := Finding{What: "not rolled back (still in effect)"}
	for _, k := range o.Kept {
		kept.Figures = append(kept.Figures, Figure{Name: "kept", Value: k})
	}
	for _, c := range o.Cleaned {
		kept.Figures = append(kept.Figures, Figure{Name: "undone by cleanup", Value: c})
	}
	for _, c := range o.FailedStep {
		kept.Figures = append(kept.Figures, Figure{Name: "failed step", Value: c})
	}
	if len(o.Kept) == 0 {
		kept.Verdict = "nothing of the committed prefix remains in effect"
	} else {
		kept.Verdict = fmt.Sprintf("%d committed effect(s) stay: continue from the state the snapshot shows, not from the plan's starting state", len(o.Kept))
	}
	if x.Phase == system.PhaseEnter || x.Phase == system.PhaseReclaim || x.Phase == system.PhaseReserve {
		kept.Verdict += "; the failed scope cannot be entered again and holds no lease"
	}
	g.add(7, stepExecution, kept)

	if f, ok := g.interleaved(o.Committed); ok {
		g.add(7, stepExecution, f)
	}
	if x.Phase == system.PhaseExit && x.Cause != nil {
		if f, ok := g.leaseEnded(x.Cause); ok {
			g.add(7, stepExecution, f)
		}
	}

	cf := Finding{What: "cause"}
	if x.Cause == nil {
		cf.Verdict = "no cause recorded"
	} else {
		op := Operation{Kind: x.Phase}
		if a := x.FailedAction; a != nil {
			op.Handle, op.Location, op.From = a.Handle, a.Location, a.From
		}
		if r := x.FailedReservation; r != nil {
			op.Kind, op.Reservation, op.Location, op.Bytes = "reserve", r.Name, r.Location, r.Bytes
		}
		sub := g.ev
		sub.Err, sub.Op = x.Cause, op
		cd := diagnose(sub, true)
		o.Cause = &cd
		cf.Figures = []Figure{fig("class", cd.Class), fig("message", cd.Message)}
		if system.ErrorClass(x.Cause) == system.ErrorOther {
			cf.Verdict = "not a structured residency error: the device or the loader failed the step; the runtime released the step's charges"
		} else {
			cf.Verdict = "diagnosed below, with the figures it had at the failure"
		}
	}
	g.add(7, stepExecution, cf)
}

func phaseMeaning(p string) string {
	switch p {
	case system.PhaseExecute:
		return "a direct transition or a plan run without a scope failed after admission; reservations it admitted stay active (release them by name)"
	case system.PhaseReclaim:
		return "a scope entry failed while removing victims; removals already done stay done"
	case system.PhaseReserve:
		return "a scope entry failed admitting a reservation; the scope's earlier reservations were released, the reclaims stay"
	case system.PhaseEnter:
		return "a scope entry failed entering an endpoint; earlier enters and reclaims stay, the scope's reservations were released"
	case system.PhaseExit:
		return "a scope's exit could not release everything; what it did release stays released"
	}
	return "unknown phase"
}

// sortCommitted sorts the partial report into what stays, what the
// failure's cleanup undid, and what the failed step left.
func (g *diag) sortCommitted(x *system.PlanExecutionError) (kept, cleaned, failed []string) {
	ts := x.PartialReport.Transitions
	used := make([]bool, len(ts))
	find := func(from int, match func(system.Transition) bool) int {
		for j := from; j < len(ts); j++ {
			if !used[j] && match(ts[j]) {
				return j
			}
		}
		return -1
	}
	now := func(value, loc string) string {
		if m := matAt(g.ev.Snapshot, value, loc); m != nil {
			return fmt.Sprintf("snapshot: %s at %s", m.State, loc)
		}
		return fmt.Sprintf("snapshot: not at %s", loc)
	}
	for i, t := range ts {
		if used[i] {
			continue
		}
		used[i] = true
		switch t.Kind {
		case "remove":
			kept = append(kept, fmt.Sprintf("%s removed from %s, %d B freed (%s; %s)", t.Handle, t.Location, t.Bytes, t.Detail, now(t.Handle, t.Location)))
		case "admit":
			j := find(i+1, func(u system.Transition) bool {
				return u.Handle == t.Handle && u.Location == t.Location && (u.Kind == "complete" || u.Kind == "fail")
			})
			switch {
			case j < 0:
				kept = append(kept, fmt.Sprintf("%s admitted at %s, %d B charged, not settled in the report (%s)", t.Handle, t.Location, t.Bytes, now(t.Handle, t.Location)))
			case ts[j].Kind == "complete":
				used[j] = true
				kept = append(kept, fmt.Sprintf("%s entered %s, %d B charged (%s; %s)", t.Handle, t.Location, t.Bytes, t.Detail, now(t.Handle, t.Location)))
			default:
				used[j] = true
				failed = append(failed, fmt.Sprintf("%s into %s admitted at v%d, failed at v%d: its %d B (and any temporary charge) were released", t.Handle, t.Location, t.Version, ts[j].Version, t.Bytes))
			}
		case "fail":
			failed = append(failed, fmt.Sprintf("%s into %s failed: its charge was released", t.Handle, t.Location))
		case "reserve":
			j := find(i+1, func(u system.Transition) bool { return u.Kind == "unreserve" && u.Name == t.Name })
			if j >= 0 {
				used[j] = true
				cleaned = append(cleaned, fmt.Sprintf("reservation %s (%d B at %s) admitted at v%d, released at v%d", t.Detail, t.Bytes, t.Location, t.Version, ts[j].Version))
			} else {
				kept = append(kept, fmt.Sprintf("reservation %s: %d B at %s, still active (release it by name)", t.Detail, t.Bytes, t.Location))
			}
		case "unreserve":
			kept = append(kept, fmt.Sprintf("reservation %s (%d B at %s) released", t.Detail, t.Bytes, t.Location))
		case "acquire":
			j := find(i+1, func(u system.Transition) bool { return u.Kind == "release" && u.ID == t.ID })
			if j >= 0 {
				used[j] = true
				cleaned = append(cleaned, fmt.Sprintf("%s of %s at %s taken at v%d, released at v%d", t.Detail, t.Handle, t.Location, t.Version, ts[j].Version))
			} else {
				kept = append(kept, fmt.Sprintf("%s on %s at %s, still held", t.Detail, t.Handle, t.Location))
			}
		case "release":
			kept = append(kept, fmt.Sprintf("%s on %s at %s released", t.Detail, t.Handle, t.Location))
		case "complete":
			kept = append(kept, fmt.Sprintf("%s completed at %s (%s)", t.Handle, t.Location, now(t.Handle, t.Location)))
		default:
			kept = append(kept, t.String())
		}
	}
	return kept, cleaned, failed
}

func (g *diag) interleaved(committed []system.Transition) (Finding, bool) {
	if len(committed) == 0 || len(g.ev.Trace) == 0 {
		return Finding{}, false
	}
	own := map[uint64]bool{}
	for _, t := range committed {
		own[t.Version] = true
	}
	f := Finding{What: "other transitions since the run's first commit"}
	for _, t := range g.ev.Trace {
		if t.Version > committed[0].Version && !own[t.Version] {
			f.Figures = append(f.Figures, Figure{Name: fmt.Sprintf("v%d", t.Version), Value: transitionText(t)})
		}
	}
	if len(f.Figures) == 0 {
		return f, false
	}
	f.Verdict = "committed by other callers between the run's steps (or after the failure): look here for what made a step fail that its preflight admitted"
	return f, true
}

// leaseEnded finds, for an exit that could not release a lease (an
// *InvalidInputError naming an inactive lease), where the trace shows that
// lease already released.
func (g *diag) leaseEnded(cause error) (Finding, bool) {
	var ie *system.InvalidInputError
	if !errors.As(cause, &ie) || ie.Inactive != system.LifetimeLease {
		return Finding{}, false
	}
	lease := "lease " + g.ev.lifetimeName(system.LifetimeLease, ie.ID)
	f := Finding{What: "the lease the exit could not release"}
	for _, t := range g.ev.Trace {
		if t.ID == ie.ID && (t.Kind == "acquire" || t.Kind == "release") {
			f.Figures = append(f.Figures, Figure{Name: fmt.Sprintf("v%d", t.Version), Value: transitionText(t)})
		}
	}
	switch {
	case len(f.Figures) == 0:
		f.Verdict = fmt.Sprintf("%s is not in the trace: it ended before the trace's oldest transition", lease)
	default:
		f.Verdict = fmt.Sprintf("%s was released outside the scope (by id, or by Close) before the exit: the scope's copy of it was stale; nothing is left to release", lease)
	}
	return f, true
}
