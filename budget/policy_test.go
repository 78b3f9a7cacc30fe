package budget

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
)

// Policy comparison: the controller (Decide) against two baselines on the
// same synthetic model-serving trace.
//
// Workload (ptGenerate, all draws from one PCG stream seeded by the seed):
//   - K values, K uniform in [20, 200]. Sizes in MiB: 50% small (1–16),
//     35% medium (32–256), 15% large (512–2048), uniform within the class.
//     80% replicable, 20% exclusive. Every value has source pageable-host
//     (unbudgeted), so a miss everywhere is a cold load from there.
//   - Locations: cuda:0 and cuda:1, each with a budget of 15% of the total
//     bytes of all values (at least the largest value); pinned-host with
//     25%; pageable-host without a budget.
//   - Popularity: Zipf with s = 1.1, v = 1 over the K ranks; ranks map to
//     values through a random permutation (popularity independent of size).
//     With shift, the permutation is redrawn at the middle of the trace.
//   - Requests: 1–3 requirements (uniform) of distinct values drawn by
//     popularity; every requirement has tiers [[cuda:0, cuda:1],
//     [pinned-host]].
//   - Serving loop, per request: the policy places (or refuses); then one
//     lease is acquired on every endpoint and all are released, as a
//     serving step that reads the values would.
//
// Policies:
//   - decide: Ledger.Decide, then the plan run through StartRun/Next/
//     Complete/Finish.
//   - naive LRU: every requirement goes to the first location of its first
//     tier (cuda:0); least recently used unprotected, recoverable values of
//     other handles are evicted there (and at a budgeted reconstruction
//     source) until it fits; otherwise the request is refused.
//   - tier LRU: per requirement and tier: a location of the tier where the
//     value is resident; else the first location of the tier where it fits
//     without eviction; else the first where LRU eviction makes it fit;
//     else the next tier; else refused.
//
// Metrics: bytes moved (every copy, move and reconstruction into a
// destination), cold loads (reconstructions), evictions (reclaims and
// evicts; not the frees of move sources), hit rate (requirements already
// resident at the endpoint the policy chose, over all requirements, refused
// requests included), refusals, and budget violations (CheckInvariants
// after every request; must be zero).

const ptMiB = 1 << 20

type ptWorkload struct {
	seed     uint64
	shift    bool
	sizes    []int64
	modes    []ReplicaMode
	gpu, pin int64
	requests [][]int // value indices per request
}

func ptGenerate(seed uint64, nreq int, shift bool) ptWorkload {
	r := rand.New(rand.NewPCG(seed, 0x5e41))
	k := 20 + r.IntN(181)
	w := ptWorkload{seed: seed, shift: shift}
	var total, largest int64
	for range k {
		var mib int64
		switch x := r.IntN(100); {
		case x < 50:
			mib = 1 + r.Int64N(16)
		case x < 85:
			mib = 32 + r.Int64N(225)
		default:
			mib = 512 + r.Int64N(1537)
		}
		b := mib * ptMiB
		w.sizes = append(w.sizes, b)
		total += b
		largest = max(largest, b)
		mode := Replicable
		if r.IntN(5) == 0 {
			mode = Exclusive
		}
		w.modes = append(w.modes, mode)
	}
	w.gpu = max(total*15/100, largest)
	w.pin = max(total*25/100, largest)
	perm := r.Perm(k)
	zipf := rand.NewZipf(r, 1.1, 1, uint64(k-1))
	for i := range nreq {
		if shift && i == nreq/2 {
			perm = r.Perm(k)
		}
		n := 1 + r.IntN(3)
		var vals []int
		for tries := 0; len(vals) < n && tries < 50; tries++ {
			v := perm[zipf.Uint64()]
			if !slices.Contains(vals, v) {
				vals = append(vals, v)
			}
		}
		w.requests = append(w.requests, vals)
	}
	return w
}

func (w ptWorkload) ledger(t testing.TB) (*Ledger, []Handle) {
	t.Helper()
	l, err := New(Config{ManagerID: "policy", Locations: []LocationConfig{
		{Name: "pageable-host"},
		{Name: "pinned-host", HasBudget: true, BudgetBytes: w.pin},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: w.gpu},
		{Name: "cuda:1", HasBudget: true, BudgetBytes: w.gpu},
	}})
	if err != nil {
		t.Fatal(err)
	}
	hs := make([]Handle, len(w.sizes))
	for i, b := range w.sizes {
		hs[i], _, err = l.Register(ValueSpec{Name: fmt.Sprintf("v%d", i), Bytes: b, Mode: w.modes[i], Source: "pageable-host"})
		if err != nil {
			t.Fatal(err)
		}
	}
	return l, hs
}

