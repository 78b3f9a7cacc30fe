package cluster

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

// limited is a location of a summary with free bytes free (budget 1 GiB).
func limited(loc string, free int64) LocationSummary {
	return LocationSummary{Location: loc, HasBudget: true, BudgetBytes: 1 << 30, UsedBytes: 1<<30 - free}
}

// unlimited is a location of a summary without a budget.
func unlimited(loc string) LocationSummary { return LocationSummary{Location: loc} }

// rooms builds a view's summaries from per-node locations.
func rooms(by map[string][]LocationSummary) map[string]map[string]LocationSummary {
	var sums []NodeSummary
	for node, locs := range by {
		sums = append(sums, NodeSummary{Node: node, Locations: locs})
	}
	return roomsOf(sums)
}

// one asks for value at the locations of one tier each.
func one(value string, tiers ...[]string) PlacementRequirement {
	return PlacementRequirement{Value: value, Tiers: tiers}
}

// The ranking is a pure function of the request and the gathered view:
// each case pins one rule of the order [PlacementCandidate] documents,
// and which nodes are candidates at all.
func TestRankCandidates(t *testing.T) {
	const max = math.MaxInt64
	cases := []struct {
		name    string
		self    string
		members []string
		rooms   map[string][]LocationSummary
		where   map[string][]Residency
		req     PlacementRequest
		want    []PlacementCandidate
	}{{
		name:    "resident before room",
		members: []string{"a", "b"},
		rooms:   map[string][]LocationSummary{"a": {limited("cuda:0@a", 1000)}, "b": {limited("cuda:0@b", 200)}},
		where:   map[string][]Residency{"w": {{Location: "cuda:0@b", Node: "b", Bytes: 100, State: "resident"}}},
		req:     PlacementRequest{Requirements: []PlacementRequirement{one("w", []string{"cuda:0@*"})}},
		want: []PlacementCandidate{
			{Node: "b", TierRanks: []int{0}, Resident: []string{"w at cuda:0@b"}, HasSummary: true, Fits: true, FreeBytes: 200},
			{Node: "a", TierRanks: []int{0}, HasSummary: true, Fits: true, FreeBytes: 1000},
		},
	}, {
		name:    "resident nowhere: most room first; a node without the location is no candidate",
		members: []string{"a", "b", "c"},
		rooms:   map[string][]LocationSummary{"a": {limited("cuda:0@a", 300)}, "b": {limited("cuda:0@b", 500)}, "c": {unlimited("pageable-host@c")}},
		req:     PlacementRequest{Requirements: []PlacementRequirement{one("w", []string{"cuda:0@*"})}},
		want: []PlacementCandidate{
			{Node: "b", TierRanks: []int{0}, HasSummary: true, Fits: true, FreeBytes: 500},
			{Node: "a", TierRanks: []int{0}, HasSummary: true, Fits: true, FreeBytes: 300},
		},
	}, {
		name:    "the caller's tier order before residency and room",
		members: []string{"a", "b"},
		rooms:   map[string][]LocationSummary{"a": {limited("cuda:0@a", 10)}, "b": {limited("cuda:0@b", 900)}},
		where:   map[string][]Residency{"w": {{Location: "cuda:0@b", Node: "b", Bytes: 5, State: "resident"}}},
		req:     PlacementRequest{Requirements: []PlacementRequirement{one("w", []string{"cuda:0@a"}, []string{"cuda:0@*"})}},
		want: []PlacementCandidate{
			{Node: "a", TierRanks: []int{0}, HasSummary: true, Fits: true, FreeBytes: 10},
			{Node: "b", TierRanks: []int{1}, Resident: []string{"w at cuda:0@b"}, HasSummary: true, Fits: true, FreeBytes: 900},
		},
	}, {
		name:    "room for every requirement before more free bytes in all",
		members: []string{"a", "b"},
		rooms: map[string][]LocationSummary{
			"a": {limited("cuda:0@a", 300), limited("pageable-host@a", 10000)},
			"b": {limited("cuda:0@b", 500), limited("pageable-host@b", 600)},
		},
		where: map[string][]Residency{"big": {{Location: "cuda:0@x", Node: "x", Bytes: 400, State: "resident"}}},
		req: PlacementRequest{Requirements: []PlacementRequirement{
			one("big", []string{"cuda:0@*"}), one("small", []string{"pageable-host@*"})}},
		want: []PlacementCandidate{
			{Node: "b", TierRanks: []int{0, 0}, HasSummary: true, Fits: true, FreeBytes: 1100},
			{Node: "a", TierRanks: []int{0, 0}, HasSummary: true, FreeBytes: 10300},
		},
	}, {
		name:    "a copy that is leaving is not resident",
		members: []string{"a", "b"},
		rooms:   map[string][]LocationSummary{"a": {limited("cuda:0@a", 50)}, "b": {limited("cuda:0@b", 60)}},
		where:   map[string][]Residency{"w": {{Location: "cuda:0@a", Node: "a", Bytes: 100, State: "leaving"}}},
		req:     PlacementRequest{Requirements: []PlacementRequirement{one("w", []string{"cuda:0@*"})}},
		want: []PlacementCandidate{
			{Node: "b", TierRanks: []int{0}, HasSummary: true, FreeBytes: 60},
			{Node: "a", TierRanks: []int{0}, HasSummary: true, FreeBytes: 50},
		},
	}, {
		name:    "a node without a summary gets the benefit of the doubt, ranked after known room",
		members: []string{"a", "b"},
		rooms:   map[string][]LocationSummary{"b": {limited("cuda:0@b", 1)}},
		req:     PlacementRequest{Requirements: []PlacementRequirement{one("w", []string{"cuda:0@*"})}},
		want: []PlacementCandidate{
			{Node: "b", TierRanks: []int{0}, HasSummary: true, Fits: true, FreeBytes: 1},
			{Node: "a", TierRanks: []int{0}},
		},
	}, {
		name:    "bare locations are the placing node's; a named non-member is a candidate",
		self:    "b",
		members: []string{"a", "b"},
		rooms:   map[string][]LocationSummary{"a": {limited("cuda:0@a", 9)}, "b": {limited("cuda:0@b", 5)}},
		req:     PlacementRequest{Requirements: []PlacementRequirement{one("w", []string{"cuda:0"}, []string{"cuda:0@ghost"})}},
		want: []PlacementCandidate{
			{Node: "b", TierRanks: []int{0}, HasSummary: true, Fits: true, FreeBytes: 5},
			{Node: "ghost", TierRanks: []int{1}},
		},
	}, {
		name:    "a reservation's location must be there too",
		members: []string{"a", "b"},
		rooms: map[string][]LocationSummary{
			"a": {limited("cuda:0@a", 9), unlimited("pinned-host@a")},
			"b": {limited("cuda:0@b", 99)},
		},
		req: PlacementRequest{Requirements: []PlacementRequirement{one("w", []string{"cuda:0@*"})},
			Reservations: []system.ReservationSpec{{Name: "io", Location: "pinned-host@*", Bytes: 5}}},
		want: []PlacementCandidate{{Node: "a", TierRanks: []int{0}, HasSummary: true, Fits: true, FreeBytes: 9}},
	}, {
		name:    "unlimited room saturates; equal nodes by name",
		members: []string{"a", "b", "c"},
		rooms: map[string][]LocationSummary{
			"a": {unlimited("cuda:0@a"), unlimited("pageable-host@a")},
			"b": {limited("cuda:0@b", 7), limited("pageable-host@b", 7)},
			"c": {limited("cuda:0@c", 7), limited("pageable-host@c", 7)},
		},
		req: PlacementRequest{Requirements: []PlacementRequirement{
			one("w", []string{"cuda:0@*"}), one("kv", []string{"pageable-host@*"})}},
		want: []PlacementCandidate{
			{Node: "a", TierRanks: []int{0, 0}, HasSummary: true, Fits: true, FreeBytes: max},
			{Node: "b", TierRanks: []int{0, 0}, HasSummary: true, Fits: true, FreeBytes: 14},
			{Node: "c", TierRanks: []int{0, 0}, HasSummary: true, Fits: true, FreeBytes: 14},
		},
	}, {
		name:    "no node has the location",
		members: []string{"a"},
		rooms:   map[string][]LocationSummary{"a": {limited("cuda:0@a", 9)}},
		req:     PlacementRequest{Requirements: []PlacementRequirement{one("w", []string{"cuda:3@*"})}},
		want:    nil,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Name = "r"
			if tc.self == "" {
				tc.self = "a"
			}
			p, err := parsePlacement(tc.req)
			require.NoError(t, err)
			v := clusterView{self: tc.self, members: tc.members, rooms: rooms(tc.rooms), where: tc.where}
			got := rankCandidates(p, v)
			var ev []PlacementCandidate
			for _, c := range got {
				ev = append(ev, c.PlacementCandidate)
			}
			require.Equal(t, tc.want, ev)
			// Deterministic: the same input ranks the same way again.
			again := rankCandidates(p, v)
			require.Equal(t, len(got), len(again))
			for i := range got {
				require.Equal(t, got[i], again[i])
			}
		})
	}
}

