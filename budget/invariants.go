package budget

import (
	"fmt"
	"reflect"
)

// CheckInvariants verifies the ledger's internal consistency: every
// location's used bytes equal the sum of its materializations' charges and
// in-flight temporary charges, reserved bytes equal its reservations, no
// location is over its budget, peaks cover current charges, every count
// equals its active leases, holds and events and none is negative,
// exclusive values have at most one materialization outside a move,
// discarded values have none, every offered charge is an active
// reservation indexed as a candidate at its location and every indexed
// charge is offered (offered ⊆ active), and an evicting charge's bytes
// are still reserved (it stays an active reservation until its owner
// answers). Tests call it after every transition.
func (l *Ledger) CheckInvariants() error {
	if err := l.checkCounts(); err != nil {
		return err
	}
	used := make([]int64, len(l.locs))
	inflight, readers, err := l.checkTransfers(used)
	if err != nil {
		return err
	}
	if err := l.checkValueTable(); err != nil {
		return err
	}
	if err := l.checkIndexes(l.liveValues()); err != nil {
		return err
	}
	if err := l.checkRecords(); err != nil {
		return err
	}
	if err := l.checkShared(); err != nil {
		return err
	}
	if err := l.checkCaps(); err != nil {
		return err
	}
	if err := l.checkValues(used, inflight, readers); err != nil {
		return err
	}
	return l.checkLocations(used)
}

// checkCounts: the transition counts add up to the state version (outside
// a simulation, whose counts are not kept).
func (l *Ledger) checkCounts() error {
	if l.sim {
		return nil
	}
	var total, removed uint64
	for _, n := range l.counts {
		total += n
	}
	for _, n := range l.removals {
		removed += n
	}
	if total != l.version || removed != l.counts["remove"] {
		return fmt.Errorf("transition counts add up to %d (removals %d of %d), version is %d", total, removed, l.counts["remove"], l.version)
	}
	return nil
}

// checkTransfers checks every transfer's ends, adds temporary buffers to
// used, and returns the transfers per value and the readers per
// materialization.
func (l *Ledger) checkTransfers(used []int64) (map[*value]int, map[*mat]int, error) {
	inflight := map[*value]int{}
	readers := map[*mat]int{}
	for _, x := range l.transfers {
		inflight[x.v]++
		if x.src >= 0 && !x.moveSrc {
			readers[x.v.mat(x.src)]++
		}
		if x.temp >= 0 {
			used[x.temp] += x.v.bytes
		}
		if m := x.v.mat(x.dest); m == nil || m.state != Entering {
			return nil, nil, fmt.Errorf("transfer %d of %s: destination %s is not entering", x.id, x.v.name, l.locs[x.dest].name)
		}
		if x.moveSrc {
			if m := x.v.mat(x.src); m == nil || m.state != Leaving {
				return nil, nil, fmt.Errorf("move %d of %s: source %s is not leaving", x.id, x.v.name, l.locs[x.src].name)
			}
		}
	}
	return inflight, readers, nil
}

// checkRecords: a value not marked changed since the last freeze has an
// up-to-date record there (every mutation marks its value).
func (l *Ledger) checkRecords() error {
	for _, v := range l.liveValues() {
		if !v.dirty && !reflect.DeepEqual(v.rec, l.record(v)) {
			return fmt.Errorf("value %s: snapshot record %+v is out of date (%+v) but not marked changed", v.name, v.rec, l.record(v))
		}
		if !v.dirty && l.vals.recs.chunks[v.slot/recChunkSize].recs[v.slot%recChunkSize] != v.rec {
			return fmt.Errorf("value %s: the record at its slot is not its own", v.name)
		}
	}
	return nil
}

// matKey names one materialization: a value at a location.
type matKey struct {
	v   *value
	loc int
}

