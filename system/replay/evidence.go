package replay

import (
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
)

// Evidence completes ev, captured right after op o failed (from
// Hooks.OnFail, with diagnose.Capture), with what the script knows of the
// op: the decision an enter used, or the plan an execute or enter ran
// and its explanation (when Hooks.ExplainFirst asked for it); and puts it
// in the script's words, as the replay output does: lease, hold and event
// ids become the script's names, scopes and caches their script names,
// an unknown handle "register it first".
func (r *Runner) Evidence(o Op, ev diagnose.Evidence) diagnose.Evidence {
	switch {
	case o.Name == "enter" && o.decision != "":
		if dec, ok := r.decisions[o.decision]; ok {
			ev.Decision = &dec
		}
	case (o.Name == "execute" || o.Name == "enter") && o.plan != nil:
		p := r.plan(o.plan)
		ev.Plan = &p
		ev.Explanation = r.explained
	}
	return r.scriptEvidence(ev)
}

// Operation is the call op o made, in the terms of a diagnosis's
// evidence (diagnose.Capture).
func (r *Runner) Operation(o Op) diagnose.Operation {
	out := diagnose.Operation{Kind: o.Name}
	h := func(name string) system.Handle {
		if hd, ok := r.handles[name]; ok {
			return hd
		}
		return system.Handle{Name: name}
	}
	switch o.Name {
	case "register":
		out.Handle, out.Location = system.Handle{Name: o.handle}, o.at
	case "place", "evict", "acquire", "hold":
		out.Handle, out.Location = h(o.handle), o.location
	case "discard":
		out.Handle = h(o.handle)
	case "copy", "move":
		out.Handle, out.From, out.Location = h(o.handle), o.from, o.to
	case "reserve":
		out.Location, out.Reservation, out.Bytes = o.location, o.resName, o.bytes
	// unreserve: its name is in the error's message (an Operation's
	// reservation would print with a size it does not have).
	case "release", "record_event":
		if e, ok := r.leases[o.lease]; ok {
			out.Handle, out.Location = e.lease.Handle(), e.lease.Location()
		}
	case "fail_next":
		out.Location = o.location
	}
	return out
}

// scriptEvidence puts evidence in the script's words, as the replay output
// does: lease, hold and event ids become the script's names, scopes and
// caches their script names, an unknown handle "register it first". The
// trace keeps its ids; ev.Names names them as the script does.
func (r *Runner) scriptEvidence(ev diagnose.Evidence) diagnose.Evidence {
	// A scope's leases share one script name; a message names one of
	// them, so it also gets its endpoint, from the trace's acquire.
	r.leaseEndpoints = map[uint64]string{}
	for _, t := range ev.Trace {
		if t.Kind == "acquire" {
			r.leaseEndpoints[t.ID] = t.Handle + " at " + t.Location
		}
	}
	ev.Names = r.lifetimeNames()
	ev.Err = r.scriptError(ev.Err, r.inactiveNames(ev.Err))
	s := ev.Snapshot
	locs := make([]system.LocationRecord, len(s.Locations))
	for i, l := range s.Locations {
		l.Reservations = append([]system.ReservationRecord(nil), l.Reservations...)
		for j := range l.Reservations {
			l.Reservations[j].Owner = r.owner(l.Reservations[j].Owner)
		}
		locs[i] = l
	}
	s.Locations = locs
	ev.Snapshot = s
	ev.Trace = r.scriptTransitions(ev.Trace)
	return ev
}

// lifetimeNames are the script's names of the runtime's leases, holds and
// events, as a diagnosis shows them after their kind ("reader", `of
// scope "S"`).
func (r *Runner) lifetimeNames() map[diagnose.LifetimeRef]string {
	out := map[diagnose.LifetimeRef]string{}
	for kind, names := range map[system.LifetimeKind]map[uint64]scriptName{
		system.LifetimeLease: r.leaseNames, system.LifetimeHold: r.holdNames, system.LifetimeEvent: r.eventNames,
	} {
		for id, n := range names {
			out[diagnose.LifetimeRef{Kind: kind, ID: id}] = n.bare()
		}
	}
	return out
}

func (r *Runner) scriptTransitions(ts []system.Transition) []system.Transition {
	if ts == nil {
		return nil
	}
	out := make([]system.Transition, len(ts))
	for i, t := range ts {
		t.Detail = r.detail(t)
		out[i] = t
	}
	return out
}

// inactiveNames is, for each lease, hold or event err's refusals name
// (an *InvalidInputError's Inactive and ID, anywhere in err's tree), the
// script's name for it (`lease "L"`; a scope's lease with its endpoint),
// by those fields. The refusal's message is then built around that name
// (InvalidInputError.MessageNaming): no message text is rewritten.
func (r *Runner) inactiveNames(err error) map[diagnose.LifetimeRef]string {
	var out map[diagnose.LifetimeRef]string
	walkErrors(err, func(e error) {
		ie, ok := e.(*system.InvalidInputError)
		if !ok || ie.Inactive == system.LifetimeNone {
			return
		}
		var name scriptName
		switch ie.Inactive {
		case system.LifetimeLease:
			name, ok = r.leaseNames[ie.ID]
		case system.LifetimeHold:
			name, ok = r.holdNames[ie.ID]
		case system.LifetimeEvent:
			name, ok = r.eventNames[ie.ID]
		}
		if !ok {
			return
		}
		to := name.String()
		if ep, ok := r.leaseEndpoints[ie.ID]; ok && ie.Inactive == system.LifetimeLease && name.scope {
			to += " on " + ep
		}
		if out == nil {
			out = map[diagnose.LifetimeRef]string{}
		}
		out[diagnose.LifetimeRef{Kind: ie.Inactive, ID: ie.ID}] = to
	})
	return out
}

// walkErrors calls f on err and every error it wraps.
func walkErrors(err error, f func(error)) {
	if err == nil {
		return
	}
	f(err)
	switch x := err.(type) {
	case interface{ Unwrap() error }:
		walkErrors(x.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, e := range x.Unwrap() {
			walkErrors(e, f)
		}
	}
}

// scriptWordsError is an error in the script's words: its message is
// rewritten, and it unwraps to a copy of the structured error whose text
// fields are rewritten too (so the diagnosis's figures match).
type scriptWordsError struct {
	msg string
	err error
}

func (e *scriptWordsError) Error() string { return e.msg }
func (e *scriptWordsError) Unwrap() error { return e.err }

// scriptError is err in the script's words: the copy of its structured
// error has its text fields in the script's words, and a refusal of an
// inactive lease, hold or event that names has its message built around
// the script's name for it.
func (r *Runner) scriptError(err error, names map[diagnose.LifetimeRef]string) error {
	if err == nil {
		return nil
	}
	_, e := classify(err)
	inner := e
	switch x := e.(type) {
	case *system.InvalidInputError:
		if name, ok := names[diagnose.LifetimeRef{Kind: x.Inactive, ID: x.ID}]; ok && x.Inactive != system.LifetimeNone {
			c := *x
			c.Message = x.MessageNaming(name)
			inner = &c
		}
	case *system.PlanExecutionError:
		c := *x
		c.PartialReport.Transitions = r.scriptTransitions(x.PartialReport.Transitions)
		c.Cause = r.scriptError(x.Cause, names)
		inner = &c
	}
	msg := err.Error()
	if len(names) > 0 && e == err {
		msg = inner.Error() // built with the names
	}
	return &scriptWordsError{msg: msg, err: inner}
}
