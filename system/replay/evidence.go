package replay

import (
	"regexp"
	"strconv"
	"strings"

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
// caches their script names, an unknown handle "register it first".
func (r *Runner) scriptEvidence(ev diagnose.Evidence) diagnose.Evidence {
	// A scope's leases share one script name; a message names one of
	// them, so it also gets its endpoint, from the trace's acquire.
	r.leaseEndpoints = map[uint64]string{}
	for _, t := range ev.Trace {
		if t.Kind != "acquire" {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimPrefix(t.Detail, "lease "), 10, 64); err == nil {
			r.leaseEndpoints[n] = t.Handle + " at " + t.Location
		}
	}
	ev.Err = r.scriptError(ev.Err)
	s := ev.Snapshot
	locs := make([]system.LocationRecord, len(s.Locations))
	for i, l := range s.Locations {
		l.Reservations = append([]system.ReservationRecord(nil), l.Reservations...)
		for j := range l.Reservations {
			l.Reservations[j].Name = r.message(l.Reservations[j].Name)
			l.Reservations[j].Owner = r.message(l.Reservations[j].Owner)
		}
		locs[i] = l
	}
	s.Locations = locs
	ev.Snapshot = s
	ev.Trace = r.scriptTransitions(ev.Trace)
	if ev.Decision != nil {
		d := *ev.Decision
		d.Evictions = append([]system.Eviction(nil), d.Evictions...)
		for i := range d.Evictions {
			d.Evictions[i].Reason = r.message(d.Evictions[i].Reason)
		}
		d.Explanation.Reason = r.message(d.Explanation.Reason)
		ev.Decision = &d
	}
	if ev.Explanation != nil {
		x := *ev.Explanation
		x.Reason = r.message(x.Reason)
		ev.Explanation = &x
	}
	return ev
}

func (r *Runner) scriptTransitions(ts []system.Transition) []system.Transition {
	if ts == nil {
		return nil
	}
	out := make([]system.Transition, len(ts))
	for i, t := range ts {
		t.Detail = r.detail(t.Detail)
		out[i] = t
	}
	return out
}

// lifetimeIDs finds the runtime's lease, hold and event ids in a message
// ("lease 3 is not active").
var lifetimeIDs = regexp.MustCompile(`\b(lease|hold|event) ([0-9]+)\b`)

// scriptMessage is runner.message, and lease, hold and event ids by their
// script names (the trace's details name them so).
func (r *Runner) scriptMessage(msg string) string {
	msg = r.message(msg)
	return lifetimeIDs.ReplaceAllStringFunc(msg, func(m string) string {
		sub := lifetimeIDs.FindStringSubmatch(m)
		n, err := strconv.ParseUint(sub[2], 10, 64)
		if err != nil {
			return m
		}
		var names map[uint64]string
		switch sub[1] {
		case "lease":
			names = r.leaseNames
		case "hold":
			names = r.holdNames
		default:
			names = r.eventNames
		}
		name, ok := names[n]
		if !ok {
			return m
		}
		if ep, ok := r.leaseEndpoints[n]; ok && sub[1] == "lease" && strings.HasPrefix(name, "lease of scope ") {
			name += " on " + ep
		}
		return name
	})
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

func (r *Runner) scriptError(err error) error {
	if err == nil {
		return nil
	}
	_, e := classify(err)
	inner := e
	switch x := e.(type) {
	case *system.PlanError:
		c := *x
		c.Reason = r.scriptMessage(c.Reason)
		inner = &c
	case *system.SearchLimitError:
		c := *x
		c.Detail = r.scriptMessage(c.Detail)
		inner = &c
	case *system.UnavailableError:
		c := *x
		c.Detail = r.scriptMessage(c.Detail)
		inner = &c
	case *system.InvalidInputError:
		c := *x
		c.Message = r.scriptMessage(c.Message)
		inner = &c
	case *system.PlanExecutionError:
		c := *x
		c.PartialReport.Transitions = r.scriptTransitions(x.PartialReport.Transitions)
		c.Cause = r.scriptError(x.Cause)
		inner = &c
	}
	return &scriptWordsError{msg: r.scriptMessage(err.Error()), err: inner}
}
