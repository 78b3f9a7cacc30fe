package replay

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/residency-go/residency/system"
)

// words puts a runtime message in the script's words: unknown handles of
// this op, and scopes by their script names.
func (r *Runner) words(msg string) string {
	for _, name := range r.unresolved {
		msg = strings.ReplaceAll(msg, fmt.Sprintf("unknown handle %q (id 0)", name), fmt.Sprintf("unknown handle %q (register it first)", name))
	}

	if len(r.scopeNames) > 0 && strings.Contains(msg, "scope-") {
		msg = r.scopeWords(msg)
	}
	if r.caches != nil && strings.Contains(msg, "cache:") {
		msg = r.caches.cacheWords(msg)
	}
	if r.staging != nil {
		msg = r.staging.stagingWords(msg)
	}
	return msg
}

// scopeWords replaces the runtime's scope names ("scope-3", quoted or
// not) with the script's (`scope "S"`).
func (r *Runner) scopeWords(msg string) string {
	var b strings.Builder
	for {
		i := strings.Index(msg, "scope-")
		if i < 0 {
			b.WriteString(msg)
			return b.String()
		}
		j := i + len("scope-")
		for j < len(msg) && msg[j] >= '0' && msg[j] <= '9' {
			j++
		}
		name, ok := r.scopeNames[msg[i:j]]
		if !ok || j == i+len("scope-") {
			b.WriteString(msg[:j])
			msg = msg[j:]
			continue
		}
		quoted := i > 0 && msg[i-1] == '"' && j < len(msg) && msg[j] == '"'
		if quoted {
			b.WriteString(msg[:i-1])
			b.WriteString(strconv.Quote(name))
			msg = msg[j+1:]
			continue
		}
		b.WriteString(msg[:i])
		b.WriteString("scope " + strconv.Quote(name))
		msg = msg[j:]
	}
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
	return r.words(t.Detail)
}
