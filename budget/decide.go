package budget

// The controller: Ledger.Decide and the bounded deterministic placement
// search behind it. The search structure is described in the package
// documentation (doc.go, section "Controller") and on Decide; the comments
// below cover the implementation choices that keep it fast without
// changing its result.

import (
	"fmt"
	"slices"
	"strings"
)

// Requirement asks for a value to be resident at one location of one of
// its tiers. Tiers are in preference order; a tier is one location or
// several equally preferred ones.
type Requirement struct {
	Handle Handle
	Tiers  [][]string
}

// Request is what [Ledger.Decide] places: every requirement resident, and
// every reservation admitted, after one plan.
type Request struct {
	Name         string
	Requirements []Requirement
	Reservations []ReservationSpec
}

// Eviction is one victim of a decision: the materialization of Handle at
// Location, its charge, and why it was chosen: in words (Reason) and as a
// kind (Kind), which programs read instead of the words.
type Eviction struct {
	Handle   Handle
	Location string
	Bytes    int64
	Reason   string
	// Kind is the reason's kind, for programs (Reason says it in words).
	Kind EvictionKind
}

// Decision is the controller's answer to a request.
type Decision struct {
	RequestName string
	// ExpectedStateVersion is the ledger version the decision was derived
	// from; run the plan with it (RunOptions.CheckVersion) to refuse a
	// stale decision.
	ExpectedStateVersion uint64
	// ExploredStates counts the assignments the search evaluated. It
	// measures search work, not evictions or quality.
	ExploredStates int
	// Evictions lists the victims in the order of Plan.Reclaim.
	Evictions []Eviction
	// Plan reclaims the victims, then admits the request's reservations,
	// then enters every requirement at its chosen location, in requirement
	// order (an endpoint that is already resident enters as a no-op).
	Plan Plan
	// Explanation is l.Explain(Plan) at ExpectedStateVersion; it is always
	// feasible.
	Explanation Explanation
	// Exhaustive is false when the state limit cut the search short after
	// a feasible assignment had been found: the plan is the best of those
	// evaluated, not necessarily of its whole tier-index vector.
	Exhaustive bool
}

// Decide searches for a plan that makes every requirement of req resident
// at one of its locations, admits req's reservations, stays within every
// budget, never touches a protected materialization and never makes a
// value unrecoverable. It is a read: it changes nothing, not even the
// state version, and consumes no fault.
//
// The search enumerates assignments (one location per requirement) in
// lexicographic order of the tier-index vector (the first requirement most
// significant), then of the position-within-tier vector, and counts each
// evaluated assignment as one explored state. It finishes the first
// tier-index vector that has a feasible assignment and returns its best
// one: the smallest descending-sorted list of victim priorities over all
// locations, then the fewest bytes transferred, then the fewest evicted
// bytes, then the fewest evictions, then the earliest position vector.
// Victims at each location follow the least-valuable-set rule of the
// priority H = L(location) + freq (see the package documentation).
//
// stateLimit bounds the explored states: 0 means [DefaultStateLimit]; a
// negative limit is invalid input. When the limit is reached before any
// feasible assignment was found, Decide returns a [*SearchLimitError]
// (feasibility unknown); when it is reached after one was found, it
// returns the best found so far with Exhaustive false. The limit counts as
// reached only when another assignment remained to be evaluated.
//
// Errors (nothing changes): a foreign or discarded handle, or a well-formed
// but unconfigured location → [*UnavailableError]; an empty request name, a
// malformed location, an unknown handle, a bad reservation (empty,
// repeated or already active name, bytes ≤ 0) → [*InvalidInputError]; a
// requirement or tier with no locations, an exclusive handle required
// twice, or no feasible assignment at all → [*PlanError] whose Reason
// names what blocked (the budget with its location and shortfall,
// protected materializations, last copies of values without a source).
// The first problem is reported, in the order of checks of the package
// documentation: the request's name, its requirements in order, its
// reservations, then the rules in the order just listed.
func (l *Ledger) Decide(req Request, stateLimit int) (Decision, error) {
	if stateLimit < 0 {
		return Decision{}, invalidf("request %q: state limit %d is negative (0 means the default %d)", req.Name, stateLimit, DefaultStateLimit)
	}
	if stateLimit == 0 {
		stateLimit = DefaultStateLimit
	}
	d, err := l.newDecider(req)
	if err != nil {
		return Decision{}, err
	}
	d.scratch = l.decideScratch(len(l.locs))
	defer d.release()
	return d.search(stateLimit)
}

// ---- validation ------------------------------------------------------------

type decideReq struct {
	v     *value
	tiers [][]int // location indices
}

