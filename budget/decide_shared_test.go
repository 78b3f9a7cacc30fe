package budget

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sharedLedger: pageable-host (no budget) and cuda:0 (budget cuda) share
// the figure shared; pinned-host (no budget, outside the group) is every
// value's source. cuda:0 spills to spill ("" for none).
func sharedLedger(t *testing.T, cuda, shared int64, spill string) *Ledger {
	t.Helper()
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{
		{Name: "pageable-host"}, {Name: "pinned-host"},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: cuda, SpillTo: spill},
	}, SharedBudgets: []SharedBudget{{Name: "igpu", Locations: []string{"pageable-host", "cuda:0"}, Bytes: shared}}})
	require.NoError(t, err)
	return l
}

// placeFromSource registers a value with its source at pinned-host and
// places it at each of locs in turn.
func placeFromSource(t *testing.T, l *Ledger, name string, bytes int64, locs ...string) Handle {
	t.Helper()
	h, _, err := l.Register(ValueSpec{Name: name, Bytes: bytes, Source: "pinned-host", Mode: Replicable})
	require.NoError(t, err)
	for _, loc := range locs {
		adm, err := l.Place(h, loc)
		require.NoError(t, err)
		_, err = l.Complete(adm.ID)
		require.NoError(t, err)
	}
	return h
}

func evictedAt(d Decision) []string {
	var out []string
	for _, e := range d.Evictions {
		out = append(out, e.Handle.Name+"@"+e.Location+"→"+e.To)
	}
	return out
}

