package budget

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cap over a group of reservations lives in the ledger: set by the
// group's first reservation, checked before the location, given its bytes
// back by a release and gone with the group's last one; each step is the
// reservation's one version, and the snapshot shows the cap and which
// reservations are in its group.
func TestCapOverAGroupOfReservations(t *testing.T) {
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{
		{Name: "pageable-host"}, {Name: "cuda:0", HasBudget: true, BudgetBytes: 140},
	}})
	require.NoError(t, err)
	require.ErrorIs(t, l.ReserveCapped("cuda:0", "c/1", "", 100, 10), ErrInvalidInput)
	require.ErrorIs(t, l.ReserveCapped("cuda:0", "c/1", "clones", -1, 10), ErrInvalidInput)
	var ce *CapError
	require.ErrorAs(t, l.ReserveCapped("cuda:0", "c/1", "clones", 100, 101), &ce, "larger than the cap")
	assert.Nil(t, l.Snapshot().Caps, "a refusal sets no cap")
	v := l.Version()

	require.NoError(t, l.ReserveCapped("cuda:0", "c/1", "clones", 100, 60))
	assert.Equal(t, v+1, l.Version())
	require.ErrorIs(t, l.ReserveCapped("cuda:0", "c/2", "clones", 90, 10), ErrInvalidInput, "another cap's bytes")
	require.NoError(t, l.Reserve("cuda:0", "other", 50)) // outside the group
	require.ErrorAs(t, l.ReserveCapped("cuda:0", "c/2", "clones", 100, 41), &ce)
	assert.Equal(t, CapError{Cap: "clones", CapBytes: 100, UsedBytes: 60, RequestedBytes: 41}, *ce)
	var be *BudgetError
	require.ErrorAs(t, l.ReserveCapped("cuda:0", "c/2", "clones", 100, 40), &be, "within the cap, over the location's budget")
	assert.Equal(t, v+2, l.Version(), "refusals commit nothing")
	require.NoError(t, l.Unreserve("other"))
	require.NoError(t, l.ReserveCapped("cuda:0", "c/2", "clones", 100, 40))

	s := l.Snapshot()
	assert.Equal(t, []CapRecord{{Name: "clones", CapBytes: 100, UsedBytes: 100, PeakBytes: 100, Reservations: []string{"c/1", "c/2"}}}, s.Caps)
	require.NoError(t, l.CheckInvariants())

	require.NoError(t, l.Unreserve("c/1"))
	assert.Equal(t, []CapRecord{{Name: "clones", CapBytes: 100, UsedBytes: 40, PeakBytes: 100, Reservations: []string{"c/2"}}}, l.Snapshot().Caps)
	require.NoError(t, l.Unreserve("c/2"))
	assert.Nil(t, l.Snapshot().Caps, "gone with its group's last reservation")
	require.NoError(t, l.ReserveCapped("cuda:0", "c/3", "clones", 90, 90), "set again, with other bytes")
	assert.Equal(t, uint64(4), l.Snapshot().TransitionCounts["reserve"])
	require.NoError(t, l.CheckInvariants())
}