type decider struct {
	l    *Ledger
	req  Request
	reqs []decideReq
	// required marks the values the request requires (by id too);
	// none of their materializations is a candidate.
	required    map[*value]bool
	requiredIDs map[uint64]bool
	// reservationAdds is the bytes the request's reservations add, per location.
	reservationAdds []int64

	// streams[loc] is loc's candidate stream, built on first use.
	streams []*candStream
	scratch *decideScratch
	memo    map[memoKey]memoEntry

	// per-evaluation scratch
	adds    []int64
	touched []int
	short   []shortfall
	entered []enteredAt

	// failures seen, in first-seen order, keyed by their message
	failures   []string
	failureSet map[string]bool
	lastFail   string
}

type enteredAt struct {
	v   *value
	loc int
}

type shortfall struct {
	loc int
	n   int64
}

func (l *Ledger) newDecider(req Request) (*decider, error) {
	if req.Name == "" {
		return nil, invalidf("request name is empty")
	}
	d := &decider{
		l:               l,
		req:             req,
		reqs:            make([]decideReq, len(req.Requirements)),
		required:        make(map[*value]bool, len(req.Requirements)),
		requiredIDs:     make(map[uint64]bool, len(req.Requirements)),
		reservationAdds: make([]int64, len(l.locs)),
		memo:            map[memoKey]memoEntry{},
		adds:            make([]int64, len(l.locs)),
		streams:         make([]*candStream, len(l.locs)),
		failureSet:      map[string]bool{},
	}
	for i, r := range req.Requirements {
		v, err := l.value(r.Handle)
		if err != nil {
			return nil, err
		}
		tiers := make([][]int, len(r.Tiers))
		for t, tier := range r.Tiers {
			tiers[t] = make([]int, len(tier))
			for p, name := range tier {
				loc, err := l.location(name)
				if err != nil {
					return nil, err
				}
				tiers[t][p] = loc
			}
		}
		d.reqs[i] = decideReq{v: v, tiers: tiers}
	}
	names := map[string]bool{}
	for i, r := range req.Reservations {
		if r.Name == "" {
			return nil, invalidf("request %q: reservation %d has an empty name", req.Name, i)
		}
		if names[r.Name] {
			return nil, invalidf("request %q: reservation name %q appears twice", req.Name, r.Name)
		}
		names[r.Name] = true
		if _, active := l.reservations[r.Name]; active {
			return nil, invalidf("request %q: reservation name %q is already active", req.Name, r.Name)
		}
		if r.Bytes <= 0 {
			return nil, invalidf("request %q: reservation %q: bytes must be positive, got %d", req.Name, r.Name, r.Bytes)
		}
		loc, err := l.location(r.Location)
		if err != nil {
			return nil, err
		}
		d.reservationAdds[loc] += r.Bytes
	}
	// Rules only after every field passed, in the order of the rule list:
	// a requirement or tier with no locations (any requirement), then an
	// exclusive value required twice.
	for i, r := range d.reqs {
		if len(r.tiers) == 0 {
			return nil, planf("request %q: requirement %d (%s) has no locations", req.Name, i, r.v.name)
		}
		for t, tier := range r.tiers {
			if len(tier) == 0 {
				return nil, planf("request %q: requirement %d (%s): tier %d has no locations", req.Name, i, r.v.name, t)
			}
		}
	}
	seen := map[*value]int{}
	for i, r := range d.reqs {
		if j, dup := seen[r.v]; dup && r.v.mode == Exclusive {
			return nil, planf("request %q: requirements %d and %d both require %q, an exclusive value; only replicable values may be required at several locations", req.Name, j, i, r.v.name)
		}
		seen[r.v] = i
		d.required[r.v] = true
		d.requiredIDs[r.v.id] = true
	}
	return d, nil
}

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
// then registration order. It is a strict total order at one location
// (a value has at most one materialization there).
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

// ---- evaluation ------------------------------------------------------------

