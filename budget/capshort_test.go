package budget

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cap's refusal names its shortfall, and it is the ledger's figures'.
func TestCapErrorShortfall(t *testing.T) {
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:0"}}})
	require.NoError(t, err)
	require.NoError(t, l.ReserveCapped("cuda:0", "c/1", "clones", 100, 70))
	var ce *CapError
	require.ErrorAs(t, l.ReserveCapped("cuda:0", "c/2", "clones", 100, 50), &ce)
	assert.Equal(t, int64(20), ce.Shortfall())
	assert.Equal(t, `residency cap "clones" exceeded: used 70 + requested 50 > cap 100 (short by 20 bytes)`, ce.Error())
}

func TestCapShortfallAndRoom(t *testing.T) {
	for _, tc := range []struct {
		capBytes, used, requested, short, room int64
	}{
		{100, 0, 100, 0, 100},
		{100, 60, 40, 0, 40},
		{100, 60, 41, 1, 40},
		{100, 100, 1, 1, 0},
		{0, 0, 1, 1, 0},
		{100, 120, 1, 21, 0}, // a group past its cap (set with other bytes) has no room
		{0, math.MaxInt64, math.MaxInt64, math.MaxInt64, 0},
		{math.MaxInt64, 0, math.MaxInt64, 0, math.MaxInt64},
	} {
		assert.Equal(t, tc.short, CapShortfall(tc.capBytes, tc.used, tc.requested), "CapShortfall(%d, %d, %d)", tc.capBytes, tc.used, tc.requested)
		assert.Equal(t, tc.room, CapRoom(tc.capBytes, tc.used), "CapRoom(%d, %d)", tc.capBytes, tc.used)
	}
}

func TestUncovered(t *testing.T) {
	for _, tc := range []struct {
		short, ahead, onTheWay, want int64
	}{
		{0, 0, 0, 0},
		{10, 0, 0, 10},
		{10, 5, 0, 15},
		{10, 5, 15, 0},
		{10, 5, 14, 1},
		{10, 5, 100, 0},
		{-3, 2, 0, 2}, // negative figures count as 0
		{4, -3, -7, 4},
		{math.MaxInt64, math.MaxInt64, 0, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, 1, math.MaxInt64 - 1},
	} {
		assert.Equal(t, tc.want, Uncovered(tc.short, tc.ahead, tc.onTheWay), "Uncovered(%d, %d, %d)", tc.short, tc.ahead, tc.onTheWay)
	}
}
