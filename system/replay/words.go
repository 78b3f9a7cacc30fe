package replay

import (
	"fmt"
	"strconv"
	"strings"
)

// words puts a runtime message in the script's words: unknown handles of
// this op, an invalid replica mode, and scopes by their script names.
func (r *Runner) words(msg string) string {
	for _, name := range r.unresolved {
		msg = strings.ReplaceAll(msg, fmt.Sprintf("unknown handle %q (id 0)", name), fmt.Sprintf("unknown handle %q (register it first)", name))
	}
	if r.badReplica != "" {
		msg = strings.ReplaceAll(msg, "unknown replica mode -1", fmt.Sprintf("unknown replica mode %q (use exclusive or replicable)", r.badReplica))
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

// detailWords rewrites a transition's detail: the runtime names leases,
// holds and events by id ("lease 3", "event 2 on lease 3"); the script
// knows them by name.
func (r *Runner) detailWords(d string) string {
	id := func(s string) (uint64, bool) {
		n, err := strconv.ParseUint(s, 10, 64)
		return n, err == nil
	}
	switch {
	case strings.HasPrefix(d, "lease "):
		if n, ok := id(d[len("lease "):]); ok {
			if name, ok := r.leaseNames[n]; ok {
				return name
			}
		}
	case strings.HasPrefix(d, "hold "):
		if n, ok := id(d[len("hold "):]); ok {
			if name, ok := r.holdNames[n]; ok {
				return name
			}
		}
	case strings.HasPrefix(d, "event "):
		rest := d[len("event "):]
		ev, lease, on := strings.Cut(rest, " on lease ")
		n, ok := id(ev)
		if !ok {
			break
		}
		evName, ok := r.eventNames[n]
		if !ok {
			break
		}
		if !on {
			return evName
		}
		if m, ok := id(lease); ok {
			if lName, ok := r.leaseNames[m]; ok {
				return evName + " on " + lName
			}
		}
	}
	return r.words(d)
}
