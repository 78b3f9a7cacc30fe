package budget

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// Tie-break tests: a table of small cases, and a property over the random
// states of the decide property test.

func TestDecideTieBreakTable(t *testing.T) {
	cases := []struct {
		name  string
		tie   TieBreak
		tiers [][]string
		want  string
	}{
		{"default keeps the first listed", TieFirstListed, [][]string{{"cuda:0", "cuda:1", "cuda:2"}}, "cuda:0"},
		{"most free", TieMostFree, [][]string{{"cuda:0", "cuda:1", "cuda:2"}}, "cuda:2"},
		{"most free listed last", TieMostFree, [][]string{{"cuda:2", "cuda:1", "cuda:0"}}, "cuda:2"},
		{"equal free falls back to listed order", TieMostFree, [][]string{{"cuda:1", "cuda:3"}}, "cuda:1"},
		{"equal free, other order", TieMostFree, [][]string{{"cuda:3", "cuda:1"}}, "cuda:3"},
		{"no budget counts as most free", TieMostFree, [][]string{{"cuda:2", "pageable-host"}}, "pageable-host"},
		{"tiers come first", TieMostFree, [][]string{{"cuda:0"}, {"cuda:2"}}, "cuda:0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := tbLedger(t)
			l, y := f.l, f.h["y"]
			d, err := l.Decide(Request{Name: "r", TieBreak: tc.tie, Requirements: []Requirement{{Handle: y, Tiers: tc.tiers}}}, 0)
			require.NoError(t, err)
			require.Equal(t, tc.want, d.Plan.Enter[0].Location)
			require.Empty(t, d.Evictions)
		})
	}
}

func TestDecideTieBreakRankingFirst(t *testing.T) {
	// a is resident at cuda:0 (70 free): no transfer there beats cuda:2
	// (100 free), whatever the tie-break.
	f := tbLedger(t)
	l, a := f.l, f.h["a"]
	for _, tie := range []TieBreak{TieFirstListed, TieMostFree} {
		d, err := l.Decide(Request{Name: "r", TieBreak: tie, Requirements: []Requirement{{Handle: a, Tiers: [][]string{{"cuda:2", "cuda:0"}}}}}, 0)
		require.NoError(t, err)
		require.Equal(t, "cuda:0", d.Plan.Enter[0].Location, tie.String())
	}
}

