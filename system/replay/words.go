package replay

import (
	"strconv"

	"github.com/residency-go/residency/system"
)

// owner is a reservation's owner in the script's words: a scope of the
// script by its name (`scope "S"`, looked up by the runtime's scope name
// the owner is); a cache's owner is the script's words already
// (`cache "NAME"`).
func (r *Runner) owner(o string) string {
	if r == nil {
		return o
	}
	if name, ok := r.scopeNames[o]; ok {
		return "scope " + strconv.Quote(name)
	}
	return o
}

// scopeReservation is the refusal of unreserve for a reservation a scope
// of the script owns, as the runtime words it but with the scope's script
// name; nil when no entered scope owns name.
func (r *Runner) scopeReservation(name string) error {
	scope, ok := r.resvScopes[name]
	if !ok {
		return nil
	}
	return invalid("reservation %q belongs to scope %q; it is released when the scope exits", name, scope)
}

// scriptName is a lease, hold or event as the script knows it: its kind
// and the name the script gave it; scope: a lease a scope took, named
// after the scope.
type scriptName struct {
	kind  string // "lease", "hold" or "event"
	name  string
	scope bool
}

// String is the name in the script's words: `lease "L"`, `lease of scope
// "S"`, `hold "H"`, `event "E"`.
func (n scriptName) String() string {
	if n.scope {
		return n.kind + " " + n.bare()
	}
	return n.kind + " " + strconv.Quote(n.name)
}

// bare is the name without its kind: `L`, or `of scope "S"`.
func (n scriptName) bare() string {
	if n.scope {
		return "of scope " + strconv.Quote(n.name)
	}
	return n.name
}

// detailWords is a transition's detail in the script's words: the
// runtime names leases, holds and events by id ("lease 3", "event 2 on
// lease 3"); the transition carries the ids (ID, Lease), and the script
// knows them by name.
func (r *Runner) detailWords(t system.Transition) string {
	switch t.Kind {
	case "acquire", "release":
		if n, ok := r.leaseNames[t.ID]; ok {
			return n.String()
		}
	case "hold", "unhold":
		if n, ok := r.holdNames[t.ID]; ok {
			return n.String()
		}
	case "reap_event":
		if n, ok := r.eventNames[t.ID]; ok {
			return n.String()
		}
	case "record_event":
		ev, okEv := r.eventNames[t.ID]
		lease, okLease := r.leaseNames[t.Lease]
		if okEv && okLease {
			return ev.String() + " on " + lease.String()
		}
	}
	return t.Detail
}
