package budget

// The controller: Ledger.Decide and the bounded deterministic placement
// search behind it. The search structure is described in the package
// documentation (doc.go, section "Controller") and on Decide; the comments
// below cover the implementation choices that keep it fast without
// changing its result.

import (
	"fmt"
	"math"
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
	// TieBreak chooses among assignments the ranking leaves equal; the
	// zero value, TieFirstListed, keeps the earliest listed.
	TieBreak TieBreak
}

// TieBreak is how [Ledger.Decide] chooses among the assignments of one
// tier-index vector that its ranking leaves equal (same victim
// priorities, transfer bytes, evicted bytes and eviction count).
type TieBreak uint8

const (
	// TieFirstListed keeps the earliest position-within-tier vector: the
	// first listed location of each tier wins a tie. The default.
	TieFirstListed TieBreak = iota
	// TieMostFree prefers, requirement by requirement in order, the chosen
	// location with the most free bytes (budget − used − reserved, before
	// the plan; a location without a budget counts as having the most);
	// assignments still equal keep the earliest position vector.
	TieMostFree
)

// String names the tie-break: "first-listed" or "most-free".
func (t TieBreak) String() string {
	switch t {
	case TieFirstListed:
		return "first-listed"
	case TieMostFree:
		return "most-free"
	}
	return fmt.Sprintf("TieBreak(%d)", uint8(t))
}

// Eviction is one victim of a decision: the materialization of Handle at
// Location (or an idle cache entry's charge there), its bytes, and why it was chosen: in words (Reason) and as a
// kind (Kind), which programs read instead of the words.
type Eviction struct {
	Handle   Handle
	Location string
	Bytes    int64
	Reason   string
	// Kind is the reason's kind, for programs (Reason says it in words).
	Kind EvictionKind
	// To is the spill target the victim is demoted to ("" when it is
	// dropped); its reclaim action carries the same To (spill.go).
	To string
	// RoomFor is set on a victim chosen at a spill target to make room
	// for a demotion into it (the spill cascade, spill.go): the position
	// in Evictions (and in Plan.Reclaim) of that demotion, always after
	// this victim. It is 0 for the request's own victims.
	RoomFor int
	// Owner and Charge name the victim when it is an offered charge (an
	// idle cache entry, Kind EvictionIdleCacheEntry; Handle is zero).
	Owner  string
	Charge string
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
// repeated or already active name, bytes ≤ 0), an unknown tie-break →
// [*InvalidInputError]; a
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

	// roomPool and roomPrefix are roomAt's scratch (spill_cascade.go).
	roomPool   []candidate
	roomPrefix []int64

	// per-evaluation scratch
	adds    []int64
	touched []int
	short   []shortfall
	entered []enteredAt

	// failures seen, in first-seen order, keyed by their message
	failures   []string
	failureSet map[string]bool
	lastFail   string
	// shortLoc and shortN: the first budget shortfall that blocked an
	// assignment (PlanError's Location and Shortfall); shortLoc -1: none.
	shortLoc int
	shortN   int64
	// heldBlock is the first assignment's refusal for room held by
	// earlier waiters (Ledger.WithHeld), nil when none was.
	heldBlock *WaitersAheadError
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
		shortLoc:        -1,
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
		if lc := &l.locs[loc]; !lc.hasBudget && d.reservationAdds[loc] > math.MaxInt64-lc.used-lc.reserved-r.Bytes {
			// Beyond the byte accounting of a location without a budget,
			// as Reserve refuses it (used+reserved+sum ≤ MaxInt64 held
			// before this reservation, so nothing above wraps).
			return nil, invalidf("request %q: its reservations at %s would overflow its byte accounting (used %d + reserved %d + %d asked before + %d)",
				req.Name, lc.name, lc.used, lc.reserved, d.reservationAdds[loc], r.Bytes)
		}
		d.reservationAdds[loc] = addSat(d.reservationAdds[loc], r.Bytes)
	}
	if req.TieBreak > TieMostFree {
		return nil, invalidf("request %q: unknown tie-break %d (want TieFirstListed or TieMostFree)", req.Name, uint8(req.TieBreak))
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
	for i, r := range d.reqs {
		if d.required[r.v] && r.v.mode == Exclusive {
			j := slices.IndexFunc(d.reqs[:i], func(o decideReq) bool { return o.v == r.v })
			return nil, planf("request %q: requirements %d and %d both require %q, an exclusive value; only replicable values may be required at several locations", req.Name, j, i, r.v.name)
		}
		d.required[r.v] = true
		d.requiredIDs[r.v.id] = true
	}
	return d, nil
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
	if d.heldBlock != nil {
		// Some assignment was blocked only by room earlier waiters hold:
		// waiting could admit the request, so it is busy, not infeasible.
		err := *d.heldBlock
		err.Detail = d.infeasibleReason(explored)
		return Decision{}, &err
	}
	pe := &PlanError{Reason: d.infeasibleReason(explored)}
	if d.shortLoc >= 0 {
		pe.Location, pe.Shortfall = d.l.locs[d.shortLoc].name, d.shortN
	}
	return Decision{}, pe
}

// noteShort records a budget shortfall of n bytes at loc that blocked an
// assignment, if it is the first.
func (d *decider) noteShort(loc int, n int64) {
	if d.shortLoc < 0 {
		d.shortLoc, d.shortN = loc, n
	}
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
		} else if r.best == nil || ev.better(r.best) || d.tieWin(ev, r.best, chosen, r.bestChosen) {
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
	list := d.demotions(chosen, victims)
	plan := Plan{}
	var evictions []Eviction
	plan.Reclaim, evictions = d.reclaims(list)
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
	if (err != nil || !ex.Feasible) && (len(list) != len(victims) || hasDemotion(list)) {
		// Not expected (spill.go keeps demotions within every charge the
		// plan makes); the request's victims stay, dropped as without
		// spill, and no victim is taken at a spill target.
		plan.Reclaim, evictions = d.reclaims(dropAll(victims))
		ex, err = decideExplain(l, plan)
	}
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