var ptTiers = [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}

type ptStats struct {
	requirements, hits, tier1  int
	coldLoads, evictions       int
	refusals, violations       int
	bytesMoved                 int64
	decideStates, decideCalls  int
	decideLimits, decideFailed int
}

func (s *ptStats) effects(effs []Effect) {
	for _, e := range effs {
		switch e.Kind {
		case EffectCopy:
			s.bytesMoved += e.Bytes
		case EffectReconstruct:
			s.bytesMoved += e.Bytes
			s.coldLoads++
		}
	}
}

// ptPolicy places every requirement of req (or refuses) and returns the
// chosen endpoints.
type ptPolicy struct {
	name  string
	serve func(t testing.TB, l *Ledger, req Request, st *ptStats) ([]string, bool)
}

var ptPolicies = []ptPolicy{
	{"decide", ptDecide},
	{"naive LRU", ptNaive},
	{"tier LRU", ptTierLRU},
}

func ptDecide(t testing.TB, l *Ledger, req Request, st *ptStats) ([]string, bool) {
	st.decideCalls++
	d, err := l.Decide(req, 0)
	if err != nil {
		var le *SearchLimitError
		switch {
		case errors.As(err, &le):
			st.decideLimits++
		case errors.Is(err, ErrPlan):
			st.decideFailed++
		default:
			t.Fatalf("decide: %v", err)
		}
		return nil, false
	}
	st.decideStates += d.ExploredStates
	run, err := l.StartRun(d.Plan, RunOptions{CheckVersion: true, ExpectedVersion: d.ExpectedStateVersion})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	for {
		step, ok, err := run.Next()
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		if !ok {
			break
		}
		switch step.Phase {
		case PhaseReclaim:
			st.evictions++
		case PhaseEnter:
			if !step.Admission.Pending {
				st.hits++
			}
			st.effects(step.Admission.Effects)
			if step.Admission.Pending {
				if _, err := run.Complete(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if _, _, err := run.Finish(); err != nil {
		t.Fatal(err)
	}
	var eps []string
	for _, a := range d.Plan.Enter {
		eps = append(eps, a.Location)
	}
	return eps, true
}

// ptNeeds returns what placing v at dest adds, as place() would do it:
// dest's charge, and the temporary charge at the source location of a
// reconstruction (-1 when none).
func ptNeeds(l *Ledger, v *value, dest int) (tempAt int) {
	if v.residentCount() > 0 {
		return -1
	}
	if v.source != dest {
		return v.source
	}
	return -1
}

// ptLRUVictims returns the least recently used evictable values at loc
// whose removal makes need bytes fit, or false.
func ptLRUVictims(l *Ledger, loc int, need int64, exclude map[*value]bool) ([]*value, bool) {
	lc := &l.locs[loc]
	if !lc.hasBudget {
		return nil, true
	}
	free := lc.budget - lc.used - lc.reserved
	if free >= need {
		return nil, true
	}
	type cand struct {
		v  *value
		lu uint64
	}
	var cs []cand
	for _, v := range l.liveValues() {
		m := v.mat(loc)
		if m == nil || m.state != Resident || m.protected() || m.busy() || exclude[v] {
			continue
		}
		if !v.hasSource && v.residentCount() < 2 {
			continue
		}
		cs = append(cs, cand{v, m.lastUse})
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if a.lu != b.lu {
			if a.lu < b.lu {
				return -1
			}
			return 1
		}
		return int(a.v.id) - int(b.v.id)
	})
	var out []*value
	for _, c := range cs {
		if free >= need {
			break
		}
		out = append(out, c.v)
		free += c.v.bytes
	}
	return out, free >= need
}

// ptPlaceLRU places v at dest, evicting LRU victims at dest (and at a
// budgeted reconstruction source) first. It evicts nothing unless both
// fit. With noEvict it only places when no eviction is needed.
func ptPlaceLRU(t testing.TB, l *Ledger, v *value, dest int, exclude map[*value]bool, noEvict bool, st *ptStats) bool {
	if m := v.mat(dest); m != nil && m.state == Resident {
		st.hits++
		return true
	}
	vd, ok := ptLRUVictims(l, dest, v.bytes, exclude)
	if !ok || (noEvict && len(vd) > 0) {
		return false
	}
	var vt []*value
	if temp := ptNeeds(l, v, dest); temp >= 0 {
		if vt, ok = ptLRUVictims(l, temp, v.bytes, exclude); !ok || (noEvict && len(vt) > 0) {
			return false
		}
		for _, x := range vt {
			if _, err := l.Evict(l.handle(x), l.locs[temp].name); err != nil {
				t.Fatal(err)
			}
			st.evictions++
		}
	}
	for _, x := range vd {
		if _, err := l.Evict(l.handle(x), l.locs[dest].name); err != nil {
			t.Fatal(err)
		}
		st.evictions++
	}
	adm, err := l.place(v, dest)
	if err != nil {
		t.Fatalf("place %s at %s after eviction: %v", v.name, l.locs[dest].name, err)
	}
	st.effects(adm.Effects)
	if adm.Pending {
		if _, err := l.Complete(adm.ID); err != nil {
			t.Fatal(err)
		}
	}
	return true
}

func ptExclude(l *Ledger, req Request) map[*value]bool {
	ex := map[*value]bool{}
	for _, r := range req.Requirements {
		ex[l.valueByID(r.Handle.ID)] = true
	}
	return ex
}

func ptNaive(t testing.TB, l *Ledger, req Request, st *ptStats) ([]string, bool) {
	ex := ptExclude(l, req)
	var eps []string
	for _, r := range req.Requirements {
		v := l.valueByID(r.Handle.ID)
		dest := r.Tiers[0][0]
		if !ptPlaceLRU(t, l, v, l.locIndex[dest], ex, false, st) {
			return nil, false
		}
		eps = append(eps, dest)
	}
	return eps, true
}

func ptTierLRU(t testing.TB, l *Ledger, req Request, st *ptStats) ([]string, bool) {
	ex := ptExclude(l, req)
	var eps []string
next:
	for _, r := range req.Requirements {
		v := l.valueByID(r.Handle.ID)
		for _, tier := range r.Tiers {
			for _, name := range tier {
				if m := v.mat(l.locIndex[name]); m != nil && m.state == Resident {
					st.hits++
					eps = append(eps, name)
					continue next
				}
			}
			for _, noEvict := range []bool{true, false} {
				for _, name := range tier {
					if ptPlaceLRU(t, l, v, l.locIndex[name], ex, noEvict, st) {
						eps = append(eps, name)
						continue next
					}
				}
			}
		}
		return nil, false
	}
	return eps, true
}

// ptReplay runs the workload's trace through one policy.
func ptReplay(t testing.TB, w ptWorkload, p ptPolicy) ptStats {
	t.Helper()
	l, hs := w.ledger(t)
	var st ptStats
	for i, vals := range w.requests {
		req := Request{Name: fmt.Sprintf("req%d", i)}
		for _, v := range vals {
			req.Requirements = append(req.Requirements, Requirement{Handle: hs[v], Tiers: ptTiers})
		}
		st.requirements += len(vals)
		eps, ok := p.serve(t, l, req, &st)
		if ok {
			var leases []LeaseID
			for j, r := range req.Requirements {
				if slices.Contains(ptTiers[0], eps[j]) {
					st.tier1++
				}
				id, err := l.Acquire(r.Handle, eps[j])
				if err != nil {
					t.Fatalf("%s request %d: endpoint %s@%s not resident: %v", p.name, i, r.Handle.Name, eps[j], err)
				}
				leases = append(leases, id)
			}
			for _, id := range leases {
				if err := l.Release(id); err != nil {
					t.Fatal(err)
				}
			}
		} else {
			st.refusals++
		}
		if err := l.CheckInvariants(); err != nil {
			st.violations++
			t.Errorf("%s request %d: %v", p.name, i, err)
		}
	}
	return st
}

type ptRow struct {
	w     ptWorkload
	stats []ptStats // in ptPolicies order
}

func ptCompare(t *testing.T, seeds []uint64, nreq int) []ptRow {
	var rows []ptRow
	for _, shift := range []bool{false, true} {
		for _, seed := range seeds {
			w := ptGenerate(seed, nreq, shift)
			row := ptRow{w: w}
			for _, p := range ptPolicies {
				st := ptReplay(t, w, p)
				if st.violations != 0 {
					t.Errorf("seed %d %s: %d budget violations", seed, p.name, st.violations)
				}
				row.stats = append(row.stats, st)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// TestPolicyComparisonSmall replays a short trace through all three
// policies on every `go test`: the plans execute, every endpoint is
// resident for its lease, and no budget is ever exceeded.
func TestPolicyComparisonSmall(t *testing.T) {
	ptCompare(t, []uint64{1, 2}, 300)
}

// TestPolicyComparisonReport replays the full traces and prints the
// comparison table. It runs only with RESIDENCY_POLICY_REPORT=1:
//
//	RESIDENCY_POLICY_REPORT=1 go test ./budget -run TestPolicyComparisonReport -v
func TestPolicyComparisonReport(t *testing.T) {
	if os.Getenv("RESIDENCY_POLICY_REPORT") == "" {
		t.Skip("set RESIDENCY_POLICY_REPORT=1 to print the policy comparison")
	}
	const nreq = 5000
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	rows := ptCompare(t, seeds, nreq)
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d requests per trace; bytes in MiB; ratio = decide bytes moved / baseline bytes moved\n\n", nreq)
	b.WriteString("Each cell: decide / naive LRU / tier LRU.\n\n")
	b.WriteString("| seed | shift | values | GPU budget MiB | MiB moved | cold loads | evictions | hit rate | GPU-tier share | refusals | decide/naive | decide/tier |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var sumNaive, sumTier float64
	var worstNaive, worstTier float64
	n := 0
	for _, row := range rows {
		st := row.stats
		three := func(f func(s ptStats) string) string {
			return f(st[0]) + " / " + f(st[1]) + " / " + f(st[2])
		}
		rn := float64(st[0].bytesMoved) / float64(st[1].bytesMoved)
		rt := float64(st[0].bytesMoved) / float64(st[2].bytesMoved)
		sumNaive, sumTier = sumNaive+rn, sumTier+rt
		worstNaive, worstTier = max(worstNaive, rn), max(worstTier, rt)
		n++
		fmt.Fprintf(&b, "| %d | %v | %d | %d | %s | %s | %s | %s | %s | %s | %.3f | %.3f |\n",
			row.w.seed, row.w.shift, len(row.w.sizes), row.w.gpu/ptMiB,
			three(func(s ptStats) string { return fmt.Sprint(s.bytesMoved / ptMiB) }),
			three(func(s ptStats) string { return fmt.Sprint(s.coldLoads) }),
			three(func(s ptStats) string { return fmt.Sprint(s.evictions) }),
			three(func(s ptStats) string { return fmt.Sprintf("%.3f", float64(s.hits)/float64(s.requirements)) }),
			three(func(s ptStats) string { return fmt.Sprintf("%.3f", float64(s.tier1)/float64(s.requirements)) }),
			three(func(s ptStats) string { return fmt.Sprint(s.refusals) }),
			rn, rt)
	}
	fmt.Fprintf(&b, "\ndecide / naive LRU: mean %.3f, worst %.3f; decide / tier LRU: mean %.3f, worst %.3f (over %d traces)\n",
		sumNaive/float64(n), worstNaive, sumTier/float64(n), worstTier, n)
	var states, calls int
	for _, row := range rows {
		states += row.stats[0].decideStates
		calls += row.stats[0].decideCalls
	}
	fmt.Fprintf(&b, "decide explored %.2f states per call on average\n", float64(states)/float64(calls))
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	fmt.Fprintf(&b, "target decide ≤ 0.6× naive LRU on every trace: %s (worst %.3f); on the mean: %s (%.3f)\n",
		met(worstNaive <= 0.6), worstNaive, met(sumNaive/float64(n) <= 0.6), sumNaive/float64(n))
	fmt.Fprintf(&b, "target decide < tier LRU on every trace: %s (worst %.3f); mean ≤ 0.95: %s (%.3f)\n",
		met(worstTier < 1), worstTier, met(sumTier/float64(n) <= 0.95), sumTier/float64(n))
	t.Log(b.String())
	// The report asserts correctness (no budget violation, checked in
	// ptCompare) and that the controller moves fewer bytes than tier LRU
	// on every trace; the other targets are reported above, met or not.
	if worstTier >= 1 {
		t.Errorf("decide moved more bytes than tier LRU on some trace (worst ratio %.3f)", worstTier)
	}
}
