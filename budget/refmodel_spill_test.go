package budget

// The reference model's demotions (a reclaim with To), written from the
// rule in docs/semantics.md ("Spill"): a move in the reclaim phase with
// the move's checks and charges; a failed copy drops the value's
// materialization instead, as a plain reclaim, unless that would lose
// data.

import (
	"fmt"
	"slices"
)

// refDemotionLost: the demotion's copy failed and dropping the source
// would lose data; the run fails.
const refDemotionLost = "demotion-lost"

// validateTo checks an action's To, after its handle, location and from:
// only a reclaim may carry one, and it must be a configured location other
// than the action's own.
func (m *refModel) validateTo(a Action, reclaim bool) string {
	if !reclaim {
		return refInvalid()
	}
	if e := m.checkLoc(a.To); e != "" {
		return e
	}
	if a.To == a.Location {
		return refInvalid()
	}
	return ""
}

// demotion carries out a demotion of v (resident at a.Location) to a.To:
// admitted as a move and completed, or, when failCopy, failed and the
// source dropped as a plain reclaim.
func (m *refModel) demotion(v *refValue, a Action, failCopy bool) string {
	if e := m.residentAt(v, a.Location); e != "" {
		return e
	}
	adm, e := m.move(v, a.Location, a.To)
	if e != "" || adm.id == 0 {
		return e
	}
	if !failCopy {
		m.Complete(adm.id)
		return ""
	}
	m.Fail(adm.id)
	if m.evict(v, a.Location) != "" {
		return refDemotionLost
	}
	return ""
}

// refSpillIn is what the reference's spill rule reads of a state: each
// location's budget and charges, its spill target, the plan's additions,
// whether a victim may be demoted to a target, and a location's
// candidates in candidate order (the request's required values left out).
type refSpillIn struct {
	hasBudget func(loc string) bool
	budget    func(loc string) int64
	charged   func(loc string) int64 // used + reserved
	spill     func(loc string) string
	adds      map[string]int64
	demotable func(e Eviction, t string) bool
	cands     func(loc string) []Eviction
	// group gives t's shared budget (its members and figure); nil or
	// false: none.
	group func(t string) ([]string, int64, bool)
}

// refSpill applies the spill rule of docs/semantics.md ("Spill", the
// cascade included) to the victims of a decision made without spill
// targets (in victim order) and returns the reclaim list the controller
// must produce: each victim with its To, and, before a demotion that does
// not fit at its target T, the victims T gives up for it (RoomFor set),
// each demoted further by the same rule or dropped. Written from the text,
// sharing no code with spill_cascade.go.
func refSpill(in refSpillIn, victims []Eviction) []Eviction {
	// (A demotion into a shared budget needs room there too: refGroupFits.)
	key := func(e Eviction) string { return fmt.Sprint(e.Location, "/", e.Handle.ID, "/", e.Charge) }
	removed, before, into := map[string]int64{}, map[string]int64{}, map[string]int64{}
	taken, takenVal := map[string]bool{}, map[uint64]bool{}
	take := func(e Eviction) {
		removed[e.Location] += e.Bytes
		taken[key(e)] = true
		if e.Charge == "" {
			takenVal[e.Handle.ID] = true
		}
	}
	for _, e := range victims {
		take(e)
	}
	excess := func(t string, b int64) int64 {
		if !in.hasBudget(t) {
			return 0
		}
		now := in.charged(t) + into[t] + b - in.budget(t)
		return max(now-removed[t]+in.adds[t], now-before[t])
	}
	// choose: the least valuable set of t's free candidates for n bytes.
	choose := func(t string, n int64) []Eviction {
		var free []Eviction
		var sum int64
		for _, c := range in.cands(t) {
			if sum >= n {
				break
			}
			if taken[key(c)] || (c.Charge == "" && takenVal[c.Handle.ID]) {
				continue
			}
			free, sum = append(free, c), sum+c.Bytes
		}
		if sum < n {
			return nil
		}
		var picked []int
		for end := len(free); n > 0; {
			var run int64
			for k := range end {
				run += free[k].Bytes
				if run >= n {
					picked = append(picked, k)
					n -= free[k].Bytes
					end = k
					break
				}
			}
		}
		slices.Reverse(picked)
		out := make([]Eviction, len(picked))
		for i, k := range picked {
			out[i] = free[k]
		}
		return out
	}
	var out []Eviction
	var place func(e Eviction, chain []string)
	place = func(e Eviction, chain []string) {
		t := in.spill(e.Location)
		if t != "" && in.demotable(e, t) && refGroupFits(in, t, e.Bytes, removed, before, into) {
			if short := excess(t, e.Bytes); short <= 0 {
				e.To = t
			} else if !slices.Contains(chain, t) {
				if picks := choose(t, short); picks != nil {
					for _, p := range picks {
						take(p)
					}
					var mine []int
					for _, p := range picks {
						mine = append(mine, len(out))
						place(p, append(slices.Clip(chain), t))
					}
					for _, i := range mine {
						out[i].RoomFor = len(out)
					}
					e.To = t
				}
			}
		}
		if e.To != "" {
			into[e.To] += e.Bytes
		}
		before[e.Location] += e.Bytes
		out = append(out, e)
	}
	for _, e := range victims {
		place(e, []string{e.Location})
	}
	return out
}

// refCandidates reads loc's candidates in candidate order from the
// ledger's candidate index (the input of the rule, not the rule), less
// the values in required, as eviction records.
func refCandidates(l *Ledger, loc string, required map[uint64]bool) []Eviction {
	var out []Eviction
	for _, b := range l.locs[l.locIndex[loc]].cands.blocks {
		for _, c := range b {
			switch {
			case isChargeID(c.id):
				r := l.charges[c.id]
				out = append(out, Eviction{Location: loc, Bytes: c.bytes, Owner: r.owner, Charge: r.name})
			case !required[c.id]:
				out = append(out, Eviction{Handle: l.handle(l.valueByID(c.id)), Location: loc, Bytes: c.bytes})
			}
		}
	}
	return out
}

// refGroupFits: a demotion of b bytes to t fits t's shared budget, if any,
// in the plan's final state and when it lands (docs/semantics.md, "Shared
// budgets"): the spill rule's two sums, over the group's members.
func refGroupFits(in refSpillIn, t string, b int64, removed, before, into map[string]int64) bool {
	if in.group == nil {
		return true
	}
	locs, bytes, ok := in.group(t)
	if !ok {
		return true
	}
	final, landing := b, b
	for _, m := range locs {
		final += in.charged(m) + into[m] - removed[m] + in.adds[m]
		landing += in.charged(m) + into[m] - before[m]
	}
	return final <= bytes && landing <= bytes
}
