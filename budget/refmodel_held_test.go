package budget

import (
	"fmt"
	"slices"
	"strings"
)

// The reference model's room held for earlier waiters (held.go), written
// from docs/semantics.md ("Calls that do not wait take no held room"):
// while m.held is set, a charge that fits its location and its group is
// refused when its location, or a member of its group, is held; the
// refusal names the held location with the most waiters (the charged
// location first, then the members in location order; ties keep the
// first).

func refHeld(loc string, waiters int) string { return fmt.Sprintf("held{%s %d}", loc, waiters) }

func refIsHeld(e string) bool { return strings.HasPrefix(e, "held{") }

// heldAt is the refusal of a new charge at loc for held room, "" if none.
func (m *refModel) heldAt(loc string) string {
	if len(m.held) == 0 {
		return ""
	}
	at, n := loc, m.held[loc]
	if g := m.groupOf(loc); g != nil {
		for _, l := range m.locs { // location order
			if slices.Contains(g.locs, l.name) && m.held[l.name] > n {
				at, n = l.name, m.held[l.name]
			}
		}
	}
	if n <= 0 {
		return ""
	}
	return refHeld(at, n)
}
