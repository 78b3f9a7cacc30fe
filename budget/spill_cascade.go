package budget

// The controller's demotions: which victims are demoted, where, and the
// victims a spill target gives up to make room for them (the spill
// cascade; the rule is in spill.go's file comment and in
// docs/semantics.md, "Spill").

import "slices"

// spilled is one entry of a decision's reclaim list: a victim, the
// location it is demoted to (-1: dropped), and, for a victim chosen at a
// spill target to make room for a demotion, that demotion's position in
// the list (0 for the request's own victims: a demotion that needs room
// always comes after the victims that make it).
type spilled struct {
	vc      victim
	to      int
	roomFor int
	// at is the demotion this victim made room for, while the list is
	// built (the victim demoted, its location); nil for the request's
	// own victims.
	at *victim
}

// spillState is the bookkeeping of one decision's demotions, by location
// index: removed counts every victim's bytes (the plan's final state),
// before the victims listed so far (when a demotion lands), into the
// demotions listed so far. taken holds every victim (location and id),
// takenVal the values with a victim anywhere in the plan.
type spillState struct {
	removed, before, into []int64
	taken                 map[[2]uint64]bool
	takenVal              map[uint64]bool
	out                   []spilled
}

// demotions returns the decision's reclaim list: the request's victims in
// victim order, each with its demotion target (or dropped), and before
// each demotion the victims its target gave up to make room for it. With
// no spill target configured, the victims as they are, all dropped.
// chosen is the assignment the victims serve.
func (d *decider) demotions(chosen []int, victims []victim) []spilled {
	l := d.l
	if !l.hasSpill() || len(victims) == 0 {
		return dropAll(victims)
	}
	// Refresh the per-location additions (d.adds) for this assignment:
	// the best evaluation is not necessarily the last one evaluated.
	d.evaluate(chosen)
	n := len(l.locs)
	st := &spillState{
		removed: make([]int64, n), before: make([]int64, n), into: make([]int64, n),
		taken: map[[2]uint64]bool{}, takenVal: map[uint64]bool{},
	}
	for _, vc := range victims {
		st.take(vc)
	}
	for _, vc := range victims {
		d.spill(st, vc, nil, []int{vc.loc})
	}
	return st.out
}

// dropAll is the reclaim list that drops every victim.
func dropAll(victims []victim) []spilled {
	if len(victims) == 0 {
		return nil
	}
	out := make([]spilled, len(victims))
	for i, vc := range victims {
		out[i] = spilled{vc: vc, to: -1}
	}
	return out
}

// hasDemotion reports whether the list demotes any victim.
func hasDemotion(list []spilled) bool {
	for _, sp := range list {
		if sp.to >= 0 {
			return true
		}
	}
	return false
}

// take records vc as a victim of the plan.
func (st *spillState) take(vc victim) {
	st.removed[vc.loc] += vc.c.bytes
	st.taken[[2]uint64{uint64(vc.loc), vc.c.id}] = true
	if !isChargeID(vc.c.id) {
		st.takenVal[vc.c.id] = true
	}
}

// spill appends vc to the list, demoted or dropped, after the victims
// its target gives up for it (if any). roomFor is the demotion vc makes
// room for (nil for the request's own victims); chain holds the
// locations of vc's chain (its first victim's location and every target
// that made room in it): no location makes room twice in one chain, so a
// cascade ends.
func (d *decider) spill(st *spillState, vc victim, roomFor *victim, chain []int) {
	l := d.l
	t := l.locs[vc.loc].spill
	to := -1
	// A spill target whose room earlier waiters hold takes no demotion
	// (held.go): the victim is dropped.
	if t >= 0 && d.l.heldErr(t) == nil && d.demotable(vc, t) && d.sharedFits(st, t, vc.c.bytes) {
		short := d.spillShort(st, t, vc.c.bytes)
		switch {
		case short <= 0:
			to = t
		case !slices.Contains(chain, t):
			if picks := d.roomAt(st, t, short); picks != nil {
				self := vc
				for _, p := range picks {
					st.take(p)
				}
				for _, p := range picks {
					d.spill(st, p, &self, append(slices.Clip(chain), t))
				}
				to = t
			}
		}
	}
	if to >= 0 {
		st.into[to] += vc.c.bytes
	}
	st.before[vc.loc] += vc.c.bytes
	st.out = append(st.out, spilled{vc: vc, to: to, at: roomFor})
}

