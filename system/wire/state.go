package wire

import "github.com/residency-go/residency/system"

// Transition is one transition of a trace or a report.
type Transition struct {
	Version  uint64  `json:"version"`
	Kind     string  `json:"kind"`
	Handle   *string `json:"handle"`
	Location *string `json:"location"`
	Bytes    int64   `json:"bytes"`
	Detail   string  `json:"detail"`
}

// Report is a plan execution's report.
type Report struct {
	Transitions []Transition `json:"transitions"`
}

// Explanation is whether a request fits, and the peaks it predicts.
type Explanation struct {
	Feasible           bool          `json:"feasible"`
	Reason             *string       `json:"reason"`
	PredictedPeakBytes LocationBytes `json:"predicted_peak_bytes"`
}

// Eviction is a decision's victim.
type Eviction struct {
	Handle   string `json:"handle"`
	Location string `json:"location"`
	Bytes    int64  `json:"bytes"`
	Reason   string `json:"reason"`
	To       string `json:"to,omitempty"` // the spill target the victim is demoted to; absent when it is dropped
	// Owner and Charge name an idle cache entry's charge (kind
	// idle_cache_entry; Handle is then ""); absent for a value.
	Owner  string `json:"owner,omitempty"`
	Charge string `json:"charge,omitempty"`
}

// Decision is a decide op's answer.
type Decision struct {
	ExpectedStateVersion uint64      `json:"expected_state_version"`
	ExploredStates       int         `json:"explored_states"`
	Evictions            []Eviction  `json:"evictions"`
	Plan                 Plan        `json:"plan"`
	Explanation          Explanation `json:"explanation"`
	Exhaustive           bool        `json:"exhaustive"`
}

// SnapshotReservation is a reservation at a snapshot's location.
type SnapshotReservation struct {
	Name  string  `json:"name"`
	Bytes int64   `json:"bytes"`
	Owner *string `json:"owner,omitempty"` // a scope or a cache
}

// SnapshotLocation is a snapshot's location.
type SnapshotLocation struct {
	Location      string                `json:"location"`
	BudgetBytes   *int64                `json:"budget_bytes"`
	UsedBytes     int64                 `json:"used_bytes"`
	ReservedBytes int64                 `json:"reserved_bytes"`
	PeakBytes     int64                 `json:"peak_bytes"`
	Reservations  []SnapshotReservation `json:"reservations"`
}

// SnapshotMaterialization is a value's copy at a location.
type SnapshotMaterialization struct {
	Location          string `json:"location"`
	State             string `json:"state"`
	ChargedBytes      int64  `json:"charged_bytes"`
	UseCount          int    `json:"use_count"`
	HoldCount         int    `json:"hold_count"`
	PendingEventCount int    `json:"pending_event_count"`
}

// SnapshotValue is a snapshot's value.
type SnapshotValue struct {
	Handle           string                    `json:"handle"`
	Bytes            int64                     `json:"bytes"`
	ReplicaMode      string                    `json:"replica_mode"`
	HasSource        bool                      `json:"has_source"`
	SourceLocation   *string                   `json:"source_location"`
	Discarded        bool                      `json:"discarded"`
	Recoverable      bool                      `json:"recoverable"`
	Materializations []SnapshotMaterialization `json:"materializations"`
}

// Snapshot is a snapshot op's state.
type Snapshot struct {
	StateVersion uint64             `json:"state_version"`
	ManagerID    string             `json:"manager_id"`
	Locations    []SnapshotLocation `json:"locations"`
	Values       []SnapshotValue    `json:"values"`
}

// TransitionsOf is ts in their JSON form; detail gives a transition's
// detail (nil: its Detail as it is).
func TransitionsOf(ts []system.Transition, detail func(system.Transition) string) []Transition {
	out := make([]Transition, 0, len(ts))
	for _, t := range ts {
		d := t.Detail
		if detail != nil {
			d = detail(t)
		}
		out = append(out, Transition{Version: t.Version, Kind: t.Kind, Handle: Nullable(t.Handle),
			Location: Nullable(t.Location), Bytes: t.Bytes, Detail: d})
	}
	return out
}

// System is the transition t names, its structured fields (id, lease,
// name, failure) left zero.
func (t Transition) System() system.Transition {
	return system.Transition{Version: t.Version, Kind: t.Kind, Handle: Text(t.Handle), Location: Text(t.Location), Bytes: t.Bytes, Detail: t.Detail}
}

// ExplanationOf is e in its JSON form.
func ExplanationOf(e system.Explanation) Explanation {
	peaks := LocationBytes{}
	for k, v := range e.PredictedPeakBytes {
		peaks[k] = v
	}
	return Explanation{Feasible: e.Feasible, Reason: Nullable(e.Reason), PredictedPeakBytes: peaks}
}

// System is the explanation e names.
func (e Explanation) System() system.Explanation {
	return system.Explanation{Feasible: e.Feasible, Reason: Text(e.Reason), PredictedPeakBytes: e.PredictedPeakBytes}
}

// MaterializationOf is m in its JSON form.
func MaterializationOf(m system.MaterializationRecord) SnapshotMaterialization {
	return SnapshotMaterialization{Location: m.Location, State: m.State.String(), ChargedBytes: m.ChargedBytes,
		UseCount: m.UseCount, HoldCount: m.HoldCount, PendingEventCount: m.PendingEventCount}
}

// DecisionOf is d in its JSON form.
func DecisionOf(d system.Decision) *Decision {
	out := &Decision{
		ExpectedStateVersion: d.ExpectedStateVersion,
		ExploredStates:       d.ExploredStates,
		Evictions:            make([]Eviction, 0, len(d.Evictions)),
		Plan:                 PlanOf(d.Plan),
		Explanation:          ExplanationOf(d.Explanation),
		Exhaustive:           d.Exhaustive,
	}
	for _, e := range d.Evictions {
		out.Evictions = append(out.Evictions, Eviction{Handle: e.Handle.Name, Location: e.Location, Bytes: e.Bytes, Reason: e.Reason, To: e.To, Owner: e.Owner, Charge: e.Charge})
	}
	return out
}

// System is the decision d names: its evictions by handle name, location,
// bytes and reason.
func (d Decision) System() system.Decision {
	out := system.Decision{ExpectedStateVersion: d.ExpectedStateVersion, ExploredStates: d.ExploredStates,
		Plan: d.Plan.System(), Explanation: d.Explanation.System(), Exhaustive: d.Exhaustive}
	for _, e := range d.Evictions {
		out.Evictions = append(out.Evictions, system.Eviction{Handle: system.Handle{Name: e.Handle}, Location: e.Location, Bytes: e.Bytes, Reason: e.Reason})
	}
	return out
}
