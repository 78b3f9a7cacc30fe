package budget

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldLedger: cuda:0 and cuda:1 (budget 100 each) spill to pinned-host
// (budget 100); pageable-host has no budget.
func heldLedger(t *testing.T) *Ledger {
	t.Helper()
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{
		{Name: "pageable-host"},
		{Name: "pinned-host", HasBudget: true, BudgetBytes: 100},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: 100, SpillTo: "pinned-host"},
		{Name: "cuda:1", HasBudget: true, BudgetBytes: 100, SpillTo: "pinned-host"},
	}})
	require.NoError(t, err)
	return l
}

func sourced(t *testing.T, l *Ledger, name string, bytes int64) Handle {
	t.Helper()
	h, _, err := l.Register(ValueSpec{Name: name, Bytes: bytes, Source: "pageable-host", Mode: Replicable})
	require.NoError(t, err)
	return h
}

// requireHeldRefusal: err is the refusal for room held at loc, and the
// ledger is exactly as it was (version and snapshot).
func requireHeldRefusal(t *testing.T, l *Ledger, before Snapshot, err error, loc string, waiters int) {
	t.Helper()
	var wa *WaitersAheadError
	require.ErrorAs(t, err, &wa)
	assert.Equal(t, loc, wa.Location)
	assert.Equal(t, waiters, wa.Waiters)
	assert.True(t, errors.Is(err, ErrBusy), "matches ErrBusy")
	assert.Equal(t, before, l.Snapshot(), "a refusal changes nothing")
}

// Calls that charge a location an earlier waiter holds are refused with
// nothing changed; the same calls elsewhere, and everything that charges
// nothing there, go ahead; outside WithHeld the location is open again.
func TestWithHeldRefusesNewChargesAtHeldLocations(t *testing.T) {
	l := heldLedger(t)
	a := sourced(t, l, "a", 10)
	b := sourced(t, l, "b", 10)
	adm, err := l.Place(b, "cuda:0")
	require.NoError(t, err)
	_, err = l.Complete(adm.ID)
	require.NoError(t, err)
	held := map[string]int{"cuda:0": 2, "nowhere": 3, "cuda:1": 0}

	l.WithHeld(held, func() {
		before := l.Snapshot()
		_, err := l.Place(a, "cuda:0")
		requireHeldRefusal(t, l, before, err, "cuda:0", 2)
		_, err = l.Place(Handle{Manager: "m", Name: "ghost"}, "cuda:0")
		assert.ErrorIs(t, err, ErrInvalidInput, "invalid input first: the order of checks is kept")
		err = l.Reserve("cuda:0", "huge", 95)
		var be *BudgetError
		assert.ErrorAs(t, err, &be, "a charge that would not fit anyway is refused for the budget")
		err = l.Reserve("cuda:0", "r", 5)
		requireHeldRefusal(t, l, before, err, "cuda:0", 2)
		_, _, err = l.Register(ValueSpec{Name: "c", Bytes: 5, At: "cuda:0"})
		requireHeldRefusal(t, l, before, err, "cuda:0", 2)
		_, err = l.Move(b, "cuda:1", "cuda:0")
		require.Error(t, err, "b is not at cuda:1")

		// What charges nothing at cuda:0 goes ahead.
		adm, err := l.Place(b, "cuda:0") // resident already
		require.NoError(t, err)
		assert.False(t, adm.Pending)
		lease, err := l.Acquire(b, "cuda:0")
		require.NoError(t, err)
		require.NoError(t, l.Release(lease))
		// Elsewhere too (a count ≤ 0 and an unknown name hold nothing).
		adm, err = l.Place(a, "cuda:1")
		require.NoError(t, err)
		_, err = l.Complete(adm.ID)
		require.NoError(t, err)
		require.NoError(t, l.Reserve("cuda:1", "r1", 5))
	})
	// Reopened.
	adm, err = l.Place(a, "cuda:0")
	require.NoError(t, err)
	_, err = l.Complete(adm.ID)
	require.NoError(t, err)
	require.NoError(t, l.CheckInvariants())
}

