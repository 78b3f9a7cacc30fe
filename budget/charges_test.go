package budget

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testCache = CacheOwnerPrefix + "w#1"

var errEntryBusy = errors.New("entry leased in between")

// chargeSetup: cuda:0 (budget 100) holds value a (40 bytes, with a source,
// so a candidate once resident; H = 1) and charge c1 (30 bytes) of
// testCache.
func chargeSetup(t *testing.T) (*checked, Handle) {
	t.Helper()
	c := std(t)
	a := c.regSrc("a", 40, Exclusive, "pageable-host")
	c.placed(a, "cuda:0")
	c.must(c.ReserveOwned("cuda:0", "c1", 30, testCache))
	return c, a
}

// roomFor asks for room for a 40-byte charge of testCache at cuda:0 (10
// bytes short).
func roomFor(name string) Request {
	return Request{Name: "load " + name, Reservations: []ReservationSpec{{Name: name, Location: "cuda:0", Bytes: 40, Owner: testCache}}}
}

func TestCharges_VictimOrder(t *testing.T) {
	cases := []struct {
		name string
		// offer runs before or after the value's last use; freq is the
		// charge's; offered false leaves it not offered.
		offered     bool
		freq        int64
		offerFirst  bool
		wantCharge  bool
		wantFailure bool
	}{
		{name: "lower H: the charge goes", offered: true, freq: 0, wantCharge: true},
		{name: "higher H: the value goes", offered: true, freq: 5, wantCharge: false},
		{name: "equal H, charge used earlier: the charge goes", offered: true, freq: 1, offerFirst: true, wantCharge: true},
		{name: "equal H, charge used later: the value goes", offered: true, freq: 1, wantCharge: false},
		{name: "not offered: the value goes", offered: false, wantCharge: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := std(t)
			a := c.regSrc("a", 40, Exclusive, "pageable-host")
			c.must(c.ReserveOwned("cuda:0", "c1", 30, testCache))
			if tc.offered && tc.offerFirst {
				c.must(c.L.OfferCharge("c1", testCache, tc.freq))
			}
			c.placed(a, "cuda:0") // H(a) = 0 + 1, last use now
			if tc.offered && !tc.offerFirst {
				c.must(c.L.OfferCharge("c1", testCache, tc.freq))
			}
			v := c.L.Version()
			d, err := c.L.Decide(roomFor("c2"), 0)
			require.NoError(t, err)
			assert.Equal(t, v, c.L.Version(), "Decide is a read")
			require.Len(t, d.Evictions, 1)
			e := d.Evictions[0]
			if tc.wantCharge {
				assert.Equal(t, EvictionIdleCacheEntry, e.Kind)
				assert.Equal(t, Action{Location: "cuda:0", Owner: testCache, Charge: "c1"}, d.Plan.Reclaim[0])
				assert.Equal(t, testCache, e.Owner)
				assert.Equal(t, "c1", e.Charge)
				assert.True(t, e.Handle.IsZero())
				assert.Contains(t, e.Reason, "idle cache entry")
				assert.Equal(t, int64(30), e.Bytes)
			} else {
				assert.Equal(t, EvictionLowestPriority, e.Kind)
				assert.Equal(t, a, e.Handle)
				assert.Empty(t, e.Charge)
			}
			assert.True(t, d.Explanation.Feasible)
		})
	}
}

