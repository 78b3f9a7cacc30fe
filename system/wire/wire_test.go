package wire

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

// TestSnapshotRoundTrip: a snapshot written in its JSON form and read
// back names the same state (handles by name, under the snapshot's
// manager).
func TestSnapshotRoundTrip(t *testing.T) {
	in := system.Snapshot{StateVersion: 7, ManagerID: "m", Locations: []system.LocationRecord{
		{Location: "cuda:0", HasBudget: true, BudgetBytes: 100, UsedBytes: 40, ReservedBytes: 10, PeakBytes: 60,
			Reservations: []system.ReservationRecord{{Name: "r", Bytes: 10, Owner: `scope "s"`}}},
		{Location: "pageable-host", UsedBytes: 1},
	}, Values: []system.ValueRecord{{Handle: system.Handle{Manager: "m", Name: "a"}, Bytes: 40, ReplicaMode: system.Replicable,
		HasSource: true, SourceLocation: "pageable-host", Recoverable: true,
		Materializations: []system.MaterializationRecord{{Location: "cuda:0", State: system.Leaving, ChargedBytes: 40, UseCount: 1}}}}}
	b, err := Marshal(SnapshotOf(in, nil))
	require.NoError(t, err)
	var back Snapshot
	require.NoError(t, json.Unmarshal(b, &back))
	got := back.System()
	assert.Equal(t, in.Locations[0].Reservations, got.Locations[0].Reservations)
	assert.Equal(t, in.Values, got.Values)
	assert.Equal(t, in.StateVersion, got.StateVersion)
	assert.Contains(t, string(b), `"budget_bytes":null`, "a location without a budget")
}

// TestDecisionForm: a decision's peaks are written in location order,
// a text that does not apply as null, and read back.
func TestDecisionForm(t *testing.T) {
	d := system.Decision{ExpectedStateVersion: 3, Explanation: system.Explanation{Feasible: true,
		PredictedPeakBytes: map[string]int64{"cuda:1": 2, "cuda:0": 1, "pinned-host": 3, "pageable-host": 4}},
		Evictions: []system.Eviction{{Handle: system.Handle{Name: "v"}, Location: "cuda:0", Bytes: 5, Reason: "r"}}}
	b, err := Marshal(DecisionOf(d))
	require.NoError(t, err)
	assert.Equal(t, `{"expected_state_version":3,"explored_states":0,"evictions":[{"handle":"v","location":"cuda:0","bytes":5,"reason":"r"}],`+
		`"plan":{"reclaim":[],"reservations":[],"enter":[]},"explanation":{"feasible":true,"reason":null,`+
		`"predicted_peak_bytes":{"pageable-host":4,"pinned-host":3,"cuda:0":1,"cuda:1":2}},"exhaustive":false}`, string(b))
	var back Decision
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, d.Evictions, back.System().Evictions)
	assert.Equal(t, d.Explanation, back.System().Explanation)
}

// TestMarshalEscapes: Marshal writes no HTML escapes and escapes what a
// terminal would obey.
func TestMarshalEscapes(t *testing.T) {
	b, err := Marshal(Object{{Key: "m", Value: "a < b \u009b \u202e"}})
	require.NoError(t, err)
	assert.Equal(t, `{"m":"a < b \u009b \u202e"}`, string(b))
}
