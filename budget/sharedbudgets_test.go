package budget

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// igpu is a ledger whose cuda:0 (budget 80) and pageable-host (no budget)
// share 100 bytes; pinned-host (budget 100) is outside the group.
func igpu(t *testing.T) *Ledger {
	t.Helper()
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{
		{Name: "pageable-host"}, {Name: "pinned-host", HasBudget: true, BudgetBytes: 100},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: 80},
	}, SharedBudgets: []SharedBudget{{Name: "igpu", Locations: []string{"cuda:0", "pageable-host"}, Bytes: 100}}})
	require.NoError(t, err)
	return l
}

func registerAt(t *testing.T, l *Ledger, name string, bytes int64, at string, mode ReplicaMode) Handle {
	t.Helper()
	h, adm, err := l.Register(ValueSpec{Name: name, Bytes: bytes, At: at, Mode: mode})
	require.NoError(t, err)
	_, err = l.Complete(adm.ID)
	require.NoError(t, err)
	return h
}

func TestSharedBudgetConfiguration(t *testing.T) {
	locs := []LocationConfig{{Name: "pageable-host"}, {Name: "pinned-host"}, {Name: "cuda:0"}}
	for name, sb := range map[string][]SharedBudget{
		"empty name":      {{Locations: []string{"cuda:0", "pageable-host"}, Bytes: 1}},
		"one location":    {{Name: "g", Locations: []string{"cuda:0"}, Bytes: 1}},
		"zero bytes":      {{Name: "g", Locations: []string{"cuda:0", "pageable-host"}}},
		"negative bytes":  {{Name: "g", Locations: []string{"cuda:0", "pageable-host"}, Bytes: -5}},
		"unconfigured":    {{Name: "g", Locations: []string{"cuda:0", "cuda:1"}, Bytes: 1}},
		"malformed":       {{Name: "g", Locations: []string{"cuda:0", "gpu"}, Bytes: 1}},
		"listed twice":    {{Name: "g", Locations: []string{"cuda:0", "cuda:0"}, Bytes: 1}},
		"two groups":      {{Name: "g", Locations: []string{"cuda:0", "pageable-host"}, Bytes: 1}, {Name: "h", Locations: []string{"cuda:0", "pinned-host"}, Bytes: 1}},
		"name used twice": {{Name: "g", Locations: []string{"cuda:0", "pageable-host"}, Bytes: 1}, {Name: "g", Locations: []string{"pinned-host", "pageable-host"}, Bytes: 1}},
	} {
		l, err := New(Config{ManagerID: "m", Locations: locs, SharedBudgets: sb})
		require.ErrorIs(t, err, ErrInvalidInput, name)
		assert.Nil(t, l, name)
	}
	l, err := New(Config{ManagerID: "m", Locations: locs, SharedBudgets: []SharedBudget{
		{Name: "z", Locations: []string{"cuda:0", "pageable-host"}, Bytes: 7}}})
	require.NoError(t, err)
	assert.Equal(t, []SharedBudgetRecord{{Name: "z", Locations: []string{"pageable-host", "cuda:0"}, Bytes: 7}}, l.Snapshot().SharedBudgets)
	require.NoError(t, l.CheckInvariants())

	plain, err := New(Config{ManagerID: "m", Locations: locs})
	require.NoError(t, err)
	assert.Nil(t, plain.Snapshot().SharedBudgets, "no group, no figure")
}

// Every charging path at a member is admitted against the group after the
// location; a refusal is a BudgetError naming the group and changes
// nothing.
func TestSharedBudgetAdmission(t *testing.T) {
	l := igpu(t)
	registerAt(t, l, "host", 60, "pageable-host", Replicable)
	v := l.Version()

	_, _, err := l.Register(ValueSpec{Name: "dev", Bytes: 50, At: "cuda:0", Mode: Replicable})
	var be *BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, BudgetError{Location: "cuda:0", BudgetBytes: 80, UsedBytes: 0, ReservedBytes: 0, RequestedBytes: 50,
		Shared: "igpu", SharedBytes: 100, SharedUsedBytes: 60, SharedRequestedBytes: 50}, *be)
	assert.Equal(t, `residency shared budget "igpu" exceeded at cuda:0: charged 60 + requested 50 > shared 100 (short by 10 bytes)`, be.Error())
	at, n := be.Short()
	assert.Equal(t, "cuda:0", at)
	assert.Equal(t, int64(10), n)
	assert.Equal(t, v, l.Version(), "a refusal commits nothing")
	_, ok := l.Lookup("dev")
	assert.False(t, ok)

	require.ErrorAs(t, l.Reserve("pageable-host", "r", 41), &be, "a reservation at a member without a budget of its own")
	assert.Equal(t, "igpu", be.Shared)
	require.NoError(t, l.Reserve("pinned-host", "outside", 100), "outside the group")

	h := registerAt(t, l, "dev", 30, "cuda:0", Replicable)
	_, err = l.Copy(h, "cuda:0", "pageable-host")
	require.ErrorAs(t, err, &be, "a copy within the group")
	assert.Equal(t, int64(90), be.SharedUsedBytes)
	require.NoError(t, l.ReserveOwned("cuda:0", "own", 10, "cache"))
	require.ErrorAs(t, l.ResizeOwned("own", "cache", 11), &be, "growing an owned charge")
	assert.Equal(t, int64(1), be.SharedRequestedBytes)
	require.NoError(t, l.UnreserveOwned("own", "cache"))
	require.ErrorAs(t, l.ReserveCapped("cuda:0", "c/1", "clones", 50, 11), &be, "a capped reservation")
	assert.Equal(t, "igpu", be.Shared)
	require.NoError(t, l.CheckInvariants())

	s := l.Snapshot()
	assert.Equal(t, []SharedBudgetRecord{{Name: "igpu", Locations: []string{"pageable-host", "cuda:0"}, Bytes: 100, UsedBytes: 90, PeakBytes: 100}}, s.SharedBudgets)
}