func TestCharges_OfferWithdrawVersionsAndStamp(t *testing.T) {
	c, _ := chargeSetup(t)
	info, ok := c.L.Charge("c1")
	require.True(t, ok)
	assert.Equal(t, ChargeNotOffered, info.State)

	assert.Equal(t, uint64(0), c.delta(func() { c.must(c.L.WithdrawCharge("c1", testCache)) }), "withdrawing a charge not offered")
	assert.Equal(t, uint64(1), c.delta(func() { c.must(c.L.OfferCharge("c1", testCache, 3)) }))
	info, _ = c.L.Charge("c1")
	assert.Equal(t, ChargeOffered, info.State)
	assert.Equal(t, int64(3), info.Priority) // L(cuda:0) = 0
	assert.Equal(t, c.L.Version(), info.LastUse)
	assert.Equal(t, uint64(1), c.delta(func() { c.must(c.L.OfferCharge("c1", testCache, 4)) }), "an offer stamps again")
	info, _ = c.L.Charge("c1")
	assert.Equal(t, c.L.Version(), info.LastUse)
	c.must(c.L.ResizeOwned("c1", testCache, 20))
	info, _ = c.L.Charge("c1")
	assert.Equal(t, ChargeOffered, info.State, "a resize keeps the offer")
	assert.Equal(t, int64(20), info.Bytes)
	c.invariants("resize offered")
	assert.Equal(t, uint64(1), c.delta(func() { c.must(c.L.WithdrawCharge("c1", testCache)) }))
	info, _ = c.L.Charge("c1")
	assert.Equal(t, ChargeNotOffered, info.State)
	c.invariants("withdraw")
	c.must(c.L.OfferCharge("c1", testCache, 0))
	c.must(c.UnreserveOwned("c1", testCache))
	_, ok = c.L.Charge("c1")
	assert.False(t, ok, "released while offered")
}

func TestCharges_OfferRefusals(t *testing.T) {
	c, _ := chargeSetup(t)
	c.must(c.Reserve("cuda:0", "plain", 1))
	c.must(c.ReserveOwned("cuda:0", "scoped", 1, "scope1"))
	for _, tc := range []struct {
		name, charge, owner string
		freq                int64
	}{
		{"not a cache owner", "scoped", "scope1", 0},
		{"an ordinary reservation", "plain", testCache, 0},
		{"another cache", "c1", CacheOwnerPrefix + "other", 0},
		{"unknown charge", "nope", testCache, 0},
		{"negative freq", "c1", testCache, -1},
		{"bare prefix", "c1", CacheOwnerPrefix, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := c.L.Version()
			err := c.L.OfferCharge(tc.charge, tc.owner, tc.freq)
			assert.ErrorIs(t, err, ErrInvalidInput)
			if tc.freq == 0 {
				assert.ErrorIs(t, c.L.WithdrawCharge(tc.charge, tc.owner), ErrInvalidInput)
			}
			assert.Equal(t, v, c.L.Version())
			c.invariants(tc.name)
		})
	}
}

// startEviction decides room for c2 with c1 offered (the victim), starts
// the run and admits the reclaim step.
func startEviction(t *testing.T, c *checked) (*checkedRun, Step) {
	t.Helper()
	c.must(c.L.OfferCharge("c1", testCache, 0))
	d, err := c.L.Decide(roomFor("c2"), 0)
	require.NoError(t, err)
	require.Equal(t, EvictionIdleCacheEntry, d.Evictions[0].Kind)
	r, err := c.StartRun(d.Plan, RunOptions{CheckVersion: true, ExpectedVersion: d.ExpectedStateVersion})
	require.NoError(t, err)
	s, ok, err := r.Next()
	require.NoError(t, err)
	require.True(t, ok)
	return r, s
}