// Each candidate carries the request restricted to its own locations:
// per requirement the tiers that name one of them (empty tiers dropped),
// unqualified; the reservations at its locations.
func TestRankCandidatesRestrictsTheRequest(t *testing.T) {
	p, err := parsePlacement(PlacementRequest{Name: "r",
		Requirements: []PlacementRequirement{one("w", []string{"cuda:1@*", "cuda:0@*"}, []string{"cuda:2@b"}, []string{"pageable-host@*"})},
		Reservations: []system.ReservationSpec{{Name: "io", Location: "pageable-host@*", Bytes: 5}}})
	require.NoError(t, err)
	v := clusterView{self: "a", members: []string{"a", "b"}, rooms: rooms(map[string][]LocationSummary{
		"a": {limited("cuda:0@a", 1), unlimited("pageable-host@a")},
		"b": {limited("cuda:0@b", 1), limited("cuda:1@b", 1), limited("cuda:2@b", 1), unlimited("pageable-host@b")},
	})}
	got := rankCandidates(p, v)
	require.Len(t, got, 2)
	by := map[string]*candidate{got[0].Node: got[0], got[1].Node: got[1]}
	tiers := func(c *candidate) [][]string {
		var out [][]string
		for _, t := range c.reqs[0].Tiers {
			out = append(out, t.Locations)
		}
		return out
	}
	require.Equal(t, [][]string{{"cuda:0"}, {"pageable-host"}}, tiers(by["a"]))
	require.Equal(t, [][]string{{"cuda:1", "cuda:0"}, {"cuda:2"}, {"pageable-host"}}, tiers(by["b"]))
	for _, c := range got {
		require.Len(t, c.resv, 1)
		require.Equal(t, "pageable-host", c.resv[0].Location)
		require.Equal(t, int64(5), c.resv[0].Bytes)
	}
}