// The example of docs/semantics.md: cuda:0 has room, the group is short
// 10; the lowest candidate across both members goes.
func TestDecideSharedShortfallTakesAcrossMembers(t *testing.T) {
	l := sharedLedger(t, 80, 100, "")
	placeFromSource(t, l, "a", 60, "pageable-host")
	placeFromSource(t, l, "b", 30, "cuda:0")
	c := placeFromSource(t, l, "c", 20, "pinned-host")
	d, err := l.Decide(Request{Name: "r", Requirements: []Requirement{{Handle: c, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"a@pageable-host→"}, evictedAt(d))
	assert.Contains(t, d.Evictions[0].Reason, `shortfall is at shared budget "igpu"`)
	assert.Contains(t, d.Evictions[0].Reason, "10-byte shortfall")
	assert.True(t, d.Explanation.Feasible)
}

// Victims chosen for the location's own shortfall count at the group:
// only the rest is the group's shortfall.
func TestDecideSharedCountsLocationVictims(t *testing.T) {
	l := sharedLedger(t, 50, 100, "")
	placeFromSource(t, l, "host", 50, "pageable-host") // H 1, used first
	placeFromSource(t, l, "dev", 40, "cuda:0")
	c := placeFromSource(t, l, "c", 30, "pinned-host")
	// cuda:0: 40 + 30 > 50, short 20 → dev (40) goes; the group: 90 + 30
	// − 100 = 20, minus dev's 40 freed → nothing more.
	d, err := l.Decide(Request{Name: "r", Requirements: []Requirement{{Handle: c, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"dev@cuda:0→"}, evictedAt(d))
	assert.NotContains(t, d.Evictions[0].Reason, "shared budget")

	// Larger: cuda:0 short 10 of its own, the group short 40 after it.
	l = sharedLedger(t, 100, 100, "")
	placeFromSource(t, l, "host", 50, "pageable-host")
	placeFromSource(t, l, "d1", 20, "cuda:0")
	placeFromSource(t, l, "d2", 30, "cuda:0")
	big := placeFromSource(t, l, "big", 60, "pinned-host")
	// cuda:0: 50 + 60 − 100 = 10 → d1 (20, the lowest there); the group:
	// 100 + 60 − 100 − 20 = 40 → host (50), first in the merged order.
	d, err = l.Decide(Request{Name: "r", Requirements: []Requirement{{Handle: big, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"host@pageable-host→", "d1@cuda:0→"}, evictedAt(d))
	assert.True(t, d.Explanation.Feasible)
}

// A group shortfall nothing can cover makes the assignment infeasible,
// and the reason names the group.
func TestDecideSharedInfeasible(t *testing.T) {
	l := sharedLedger(t, 100, 100, "")
	h := placeFromSource(t, l, "host", 90, "pageable-host")
	_, err := l.Hold(h, "pageable-host")
	require.NoError(t, err)
	c := placeFromSource(t, l, "c", 20, "pinned-host")
	_, err = l.Decide(Request{Name: "r", Requirements: []Requirement{{Handle: c, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	var pe *PlanError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, pe.Reason, `shared budget "igpu" (pageable-host, cuda:0): short 10 bytes (figure 100, charged 90)`)
}

// A value without a source resident at both members keeps one copy: the
// merged list leaves out the copy that would be its last.
func TestDecideSharedKeepsLastCopy(t *testing.T) {
	l := sharedLedger(t, 100, 100, "")
	h, adm, err := l.Register(ValueSpec{Name: "only", Bytes: 40, At: "pageable-host", Mode: Replicable})
	require.NoError(t, err)
	_, err = l.Complete(adm.ID)
	require.NoError(t, err)
	adm, err = l.Copy(h, "pageable-host", "cuda:0")
	require.NoError(t, err)
	_, err = l.Complete(adm.ID)
	require.NoError(t, err)
	placeFromSource(t, l, "late", 10, "cuda:0") // used last: the highest rank
	c := placeFromSource(t, l, "c", 60, "pinned-host")
	// The group: 90 + 60 − 100 = 50: only@pageable-host (40), then the
	// copy at cuda:0 is its last and is skipped, then late (10).
	d, err := l.Decide(Request{Name: "r", Requirements: []Requirement{{Handle: c, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"only@pageable-host→", "late@cuda:0→"}, evictedAt(d))
	assert.True(t, d.Explanation.Feasible)
}

// A demotion from one member to another frees nothing at the group: a
// victim of the group's shortfall is dropped, not demoted within it; a
// victim of the location's own shortfall is demoted when the group has
// room for it.
func TestDecideSharedDemotionWithinGroup(t *testing.T) {
	l := sharedLedger(t, 80, 100, "pageable-host")
	placeFromSource(t, l, "dev", 60, "cuda:0")
	placeFromSource(t, l, "host", 30, "pageable-host")
	c := placeFromSource(t, l, "c", 30, "pinned-host")
	// cuda:0: 60 + 30 − 80 = 10 → dev; the group: 90 + 30 − 100 − 60 ≤ 0.
	// Demoting dev to pageable-host would put its 60 back: 30 + 60 + 30 > 100.
	d, err := l.Decide(Request{Name: "r", Requirements: []Requirement{{Handle: c, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"dev@cuda:0→"}, evictedAt(d))
	assert.True(t, d.Explanation.Feasible)

	l = sharedLedger(t, 80, 200, "pageable-host")
	placeFromSource(t, l, "dev", 60, "cuda:0")
	c = placeFromSource(t, l, "c", 30, "pinned-host")
	d, err = l.Decide(Request{Name: "r", Requirements: []Requirement{{Handle: c, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"dev@cuda:0→pageable-host"}, evictedAt(d), "the group has room: demoted")
	assert.True(t, d.Explanation.Feasible)
}

// Without a shortfall anywhere, no victim; a run without groups decides
// exactly as before (the package's goldens cover that).
func TestDecideSharedNoShortfall(t *testing.T) {
	l := sharedLedger(t, 80, 100, "")
	placeFromSource(t, l, "a", 30, "pageable-host")
	c := placeFromSource(t, l, "c", 20, "pinned-host")
	d, err := l.Decide(Request{Name: "r", Requirements: []Requirement{{Handle: c, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.NoError(t, err)
	assert.Empty(t, d.Evictions)
}