func TestCharges_EvictConfirmed(t *testing.T) {
	c, _ := chargeSetup(t)
	before := c.figures("cuda:0")
	var r *checkedRun
	var s Step
	assert.Equal(t, uint64(2), c.delta(func() { r, s = startEviction(t, c) }), "offer and evict_charge")
	assert.Equal(t, PhaseReclaim, s.Phase)
	require.True(t, s.Admission.Pending)
	assert.Equal(t, []Effect{{Kind: EffectDropCharge, Location: "cuda:0", Bytes: 30, Owner: testCache, Charge: "c1"}}, s.Admission.Effects)
	info, _ := c.L.Charge("c1")
	assert.Equal(t, ChargeEvicting, info.State)
	assert.Equal(t, before, c.figures("cuda:0"), "an evicting charge is still counted")

	var busy *ChargeBusyError
	require.ErrorAs(t, c.L.OfferCharge("c1", testCache, 0), &busy)
	assert.Equal(t, ChargeEvicting, busy.State)
	assert.ErrorIs(t, c.L.ResizeOwned("c1", testCache, 10), ErrBusy)
	assert.Equal(t, uint64(0), c.delta(func() { c.must(c.L.WithdrawCharge("c1", testCache)) }), "withdraw while evicting")
	_, _, err := r.Next()
	assert.ErrorIs(t, err, ErrInvalidInput, "the step is pending")

	assert.Equal(t, uint64(1), c.delta(func() {
		effs, err := r.Complete()
		require.NoError(t, err)
		assert.Empty(t, effs)
	}))
	_, ok := c.L.Charge("c1")
	assert.False(t, ok)
	s, ok, err = r.Next()
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, PhaseReserve, s.Phase)
	_, ok, err = r.Next()
	require.NoError(t, err)
	require.False(t, ok)
	rep, _, err := r.Finish()
	require.NoError(t, err)
	assert.Len(t, rep.Transitions, 3) // evict_charge, unreserve, reserve
	info, ok = c.L.Charge("c2")
	require.True(t, ok)
	assert.Equal(t, testCache, info.Owner, "the room's reservation is the cache's charge")
	assert.Empty(t, r.R.Reservations(), "an owned spec is not the run's")
	assert.ErrorIs(t, c.Unreserve("c2"), ErrInvalidInput, "only the cache releases it")
}

func TestCharges_EvictRefused(t *testing.T) {
	for _, withdrawFirst := range []bool{false, true} {
		c, _ := chargeSetup(t)
		r, _ := startEviction(t, c)
		if withdrawFirst {
			c.must(c.L.WithdrawCharge("c1", testCache))
		}
		before := c.figures("cuda:0")
		var err error
		assert.Equal(t, uint64(1), c.delta(func() { _, err = r.FailStep(errEntryBusy) }))
		var pe *PlanExecutionError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, PhaseExecute, pe.Phase) // a plain execute names no phase
		var busy *ChargeBusyError
		require.ErrorAs(t, err, &busy)
		assert.True(t, busy.Refused)
		assert.Equal(t, "c1", busy.Charge)
		assert.ErrorIs(t, err, ErrBusy)
		assert.ErrorIs(t, err, errEntryBusy)
		assert.NotErrorIs(t, err, ErrPlan)
		info, _ := c.L.Charge("c1")
		assert.Equal(t, ChargeNotOffered, info.State)
		assert.Equal(t, before, c.figures("cuda:0"))
		_, ok := c.L.Charge("c2")
		assert.False(t, ok, "the failed run reserved nothing")
		// Decide again: c1 is not offered, so the value goes.
		d, err := c.L.Decide(roomFor("c2"), 0)
		require.NoError(t, err)
		assert.Equal(t, EvictionLowestPriority, d.Evictions[0].Kind)
	}
}

func TestCharges_ReleasedWhileEvicting(t *testing.T) {
	t.Run("confirmed", func(t *testing.T) {
		c, _ := chargeSetup(t)
		r, _ := startEviction(t, c)
		c.must(c.UnreserveOwned("c1", testCache))
		// The name is taken again meanwhile: the answer must not touch it.
		c.must(c.ReserveOwned("cuda:0", "c1", 5, testCache))
		assert.Equal(t, uint64(0), c.delta(func() { _, err := r.Complete(); require.NoError(t, err) }))
		info, ok := c.L.Charge("c1")
		require.True(t, ok)
		assert.Equal(t, int64(5), info.Bytes)
		_, ok, err := r.Next()
		require.NoError(t, err)
		require.True(t, ok)
		_, ok, err = r.Next()
		require.NoError(t, err)
		require.False(t, ok)
		_, _, err = r.Finish()
		require.NoError(t, err)
	})
	t.Run("refused", func(t *testing.T) {
		c, _ := chargeSetup(t)
		r, _ := startEviction(t, c)
		c.must(c.UnreserveOwned("c1", testCache))
		var err error
		assert.Equal(t, uint64(0), c.delta(func() { err = r.Fail(errEntryBusy) }))
		var busy *ChargeBusyError
		require.ErrorAs(t, err, &busy)
		assert.True(t, busy.Refused)
	})
}