// A location in a shared budget is closed while any member of its group
// is held: the members draw on one figure.
func TestWithHeldClosesTheWholeSharedBudget(t *testing.T) {
	l := igpu(t)
	h := sourced(t, l, "a", 10)
	l.WithHeld(map[string]int{"pageable-host": 1}, func() {
		before := l.Snapshot()
		_, err := l.Place(h, "cuda:0")
		requireHeldRefusal(t, l, before, err, "pageable-host", 1)
		require.NoError(t, l.Reserve("pinned-host", "r", 10), "outside the group")
	})
}

// The controller places a request where no waiter holds the room when its
// tiers allow, and refuses with WaitersAheadError (its detail naming the
// blocked assignments) when only held room would do.
func TestDecideUnderHeldRoom(t *testing.T) {
	l := heldLedger(t)
	a := sourced(t, l, "a", 10)
	held := map[string]int{"cuda:0": 1}
	req := Request{Name: "q", Requirements: []Requirement{{Handle: a, Tiers: [][]string{{"cuda:0"}, {"cuda:1"}}}}}
	l.WithHeld(held, func() {
		d, err := l.Decide(req, 0)
		require.NoError(t, err)
		require.Len(t, d.Plan.Enter, 1)
		assert.Equal(t, "cuda:1", d.Plan.Enter[0].Location, "the second tier: the first one's room is held")

		only := Request{Name: "q0", Requirements: []Requirement{{Handle: a, Tiers: [][]string{{"cuda:0"}}}}}
		before := l.Snapshot()
		_, err = l.Decide(only, 0)
		requireHeldRefusal(t, l, before, err, "cuda:0", 1)
		assert.Contains(t, err.Error(), "a→cuda:0", "the detail names the blocked assignment")

		res := Request{Name: "q1", Reservations: []ReservationSpec{{Name: "r", Location: "cuda:0", Bytes: 1}}}
		_, err = l.Decide(res, 0)
		requireHeldRefusal(t, l, before, err, "cuda:0", 1)
	})
	d, err := l.Decide(req, 0)
	require.NoError(t, err)
	assert.Equal(t, "cuda:0", d.Plan.Enter[0].Location, "not held: the first tier")
}

// A spill target whose room is held takes no demotion: the victim is
// dropped instead, and the plan runs under the same held room.
func TestDecideDropsInsteadOfDemotingIntoHeldRoom(t *testing.T) {
	l := heldLedger(t)
	v := sourced(t, l, "v", 60)
	adm, err := l.Place(v, "cuda:0")
	require.NoError(t, err)
	_, err = l.Complete(adm.ID)
	require.NoError(t, err)
	w := sourced(t, l, "w", 60)
	req := Request{Name: "q", Requirements: []Requirement{{Handle: w, Tiers: [][]string{{"cuda:0"}}}}}

	d, err := l.Decide(req, 0)
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	assert.Equal(t, "pinned-host", d.Evictions[0].To, "not held: demoted")

	l.WithHeld(map[string]int{"pinned-host": 1}, func() {
		d, err := l.Decide(req, 0)
		require.NoError(t, err)
		require.Len(t, d.Evictions, 1)
		assert.Equal(t, "", d.Evictions[0].To, "held: dropped")
		run, err := l.StartDecided(&d, "")
		require.NoError(t, err)
		for {
			st, ok, err := run.Next()
			require.NoError(t, err)
			if !ok {
				break
			}
			if st.Admission.Pending {
				_, err := run.Complete()
				require.NoError(t, err)
			}
		}
		_, _, err = run.Finish()
		require.NoError(t, err)
	})
	s := l.Snapshot()
	vs, _ := s.Value("v")
	assert.Empty(t, vs.Materializations, "v was dropped, not demoted")
	require.NoError(t, l.CheckInvariants())

	// An explicit plan that demotes into held room is refused whole.
	x := sourced(t, l, "x", 30)
	adm, err = l.Place(x, "cuda:1")
	require.NoError(t, err)
	_, err = l.Complete(adm.ID)
	require.NoError(t, err)
	l.WithHeld(map[string]int{"pinned-host": 4}, func() {
		before := l.Snapshot()
		_, err := l.StartRun(Plan{Reclaim: []Action{{Handle: x, Location: "cuda:1", To: "pinned-host"}}}, RunOptions{})
		requireHeldRefusal(t, l, before, err, "pinned-host", 4)
	})
}

