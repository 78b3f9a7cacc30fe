package budget

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWaitQueueEligible(t *testing.T) {
	type w struct {
		name   string
		class  int
		locs   []string
		bypass bool
	}
	cases := []struct {
		name    string
		push    []w
		remove  []string
		order   []string // queue order
		eligble []string
	}{
		{name: "empty"},
		{name: "FIFO in a class: only the head of a location",
			push:  []w{{"a", 0, []string{"g"}, false}, {"b", 0, []string{"g"}, false}, {"c", 0, []string{"g"}, false}},
			order: []string{"a", "b", "c"}, eligble: []string{"a"}},
		{name: "higher classes first, FIFO within",
			push:  []w{{"a", 0, []string{"g"}, false}, {"b", 2, []string{"g"}, false}, {"c", 1, []string{"g"}, false}, {"d", 2, []string{"g"}, false}},
			order: []string{"b", "d", "c", "a"}, eligble: []string{"b"}},
		{name: "other locations are not held up",
			push:  []w{{"a", 0, []string{"g0"}, false}, {"b", 0, []string{"g0"}, false}, {"c", 0, []string{"g1"}, false}},
			order: []string{"a", "b", "c"}, eligble: []string{"a", "c"}},
		{name: "a waiter over two locations is held up by either",
			push:  []w{{"a", 0, []string{"g0"}, false}, {"b", 0, []string{"g1", "g0"}, false}, {"c", 0, []string{"g1"}, false}},
			order: []string{"a", "b", "c"}, eligble: []string{"a"}},
		{name: "bypass lets later ones through",
			push:  []w{{"big", 0, []string{"g"}, true}, {"s1", 0, []string{"g"}, false}, {"s2", 0, []string{"g"}, false}},
			order: []string{"big", "s1", "s2"}, eligble: []string{"big", "s1"}},
		{name: "no location: always eligible, holds up nobody",
			push:  []w{{"a", 0, nil, false}, {"b", 0, []string{"g"}, false}},
			order: []string{"a", "b"}, eligble: []string{"a", "b"}},
		{name: "removing the head makes the next eligible",
			push:   []w{{"a", 0, []string{"g"}, false}, {"b", 0, []string{"g"}, false}},
			remove: []string{"a"}, order: []string{"b"}, eligble: []string{"b"}},
		{name: "a higher class holds up a lower one",
			push:  []w{{"lo", 0, []string{"g"}, false}, {"hi", 5, []string{"g"}, false}},
			order: []string{"hi", "lo"}, eligble: []string{"hi"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q, err := NewWaitQueue(0)
			require.NoError(t, err)
			ids := map[string]WaitID{}
			names := map[WaitID]string{}
			for _, x := range tc.push {
				id, err := q.Push(WaitSpec{Name: x.name, Class: x.class, Locations: x.locs, AllowBypass: x.bypass})
				require.NoError(t, err)
				ids[x.name], names[id] = id, x.name
			}
			for _, n := range tc.remove {
				require.True(t, q.Remove(ids[n]))
				require.False(t, q.Remove(ids[n]), "removed twice")
			}
			var order []string
			for _, s := range q.Waiting() {
				order = append(order, s.Name)
			}
			assert.Equal(t, tc.order, order)
			var el []string
			for _, id := range q.Eligible(nil) {
				el = append(el, names[id])
			}
			assert.Equal(t, tc.eligble, el)
			assert.Equal(t, len(tc.order), q.Len())
		})
	}
}