// demotable reports whether victim vc may be demoted to t: a value with
// no other resident materialization and none at t, or a charge its owner
// offered as demotable to t.
func (d *decider) demotable(vc victim, t int) bool {
	l := d.l
	if isChargeID(vc.c.id) {
		return l.chargeDemotable(l.charges[vc.c.id], t)
	}
	v := l.valueByID(vc.c.id)
	return v.residentCount() == 1 && v.mat(t) == nil
}

// spillShort is how many bytes t lacks for a demotion of b bytes: the
// larger excess of the plan's final state and of the moment it lands
// (≤ 0: it fits; always fits when t has no budget).
//
//	final:   used + reserved − removed + adds + into + b − budget
//	landing: used + reserved − before + into + b − budget
func (d *decider) spillShort(st *spillState, t int, b int64) int64 {
	lc := &d.l.locs[t]
	if !lc.hasBudget {
		return 0
	}
	base := lc.used + lc.reserved + st.into[t] + b - lc.budget
	return max(base-st.removed[t]+d.adds[t], base-st.before[t])
}

// roomAt chooses the victims at t for a shortfall of n bytes: t's
// candidates in candidate order (the request's required values are not
// among them), less those already victims of the plan and the other
// copies of values with a victim, by the victim rule (the least valuable
// set). It returns them in candidate order, or nil when they cannot
// cover n.
func (d *decider) roomAt(st *spillState, t int, n int64) []victim {
	s := d.stream(t)
	// pool and prefix are the decider's scratch: nothing keeps them past
	// this call.
	pool, prefix := d.roomPool[:0], append(d.roomPrefix[:0], 0)
	defer func() { d.roomPool, d.roomPrefix = pool[:0], prefix[:0] }()
	for i := 0; prefix[len(prefix)-1] < n; i++ {
		if i == len(s.sorted) && !s.more() {
			return nil
		}
		c := s.sorted[i]
		if st.taken[[2]uint64{uint64(t), c.id}] || (!isChargeID(c.id) && st.takenVal[c.id]) {
			continue
		}
		pool = append(pool, c)
		prefix = append(prefix, prefix[len(prefix)-1]+c.bytes)
	}
	pos := leastValuableSet(prefix, n, nil)
	out := make([]victim, len(pos))
	for i, p := range pos {
		out[len(pos)-1-i] = victim{loc: t, c: pool[p], n: n}
	}
	return out
}

// settle fills in each cascade victim's roomFor: the position of the
// first later entry that is the demotion it made room for.
func settle(list []spilled) {
	for i := range list {
		at := list[i].at
		if at == nil {
			continue
		}
		for j := i + 1; j < len(list); j++ {
			if list[j].vc.loc == at.loc && list[j].vc.c.id == at.c.id {
				list[i].roomFor = j
				break
			}
		}
	}
}

// reclaims builds the decision's reclaim list and eviction records from
// the list demotions made.
func (d *decider) reclaims(list []spilled) ([]Action, []Eviction) {
	l := d.l
	if len(list) == 0 {
		return nil, nil
	}
	settle(list)
	actions := make([]Action, 0, len(list))
	evictions := make([]Eviction, 0, len(list))
	for _, sp := range list {
		vc := sp.vc
		name := l.locs[vc.loc].name
		to := ""
		if sp.to >= 0 {
			to = l.locs[sp.to].name
		}
		var a Action
		var e Eviction
		if isChargeID(vc.c.id) {
			a, e = d.chargeReclaim(vc, name, to)
		} else {
			h := l.handle(l.valueByID(vc.c.id))
			a = Action{Handle: h, Location: name, To: to}
			e = Eviction{Handle: h, Location: name, Bytes: vc.c.bytes, Kind: EvictionLowestPriority, To: to}
			what := "evicted"
			if to != "" {
				e.Kind, what = EvictionDemoted, "demoted to "+to
			}
			e.Reason = victimReason(vc.c.prio, vc.c.lastUse, name, what, vc.c.bytes, vc.n, d.req.Name)
		}
		e.Reason += d.sharedVictimReason(vc)
		if sp.at != nil {
			e.RoomFor = sp.roomFor
			e.Reason += roomForReason(name, d.victimName(*sp.at), l.locs[sp.at.loc].name, sp.roomFor)
		}
		actions = append(actions, a)
		evictions = append(evictions, e)
	}
	return actions, evictions
}

// victimName names a victim in words: its value's name, or its charge's.
func (d *decider) victimName(vc victim) string {
	if isChargeID(vc.c.id) {
		return "charge " + d.l.shownName(d.l.charges[vc.c.id].name)
	}
	return d.l.valueByID(vc.c.id).name
}
