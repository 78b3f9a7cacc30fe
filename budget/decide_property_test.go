package budget

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// The property test builds a thousand random ledger states and random
// requests, decides each one, and checks:
//
//   - the decision equals the one of dtRefDecide, a literal transcription of
//     the rules of docs/semantics.md (the controller) without the lazy heap, the
//     memo or the conflict shortcut of decide.go;
//   - a returned plan is feasible under Explain, names no protected,
//     in-flight or required victim, executes through
//     StartRun/Next/Complete/Finish, leaves every requirement resident and
//     every recoverable value recoverable, and CheckInvariants holds;
//   - Decide changed nothing.

func TestDecideProperties(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	var decided, infeasible, limited, evicting int
	for seed := range uint64(n) {
		r := rand.New(rand.NewPCG(seed, 0xdec1de))
		l, handles := dtRandomLedger(t, r)
		req, limit := dtRandomRequest(r, l, handles)
		before, v := l.Snapshot(), l.Version()
		got, err := l.Decide(req, limit)
		if l.Version() != v || !reflect.DeepEqual(before, l.Snapshot()) {
			t.Fatalf("seed %d: Decide changed the ledger", seed)
		}
		want, werr := dtRefDecide(l, req, limit)
		dtCompare(t, seed, req, got, err, want, werr)
		if err != nil {
			var le *SearchLimitError
			if errors.As(err, &le) {
				limited++
			} else if errors.Is(err, ErrPlan) {
				infeasible++
			}
			continue
		}
		decided++
		if len(got.Evictions) > 0 {
			evicting++
		}
		dtCheckDecision(t, seed, l, req, got)
	}
	t.Logf("%d states: %d decided (%d with evictions), %d infeasible, %d search limits", n, decided, evicting, infeasible, limited)
	if decided < n/4 || evicting < n/10 || infeasible == 0 || limited == 0 {
		t.Errorf("the generator no longer covers the interesting cases: %d decided, %d evicting, %d infeasible, %d limited", decided, evicting, infeasible, limited)
	}
}

var dtPropLocs = []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}

// dtRandomLedger builds a random reachable state: values of random size,
// mode and origin, placed, copied, moved and evicted at random, with
// leases, holds, pending events, reservations and (sometimes) transfers in
// flight. Refused operations are simply skipped.
func dtRandomLedger(t *testing.T, r *rand.Rand) (*Ledger, []Handle) {
	t.Helper()
	return dtRandomLedgerWith(t, r, nil)
}

