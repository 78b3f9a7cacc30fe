package budget

// The controller's evaluation of one assignment: what it adds where,
// its shortfalls and its victims.

import (
	"fmt"
	"math"
	"slices"
)

// ---- evaluation ------------------------------------------------------------

type victim struct {
	loc int
	c   candidate
	n   int64 // the location's shortfall, or its group's
	// shared is the index+1 of the group whose shortfall chose it, 0
	// for a location's (decide_shared.go).
	shared int
}

// evaluation is a feasible assignment's outcome and its rank.
type evaluation struct {
	victims  []victim
	prios    []int64 // descending
	transfer int64
	evicted  int64
}

// better reports whether a ranks before b. Equal ranks keep the earlier
// position vector, so the caller replaces its best only on true.
func (a *evaluation) better(b *evaluation) bool {
	if c := slices.Compare(a.prios, b.prios); c != 0 {
		return c < 0
	}
	if a.transfer != b.transfer {
		return a.transfer < b.transfer
	}
	if a.evicted != b.evicted {
		return a.evicted < b.evicted
	}
	return len(a.victims) < len(b.victims)
}

// tieWin reports whether assignment chosen (evaluated as a) wins a tie
// against the best so far (b at bestChosen) under the request's
// tie-break. Only TieMostFree breaks ties; the caller asks only when a
// does not rank before b.
func (d *decider) tieWin(a, b *evaluation, chosen, bestChosen []int) bool {
	if d.req.TieBreak != TieMostFree || b.better(a) {
		return false
	}
	for i, loc := range chosen {
		if fa, fb := d.free(loc), d.free(bestChosen[i]); fa != fb {
			return fa > fb
		}
	}
	return false
}

// free is loc's free bytes before the plan: budget − used − reserved, or
// the most an int64 holds when loc has no budget.
func (d *decider) free(loc int) int64 {
	lc := &d.l.locs[loc]
	if !lc.hasBudget {
		return math.MaxInt64
	}
	return lc.budget - lc.used - lc.reserved
}

// evaluate computes the outcome of one assignment (chosen[i] is the
// location of requirement i). It mirrors place() on the state the plan
// would produce: an endpoint already resident adds nothing; an exclusive
// value resident elsewhere moves (its only materialization must be
// resident and unprotected); a replicable value copies from its preferred
// resident materialization (earlier enters of the same plan included);
// otherwise it is reconstructed, charging its size temporarily at its
// source location when that differs from the destination.
func (d *decider) evaluate(chosen []int) (*evaluation, string) {
	for _, loc := range d.touched {
		d.adds[loc] = 0
	}
	d.touched = d.touched[:0]
	d.entered = d.entered[:0]
	ev := &evaluation{}
	if fail := d.addEnters(chosen, ev); fail != "" {
		return nil, fail
	}
	for loc, b := range d.reservationAdds {
		if b > 0 {
			d.add(loc, b)
		}
	}
	if fail := d.chooseVictims(ev); fail != "" {
		return nil, fail
	}
	// Room held for earlier waiters last: it blocks only an assignment
	// that would be feasible (held.go).
	if d.l.held != nil {
		for _, loc := range d.touched {
			if d.adds[loc] <= 0 {
				continue
			}
			if err := d.l.heldErr(loc); err != nil {
				wa := err.(*WaitersAheadError)
				if d.heldBlock == nil {
					d.heldBlock = wa
				}
				return nil, fmt.Sprintf("held room: %d earlier callers wait for room at %s", wa.Waiters, wa.Location)
			}
		}
	}
	return ev, ""
}

// add counts b more bytes the assignment adds at loc.
func (d *decider) add(loc int, b int64) {
	if d.adds[loc] == 0 {
		d.touched = append(d.touched, loc)
	}
	d.adds[loc] = addSat(d.adds[loc], b)
}

// addEnters counts what entering each requirement at its chosen location
// adds (the value, and a temporary at its source when it is
// reconstructed), and the transfer bytes; a reason when the assignment
// cannot be carried out.
func (d *decider) addEnters(chosen []int, ev *evaluation) string {
	l := d.l
	for i, r := range d.reqs {
		v, dest := r.v, chosen[i]
		if m := v.mat(dest); m != nil {
			if m.state != Resident {
				return fmt.Sprintf("value %s: a transition into %s is in flight", v.name, l.locs[dest].name)
			}
			continue
		}
		if slices.Contains(d.entered, enteredAt{v, dest}) {
			continue // the same replicable value required twice at dest
		}
		d.entered = append(d.entered, enteredAt{v, dest})
		ev.transfer += v.bytes
		if v.mode == Exclusive && len(v.mats) > 0 {
			if fail := d.exclusiveMove(v, dest); fail != "" {
				return fail
			}
			d.add(dest, v.bytes)
			continue
		}
		if d.hasSourceCopy(v) {
			d.add(dest, v.bytes)
			continue
		}
		if !v.hasSource {
			return fmt.Sprintf("value %s has no resident materialization and no source to reconstruct from", v.name)
		}
		d.add(dest, v.bytes)
		if v.source != dest {
			d.add(v.source, v.bytes)
		}
	}
	return ""
}