func TestDecideTieBreakInvalid(t *testing.T) {
	f := tbLedger(t)
	l, y := f.l, f.h["y"]
	v := l.Version()
	_, err := l.Decide(Request{Name: "r", TieBreak: TieMostFree + 1, Requirements: []Requirement{{Handle: y, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.ErrorIs(t, err, ErrInvalidInput)
	require.Equal(t, v, l.Version())
	require.Equal(t, "TieBreak(2)", (TieMostFree + 1).String())
	require.Equal(t, "first-listed", TieFirstListed.String())
	require.Equal(t, "most-free", TieMostFree.String())
}

// tbLedger: cuda:0..3 of 100 bytes each; a (30) resident at cuda:0, b (10)
// at cuda:1, a reservation of 10 at cuda:3; y (20) registered with a
// source. Free: cuda:0 70, cuda:1 90, cuda:2 100, cuda:3 90.
func tbLedger(t *testing.T) *dtFixture {
	t.Helper()
	f := dtNew(t, "pageable-host", "pinned-host=1000", "cuda:0=100", "cuda:1=100", "cuda:2=100", "cuda:3=100")
	f.src("a", 30, Exclusive, "pinned-host", "cuda:0")
	f.src("b", 10, Exclusive, "pinned-host", "cuda:1")
	f.src("y", 20, Exclusive, "pinned-host")
	f.must(f.l.Reserve("cuda:3", "kv", 10))
	return f
}

// TestDecideTieBreakProperties decides random states (the generators of
// TestDecideProperties) three ways and checks: an explicit TieFirstListed
// gives exactly the default decision; TieMostFree gives the same outcome
// class (error kind, explored states, exhaustiveness), the same tier of
// every requirement and the same rank (victim priorities, transfer bytes,
// evicted bytes, eviction count), and where its plan differs its vector of
// free bytes at the chosen locations is lexicographically larger; its plan
// passes every check of the decide property test.
func TestDecideTieBreakProperties(t *testing.T) {
	n := 600
	if testing.Short() {
		n = 150
	}
	var differed, decided int
	for seed := range uint64(n) {
		r := rand.New(rand.NewPCG(seed, 0x71eb))
		l, handles := dtRandomLedger(t, r)
		req, limit := dtRandomRequest(r, l, handles)
		def, derr := l.Decide(req, limit)
		first := req
		first.TieBreak = TieFirstListed
		got, gerr := l.Decide(first, limit)
		require.Equal(t, fmt.Sprint(derr), fmt.Sprint(gerr), "seed %d", seed)
		require.True(t, reflect.DeepEqual(def, got), "seed %d: TieFirstListed changed the decision", seed)

		most := req
		most.TieBreak = TieMostFree
		before, v := l.Snapshot(), l.Version()
		mf, merr := l.Decide(most, limit)
		require.Equal(t, v, l.Version(), "seed %d", seed)
		require.True(t, reflect.DeepEqual(before, l.Snapshot()), "seed %d: Decide changed the ledger", seed)
		if derr != nil {
			require.Error(t, merr, "seed %d", seed)
			require.Equal(t, reflect.TypeOf(derr), reflect.TypeOf(merr), "seed %d", seed)
			continue
		}
		require.NoError(t, merr, "seed %d", seed)
		decided++
		require.Equal(t, def.ExploredStates, mf.ExploredStates, "seed %d", seed)
		require.Equal(t, def.Exhaustive, mf.Exhaustive, "seed %d", seed)
		require.Equal(t, tbTiers(l, req, def), tbTiers(l, req, mf), "seed %d: tier-index vector", seed)
		require.Equal(t, tbRank(l, def), tbRank(l, mf), "seed %d: rank", seed)
		df, mff := tbFree(l, def), tbFree(l, mf)
		if reflect.DeepEqual(def.Plan, mf.Plan) {
			continue
		}
		differed++
		require.Positive(t, slices.Compare(mff, df), "seed %d: most-free chose %v (free %v) over %v (free %v)", seed, dtEnters(mf), mff, dtEnters(def), df)
		dtCheckDecision(t, seed, l, most, mf)
	}
	t.Logf("%d states: %d decided, %d where most-free chose differently", n, decided, differed)
	require.Positive(t, differed, "the generator no longer produces ties that most-free breaks differently")
}

// tbTiers is, for each requirement, the first tier that lists its chosen
// location.
func tbTiers(l *Ledger, req Request, d Decision) []int {
	out := make([]int, len(req.Requirements))
	for i, rq := range req.Requirements {
		out[i] = slices.IndexFunc(rq.Tiers, func(tier []string) bool { return slices.Contains(tier, d.Plan.Enter[i].Location) })
	}
	return out
}

type tbRanked struct {
	Prios             []int64
	Transfer, Evicted int64
	Victims           int
}

// tbRank recomputes a decision's rank from the ledger before the plan.
func tbRank(l *Ledger, d Decision) tbRanked {
	var r tbRanked
	for _, e := range d.Evictions {
		m := l.valueByID(e.Handle.ID).mat(l.locIndex[e.Location])
		r.Prios = append(r.Prios, m.prio)
		r.Evicted += e.Bytes
		r.Victims++
	}
	slices.SortFunc(r.Prios, func(a, b int64) int { return cmp.Compare(b, a) })
	seen := map[string]bool{}
	for _, a := range d.Plan.Enter {
		v := l.valueByID(a.Handle.ID)
		key := fmt.Sprint(v.id, "@", a.Location)
		if v.mat(l.locIndex[a.Location]) != nil || seen[key] {
			continue
		}
		seen[key] = true
		r.Transfer += v.bytes
	}
	return r
}

// tbFree is the free bytes before the plan at each chosen location.
func tbFree(l *Ledger, d Decision) []int64 {
	out := make([]int64, len(d.Plan.Enter))
	for i, a := range d.Plan.Enter {
		lc := &l.locs[l.locIndex[a.Location]]
		out[i] = math.MaxInt64
		if lc.hasBudget {
			out[i] = lc.budget - lc.used - lc.reserved
		}
	}
	return out
}