// dtRandomLedgerWith is dtRandomLedger with spill targets (location →
// target; nil for none). The targets draw nothing from r, so the same r
// gives the same state with or without them.
func dtRandomLedgerWith(t *testing.T, r *rand.Rand, spill map[string]string) (*Ledger, []Handle) {
	t.Helper()
	cfg := Config{ManagerID: "prop"}
	for _, name := range dtPropLocs {
		lc := LocationConfig{Name: name, SpillTo: spill[name]}
		if name != "pageable-host" || r.IntN(3) == 0 {
			lc.HasBudget, lc.BudgetBytes = true, int64(60+r.IntN(140))
		}
		cfg.Locations = append(cfg.Locations, lc)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pick := func() string { return dtPropLocs[r.IntN(len(dtPropLocs))] }
	settle := func(adm Admission, err error) {
		if err == nil && adm.Pending {
			if _, err := l.Complete(adm.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	var hs []Handle
	nv := 3 + r.IntN(10)
	for i := range nv {
		spec := ValueSpec{Name: fmt.Sprintf("v%d", i), Bytes: int64(5 + r.IntN(50))}
		if r.IntN(3) > 0 {
			spec.Mode = Replicable
		}
		if r.IntN(3) == 0 {
			spec.At = pick()
		} else {
			spec.Source = pick()
		}
		h, adm, err := l.Register(spec)
		if err != nil {
			continue
		}
		settle(adm, nil)
		hs = append(hs, h)
	}
	if len(hs) == 0 {
		h, _, err := l.Register(ValueSpec{Name: "fallback", Bytes: 10, Source: "pageable-host"})
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	var leases []LeaseID
	for range 10 + r.IntN(30) {
		h := hs[r.IntN(len(hs))]
		switch op := r.IntN(12); {
		case op < 5:
			settle(l.Place(h, pick()))
		case op == 5:
			settle(l.Copy(h, pick(), pick()))
		case op == 6:
			_, _ = l.Evict(h, pick())
		case op == 7:
			if id, err := l.Acquire(h, pick()); err == nil {
				leases = append(leases, id)
			}
		case op == 8 && len(leases) > 0:
			i := r.IntN(len(leases))
			if r.IntN(2) == 0 {
				_, _ = l.RecordEvent(leases[i])
			}
			_ = l.Release(leases[i])
			leases = slices.Delete(leases, i, i+1)
		case op == 9:
			if id, err := l.Hold(h, pick()); err == nil && r.IntN(2) == 0 {
				_ = l.Unhold(id)
			}
		case op == 10:
			_ = l.Reserve(pick(), fmt.Sprintf("res%d", r.IntN(1000)), int64(1+r.IntN(30)))
		case op == 11:
			for range r.IntN(4) {
				id, err := l.Acquire(h, pick())
				if err == nil {
					_ = l.Release(id)
				}
			}
		}
	}
	// Sometimes leave a transfer in flight.
	if r.IntN(4) == 0 {
		_, _ = l.Place(hs[r.IntN(len(hs))], pick())
	}
	if err := l.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	return l, hs
}

func dtRandomRequest(r *rand.Rand, l *Ledger, hs []Handle) (Request, int) {
	req := Request{Name: fmt.Sprintf("req%d", r.IntN(100))}
	for range 1 + r.IntN(3) {
		rq := Requirement{Handle: hs[r.IntN(len(hs))]}
		for range 1 + r.IntN(3) {
			var tier []string
			for range 1 + r.IntN(2) {
				tier = append(tier, dtPropLocs[r.IntN(len(dtPropLocs))])
			}
			rq.Tiers = append(rq.Tiers, tier)
		}
		req.Requirements = append(req.Requirements, rq)
	}
	if r.IntN(4) == 0 {
		req.Reservations = []ReservationSpec{{Name: "decide-kv", Location: dtPropLocs[r.IntN(len(dtPropLocs))], Bytes: int64(1 + r.IntN(40))}}
	}
	limit := 0
	if r.IntN(4) == 0 {
		limit = 1 + r.IntN(6)
	}
	return req, limit
}

func dtCompare(t *testing.T, seed uint64, req Request, got Decision, err error, want Decision, werr error) {
	t.Helper()
	if (err == nil) != (werr == nil) {
		t.Fatalf("seed %d: request %+v\nDecide: %+v, %v\nreference: %+v, %v", seed, req, got, err, want, werr)
	}
	if err != nil {
		var a, b *SearchLimitError
		var ia, ib *InvalidInputError
		var pa, pb *PlanError
		var ua, ub *UnavailableError
		same := false
		switch {
		case errors.As(err, &a):
			same = errors.As(werr, &b) && a.RequestName == b.RequestName && a.StateLimit == b.StateLimit && a.ExploredStates == b.ExploredStates
		case errors.As(err, &pa):
			same = errors.As(werr, &pb)
		case errors.As(err, &ia):
			same = errors.As(werr, &ib)
		case errors.As(err, &ua):
			same = errors.As(werr, &ub)
		}
		if !same {
			t.Fatalf("seed %d: request %+v\nDecide: %v\nreference: %v", seed, req, err, werr)
		}
		return
	}
	type brief struct {
		Evict    []string
		Plan     Plan
		Explored int
		Exh      bool
	}
	g := brief{dtEvictions(got), got.Plan, got.ExploredStates, got.Exhaustive}
	w := brief{dtEvictions(want), want.Plan, want.ExploredStates, want.Exhaustive}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("seed %d: request %+v\nDecide:    %+v\nreference: %+v", seed, req, g, w)
	}
}

func dtCheckDecision(t *testing.T, seed uint64, l *Ledger, req Request, d Decision) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: "+format, append([]any{seed}, args...)...)
	}
	if ex := l.Explain(d.Plan); !ex.Feasible || !reflect.DeepEqual(ex, d.Explanation) {
		fail("plan not feasible under Explain: %+v", ex)
	}
	required := map[uint64]bool{}
	for _, rq := range req.Requirements {
		required[rq.Handle.ID] = true
	}
	for _, e := range d.Evictions {
		if e.Charge != "" { // an idle cache entry's charge: offered, as recorded
			info, ok := l.Charge(e.Charge)
			if !ok || info.State != ChargeOffered || info.Owner != e.Owner || info.Location != e.Location || info.Bytes != e.Bytes {
				fail("charge victim %s@%s is not offered as recorded: %+v", e.Charge, e.Location, info)
			}
			continue
		}
		v := l.valueByID(e.Handle.ID)
		m := v.mat(l.locIndex[e.Location])
		switch {
		case m == nil || m.state != Resident:
			fail("victim %s@%s is not resident", e.Handle.Name, e.Location)
		case m.protected() || m.busy():
			fail("victim %s@%s is protected or in flight", e.Handle.Name, e.Location)
		case required[e.Handle.ID]:
			fail("victim %s@%s is required by the request", e.Handle.Name, e.Location)
		case e.Bytes != v.bytes:
			fail("victim %s@%s bytes %d", e.Handle.Name, e.Location, e.Bytes)
		}
	}
	recoverable := map[uint64]bool{}
	for _, v := range l.liveValues() {
		recoverable[v.id] = l.recoverable(v)
	}
	if _, err := dtExecute(l, d); err != nil {
		fail("executing the plan: %v", err)
	}
	if err := l.CheckInvariants(); err != nil {
		fail("invariants after execution: %v", err)
	}
	for _, a := range d.Plan.Enter {
		v := l.valueByID(a.Handle.ID)
		if m := v.mat(l.locIndex[a.Location]); m == nil || m.state != Resident {
			fail("%s not resident at %s after execution", a.Handle.Name, a.Location)
		}
	}
	for _, v := range l.liveValues() {
		if recoverable[v.id] && !l.recoverable(v) {
			fail("value %s became unrecoverable", v.name)
		}
	}
}

// ---- reference model ---------------------------------------------------------

// dtRefDecide transcribes the controller rules literally: every assignment
// in enumeration order; victims location by location in location order,
// each location's candidates recomputed from scratch (excluding the last
// copies that earlier locations' victims would leave) and the recursive
// rule applied on a fully sorted list. It shares no code with decide.go
// beyond validation (newDecider) and Explain.
func dtRefDecide(l *Ledger, req Request, limit int) (Decision, error) {
	if limit < 0 {
		return Decision{}, invalidf("negative")
	}
	if limit == 0 {
		limit = DefaultStateLimit
	}
	d, err := l.newDecider(req)
	if err != nil {
		return Decision{}, err
	}
	type outcome struct {
		victims  []victim
		prios    []int64
		transfer int64
		evicted  int64
	}
	required := map[*value]bool{}
	for _, r := range d.reqs {
		required[r.v] = true
	}
	evaluate := func(chosen []int) (outcome, bool) {
		var o outcome
		adds := make([]int64, len(l.locs))
		// resident locations of each required value as the plan proceeds
		res := map[*value][]int{}
		for _, r := range d.reqs {
			if _, ok := res[r.v]; ok {
				continue
			}
			for _, m := range r.v.mats {
				if m.state == Resident {
					res[r.v] = append(res[r.v], m.loc)
				}
			}
		}
		for i, r := range d.reqs {
			v, dest := r.v, chosen[i]
			if m := v.mat(dest); m != nil && m.state != Resident {
				return o, false
			}
			if slices.Contains(res[v], dest) {
				continue
			}
			o.transfer += v.bytes
			switch {
			case v.mode == Exclusive && len(v.mats) > 0:
				m := v.mats[0]
				if len(v.mats) > 1 || m.state != Resident || m.protected() || m.busy() {
					return o, false
				}
				adds[dest] += v.bytes
				res[v] = []int{dest}
			case len(res[v]) > 0:
				adds[dest] += v.bytes
				res[v] = append(res[v], dest)
			case v.hasSource:
				adds[dest] += v.bytes
				if v.source != dest {
					adds[v.source] += v.bytes
				}
				res[v] = append(res[v], dest)
			default:
				return o, false
			}
		}
		for _, rs := range req.Reservations {
			adds[l.locIndex[rs.Location]] += rs.Bytes
		}
		removed := map[*value]int{}
		for loc := range l.locs {
			lc := &l.locs[loc]
			n := adds[loc] - (lc.budget - lc.used - lc.reserved)
			if !lc.hasBudget || adds[loc] == 0 || n <= 0 {
				continue
			}
			var cands []candidate
			for _, v := range l.liveValues() {
				m := v.mat(loc)
				if v.discarded || m == nil || m.state != Resident || m.protected() || m.busy() || required[v] {
					continue
				}
				if !v.hasSource && v.residentCount()-removed[v] < 2 {
					continue
				}
				cands = append(cands, candidate{prio: m.prio, lastUse: m.lastUse, id: v.id, bytes: v.bytes})
			}
			slices.SortFunc(cands, func(a, b candidate) int {
				if candLess(&a, &b) {
					return -1
				}
				return 1
			})
			var rule func(list []candidate, n int64) ([]candidate, bool)
			rule = func(list []candidate, n int64) ([]candidate, bool) {
				if n <= 0 {
					return nil, true
				}
				sum := int64(0)
				for k, c := range list {
					sum += c.bytes
					if sum >= n {
						rest, _ := rule(list[:k], n-c.bytes)
						return append(rest, c), true
					}
				}
				return nil, false
			}
			vs, ok := rule(cands, n)
			if !ok {
				return o, false
			}
			slices.SortFunc(vs, func(a, b candidate) int {
				if candLess(&a, &b) {
					return -1
				}
				return 1
			})
			for _, c := range vs {
				o.victims = append(o.victims, victim{loc: loc, c: c, n: n})
				o.prios = append(o.prios, c.prio)
				o.evicted += c.bytes
				removed[l.valueByID(c.id)]++
			}
		}
		slices.SortFunc(o.prios, func(a, b int64) int { return cmp.Compare(b, a) })
		return o, true
	}
	less := func(a, b outcome) bool {
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
	// Enumerate every assignment in order into a flat list of
	// (tier vector index, chosen) so that the limit is a plain cut.
	type assignment struct {
		group  int
		chosen []int
	}
	var all []assignment
	var tierVecs func(i int, tv []int)
	group := 0
	tierVecs = func(i int, tv []int) {
		if len(all) > limit+1 {
			return
		}
		if i == len(d.reqs) {
			var pos func(j int, chosen []int)
			pos = func(j int, chosen []int) {
				if len(all) > limit+1 {
					return
				}
				if j == len(d.reqs) {
					all = append(all, assignment{group, slices.Clone(chosen)})
					return
				}
				for _, loc := range d.reqs[j].tiers[tv[j]] {
					pos(j+1, append(chosen, loc))
				}
			}
			pos(0, nil)
			group++
			return
		}
		for t := range d.reqs[i].tiers {
			tierVecs(i+1, append(tv, t))
		}
	}
	tierVecs(0, nil)
	var best *outcome
	var bestChosen []int
	bestGroup := -1
	explored := 0
	for k, a := range all {
		if best != nil && a.group != bestGroup {
			explored = k
			break
		}
		if k == limit {
			if best == nil {
				return Decision{}, &SearchLimitError{RequestName: req.Name, StateLimit: limit, ExploredStates: limit}
			}
			explored = k
			break
		}
		explored = k + 1
		if o, ok := evaluate(a.chosen); ok && (best == nil || less(o, *best)) {
			best, bestChosen, bestGroup = &o, a.chosen, a.group
		}
	}
	if best == nil {
		return Decision{}, &PlanError{Reason: "reference: infeasible"}
	}
	exhaustive := explored == len(all) || all[explored].group != bestGroup
	dec := Decision{RequestName: req.Name, ExploredStates: explored, Exhaustive: exhaustive, ExpectedStateVersion: l.version}
	for _, vc := range best.victims {
		h := l.handle(l.valueByID(vc.c.id))
		dec.Evictions = append(dec.Evictions, Eviction{Handle: h, Location: l.locs[vc.loc].name, Bytes: vc.c.bytes})
		dec.Plan.Reclaim = append(dec.Plan.Reclaim, Action{Handle: h, Location: l.locs[vc.loc].name})
	}
	if len(req.Reservations) > 0 {
		dec.Plan.Reservations = slices.Clone(req.Reservations)
	}
	dec.Plan.Enter = make([]Action, len(d.reqs))
	for i, loc := range bestChosen {
		dec.Plan.Enter[i] = Action{Handle: req.Requirements[i].Handle, Location: l.locs[loc].name}
	}
	return dec, nil
}
