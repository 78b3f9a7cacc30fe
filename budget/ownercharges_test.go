package budget

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// OwnerCharges.Short and TooLarge agree with the ledger: on random states
// of the igpu ledger, a reservation of b bytes at a location is admitted
// exactly when Short(b) is nil, and refused with the same figures (the
// location's budget first, then the group's) otherwise; TooLarge(b) is
// non-nil exactly when no state of the ledger could admit b there.
func TestOwnerChargesAgreeWithTheLedger(t *testing.T) {
	locs := []string{"pageable-host", "pinned-host", "cuda:0"}
	caps := map[string]int64{"pageable-host": 100, "pinned-host": 100, "cuda:0": 80} // the most one charge can hold
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		l := igpu(t)
		for i := range 6 {
			loc := locs[rng.IntN(len(locs))]
			_ = l.Reserve(loc, fmt.Sprintf("fill%d", i), rng.Int64N(60)) // some are refused: fine
		}
		for _, loc := range locs {
			ch, err := l.OwnerCharges(loc, "probe")
			require.NoError(t, err)
			for _, b := range []int64{1, 10, 20, 40, 80, 81, 100, 101, 1 << 40} {
				short := ch.Short(b)
				err := l.Reserve(loc, "probe", b)
				if short == nil {
					require.NoError(t, err, "seed %d: %d at %s", seed, b, loc)
					require.NoError(t, l.Unreserve("probe"))
				} else {
					require.Error(t, err, "seed %d: %d at %s", seed, b, loc)
					var be *BudgetError
					require.ErrorAs(t, err, &be)
					assert.Equal(t, be, short, "seed %d: %d at %s", seed, b, loc)
				}
				assert.Equal(t, b > caps[loc], ch.TooLarge(b) != nil, "seed %d: %d at %s", seed, b, loc)
				if tl := ch.TooLarge(b); tl != nil {
					assert.True(t, tl.NeverFits(b))
					assert.False(t, tl.NeverFits(caps[loc]))
				}
			}
		}
	}
}

// Refusal counts the parts at the members of one group together.
func TestRefusalOfPartsTogether(t *testing.T) {
	l := igpu(t)
	require.NoError(t, l.Reserve("pageable-host", "held", 30))
	at := map[string]OwnerCharges{}
	for _, loc := range []string{"pageable-host", "pinned-host", "cuda:0"} {
		ch, err := l.OwnerCharges(loc, "o")
		require.NoError(t, err)
		at[loc] = ch
	}
	parts := func(gpu, host, pinned int64) []ReservationSpec {
		return []ReservationSpec{{Location: "cuda:0", Bytes: gpu}, {Location: "pageable-host", Bytes: host}, {Location: "pinned-host", Bytes: pinned}}
	}
	be, never := Refusal(parts(40, 30, 100), at)
	assert.Nil(t, be, "40+30 more in the group: 100 with the 30 held; 100 at pinned-host, its budget")
	assert.False(t, never)

	be, never = Refusal(parts(40, 31, 10), at)
	require.NotNil(t, be, "one byte over the group's figure now")
	assert.False(t, never, "room may be made: the 30 held may go")
	assert.Equal(t, "igpu", be.Shared)
	assert.Equal(t, int64(71), be.SharedRequestedBytes)
	assert.Equal(t, int64(30), be.SharedUsedBytes)

	be, never = Refusal(parts(60, 41, 10), at)
	require.NotNil(t, be)
	assert.True(t, never, "101 together is above the figure of 100")
	assert.Equal(t, int64(101), be.SharedRequestedBytes)

	be, never = Refusal(parts(81, 1, 1), at)
	require.NotNil(t, be)
	assert.True(t, never, "81 is above cuda:0's own budget")
	assert.Empty(t, be.Shared)
	assert.Equal(t, "cuda:0", be.Location)

	be, never = Refusal(parts(1, 1, 101), at)
	require.NotNil(t, be)
	assert.True(t, never, "pinned-host is outside the group: its own budget")
	assert.Equal(t, "pinned-host", be.Location)
}
