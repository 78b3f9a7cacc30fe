package budget

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// spillChargeSetup: stdConfig with cuda:0 spilling to pinned-host (budget
// pinnedBudget); cuda:0 (100) holds charge c1 (30 bytes) of testCache,
// offered (demotable when demote), and value a (40 bytes, with a source),
// used after c1's offer so that c1 is the first victim.
func spillChargeSetup(t *testing.T, pinnedBudget int64, demote bool) (*checked, Handle) {
	t.Helper()
	cfg := stdConfig()
	cfg.Locations[1].BudgetBytes = pinnedBudget
	cfg.Locations[2].SpillTo = "pinned-host"
	c := newChecked(t, cfg)
	c.must(c.ReserveOwned("cuda:0", "c1", 30, testCache))
	if demote {
		c.must(c.L.OfferDemotableCharge("c1", testCache, 0))
	} else {
		c.must(c.L.OfferCharge("c1", testCache, 0))
	}
	a := c.regSrc("a", 40, Exclusive, "pageable-host")
	c.placed(a, "cuda:0")
	return c, a
}

func TestChargeSpill_Decide(t *testing.T) {
	cases := []struct {
		name         string
		pinned       int64
		demote       bool
		wantDemotion bool
	}{
		{name: "demotable, room at the target: demoted", pinned: 1000, demote: true, wantDemotion: true},
		{name: "demotable, target exactly full after it: demoted", pinned: 30, demote: true, wantDemotion: true},
		{name: "demotable, target too small: dropped", pinned: 29, demote: true},
		{name: "offered without demotion: dropped", pinned: 1000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := spillChargeSetup(t, tc.pinned, tc.demote)
			d, err := c.L.Decide(roomFor("c2"), 0)
			require.NoError(t, err)
			require.Len(t, d.Evictions, 1)
			e := d.Evictions[0]
			assert.Equal(t, EvictionIdleCacheEntry, e.Kind, "victims are unchanged by spill")
			assert.Equal(t, "c1", e.Charge)
			want := Action{Location: "cuda:0", Owner: testCache, Charge: "c1"}
			if tc.wantDemotion {
				want.To = "pinned-host"
				assert.Equal(t, "pinned-host", e.To)
				assert.Contains(t, e.Reason, "demoted to pinned-host")
			} else {
				assert.Empty(t, e.To)
				assert.Contains(t, e.Reason, "dropped by its owner")
			}
			assert.Equal(t, want, d.Plan.Reclaim[0])
			assert.True(t, d.Explanation.Feasible, d.Explanation.Reason)
		})
	}
}

// runToDemotion decides room for c2 and runs the plan to its pending
// demotion step, checking its effect and the charges while both exist.
func runToDemotion(t *testing.T, c *checked) *Run {
	t.Helper()
	d, err := c.L.Decide(roomFor("c2"), 0)
	require.NoError(t, err)
	run, err := c.L.StartRun(d.Plan, RunOptions{CheckVersion: true, ExpectedVersion: d.ExpectedStateVersion})
	require.NoError(t, err)
	step, ok, err := run.Next()
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, step.Admission.Pending)
	eff := step.Admission.Effects[0]
	assert.Equal(t, Effect{Kind: EffectDropCharge, Location: "cuda:0", Bytes: 30, Owner: testCache, Charge: "c1", To: "pinned-host", Demoted: "c1→pinned-host"}, eff)
	assert.Contains(t, eff.String(), "demote charge c1")
	old, ok := c.L.Charge("c1")
	require.True(t, ok)
	assert.Equal(t, ChargeEvicting, old.State)
	nu, ok := c.L.Charge("c1→pinned-host")
	require.True(t, ok, "the new charge is admitted with the step")
	assert.Equal(t, ChargeInfo{Name: "c1→pinned-host", Owner: testCache, Location: "pinned-host", Bytes: 30, State: ChargeNotOffered}, nu)
	c.invariants("demotion pending")
	return run
}

func TestChargeSpill_RunDemoted(t *testing.T) {
	c, _ := spillChargeSetup(t, 1000, true)
	run := runToDemotion(t, c)
	effects, err := run.Complete()
	require.NoError(t, err)
	assert.Empty(t, effects)
	_, ok := c.L.Charge("c1")
	assert.False(t, ok, "the old charge is released")
	nu, ok := c.L.Charge("c1→pinned-host")
	require.True(t, ok, "the new charge stays: the owner keeps the entry there")
	assert.Equal(t, ChargeNotOffered, nu.State)
	finishRun(t, run)
	c.invariants("demoted")
	ch, ok := c.L.Charge("c2")
	require.True(t, ok)
	assert.Equal(t, int64(40), ch.Bytes)
	// The demoted charge is the owner's: it may offer it, release it.
	c.must(c.L.OfferCharge("c1→pinned-host", testCache, 0))
	c.must(c.L.UnreserveOwned("c1→pinned-host", testCache))
}