// The members of a shared budget count as one location: a waiter at one
// holds up later waiters and new callers at the others, and is held up
// by them; a location outside the group is not.
func TestWaitQueueSharedBudgets(t *testing.T) {
	q, err := NewWaitQueue(0)
	require.NoError(t, err)
	q.ShareBudgets([]SharedBudget{{Name: "igpu", Locations: []string{"cuda:0", "pageable-host"}, Bytes: 100}})
	gpu, err := q.Push(WaitSpec{Name: "gpu", Locations: []string{"cuda:0"}})
	require.NoError(t, err)
	host, err := q.Push(WaitSpec{Name: "host", Locations: []string{"pageable-host"}})
	require.NoError(t, err)
	pinned, err := q.Push(WaitSpec{Name: "pinned", Locations: []string{"pinned-host"}})
	require.NoError(t, err)
	assert.Equal(t, []WaitID{gpu, pinned}, q.Eligible(nil), "host waits behind gpu: one figure")
	assert.Equal(t, 1, q.Holding(host))
	assert.Equal(t, 0, q.Holding(pinned))
	assert.Equal(t, 2, q.Ahead(WaitSpec{Name: "new", Locations: []string{"pageable-host"}}))
	assert.Equal(t, 1, q.Ahead(WaitSpec{Name: "new", Locations: []string{"pinned-host"}}), "only the waiter at pinned-host")
	assert.Equal(t, 0, q.Ahead(WaitSpec{Name: "new", Locations: []string{"cuda:1"}}))
	assert.Equal(t, map[string]int{"cuda:0": 1, "pageable-host": 1, "pinned-host": 1}, q.HeldAt(0),
		"HeldAt names the waiters' own locations; the ledger extends them to their groups")
	require.True(t, q.Remove(gpu))
	assert.Equal(t, []WaitID{host, pinned}, q.Eligible(nil))
}

// HeldAhead: a caller not yet queued is held by the waiters of its class
// or higher (HeldAt); a queued waiter's try by those ahead of it, bypass
// ones aside, whatever their locations.
func TestWaitQueueHeldAhead(t *testing.T) {
	q, err := NewWaitQueue(0)
	require.NoError(t, err)
	hi, err := q.Push(WaitSpec{Name: "hi", Class: 2, Locations: []string{"pageable-host"}})
	require.NoError(t, err)
	_, err = q.Push(WaitSpec{Name: "by", Class: 1, Locations: []string{"cuda:1"}, AllowBypass: true})
	require.NoError(t, err)
	mid, err := q.Push(WaitSpec{Name: "mid", Class: 1, Locations: []string{"cuda:0", "cuda:0"}})
	require.NoError(t, err)
	lo, err := q.Push(WaitSpec{Name: "lo", Locations: []string{"cuda:0"}})
	require.NoError(t, err)
	assert.Nil(t, q.HeldAhead(hi, 2), "the head: nobody ahead")
	assert.Equal(t, map[string]int{"pageable-host": 1}, q.HeldAhead(mid, 1))
	assert.Equal(t, map[string]int{"pageable-host": 1, "cuda:0": 1}, q.HeldAhead(lo, 0))
	assert.Equal(t, q.HeldAt(1), q.HeldAhead(0, 1))
	assert.Equal(t, map[string]int{"pageable-host": 1, "cuda:0": 2}, q.HeldAhead(0, 0))
}

func TestWaitQueueBound(t *testing.T) {
	_, err := NewWaitQueue(-1)
	var ie *InvalidInputError
	require.ErrorAs(t, err, &ie)
	q, err := NewWaitQueue(2)
	require.NoError(t, err)
	assert.Equal(t, 2, q.Max())
	_, err = q.Push(WaitSpec{Name: "a"})
	require.NoError(t, err)
	b, err := q.Push(WaitSpec{Name: "b"})
	require.NoError(t, err)
	_, err = q.Push(WaitSpec{Name: "c"})
	var qf *QueueFullError
	require.ErrorAs(t, err, &qf)
	assert.True(t, errors.Is(err, ErrBusy))
	assert.Equal(t, 2, q.Len(), "a refusal changes nothing")
	require.True(t, q.Remove(b))
	_, err = q.Push(WaitSpec{Name: "c"})
	require.NoError(t, err)
	d, _ := NewWaitQueue(0)
	assert.Equal(t, DefaultMaxWaiters, d.Max())
}