// A move within the group charges its destination while its source stays
// charged: both count until it completes.
func TestSharedBudgetMoveWithinGroup(t *testing.T) {
	l := igpu(t)
	h := registerAt(t, l, "x", 60, "pageable-host", Exclusive)
	_, err := l.Move(h, "pageable-host", "cuda:0")
	var be *BudgetError
	require.ErrorAs(t, err, &be, "60 + 60 > 100 while both are charged")
	assert.Equal(t, "igpu", be.Shared)

	_, err = l.Move(h, "pageable-host", "pinned-host")
	require.NoError(t, err, "out of the group: only pinned-host's budget")
}

// A reconstruction whose destination and temporary are members of one
// group counts both charges there.
func TestSharedBudgetReconstructionCountsBothCharges(t *testing.T) {
	l := igpu(t)
	h, _, err := l.Register(ValueSpec{Name: "w", Bytes: 40, Source: "pageable-host", Mode: Replicable})
	require.NoError(t, err)
	registerAt(t, l, "other", 30, "pageable-host", Replicable)
	v := l.Version()
	_, err = l.Place(h, "cuda:0")
	var be *BudgetError
	require.ErrorAs(t, err, &be, "30 + 40 + 40 > 100")
	assert.Equal(t, BudgetError{Location: "pageable-host", UsedBytes: 30, RequestedBytes: 40,
		Shared: "igpu", SharedBytes: 100, SharedUsedBytes: 30, SharedRequestedBytes: 80}, *be)
	assert.Equal(t, v, l.Version())

	adm, err := l.Place(h, "pinned-host")
	require.NoError(t, err, "the destination is outside the group: 30 + 40 at the group")
	assert.Equal(t, []SharedBudgetRecord{{Name: "igpu", Locations: []string{"pageable-host", "cuda:0"}, Bytes: 100, UsedBytes: 70, PeakBytes: 70}}, l.Snapshot().SharedBudgets)
	_, err = l.Complete(adm.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(30), l.Snapshot().SharedBudgets[0].UsedBytes, "the temporary charge is gone")
	assert.Equal(t, int64(70), l.Snapshot().SharedBudgets[0].PeakBytes)
	require.NoError(t, l.CheckInvariants())
}

// Figures near the int64 limit: the group's check neither wraps nor
// admits past the figure.
func TestSharedBudgetLargeFigures(t *testing.T) {
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{{Name: "pageable-host"}, {Name: "cuda:0"}},
		SharedBudgets: []SharedBudget{{Name: "g", Locations: []string{"pageable-host", "cuda:0"}, Bytes: math.MaxInt64}}})
	require.NoError(t, err)
	h, _, err := l.Register(ValueSpec{Name: "big", Bytes: math.MaxInt64 / 2, Source: "pageable-host", Mode: Replicable})
	require.NoError(t, err)
	require.NoError(t, l.Reserve("cuda:0", "r", 2))
	_, err = l.Place(h, "cuda:0")
	var be *BudgetError
	require.ErrorAs(t, err, &be, "2 + 2×(MaxInt64/2) > MaxInt64")
	assert.Equal(t, int64(math.MaxInt64-1), be.SharedRequestedBytes)
	require.NoError(t, l.Unreserve("r"))
	_, err = l.Place(h, "cuda:0")
	require.NoError(t, err)
	require.NoError(t, l.CheckInvariants())
}

// A plan's simulation (Explain) checks the group like the ledger does and
// leaves the ledger's peaks alone.
func TestSharedBudgetExplain(t *testing.T) {
	l := igpu(t)
	h := registerAt(t, l, "x", 60, "pageable-host", Replicable)
	ex := l.Explain(Plan{Enter: []Action{{Handle: h, Location: "cuda:0"}}})
	assert.False(t, ex.Feasible)
	assert.Contains(t, ex.Reason, `shared budget "igpu"`)
	assert.Equal(t, int64(60), l.Snapshot().SharedBudgets[0].PeakBytes)
}
