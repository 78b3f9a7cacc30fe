package diagnose

import (
	"fmt"
	"strings"

	"github.com/residency-go/residency/system"
)

// ---- step 4 ----------------------------------------------------------------

// openLifetimes replays the trace for one endpoint: the leases, holds and
// events taken and not yet ended, by the ids the transitions carry (ID,
// and Lease for a record_event), shown as ev.Names names them.
func (ev Evidence) openLifetimes(value, loc string) (leases, holds, events []Lifetime) {
	open := map[LifetimeRef]Lifetime{}
	var order []LifetimeRef
	take := func(kind system.LifetimeKind, t system.Transition) {
		k := LifetimeRef{kind, t.ID}
		lt := Lifetime{Kind: kind.String(), ID: ev.lifetimeName(kind, t.ID), Version: t.Version}
		if kind == system.LifetimeEvent {
			lt.Lease = ev.lifetimeName(system.LifetimeLease, t.Lease)
		}
		open[k] = lt
		order = append(order, k)
	}
	for _, t := range ev.Trace {
		if t.Handle != value {
			continue
		}
		if t.Kind == "discard" {
			open, order = map[LifetimeRef]Lifetime{}, nil
			continue
		}
		if t.Location != loc {
			continue
		}
		switch t.Kind {
		case "acquire":
			take(system.LifetimeLease, t)
		case "release":
			delete(open, LifetimeRef{system.LifetimeLease, t.ID})
		case "hold":
			take(system.LifetimeHold, t)
		case "unhold":
			delete(open, LifetimeRef{system.LifetimeHold, t.ID})
		case "record_event":
			take(system.LifetimeEvent, t)
		case "reap_event":
			delete(open, LifetimeRef{system.LifetimeEvent, t.ID})
		}
	}
	for _, k := range order {
		lt, ok := open[k]
		if !ok {
			continue
		}
		delete(open, k)
		switch k.Kind {
		case system.LifetimeLease:
			leases = append(leases, lt)
		case system.LifetimeHold:
			holds = append(holds, lt)
		default:
			events = append(events, lt)
		}
	}
	return leases, holds, events
}

func lifetimes(ls []Lifetime) string {
	if len(ls) == 0 {
		return "none"
	}
	ss := make([]string, len(ls))
	for i, l := range ls {
		ss[i] = l.String()
	}
	return strings.Join(ss, ", ")
}

func (g *diag) protection(x *system.InUseError) {
	p := &ProtectionOwners{Value: x.Handle, Location: x.Location, UseCount: x.UseCount, HoldCount: x.HoldCount, PendingEventCount: x.PendingEventCount}
	p.Leases, p.Holds, p.Events = g.ev.openLifetimes(x.Handle, x.Location)
	oldest, _ := traceEnds(g.ev.Trace)
	p.Complete = oldest == 1
	p.Now = matAt(g.ev.Snapshot, x.Handle, x.Location)
	g.d.Protection = p
	g.add(4, stepProtect, Finding{What: fmt.Sprintf("protection of (%s, %s) at the refusal", x.Handle, x.Location), Figures: []Figure{
		fig("use_count", x.UseCount), fig("hold_count", x.HoldCount), fig("pending_event_count", x.PendingEventCount)},
		Verdict: "any count above zero blocks the removal; the controller would skip this materialization as a victim"})
	f := Finding{What: "owning lifetimes open in the trace", Figures: []Figure{
		fig("leases", lifetimes(p.Leases)), fig("holds", lifetimes(p.Holds)), fig("pending events", lifetimes(p.Events))}}
	var todo []string
	if len(p.Leases) > 0 {
		todo = append(todo, "release the lease(s) once every reading stream has recorded its event")
	}
	if len(p.Holds) > 0 {
		todo = append(todo, "release the hold(s) if obsolete")
	}
	if len(p.Events) > 0 {
		todo = append(todo, "wait for the consumer stream(s) (WaitReaped) if the removal must happen now")
	}
	todo = append(todo, "or defer the removal; never discard or close the runtime to get past unknown readers")
	f.Verdict = strings.Join(todo, "; ")
	if n := len(p.Leases) + len(p.Holds) + len(p.Events); n != x.UseCount+x.HoldCount+x.PendingEventCount {
		if p.Complete {
			f.Verdict = fmt.Sprintf("the trace shows %d open lifetimes where the refusal counted %d: they changed after it. ", n, x.UseCount+x.HoldCount+x.PendingEventCount) + f.Verdict
		} else {
			f.Verdict = fmt.Sprintf("the trace starts at v%d and shows %d of the %d protections; the others were taken before it. ", oldest, n, x.UseCount+x.HoldCount+x.PendingEventCount) + f.Verdict
		}
	}
	g.add(4, stepProtect, f)
}

// protected lists protected materializations (a plan error: the controller
// and plans cannot remove them).
func (g *diag) protected() {
	var ps []string
	for _, v := range g.ev.Snapshot.Values {
		for _, m := range v.Materializations {
			if m.UseCount+m.HoldCount+m.PendingEventCount > 0 {
				ps = append(ps, v.Handle.Name+" at "+matString(m))
			}
		}
	}
	f := Finding{What: "protected materializations in the snapshot"}
	if len(ps) == 0 {
		f.Verdict = "none: protection does not explain the refusal"
	} else {
		f.Figures = []Figure{fig("protected", strings.Join(ps, "; "))}
		f.Verdict = "none of these can be reclaimed or chosen as a victim until its lifetimes end"
	}
	g.add(4, stepProtect, f)
}