func TestCharges_WithdrawnBeforeTheStep(t *testing.T) {
	c, _ := chargeSetup(t)
	c.must(c.L.OfferCharge("c1", testCache, 0))
	d, err := c.L.Decide(roomFor("c2"), 0)
	require.NoError(t, err)
	r, err := c.StartRun(d.Plan, RunOptions{})
	require.NoError(t, err)
	c.must(c.L.WithdrawCharge("c1", testCache)) // a lease was taken
	_, _, err = r.Next()
	var busy *ChargeBusyError
	require.ErrorAs(t, err, &busy)
	assert.False(t, busy.Refused)
	assert.Equal(t, ChargeNotOffered, busy.State)
	assert.ErrorIs(t, err, ErrBusy)
}

func TestCharges_PlanValidation(t *testing.T) {
	c, a := chargeSetup(t)
	bad := []Plan{
		{Enter: []Action{{Location: "cuda:0", Owner: testCache, Charge: "c1"}}},
		{Reclaim: []Action{{Location: "cuda:0", Owner: testCache}}},
		{Reclaim: []Action{{Handle: a, Location: "cuda:0", Owner: testCache, Charge: "c1"}}},
		{Reclaim: []Action{{Location: "cuda:0", Owner: "scope1", Charge: "c1"}}},
		// A charge's demotion names another location (charges_spill.go).
		{Reclaim: []Action{{Location: "cuda:0", Owner: testCache, Charge: "c1", To: "cuda:0"}}},
		{Reclaim: []Action{{Location: "cuda:0", Owner: testCache, Charge: "c1", To: "gpu0"}}},
	}
	for i, p := range bad {
		_, err := c.StartRun(p, RunOptions{})
		assert.ErrorIs(t, err, ErrInvalidInput, "plan %d", i)
	}
	// Well formed but infeasible: not offered, elsewhere, twice.
	assert.False(t, c.Explain(Plan{Reclaim: []Action{{Location: "cuda:0", Owner: testCache, Charge: "c1"}}}).Feasible)
	c.must(c.L.OfferCharge("c1", testCache, 0))
	ok := Plan{Reclaim: []Action{{Location: "cuda:0", Owner: testCache, Charge: "c1"}}}
	ex := c.Explain(ok)
	assert.True(t, ex.Feasible, ex.Reason)
	assert.False(t, c.Explain(Plan{Reclaim: []Action{{Location: "cuda:1", Owner: testCache, Charge: "c1"}}}).Feasible)
	assert.False(t, c.Explain(Plan{Reclaim: append(ok.Reclaim, ok.Reclaim...)}).Feasible)
	assert.False(t, c.Explain(Plan{Reclaim: []Action{{Location: "cuda:0", Owner: CacheOwnerPrefix + "x", Charge: "c1"}}}).Feasible)
}

func TestCharges_RoomForALoadEvictsValuesNotLastCopies(t *testing.T) {
	c := std(t)
	keep := c.reg("keep", 50, Exclusive, "cuda:0") // the last copy, no source
	src := c.regSrc("src", 30, Exclusive, "pageable-host")
	c.placed(src, "cuda:0")
	lease, err := c.Acquire(src, "cuda:0")
	c.must(err)
	_, err = c.L.Decide(roomFor("c2"), 0)
	var pe *PlanError
	require.ErrorAs(t, err, &pe, "a protected value and a last copy are never victims")
	c.must(c.Release(lease))
	d, err := c.L.Decide(roomFor("c2"), 0)
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	assert.Equal(t, src, d.Evictions[0].Handle)
	assert.NotEqual(t, keep, d.Evictions[0].Handle)
}

func TestCharges_EvictionKindText(t *testing.T) {
	var k EvictionKind
	b, err := EvictionIdleCacheEntry.MarshalText()
	require.NoError(t, err)
	require.NoError(t, k.UnmarshalText(b))
	assert.Equal(t, EvictionIdleCacheEntry, k)
	assert.Equal(t, "idle_cache_entry", k.String())
	assert.Equal(t, "drop_charge", EffectDropCharge.String())
	assert.Equal(t, "evicting", ChargeEvicting.String())
}