func TestWaitQueueHeldAt(t *testing.T) {
	q, err := NewWaitQueue(0)
	require.NoError(t, err)
	assert.Nil(t, q.HeldAt(0), "empty")
	for _, s := range []WaitSpec{
		{Name: "a", Class: 0, Locations: []string{"cuda:0", "cuda:0", "cuda:1"}},
		{Name: "b", Class: 0, Locations: []string{"cuda:0"}},
		{Name: "bypass", Class: 3, Locations: []string{"pinned-host"}, AllowBypass: true},
		{Name: "low", Class: -1, Locations: []string{"pinned-host"}},
		{Name: "high", Class: 2, Locations: []string{"cuda:1"}},
	} {
		_, err := q.Push(s)
		require.NoError(t, err)
	}
	assert.Equal(t, map[string]int{"cuda:0": 2, "cuda:1": 2}, q.HeldAt(0), "a location named twice by one waiter counts once; bypass and lower classes hold nothing")
	assert.Equal(t, map[string]int{"cuda:0": 2, "cuda:1": 2, "pinned-host": 1}, q.HeldAt(-1))
	assert.Equal(t, map[string]int{"cuda:1": 1}, q.HeldAt(1))
}

// A WithHeld inside another replaces the held room for its own f and
// restores the outer one after; a panic in f leaves nothing held.
func TestWithHeldNestsAndRestores(t *testing.T) {
	l := heldLedger(t)
	l.WithHeld(map[string]int{"cuda:0": 1}, func() {
		assert.Error(t, l.Reserve("cuda:0", "a", 1))
		l.WithHeld(map[string]int{"cuda:1": 2}, func() {
			require.NoError(t, l.Reserve("cuda:0", "b", 1), "replaced: cuda:0 is open")
			assert.Error(t, l.Reserve("cuda:1", "c", 1))
		})
		assert.Error(t, l.Reserve("cuda:0", "a", 1), "the outer held room is back")
		require.NoError(t, l.Reserve("cuda:1", "c", 1))
	})
	assert.Panics(t, func() {
		l.WithHeld(map[string]int{"cuda:0": 1}, func() { panic("boom") })
	})
	require.NoError(t, l.Reserve("cuda:0", "d", 1), "nothing held after a panic")
}

// HeldOutside leaves out the locations a call names and the members of
// their shared budgets; RequestLocations lists tiers, then reservations.
func TestHeldOutside(t *testing.T) {
	l := igpu(t) // cuda:0 and pageable-host share a budget; pinned-host does not
	held := map[string]int{"cuda:0": 1, "pinned-host": 2, "pageable-host": 3, "cuda:9": 1}
	assert.Equal(t, map[string]int{"pinned-host": 2}, l.HeldOutside(held, []string{"pageable-host"}), "its group with it; unknown names dropped")
	assert.Equal(t, map[string]int{"cuda:0": 1, "pageable-host": 3}, l.HeldOutside(held, []string{"pinned-host"}))
	assert.Nil(t, l.HeldOutside(held, []string{"cuda:0", "pinned-host"}))
	req := Request{Requirements: []Requirement{{Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}}},
		Reservations: []ReservationSpec{{Location: "cuda:1"}, {Location: "pageable-host"}}}
	assert.Equal(t, []string{"cuda:0", "cuda:1", "pinned-host", "pageable-host"}, RequestLocations(req))
}
