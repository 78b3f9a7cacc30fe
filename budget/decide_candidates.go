package budget

// The controller's candidates: per-location candidate streams in
// candidate order and the least-valuable-set rule over them.

import (
	"fmt"
	"slices"
)

// ---- candidates ------------------------------------------------------------

// candidate is one evictable materialization at a location. It holds no
// pointer (the value is l.valueByID(id)) so that candidate indexes of
// millions of entries cost the garbage collector nothing to scan.
type candidate struct {
	prio    int64
	lastUse uint64
	id      uint64
	bytes   int64
}

// candLess is the candidate order: ascending H, then ascending last use,
// then id: registration order among values, then the offered charges
// (ids with chargeIDBit, charges.go) in admission order. It is a strict
// total order at one location (a value has at most one materialization
// there, and a charge's id is its own).
func candLess(a, b *candidate) bool {
	if a.prio != b.prio {
		return a.prio < b.prio
	}
	if a.lastUse != b.lastUse {
		return a.lastUse < b.lastUse
	}
	return a.id < b.id
}

// candStream yields a location's candidates for one Decide in candidate
// order, read from the location's candidate index (candindex.go) as far as
// a shortfall needs, leaving out the request's required values: sorted
// holds those read so far, with their running byte sums in prefix.
// k victims cost O(k) reads (plus the required values skipped).
type candStream struct {
	cur    candCursor
	d      *decider
	sorted []candidate
	prefix []int64 // prefix[i] = bytes of sorted[:i]
	total  int64   // bytes of every candidate

	// Bytes at the location that are not candidates, by why (for reasons).
	protectedBytes, lastCopyBytes, requiredBytes, inFlightBytes int64
}

// stream returns loc's candidate stream, made on first use from the
// location's accounting: the figures by category, less the materializations
// of the values the request requires (they are not candidates for it).
// Its buffers come from a pool, so deciding again and again allocates
// (almost) nothing for them.
func (d *decider) stream(loc int) *candStream {
	if s := d.streams[loc]; s != nil {
		return s
	}
	sc := d.scratch
	lc := &d.l.locs[loc]
	s := &candStream{
		cur:            candCursor{x: &lc.cands},
		d:              d,
		sorted:         sc.sorted[loc][:0],
		prefix:         append(sc.prefix[loc][:0], 0),
		total:          lc.catBytes[catCandidate],
		protectedBytes: lc.catBytes[catProtected],
		lastCopyBytes:  lc.catBytes[catLastCopy],
		inFlightBytes:  lc.catBytes[catInFlight],
	}
	for v := range d.required {
		m := v.mat(loc)
		if m == nil {
			continue
		}
		switch cat, _ := v.category(m); cat {
		case catInFlight:
			continue // in flight comes first, required or not
		case catProtected:
			s.protectedBytes -= v.bytes
		case catLastCopy:
			s.lastCopyBytes -= v.bytes
		case catCandidate:
			s.total -= v.bytes
		}
		s.requiredBytes += v.bytes
	}
	d.streams[loc] = s
	return s
}

// isRequired reports whether the request requires the value with id (a
// short linear scan for the usual handful of requirements; the map beyond
// that).
func (d *decider) isRequired(id uint64) bool {
	if len(d.reqs) > 8 {
		return d.requiredIDs[id]
	}
	for _, r := range d.reqs {
		if r.v.id == id {
			return true
		}
	}
	return false
}

// decideScratch holds the candidate buffers of one Decide, per location,
// for reuse by the next one. Nothing in a Decision points into them.
type decideScratch struct {
	sorted [][]candidate
	prefix [][]int64
}

// decideScratch returns the ledger's reusable candidate buffers (the
// ledger is single-threaded, so one set serves every Decide in turn).
func (l *Ledger) decideScratch(nlocs int) *decideScratch {
	if l.scratch == nil {
		l.scratch = new(decideScratch)
	}
	sc := l.scratch
	for len(sc.sorted) < nlocs {
		sc.sorted = append(sc.sorted, nil)
		sc.prefix = append(sc.prefix, nil)
	}
	return sc
}

// release keeps the streams' buffers (grown or not) for the next Decide.
func (d *decider) release() {
	sc := d.scratch
	for loc, s := range d.streams {
		if s != nil {
			sc.sorted[loc], sc.prefix[loc] = s.sorted[:0], s.prefix[:0]
		}
	}
	d.streams, d.scratch = nil, nil
}

// more reads the next candidate that the request does not require into
// sorted, and reports false when none is left.
func (s *candStream) more() bool {
	for {
		c, ok := s.cur.next()
		if !ok {
			return false
		}
		if s.d.isRequired(c.id) {
			continue
		}
		s.sorted = append(s.sorted, c)
		s.prefix = append(s.prefix, s.prefix[len(s.prefix)-1]+c.bytes)
		return true
	}
}

// reach reads candidates until their running sum reaches n (or none is
// left) and reports whether it did.
func (s *candStream) reach(n int64) bool {
	for s.prefix[len(s.prefix)-1] < n && s.more() {
	}
	return s.prefix[len(s.prefix)-1] >= n
}

// leastValuableSet applies the victim rule to a list whose running byte
// sums are prefix (prefix[0] = 0, prefix[i] = bytes of the first i
// entries) and which reaches n: take the first entry c_k at which the
// running sum reaches n, then the victims for n − bytes(c_k) among the
// entries before it. Each level is a binary search because the running
// sums of c_1…c_{k−1} are unchanged. It returns positions, descending.
func leastValuableSet(prefix []int64, n int64, out []int) []int {
	hi := len(prefix) - 1 // search among entries [0, hi)
	for n > 0 {
		// smallest k in [0, hi) with prefix[k+1] >= n
		lo, h := 0, hi
		for lo < h {
			mid := int(uint(lo+h) >> 1)
			if prefix[mid+1] >= n {
				h = mid
			} else {
				lo = mid + 1
			}
		}
		out = append(out, lo)
		n -= prefix[lo+1] - prefix[lo]
		hi = lo
	}
	return out
}

type memoKey struct {
	loc int
	n   int64
}

type memoEntry struct {
	ok   bool
	pos  []int // positions in the stream's sorted list, ascending
	fail string
}

// victimsAt returns the victims for shortfall n at loc, unconstrained by
// victims elsewhere, memoized by (location, shortfall): the candidate list
// is fixed for the whole Decide, so the rule's answer depends on nothing
// else.
func (d *decider) victimsAt(loc int, n int64) memoEntry {
	k := memoKey{loc, n}
	if e, ok := d.memo[k]; ok {
		return e
	}
	s := d.stream(loc)
	var e memoEntry
	if s.reach(n) {
		pos := leastValuableSet(s.prefix, n, nil)
		slices.Reverse(pos)
		e = memoEntry{ok: true, pos: pos}
	} else {
		e = memoEntry{fail: d.budgetReason(loc, n, s)}
	}
	d.memo[k] = e
	return e
}

func (d *decider) budgetReason(loc int, n int64, s *candStream) string {
	lc := &d.l.locs[loc]
	return fmt.Sprintf("budget at %s: short %d bytes (budget %d, used %d, reserved %d), but evictable candidates free at most %d; not evictable there: %d bytes protected by leases, holds or pending events, %d bytes last copies of values without a source, %d bytes required by this request, %d bytes in flight (entering, leaving or the source of a copy)",
		lc.name, n, lc.budget, lc.used, lc.reserved, s.total, s.protectedBytes, s.lastCopyBytes, s.requiredBytes, s.inFlightBytes)
}