// exclusiveMove is why exclusive value v cannot move to dest now, or "".
func (d *decider) exclusiveMove(v *value, dest int) string {
	l := d.l
	m := v.mats[0]
	if m.state != Resident || len(v.mats) > 1 {
		return fmt.Sprintf("exclusive value %s has a transition in flight", v.name)
	}
	if m.protected() {
		return fmt.Sprintf("protected: exclusive value %s would move from %s to %s, but its materialization at %s is in use (%d leases, %d holds, %d pending events)",
			v.name, l.locs[m.loc].name, l.locs[dest].name, l.locs[m.loc].name, m.uses, m.holds, m.pending)
	}
	if m.busy() {
		return fmt.Sprintf("exclusive value %s would move from %s, which is the source of a copy in flight", v.name, l.locs[m.loc].name)
	}
	return ""
}

// chooseVictims finds the shortfall at each touched location with a budget
// and the victims that cover it, then those of every shared budget short,
// with their priorities (highest first); a reason when no victims can.
func (d *decider) chooseVictims(ev *evaluation) string {
	l := d.l
	// Shortfalls, in location order.
	d.short = d.short[:0]
	for _, loc := range d.touched {
		lc := &l.locs[loc]
		if !lc.hasBudget {
			if err := AccountingOverflow(lc.name, lc.used, lc.reserved, d.adds[loc]); err != nil {
				return err.Error() // no eviction makes room in the accounting itself
			}
			continue
		}
		if n := d.adds[loc] - (lc.budget - lc.used - lc.reserved); n > 0 {
			d.short = append(d.short, shortfall{loc, n})
		}
	}
	if len(d.short) == 0 && len(l.shared) == 0 {
		return ""
	}
	slices.SortFunc(d.short, func(a, b shortfall) int { return a.loc - b.loc })
	for _, sf := range d.short {
		e := d.victimsAt(sf.loc, sf.n)
		if !e.ok {
			d.noteShort(sf.loc, sf.n)
			return e.fail
		}
		s := d.streams[sf.loc]
		for _, p := range e.pos {
			ev.victims = append(ev.victims, victim{loc: sf.loc, c: s.sorted[p], n: sf.n})
		}
	}
	if len(d.short) > 1 && d.lastCopyConflict(ev.victims) {
		var fail string
		if ev.victims, fail = d.constrainedVictims(); fail != "" {
			return fail
		}
	}
	if len(l.shared) > 0 {
		if fail := d.sharedVictims(ev); fail != "" {
			return fail
		}
	}
	for _, vc := range ev.victims {
		ev.prios = append(ev.prios, vc.c.prio)
		ev.evicted += vc.c.bytes
	}
	slices.SortFunc(ev.prios, func(a, b int64) int {
		switch {
		case a > b:
			return -1
		case a < b:
			return 1
		}
		return 0
	})
	return ""
}

// hasSourceCopy reports whether v has a resident materialization to copy
// from, counting endpoints entered earlier in the same plan.
func (d *decider) hasSourceCopy(v *value) bool {
	for _, m := range v.mats {
		if m.state == Resident {
			return true
		}
	}
	for _, e := range d.entered[:len(d.entered)-1] {
		if e.v == v {
			return true
		}
	}
	return false
}

// lastCopyConflict reports whether victims chosen independently at
// different locations would together remove every resident copy of a
// value without a source.
func (d *decider) lastCopyConflict(vs []victim) bool {
	var count map[*value]int
	for _, vc := range vs {
		if isChargeID(vc.c.id) {
			continue
		}
		v := d.l.valueByID(vc.c.id)
		if v.hasSource {
			continue
		}
		if count == nil {
			count = map[*value]int{}
		}
		count[v]++
		if count[v] >= v.residentCount() {
			return true
		}
	}
	return false
}

// constrainedVictims recomputes the victims location by location, in
// location order, dropping from each location's candidate list the
// materializations whose removal, together with the victims already chosen
// at earlier locations, would leave a value without a source with no
// resident copy. Where no conflict exists this gives the same victims as
// the independent computation (removing candidates that the rule did not
// select cannot change what it selects), so it runs only on conflict.
func (d *decider) constrainedVictims() ([]victim, string) {
	removed := map[*value]int{}
	var out []victim
	var prefix []int64
	var list []candidate
	for _, sf := range d.short {
		s := d.stream(sf.loc)
		prefix = append(prefix[:0], 0)
		list = list[:0]
		skipped := int64(0)
		for i := 0; prefix[len(prefix)-1] < sf.n; i++ {
			if i == len(s.sorted) && !s.more() {
				break
			}
			c := s.sorted[i]
			if isChargeID(c.id) {
				// an offered charge: never a last copy
			} else if v := d.l.valueByID(c.id); !v.hasSource && removed[v]+1 >= v.residentCount() {
				skipped += c.bytes
				continue
			}
			list = append(list, c)
			prefix = append(prefix, prefix[len(prefix)-1]+c.bytes)
		}
		if prefix[len(prefix)-1] < sf.n {
			return nil, fmt.Sprintf("unrecoverable: at %s, short %d bytes, the remaining candidates free only %d because %d bytes are the last copies of values without a source once the victims at earlier locations are removed",
				d.l.locs[sf.loc].name, sf.n, prefix[len(prefix)-1], skipped)
		}
		pos := leastValuableSet(prefix, sf.n, nil)
		slices.Reverse(pos)
		for _, p := range pos {
			out = append(out, victim{loc: sf.loc, c: list[p], n: sf.n})
			if !isChargeID(list[p].id) {
				removed[d.l.valueByID(list[p].id)]++
			}
		}
	}
	return out, ""
}
