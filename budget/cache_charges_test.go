package budget

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A touched charge ranks by its last touch, not by its offer: two
// charges touched in one order and offered in the other rank in touch
// order, also touched at one version.
func TestTouchChargeRanksByTake(t *testing.T) {
	c := std(t)
	c.must(c.ReserveOwned("cuda:0", "c1", 30, testCache))
	c.must(c.ReserveOwned("cuda:0", "c2", 30, testCache))
	v := c.L.Version()
	c.must(c.L.TouchCharge("c2", testCache)) // c2 taken first
	c.must(c.L.TouchCharge("c1", testCache))
	assert.Equal(t, v, c.L.Version(), "a touch costs no version")
	c.must(c.L.OfferCharge("c1", testCache, 1)) // released first
	c.must(c.L.OfferCharge("c2", testCache, 1))
	d, err := c.L.Decide(Request{Name: "room", Reservations: []ReservationSpec{{Name: "c3", Location: "cuda:0", Bytes: 60, Owner: testCache}}}, 0)
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	assert.Equal(t, "c2", d.Evictions[0].Charge, "taken first, so the victim, whatever the order of the offers")
	i1, _ := c.L.Charge("c1")
	i2, _ := c.L.Charge("c2")
	assert.Equal(t, v, i1.LastUse, "last use is the touch's version")
	assert.Equal(t, i1.Priority, i2.Priority)

	// Touching an offered charge keeps it indexed (the invariants hold).
	c.must(c.L.TouchCharge("c1", testCache))
	require.Error(t, c.L.TouchCharge("nope", testCache))
}

func TestCacheFiguresArithmetic(t *testing.T) {
	assert.Equal(t, int64(30), OwnerCharges{HasBudget: true, BudgetBytes: 100, UsedBytes: 50, ReservedBytes: 20}.FreeBytes())
	assert.Equal(t, int64(math.MaxInt64-70), OwnerCharges{UsedBytes: 50, ReservedBytes: 20}.FreeBytes())
	require.NoError(t, AccountingOverflow("h", 10, 10, math.MaxInt64-20))
	err := AccountingOverflow("h", 10, 10, math.MaxInt64-19)
	require.ErrorIs(t, err, ErrInvalidInput)
	assert.Contains(t, err.Error(), "would overflow its byte accounting")
	loc, n := (&BudgetError{Location: "g", BudgetBytes: 100, UsedBytes: 60, RequestedBytes: 60}).Short()
	assert.Equal(t, "g", loc)
	assert.Equal(t, int64(20), n)
	loc, n = (&BudgetError{Location: "g", BudgetBytes: 100, RequestedBytes: 60}).Short()
	assert.Empty(t, loc)
	assert.Zero(t, n)
}

// Ahead counts the waiters a new caller would not pass; Holding and
// Position describe a queued one.
func TestWaitQueueAheadHoldingPosition(t *testing.T) {
	q, err := NewWaitQueue(0)
	require.NoError(t, err)
	a, _ := q.Push(WaitSpec{Name: "a", Class: 1, Locations: []string{"g0"}})
	b, _ := q.Push(WaitSpec{Name: "b", Locations: []string{"g0", "g1"}, AllowBypass: true})
	c, _ := q.Push(WaitSpec{Name: "c", Locations: []string{"g1"}})
	assert.Equal(t, 1, q.Ahead(WaitSpec{Locations: []string{"g0"}}), "a (class 1); b allows bypass")
	assert.Equal(t, 0, q.Ahead(WaitSpec{Class: 2, Locations: []string{"g0"}}), "a higher class passes")
	assert.Equal(t, 1, q.Ahead(WaitSpec{Locations: []string{"g1"}}), "c")
	assert.Equal(t, 0, q.Ahead(WaitSpec{Locations: []string{"g2"}}))
	assert.Equal(t, 0, q.Holding(a))
	assert.Equal(t, 1, q.Holding(b), "a holds b at g0")
	assert.Equal(t, 0, q.Holding(c), "b allows bypass")
	p, ok := q.Position(c)
	assert.True(t, ok)
	assert.Equal(t, 2, p)
	_, ok = q.Position(99)
	assert.False(t, ok)
}
