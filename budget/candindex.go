package budget

import (
	"fmt"
	"slices"
)

// The controller's candidate indexes. Every location
// keeps its candidates — materializations there that are resident,
// unprotected, not the source of a copy in flight, and not the last
// resident copy of a value without a source, and the charges offered
// there (charges.go) — in candidate order
// (ascending H, then last use, then registration), and the bytes of its
// other materializations by why they are not candidates. The ledger keeps
// both up to date on every mutation that changes a materialization's
// category or key (its state, its readers, its protections, its priority
// or last use, or, for a value without a source, how many resident copies
// it has), so Decide reads the first candidates in order without looking
// at any other value: its cost grows with the victims it needs, not with
// the values resident. A request's own required values are skipped as the
// candidates are read (a handful at most per location).

// matCat is why a materialization is, or is not, a candidate. The order is
// the precedence of the checks: in flight first, then protected, then
// last copy; otherwise a candidate.
type matCat int8

const (
	catNone      matCat = iota // not accounted (a simulation's copy)
	catInFlight                // entering, leaving, or the source of a copy in flight
	catProtected               // leases, holds or pending events
	catLastCopy                // the last resident copy of a value without a source
	catCandidate               // in the location's candidate index
	numCats
)

// category computes m's category and, for a candidate, its index entry.
func (v *value) category(m *mat) (matCat, candidate) {
	switch {
	case m.state != Resident || m.busy():
		return catInFlight, candidate{}
	case m.protected():
		return catProtected, candidate{}
	case !v.hasSource && v.residentCount() < 2:
		return catLastCopy, candidate{}
	}
	return catCandidate, candidate{prio: m.prio, lastUse: m.lastUse, id: v.id, bytes: v.bytes}
}

// reindex brings the accounting of every materialization of v up to date.
// Every mutation of v's materializations calls it once it is done (a
// removed materialization is unindexed before it goes). A simulation's
// clone keeps no indexes.
func (l *Ledger) reindex(v *value) {
	if l.sim {
		return
	}
	l.touch(v) // its snapshot record too
	for _, m := range v.mats {
		cat, key := v.category(m)
		if cat == m.cat && (cat != catCandidate || key == m.key) {
			continue
		}
		l.unindex(v, m)
		lc := &l.locs[m.loc]
		lc.catBytes[cat] += v.bytes
		if cat == catCandidate {
			lc.cands.insert(key)
		}
		m.cat, m.key = cat, key
	}
}

// unindex removes m from its location's accounting.
func (l *Ledger) unindex(v *value, m *mat) {
	if l.sim || m.cat == catNone {
		return
	}
	lc := &l.locs[m.loc]
	lc.catBytes[m.cat] -= v.bytes
	if m.cat == catCandidate {
		lc.cands.remove(m.key)
	}
	m.cat, m.key = catNone, candidate{}
}

// candIndex is an ordered set of candidates (candLess order): a list of
// sorted blocks, each holding at most candBlockMax entries. Insert and
// remove cost two binary searches and a copy within one block; reading in
// order is a walk over the blocks. Entries hold no pointers, so the
// garbage collector does not scan them.
type candIndex struct {
	blocks [][]candidate
	n      int
	spare  []candidate // the last block emptied, for the next insert
}

const candBlockMax = 256