// checkValues checks every live value's materializations against the
// leases, holds, events and transfers naming them, and adds their bytes
// to used.
func (l *Ledger) checkValues(used []int64, inflight map[*value]int, readers map[*mat]int) error {
	uses, holds, pend := map[matKey]int{}, map[matKey]int{}, map[matKey]int{}
	for _, ls := range l.leases {
		uses[matKey{ls.v, ls.loc}]++
	}
	for _, h := range l.holds {
		holds[matKey{h.v, h.loc}]++
	}
	for _, e := range l.events {
		pend[matKey{e.v, e.loc}]++
	}
	for _, v := range l.liveValues() {
		if v.discarded {
			return fmt.Errorf("retired value %s is still in the value table", v.name)
		}
		if inflight[v] != v.inflight {
			return fmt.Errorf("value %s: inflight %d, transfers %d", v.name, v.inflight, inflight[v])
		}
		seen := map[int]bool{}
		leaving, entering := 0, 0
		for _, m := range v.mats {
			if seen[m.loc] {
				return fmt.Errorf("value %s has two materializations at %s", v.name, l.locs[m.loc].name)
			}
			seen[m.loc] = true
			used[m.loc] += v.bytes
			k := matKey{v, m.loc}
			if m.uses != uses[k] || m.holds != holds[k] || m.pending != pend[k] {
				return fmt.Errorf("value %s at %s: counts uses=%d holds=%d pending=%d, actual %d/%d/%d", v.name, l.locs[m.loc].name, m.uses, m.holds, m.pending, uses[k], holds[k], pend[k])
			}
			if m.readers != readers[m] {
				return fmt.Errorf("value %s at %s: %d readers, %d copies in flight from it", v.name, l.locs[m.loc].name, m.readers, readers[m])
			}
			if m.uses < 0 || m.holds < 0 || m.pending < 0 {
				return fmt.Errorf("value %s at %s: negative count", v.name, l.locs[m.loc].name)
			}
			if m.state != Resident && m.protected() {
				return fmt.Errorf("value %s at %s: %s materialization is protected", v.name, l.locs[m.loc].name, m.state)
			}
			switch m.state {
			case Leaving:
				leaving++
			case Entering:
				entering++
			}
		}
		if v.mode == Exclusive && len(v.mats) > 1 && !(len(v.mats) == 2 && leaving == 1 && entering == 1) {
			return fmt.Errorf("exclusive value %s has %d materializations", v.name, len(v.mats))
		}
	}
	return nil
}

// checkLocations checks every location's used, reserved and peak bytes
// against the charges summed from the values and reservations.
func (l *Ledger) checkLocations(used []int64) error {
	reserved := make([]int64, len(l.locs))
	for _, r := range l.reservations {
		reserved[r.loc] += r.bytes
	}
	for i := range l.locs {
		lc := &l.locs[i]
		for _, r := range lc.reservations {
			if l.reservations[r.name] != r {
				return fmt.Errorf("%s lists reservation %s that is not active", lc.name, r.name)
			}
		}
		if lc.used != used[i] {
			return fmt.Errorf("%s: used %d, sum of charges %d", lc.name, lc.used, used[i])
		}
		if lc.reserved != reserved[i] {
			return fmt.Errorf("%s: reserved %d, sum of reservations %d", lc.name, lc.reserved, reserved[i])
		}
		if lc.hasBudget && lc.used+lc.reserved > lc.budget {
			return fmt.Errorf("%s over budget: used %d + reserved %d > %d", lc.name, lc.used, lc.reserved, lc.budget)
		}
		if lc.peak < lc.used+lc.reserved {
			return fmt.Errorf("%s: peak %d below current %d", lc.name, lc.peak, lc.used+lc.reserved)
		}
	}
	return nil
}

// checkValueTable verifies the value table: every live value once, in id
// order, at its slot, named in byName; ids at or below the high-water mark.
func (l *Ledger) checkValueTable() error {
	t := &l.vals
	n, last := 0, uint64(0)
	for i, v := range t.order {
		if v == nil {
			continue
		}
		n++
		if v.slot != i || v.id <= last || v.id > t.maxID || t.byID[v.id] != v {
			return fmt.Errorf("value table: %s (id %d) misplaced at slot %d", v.name, v.id, i)
		}
		if l.byName[v.name] != v {
			return fmt.Errorf("value table: %s is not found by its name", v.name)
		}
		last = v.id
	}
	if n != len(t.byID) || n != len(l.byName) || len(t.order)-n != t.holes {
		return fmt.Errorf("value table: %d in order, %d by id, %d by name, %d holes of %d", n, len(t.byID), len(l.byName), t.holes, len(t.order))
	}
	return nil
}