// Validation refuses a malformed request before anything is asked, and
// collects the nodes the request names.
func TestParsePlacement(t *testing.T) {
	for _, tc := range []struct {
		req  PlacementRequest
		want string
	}{
		{PlacementRequest{}, "request name is empty"},
		{PlacementRequest{Name: "r"}, "no requirements and no reservations"},
		{PlacementRequest{Name: "r", Requirements: []PlacementRequirement{{}}}, "requirement 0 has no value name"},
		{PlacementRequest{Name: "r", Requirements: []PlacementRequirement{one("w", []string{"gpu:0@*"})}}, "requirement 0 (w)"},
		{PlacementRequest{Name: "r", Reservations: []system.ReservationSpec{{Name: "io", Location: "cuda:0@"}}}, `reservation "io"`},
	} {
		_, err := parsePlacement(tc.req)
		require.ErrorIs(t, err, system.ErrInvalidInput)
		require.ErrorContains(t, err, tc.want)
	}
	p, err := parsePlacement(PlacementRequest{Name: "r",
		Requirements: []PlacementRequirement{one("w", []string{"cuda:0@c", "cuda:0@*", "cuda:0"}, []string{"pageable-host@b"})},
		Reservations: []system.ReservationSpec{{Name: "io", Location: "pinned-host@c"}}})
	require.NoError(t, err)
	require.Equal(t, []string{"b", "c"}, p.named)
	require.Equal(t, DefaultPlacementAttempts, p.maxAttempts)
	require.Equal(t, []locRef{{loc: "cuda:0", node: "c"}, {loc: "cuda:0", node: AnyNode}, {loc: "cuda:0"}}, p.tiers[0][0])
}
