package budget

// The controller's victims for shared budgets: after an assignment's
// location victims, each group's shortfall and the victims that cover it,
// taken from its members' candidates merged in candidate order (the rule:
// docs/semantics.md, "Shared budgets").

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// sharedVictims adds to ev the victims of every group short in the
// assignment, groups in name order; a reason when one cannot be covered.
//
//	N = adds at its members − (figure − charged) − bytes of the victims chosen at its members
func (d *decider) sharedVictims(ev *evaluation) string {
	l := d.l
	for gi := range l.shared {
		g := &l.shared[gi]
		adds := int64(0)
		for _, m := range g.members {
			adds = addSat(adds, d.adds[m])
		}
		if adds == 0 {
			continue
		}
		freed := int64(0)
		for _, vc := range ev.victims {
			if l.locs[vc.loc].shared == gi+1 {
				freed = addSat(freed, vc.c.bytes)
			}
		}
		n := subSat(subSat(adds, g.bytes-l.sharedCharged(g)), freed)
		if n <= 0 {
			continue
		}
		list, prefix, skipped := d.mergedCandidates(gi+1, ev.victims, n)
		if prefix[len(prefix)-1] < n {
			for _, m := range g.members {
				if d.adds[m] > 0 {
					d.noteShort(m, n)
					break
				}
			}
			return d.sharedReason(g, n, prefix[len(prefix)-1], skipped)
		}
		pos := leastValuableSet(prefix, n, nil)
		slices.Reverse(pos)
		for _, p := range pos {
			ev.victims = append(ev.victims, victim{loc: list[p].loc, c: list[p].c, n: n, shared: gi + 1})
		}
	}
	return ""
}

// mergedCandidates reads the candidates of group g's members (g is the
// index+1), merged in candidate order and then location order, until
// their running sum reaches n or none is left. It leaves out the victims
// already chosen, and a copy of a value without a source that would be
// its last once the victims chosen and the copies listed before it are
// removed (their bytes are skipped). prefix holds the running sums.
func (d *decider) mergedCandidates(g int, chosen []victim, n int64) (list []victim, prefix []int64, skipped int64) {
	l := d.l
	members := l.shared[g-1].members
	taken := map[[2]uint64]bool{}
	removed := map[*value]int{}
	for _, vc := range chosen {
		taken[[2]uint64{uint64(vc.loc), vc.c.id}] = true
		if !isChargeID(vc.c.id) {
			removed[l.valueByID(vc.c.id)]++
		}
	}
	next := make([]int, len(members)) // per member: its next position in its stream
	prefix = []int64{0}
	for prefix[len(prefix)-1] < n {
		best := -1
		for i, m := range members {
			s := d.stream(m)
			if next[i] == len(s.sorted) && !s.more() {
				continue
			}
			if best < 0 || candLess(&s.sorted[next[i]], &d.stream(members[best]).sorted[next[best]]) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		loc := members[best]
		c := d.stream(loc).sorted[next[best]]
		next[best]++
		if taken[[2]uint64{uint64(loc), c.id}] {
			continue
		}
		if !isChargeID(c.id) {
			if v := l.valueByID(c.id); !v.hasSource {
				if removed[v]+1 >= v.residentCount() {
					skipped = addSat(skipped, c.bytes)
					continue
				}
				removed[v]++
			}
		}
		list = append(list, victim{loc: loc, c: c})
		prefix = append(prefix, addSat(prefix[len(prefix)-1], c.bytes))
	}
	return list, prefix, skipped
}

// sharedReason says why group g's shortfall of n bytes cannot be covered:
// its figures, and what its members' candidates could free.
func (d *decider) sharedReason(g *sharedGroup, n, free, skipped int64) string {
	l := d.l
	names := make([]string, len(g.members))
	for i, m := range g.members {
		names[i] = l.locs[m].name
	}
	return fmt.Sprintf("shared budget %q (%s): short %d bytes (figure %d, charged %d), but the evictable candidates at its locations free at most %d beyond the victims already chosen (%d bytes more are last copies of values without a source)",
		g.name, strings.Join(names, ", "), n, g.bytes, l.sharedCharged(g), free, skipped)
}

// sharedVictimReason is what a victim chosen for a group's shortfall adds
// to its Reason.
func (d *decider) sharedVictimReason(vc victim) string {
	if vc.shared == 0 {
		return ""
	}
	return " (the shortfall is at shared budget " + strconv.Quote(d.l.shared[vc.shared-1].name) + ")"
}

// sharedFits reports whether a demotion of b bytes to t fits t's group,
// if any, in the plan's final state and when it lands (the figures of
// spillShort, summed over the members).
func (d *decider) sharedFits(st *spillState, t int, b int64) bool {
	g := d.l.sharedOf(t)
	if g == nil {
		return true
	}
	final, landing := b, b
	for _, m := range g.members {
		lc := &d.l.locs[m]
		base := addSat(lc.used+lc.reserved, st.into[m])
		final = addSat(final, addSat(subSat(base, st.removed[m]), d.adds[m]))
		landing = addSat(landing, subSat(base, st.before[m]))
	}
	return final <= g.bytes && landing <= g.bytes
}