func TestChargeSpill_RunCopyFailedDropsBoth(t *testing.T) {
	c, _ := spillChargeSetup(t, 1000, true)
	run := runToDemotion(t, c)
	require.NoError(t, run.CompleteDropped(errEntryBusy))
	_, ok := c.L.Charge("c1")
	assert.False(t, ok)
	_, ok = c.L.Charge("c1→pinned-host")
	assert.False(t, ok, "a failed copy leaves nothing at the target")
	finishRun(t, run)
	c.invariants("dropped")
	snap := c.L.Snapshot()
	for _, l := range snap.Locations {
		if l.Location == "pinned-host" {
			assert.Zero(t, l.ReservedBytes)
		}
	}
	assert.Error(t, run.CompleteDropped(nil), "nothing pending any more")
}

func TestChargeSpill_RunRefused(t *testing.T) {
	c, _ := spillChargeSetup(t, 1000, true)
	run := runToDemotion(t, c)
	_, err := run.FailStep(errEntryBusy)
	var busy *ChargeBusyError
	require.ErrorAs(t, err, &busy)
	assert.True(t, busy.Refused)
	old, ok := c.L.Charge("c1")
	require.True(t, ok, "a refused demotion keeps the entry where it was")
	assert.Equal(t, ChargeNotOffered, old.State)
	_, ok = c.L.Charge("c1→pinned-host")
	assert.False(t, ok)
	c.invariants("refused")
}

func TestChargeSpill_OfferRefusals(t *testing.T) {
	c := std(t) // no spill targets
	c.must(c.ReserveOwned("cuda:0", "c1", 30, testCache))
	err := c.do("offer demotable", mutation, func() error { return c.L.OfferDemotableCharge("c1", testCache, 0) })
	assert.ErrorIs(t, err, ErrInvalidInput)
	assert.Contains(t, err.Error(), "no spill target")
	err = c.do("offer demotable, negative freq", mutation, func() error { return c.L.OfferDemotableCharge("c1", testCache, -1) })
	assert.ErrorIs(t, err, ErrInvalidInput)
}

func TestChargeSpill_ReofferWithoutDemotion(t *testing.T) {
	c, _ := spillChargeSetup(t, 1000, true)
	info, _ := c.L.Charge("c1")
	assert.True(t, info.Demotable)
	c.must(c.L.OfferCharge("c1", testCache, 0))
	info, _ = c.L.Charge("c1")
	assert.False(t, info.Demotable, "an offer by OfferCharge is not demotable")
}

func TestChargeSpill_ExplainUserPlans(t *testing.T) {
	reclaim := func(to string) Plan {
		return Plan{Reclaim: []Action{{Location: "cuda:0", Owner: testCache, Charge: "c1", To: to}},
			Reservations: []ReservationSpec{{Name: "c2", Location: "cuda:0", Bytes: 40, Owner: testCache}}}
	}
	t.Run("demotable to its spill target: feasible, charged there", func(t *testing.T) {
		c, _ := spillChargeSetup(t, 1000, true)
		x := c.L.Explain(reclaim("pinned-host"))
		assert.True(t, x.Feasible, x.Reason)
		assert.Equal(t, int64(30), x.PredictedPeakBytes["pinned-host"])
	})
	t.Run("target without room: infeasible", func(t *testing.T) {
		c, _ := spillChargeSetup(t, 20, true)
		x := c.L.Explain(reclaim("pinned-host"))
		assert.False(t, x.Feasible)
		assert.Contains(t, x.Reason, "pinned-host")
	})
	t.Run("not offered as demotable", func(t *testing.T) {
		c, _ := spillChargeSetup(t, 1000, false)
		x := c.L.Explain(reclaim("pinned-host"))
		assert.False(t, x.Feasible)
		assert.Contains(t, x.Reason, "did not offer it as demotable")
	})
	t.Run("not the spill target", func(t *testing.T) {
		c, _ := spillChargeSetup(t, 1000, true)
		x := c.L.Explain(reclaim("cuda:1"))
		assert.False(t, x.Feasible)
		assert.Contains(t, x.Reason, "spill target")
	})
	t.Run("to its own location", func(t *testing.T) {
		c, _ := spillChargeSetup(t, 1000, true)
		x := c.L.Explain(reclaim("cuda:0"))
		assert.False(t, x.Feasible)
		assert.Contains(t, x.Reason, "must differ")
	})
	t.Run("a run of a user's demotion", func(t *testing.T) {
		c, _ := spillChargeSetup(t, 1000, true)
		run, err := c.L.StartRun(reclaim("pinned-host"), RunOptions{})
		require.NoError(t, err)
		step, ok, err := run.Next()
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, "c1→pinned-host", step.Admission.Effects[0].Demoted)
		_, err = run.Complete()
		require.NoError(t, err)
		finishRun(t, run)
		c.invariants("user demotion")
	})
}

// finishRun admits the rest of run (no pending steps expected) and
// finishes it.
func finishRun(t *testing.T, run *Run) {
	t.Helper()
	for {
		step, ok, err := run.Next()
		require.NoError(t, err)
		if !ok {
			break
		}
		require.False(t, step.Admission.Pending)
	}
	_, _, err := run.Finish()
	require.NoError(t, err)
}