type victim struct {
	loc int
	c   candidate
	n   int64 // the location's shortfall
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

// evaluate computes the outcome of one assignment (chosen[i] is the
// location of requirement i). It mirrors place() on the state the plan
// would produce: an endpoint already resident adds nothing; an exclusive
// value resident elsewhere moves (its only materialization must be
// resident and unprotected); a replicable value copies from its preferred
// resident materialization (earlier enters of the same plan included);
// otherwise it is reconstructed, charging its size temporarily at its
// source location when that differs from the destination.
func (d *decider) evaluate(chosen []int) (*evaluation, string) {
	l := d.l
	for _, loc := range d.touched {
		d.adds[loc] = 0
	}
	d.touched = d.touched[:0]
	d.entered = d.entered[:0]
	add := func(loc int, b int64) {
		if d.adds[loc] == 0 {
			d.touched = append(d.touched, loc)
		}
		d.adds[loc] += b
	}
	ev := &evaluation{}
	for i, r := range d.reqs {
		v, dest := r.v, chosen[i]
		if m := v.mat(dest); m != nil {
			if m.state != Resident {
				return nil, fmt.Sprintf("value %s: a transition into %s is in flight", v.name, l.locs[dest].name)
			}
			continue
		}
		if slices.Contains(d.entered, enteredAt{v, dest}) {
			continue // the same replicable value required twice at dest
		}
		d.entered = append(d.entered, enteredAt{v, dest})
		ev.transfer += v.bytes
		if v.mode == Exclusive && len(v.mats) > 0 {
			m := v.mats[0]
			if m.state != Resident || len(v.mats) > 1 {
				return nil, fmt.Sprintf("exclusive value %s has a transition in flight", v.name)
			}
			if m.protected() {
				return nil, fmt.Sprintf("protected: exclusive value %s would move from %s to %s, but its materialization at %s is in use (%d leases, %d holds, %d pending events)",
					v.name, l.locs[m.loc].name, l.locs[dest].name, l.locs[m.loc].name, m.uses, m.holds, m.pending)
			}
			if m.busy() {
				return nil, fmt.Sprintf("exclusive value %s would move from %s, which is the source of a copy in flight", v.name, l.locs[m.loc].name)
			}
			add(dest, v.bytes)
			continue
		}
		if d.hasSourceCopy(v) {
			add(dest, v.bytes)
			continue
		}
		if !v.hasSource {
			return nil, fmt.Sprintf("value %s has no resident materialization and no source to reconstruct from", v.name)
		}
		add(dest, v.bytes)
		if v.source != dest {
			add(v.source, v.bytes)
		}
	}
	for loc, b := range d.reservationAdds {
		if b > 0 {
			add(loc, b)
		}
	}
	// Shortfalls, in location order.
	d.short = d.short[:0]
	for _, loc := range d.touched {
		lc := &l.locs[loc]
		if !lc.hasBudget {
			continue
		}
		if n := d.adds[loc] - (lc.budget - lc.used - lc.reserved); n > 0 {
			d.short = append(d.short, shortfall{loc, n})
		}
	}
	if len(d.short) == 0 {
		return ev, ""
	}
	slices.SortFunc(d.short, func(a, b shortfall) int { return a.loc - b.loc })
	for _, sf := range d.short {
		e := d.victimsAt(sf.loc, sf.n)
		if !e.ok {
			return nil, e.fail
		}
		s := d.streams[sf.loc]
		for _, p := range e.pos {
			ev.victims = append(ev.victims, victim{loc: sf.loc, c: s.sorted[p], n: sf.n})
		}
	}
	if len(d.short) > 1 && d.lastCopyConflict(ev.victims) {
		var fail string
		if ev.victims, fail = d.constrainedVictims(); fail != "" {
			return nil, fail
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
	return ev, ""
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
			if v := d.l.valueByID(c.id); !v.hasSource && removed[v]+1 >= v.residentCount() {
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
			removed[d.l.valueByID(list[p].id)]++
		}
	}
	return out, ""
}

// ---- search ----------------------------------------------------------------

// decideExplain is the check every chosen plan passes before it is
// returned. Tests replace it to exercise the path where the check fails.
var decideExplain = func(l *Ledger, p Plan) (Explanation, error) { return l.explain(p) }

func (d *decider) fail(chosen []int, why string) {
	d.lastFail = why
	if d.failureSet[why] {
		return
	}
	d.failureSet[why] = true
	d.failures = append(d.failures, fmt.Sprintf("%s [first blocked assignment: %s]", why, d.describe(chosen)))
}

func (d *decider) describe(chosen []int) string {
	if len(chosen) == 0 {
		return "no requirements"
	}
	parts := make([]string, len(chosen))
	for i, loc := range chosen {
		parts[i] = d.reqs[i].v.name + "→" + d.l.locs[loc].name
	}
	return strings.Join(parts, ", ")
}

func (d *decider) search(limit int) (Decision, error) {
	tv := make([]int, len(d.reqs)) // tier-index vector
	explored := 0
	for {
		var rejected map[string]bool
		for {
			sc := d.scan(tv, limit-explored, rejected)
			if sc.best == nil {
				explored += sc.evaluated
				if sc.cut {
					return Decision{}, &SearchLimitError{RequestName: d.req.Name, StateLimit: limit, ExploredStates: explored,
						Detail: d.limitDetail(explored, tv, sc.cutPos)}
				}
				break
			}
			dec, why := d.build(sc.bestChosen, sc.best)
			if why == "" {
				dec.ExploredStates = explored + sc.evaluated
				dec.Exhaustive = !sc.cut
				return dec, nil
			}
			// Explain refused the plan (it should not happen): that
			// assignment is infeasible; rescan the same positions
			// without it. The rescan counts no new states.
			d.fail(sc.bestChosen, why)
			if rejected == nil {
				rejected = map[string]bool{}
			}
			rejected[fmt.Sprint(sc.bestPos)] = true
		}
		if !odometer(tv, func(i int) int { return len(d.reqs[i].tiers) }) {
			break
		}
	}
	return Decision{}, &PlanError{Reason: d.infeasibleReason(explored)}
}

type scanResult struct {
	best       *evaluation
	bestChosen []int
	bestPos    []int
	evaluated  int
	cut        bool  // positions remained when the budget ran out
	cutPos     []int // the first position not evaluated
}

// scan evaluates the position vectors of tier vector tv in lexicographic
// order, at most budget of them, and returns the best feasible one.
// Position vectors in rejected count as evaluated but infeasible.
func (d *decider) scan(tv []int, budget int, rejected map[string]bool) scanResult {
	var r scanResult
	pos := make([]int, len(d.reqs))
	chosen := make([]int, len(d.reqs))
	for {
		if r.evaluated == budget {
			r.cut, r.cutPos = true, pos
			return r
		}
		r.evaluated++
		for i, q := range d.reqs {
			chosen[i] = q.tiers[tv[i]][pos[i]]
		}
		if rejected != nil && rejected[fmt.Sprint(pos)] {
			// already reported by search
		} else if ev, why := d.evaluate(chosen); ev == nil {
			d.fail(chosen, why)
		} else if r.best == nil || ev.better(r.best) {
			r.best, r.bestChosen, r.bestPos = ev, slices.Clone(chosen), slices.Clone(pos)
		}
		if !odometer(pos, func(i int) int { return len(d.reqs[i].tiers[tv[i]]) }) {
			return r
		}
	}
}

// odometer advances v to the next vector in lexicographic order (v[0] most
// significant, digit i ranging over [0, size(i))) and reports false after
// the last one.
func odometer(v []int, size func(int) int) bool {
	for i := len(v) - 1; i >= 0; i-- {
		v[i]++
		if v[i] < size(i) {
			return true
		}
		v[i] = 0
	}
	return false
}

func (d *decider) limitDetail(explored int, tv, pos []int) string {
	s := fmt.Sprintf("no feasible assignment among the %d evaluated; stopped before tier-index vector %v, position vector %v", explored, tv, pos)
	if d.lastFail != "" {
		s += "; last blocker: " + d.lastFail
	}
	return s
}

func (d *decider) infeasibleReason(explored int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "request %q: no feasible assignment (%d explored, search exhaustive); blocked by: ", d.req.Name, explored)
	const maxListed = 4
	for i, f := range d.failures {
		if i == maxListed {
			fmt.Fprintf(&b, "; and %d more distinct blockers", len(d.failures)-maxListed)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f)
	}
	return b.String()
}

// build turns a feasible evaluation into a decision and checks it: the
// plan must be feasible under Explain, and its enter list must hold every
// requirement's chosen endpoint (Explain's final check makes each of them
// resident in the final simulated state). A failed check makes the
// assignment infeasible; by construction it should not happen, because the
// shortfall arithmetic over-approximates every intermediate charge.
func (d *decider) build(chosen []int, ev *evaluation) (Decision, string) {
	l := d.l
	victims := slices.Clone(ev.victims)
	slices.SortStableFunc(victims, func(a, b victim) int { return a.loc - b.loc })
	plan := Plan{}
	var evictions []Eviction
	for _, vc := range victims {
		h := l.handle(l.valueByID(vc.c.id))
		name := l.locs[vc.loc].name
		plan.Reclaim = append(plan.Reclaim, Action{Handle: h, Location: name})
		evictions = append(evictions, Eviction{Handle: h, Location: name, Bytes: vc.c.bytes,
			Reason: fmt.Sprintf("priority H=%d (last use v%d) among the lowest at %s; evicted to free %d bytes of the %d-byte shortfall for request %q",
				vc.c.prio, vc.c.lastUse, name, vc.c.bytes, vc.n, d.req.Name),
			Kind: EvictionLowestPriority})
	}
	if len(d.req.Reservations) > 0 {
		plan.Reservations = slices.Clone(d.req.Reservations)
	}
	plan.Enter = make([]Action, len(d.reqs))
	for i := range d.reqs {
		plan.Enter[i] = Action{Handle: d.req.Requirements[i].Handle, Location: l.locs[chosen[i]].name}
	}
	// Explain ends by checking that every entered endpoint is resident in
	// the final simulated state; with one enter per requirement at its
	// chosen location, a feasible explanation is exactly the assertion.
	ex, err := decideExplain(l, plan)
	if err != nil || !ex.Feasible {
		return Decision{}, "internal: the controller's arithmetic admitted a plan that Explain finds infeasible: " + ex.Reason
	}
	return Decision{
		RequestName:          d.req.Name,
		ExpectedStateVersion: l.version,
		Evictions:            evictions,
		Plan:                 plan,
		Explanation:          ex,
	}, ""
}