func TestRoomReleasesCountsRoomKinds(t *testing.T) {
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:0", HasBudget: true, BudgetBytes: 100}}})
	require.NoError(t, err)
	require.NoError(t, l.Reserve("cuda:0", "r", 10))
	assert.Equal(t, uint64(0), l.RoomReleases(), "a reservation makes no room")
	require.NoError(t, l.Unreserve("r"))
	assert.Equal(t, uint64(1), l.RoomReleases())
	for _, k := range []string{"remove", "fail", "unreserve", "resize", "release", "unhold", "reap_event", "complete", "discard"} {
		assert.True(t, RoomKind(k), k)
	}
	for _, k := range []string{"admit", "reserve", "acquire", "hold", "record_event", "register"} {
		assert.False(t, RoomKind(k), k)
	}
}

func TestCannotFit(t *testing.T) {
	h := Handle{Manager: "m", ID: 1, Name: "w"}
	sizes := map[uint64]int64{1: 80}
	bytes := func(h Handle) (int64, bool) { n, ok := sizes[h.ID]; return n, ok }
	budgets := map[string]int64{"cuda:0": 100, "cuda:1": 50, "cuda:2": math.MaxInt64}
	cases := []struct {
		name  string
		req   Request
		never bool
	}{
		{"fits", Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:0", Bytes: 100}}}, false},
		{"one reservation too big", Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:1", Bytes: 51}}}, true},
		{"two add up too big", Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:0", Bytes: 60}, {Name: "b", Location: "cuda:0", Bytes: 41}}}, true},
		{"no budget", Request{Reservations: []ReservationSpec{{Name: "a", Location: "pageable-host", Bytes: 1 << 40}}}, false},
		{"a sum above int64 at a budget of MaxInt64", Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:2", Bytes: math.MaxInt64}, {Name: "b", Location: "cuda:2", Bytes: math.MaxInt64}}}, true},
		{"a sum above int64 at a small budget", Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:0", Bytes: math.MaxInt64}, {Name: "b", Location: "cuda:0", Bytes: 2}}}, true},
		{"value fits one tier location", Request{Requirements: []Requirement{{Handle: h, Tiers: [][]string{{"cuda:1"}, {"cuda:0"}}}}}, false},
		{"value fits nowhere", Request{Requirements: []Requirement{{Handle: h, Tiers: [][]string{{"cuda:1"}}}}}, true},
		{"unknown value", Request{Requirements: []Requirement{{Handle: Handle{ID: 9}, Tiers: [][]string{{"cuda:1"}}}}}, false},
	}
	for _, tc := range cases {
		err := CannotFit(tc.req, budgets, bytes)
		if tc.never {
			var pe *PlanError
			assert.ErrorAs(t, err, &pe, tc.name)
		} else {
			assert.NoError(t, err, tc.name)
		}
	}
}

func TestCannotFitShared(t *testing.T) {
	h := Handle{Manager: "m", ID: 1, Name: "w"}
	sizes := map[uint64]int64{1: 80}
	bytes := func(h Handle) (int64, bool) { n, ok := sizes[h.ID]; return n, ok }
	groups := []SharedBudget{{Name: "igpu", Locations: []string{"cuda:0", "pageable-host"}, Bytes: 70}}
	cases := []struct {
		name  string
		req   Request
		never bool
	}{
		{"fits the group", Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:0", Bytes: 70}}}, false},
		{"members add up too big", Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:0", Bytes: 40}, {Name: "b", Location: "pageable-host", Bytes: 31}}}, true},
		{"outside every group", Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:1", Bytes: 1 << 40}}}, false},
		{"value larger than the group", Request{Requirements: []Requirement{{Handle: h, Tiers: [][]string{{"cuda:0"}}}}}, true},
		{"value fits a location outside the group", Request{Requirements: []Requirement{{Handle: h, Tiers: [][]string{{"cuda:0"}, {"cuda:1"}}}}}, false},
	}
	for _, tc := range cases {
		err := CannotFitShared(tc.req, groups, bytes)
		if tc.never {
			var pe *PlanError
			assert.ErrorAs(t, err, &pe, tc.name)
		} else {
			assert.NoError(t, err, tc.name)
		}
	}
	assert.NoError(t, CannotFitShared(Request{Reservations: []ReservationSpec{{Name: "a", Location: "cuda:0", Bytes: 1 << 40}}}, nil, bytes), "no groups")
}