// block returns the index of the first block whose last entry is not
// below c (len(blocks) when every entry is below c).
func (x *candIndex) block(c *candidate) int {
	lo, hi := 0, len(x.blocks)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		b := x.blocks[mid]
		if candLess(&b[len(b)-1], c) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// position returns the index of the first entry of b not below c.
func position(b []candidate, c *candidate) int {
	lo, hi := 0, len(b)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if candLess(&b[mid], c) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

func (x *candIndex) insert(c candidate) {
	x.n++
	if len(x.blocks) == 0 {
		blk := x.spare
		if blk == nil {
			blk = make([]candidate, 0, 8)
		}
		x.spare = nil
		x.blocks = append(x.blocks, append(blk, c))
		return
	}
	bi := x.block(&c)
	if bi == len(x.blocks) {
		bi--
	}
	b := x.blocks[bi]
	b = slices.Insert(b, position(b, &c), c)
	if len(b) > candBlockMax {
		half := len(b) / 2
		right := make([]candidate, len(b)-half, candBlockMax+1)
		copy(right, b[half:])
		b = b[:half]
		x.blocks = slices.Insert(x.blocks, bi+1, right)
	}
	x.blocks[bi] = b
}

// remove removes c, which must be present (the ledger's accounting says
// so; anything else is a broken invariant).
func (x *candIndex) remove(c candidate) {
	bi := x.block(&c)
	var b []candidate
	p := 0
	if bi < len(x.blocks) {
		b = x.blocks[bi]
		p = position(b, &c)
	}
	if b == nil || p == len(b) || b[p] != c {
		panic(fmt.Sprintf("budget: candidate index has no entry %+v", c))
	}
	x.n--
	b = slices.Delete(b, p, p+1)
	switch {
	case len(b) == 0:
		x.blocks = slices.Delete(x.blocks, bi, bi+1)
		if len(x.blocks) == 0 && cap(b) <= 2*candBlockMax {
			x.spare = b // an index that empties and fills again allocates nothing
		}
		return
	case len(b) < candBlockMax/4 && bi+1 < len(x.blocks) && len(b)+len(x.blocks[bi+1]) <= candBlockMax:
		b = append(b, x.blocks[bi+1]...)
		x.blocks = slices.Delete(x.blocks, bi+1, bi+2)
	}
	x.blocks[bi] = b
}

// candCursor reads an index in order.
type candCursor struct {
	x      *candIndex
	blk, i int
}

// next returns the next entry, or false at the end.
func (c *candCursor) next() (candidate, bool) {
	for c.blk < len(c.x.blocks) {
		b := c.x.blocks[c.blk]
		if c.i < len(b) {
			c.i++
			return b[c.i-1], true
		}
		c.blk, c.i = c.blk+1, 0
	}
	return candidate{}, false
}

// checkIndexes verifies every location's accounting against the
// materializations (CheckInvariants).
func (l *Ledger) checkIndexes(vals []*value) error {
	var bytes [][numCats]int64 = make([][numCats]int64, len(l.locs))
	cands := make([]map[candidate]bool, len(l.locs))
	for i := range cands {
		cands[i] = map[candidate]bool{}
	}
	for _, v := range vals {
		for _, m := range v.mats {
			cat, key := v.category(m)
			if m.cat != cat || (cat == catCandidate && m.key != key) {
				return fmt.Errorf("value %s at %s: accounted as category %d %+v, is %d %+v", v.name, l.locs[m.loc].name, m.cat, m.key, cat, key)
			}
			bytes[m.loc][cat] += v.bytes
			if cat == catCandidate {
				cands[m.loc][key] = true
			}
		}
	}
	chargeBytes, chargeKeys, err := l.checkCharges()
	if err != nil {
		return err
	}
	for k := range chargeKeys {
		cands[l.charges[k.id].loc][k] = true
	}
	for i := range l.locs {
		lc := &l.locs[i]
		bytes[i][catCandidate] += chargeBytes[i]
		if lc.catBytes != bytes[i] {
			return fmt.Errorf("%s: category bytes %v, materializations %v", lc.name, lc.catBytes, bytes[i])
		}
		n := 0
		var prev *candidate
		for _, b := range lc.cands.blocks {
			if len(b) == 0 || len(b) > candBlockMax {
				return fmt.Errorf("%s: candidate block of %d entries", lc.name, len(b))
			}
			for j := range b {
				if prev != nil && !candLess(prev, &b[j]) {
					return fmt.Errorf("%s: candidate index out of order at %+v", lc.name, b[j])
				}
				if !cands[i][b[j]] {
					return fmt.Errorf("%s: candidate index lists %+v, not a candidate", lc.name, b[j])
				}
				prev = &b[j]
				n++
			}
		}
		if n != len(cands[i]) || n != lc.cands.n {
			return fmt.Errorf("%s: candidate index holds %d (counted %d), candidates %d", lc.name, n, lc.cands.n, len(cands[i]))
		}
	}
	return nil
}
