package budget

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Reservations whose sum overflows int64 are refused as what they are,
// not as the controller's internal inconsistency: at a location with a
// budget, a plain shortfall (*PlanError, no victims can make room); at one
// without, invalid input (the byte accounting could not hold them), as
// Reserve refuses them. Before, the sums wrapped negative, the search
// admitted a plan, and Explain refused it ("internal: the controller's
// arithmetic admitted a plan that Explain finds infeasible").
func TestDecideReservationSumsDoNotOverflow(t *testing.T) {
	f := dtNew(t, "pageable-host", "cuda:0=100", "cuda:1=100")
	huge := func(loc string) Request {
		return Request{Name: "r", Reservations: []ReservationSpec{{Name: "a", Location: loc, Bytes: math.MaxInt64}, {Name: "b", Location: loc, Bytes: 2}}}
	}
	_, err := f.l.Decide(huge("cuda:0"), 0)
	var pe *PlanError
	require.ErrorAs(t, err, &pe)
	assert.NotContains(t, err.Error(), "internal")
	assert.Contains(t, err.Error(), "cuda:0")

	_, err = f.l.Decide(huge("pageable-host"), 0)
	require.ErrorIs(t, err, ErrInvalidInput)
	assert.Contains(t, err.Error(), "overflow")

	require.NoError(t, f.l.Reserve("pageable-host", "big", math.MaxInt64-10))
	_, err = f.l.Decide(Request{Name: "r", Reservations: []ReservationSpec{{Name: "c", Location: "pageable-host", Bytes: 11}}}, 0)
	require.ErrorIs(t, err, ErrInvalidInput, "what is charged there counts")
	_, err = f.l.Decide(Request{Name: "r", Reservations: []ReservationSpec{{Name: "c", Location: "pageable-host", Bytes: 10}}}, 0)
	require.NoError(t, err)
}
