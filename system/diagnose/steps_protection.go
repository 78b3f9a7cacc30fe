package diagnose

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/residency-go/residency/system"
)

// ---- step 4 ----------------------------------------------------------------

// openLifetimes replays the trace for one endpoint: the leases, holds and
// events taken and not yet ended. Details are "lease 3", "hold 2",
// "event 5 on lease 3" as the runtime writes them, or the bare names a
// replay script gave ("reader", "ev on reader").
func openLifetimes(tr []system.Transition, value, loc string) (leases, holds, events []Lifetime) {
	type key struct{ kind, id string }
	open := map[key]Lifetime{}
	var order []key
	for _, t := range tr {
		if t.Handle != value {
			continue
		}
		if t.Kind == "discard" {
			open, order = map[key]Lifetime{}, nil
			continue
		}
		if t.Location != loc {
			continue
		}
		switch t.Kind {
		case "acquire", "release":
			k := key{"lease", lifetimeID(t.Detail, "lease ")}
			if t.Kind == "acquire" {
				open[k] = Lifetime{Kind: "lease", ID: k.id, Version: t.Version}
				order = append(order, k)
			} else {
				delete(open, k)
			}
		case "hold", "unhold":
			k := key{"hold", lifetimeID(t.Detail, "hold ")}
			if t.Kind == "hold" {
				open[k] = Lifetime{Kind: "hold", ID: k.id, Version: t.Version}
				order = append(order, k)
			} else {
				delete(open, k)
			}
		case "record_event":
			ev, lease, _ := strings.Cut(t.Detail, " on ")
			k := key{"event", lifetimeID(ev, "event ")}
			open[k] = Lifetime{Kind: "event", ID: k.id, Version: t.Version, Lease: lifetimeID(lease, "lease ")}
			order = append(order, k)
		case "reap_event":
			delete(open, key{"event", lifetimeID(t.Detail, "event ")})
		}
	}
	for _, k := range order {
		lt, ok := open[k]
		if !ok {
			continue
		}
		delete(open, k)
		switch k.kind {
		case "lease":
			leases = append(leases, lt)
		case "hold":
			holds = append(holds, lt)
		default:
			events = append(events, lt)
		}
	}
	return leases, holds, events
}

// lifetimeID is the id in a trace detail: "lease 3" → "3"; the replay
// CLI's `lease "reader"` → "reader".
func lifetimeID(detail, prefix string) string {
	id := strings.TrimPrefix(detail, prefix)
	if u, err := strconv.Unquote(id); err == nil {
		return u
	}
	return id
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
	p.Leases, p.Holds, p.Events = openLifetimes(g.ev.Trace, x.Handle, x.Location)
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
