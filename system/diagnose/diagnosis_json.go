package diagnose

import (
	"bytes"
	"encoding/json"

	"github.com/residency-go/residency/system/wire"
)

// The JSON form of a diagnosis ([Diagnosis.MarshalJSON]; `demo diagnose
// --json` prints it under "diagnosis"): keys in snake_case, in the order
// below, every key always present.
// A part that does not apply to the class is null (budget, protection,
// search, stale, execution), a list with nothing in it is [], and a text
// field that does not apply is null. Plans, transitions, materializations
// and evictions have the shapes of the replay output (docs/replay.md).
//
//	{"class", "message", "meaning", "first_action",
//	  "operation": {"kind", "handle", "location", "from", "reservation", "bytes"},
//	  "state_version", "manager_id",
//	  "capture": {"state_version", "trace_oldest", "trace_newest", "one_view", "at_failure", "differences"},
//	  "steps": [{"number", "title", "findings": [{"what", "figures": [{"name", "value"}], "verdict"}]}],
//	  "endpoints", "budget", "protection", "search", "stale", "execution"}
//
// execution.cause is a diagnosis of the same form (its capture is not
// checked: zeros and nulls).

// MarshalJSON writes the diagnosis in its JSON form (above), without
// HTML escaping. Text fields that do not apply are null.
func (d Diagnosis) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(toDiagnosisJSON(d)); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

type diagnosisJSON struct {
	Class        string          `json:"class"`
	Message      string          `json:"message"`
	Meaning      string          `json:"meaning"`
	FirstAction  string          `json:"first_action"`
	Operation    operationJSON   `json:"operation"`
	StateVersion uint64          `json:"state_version"`
	ManagerID    string          `json:"manager_id"`
	Capture      captureJSON     `json:"capture"`
	Steps        []stepJSON      `json:"steps"`
	Endpoints    []endpointJSON  `json:"endpoints"`
	Budget       *budgetJSON     `json:"budget"`
	Protection   *protectionJSON `json:"protection"`
	Search       *searchJSON     `json:"search"`
	Stale        *staleJSON      `json:"stale"`
	Execution    *executionJSON  `json:"execution"`
}

type operationJSON struct {
	Kind        *string `json:"kind"`
	Handle      *string `json:"handle"`
	Location    *string `json:"location"`
	From        *string `json:"from"`
	Reservation *string `json:"reservation"`
	Bytes       *int64  `json:"bytes"` // a reservation's; null otherwise
}

type captureJSON struct {
	StateVersion uint64   `json:"state_version"`
	TraceOldest  uint64   `json:"trace_oldest"` // 0: the trace is empty
	TraceNewest  uint64   `json:"trace_newest"`
	OneView      bool     `json:"one_view"`
	AtFailure    *bool    `json:"at_failure"` // null: nothing to compare
	Differences  []string `json:"differences"`
}

type stepJSON struct {
	Number   int           `json:"number"`
	Title    string        `json:"title"`
	Findings []findingJSON `json:"findings"`
}

type findingJSON struct {
	What    string       `json:"what"`
	Figures []figureJSON `json:"figures"`
	Verdict *string      `json:"verdict"`
}

type figureJSON struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type endpointJSON struct {
	Value            string                         `json:"value"`
	Location         *string                        `json:"location"`
	Live             bool                           `json:"live"`
	Gone             *string                        `json:"gone"`
	Bytes            int64                          `json:"bytes"`
	ReplicaMode      *string                        `json:"replica_mode"` // null when not live
	Recoverable      bool                           `json:"recoverable"`
	HasSource        bool                           `json:"has_source"`
	SourceLocation   *string                        `json:"source_location"`
	Materializations []wire.SnapshotMaterialization `json:"materializations"`
	AtLocation       *wire.SnapshotMaterialization  `json:"at_location"`
}

type locationNowJSON struct {
	Location       string                     `json:"location"`
	BudgetBytes    *int64                     `json:"budget_bytes"`
	UsedBytes      int64                      `json:"used_bytes"`
	TemporaryBytes int64                      `json:"temporary_bytes"`
	ReservedBytes  int64                      `json:"reserved_bytes"`
	PeakBytes      int64                      `json:"peak_bytes"`
	Reservations   []wire.SnapshotReservation `json:"reservations"`
}

type budgetJSON struct {
	Location       string           `json:"location"`
	BudgetBytes    int64            `json:"budget_bytes"`
	UsedBytes      int64            `json:"used_bytes"`
	ReservedBytes  int64            `json:"reserved_bytes"`
	RequestedBytes int64            `json:"requested_bytes"`
	CurrentCharged int64            `json:"current_charged"`
	NewPeak        int64            `json:"new_peak"`
	MissingBytes   int64            `json:"missing_bytes"`
	Charge         string           `json:"charge"`
	ChargeReason   string           `json:"charge_reason"`
	Now            *locationNowJSON `json:"now"`
}

type lifetimeJSON struct {
	Kind    string  `json:"kind"`
	ID      string  `json:"id"`
	Version uint64  `json:"version"`
	Lease   *string `json:"lease"` // an event's lease
}

type protectionJSON struct {
	Value             string                        `json:"value"`
	Location          string                        `json:"location"`
	UseCount          int                           `json:"use_count"`
	HoldCount         int                           `json:"hold_count"`
	PendingEventCount int                           `json:"pending_event_count"`
	Leases            []lifetimeJSON                `json:"leases"`
	Holds             []lifetimeJSON                `json:"holds"`
	Events            []lifetimeJSON                `json:"events"`
	Complete          bool                          `json:"complete"`
	Now               *wire.SnapshotMaterialization `json:"now"`
}

type locationBytesJSON struct {
	Location string `json:"location"`
	Bytes    int64  `json:"bytes"`
}

type searchJSON struct {
	RequestName          *string             `json:"request_name"`
	StateLimit           *int                `json:"state_limit"` // a search limit error's
	ExploredStates       int                 `json:"explored_states"`
	Exhaustive           bool                `json:"exhaustive"`
	ExpectedStateVersion uint64              `json:"expected_state_version"`
	Detail               *string             `json:"detail"`
	Evictions            []wire.Eviction     `json:"evictions"`
	Plan                 *wire.Plan          `json:"plan"`
	Feasible             bool                `json:"feasible"`
	Reason               *string             `json:"reason"`
	PredictedPeaks       []locationBytesJSON `json:"predicted_peaks"`
}

type staleJSON struct {
	ExpectedVersion uint64            `json:"expected_version"`
	ActualVersion   uint64            `json:"actual_version"`
	Intervening     []wire.Transition `json:"intervening"`
	Covered         bool              `json:"covered"`
	Missing         uint64            `json:"missing"`
}

type executionJSON struct {
	Phase                  string            `json:"phase"`
	FailedAction           *wire.Action      `json:"failed_action"`
	FailedActionIndex      *int              `json:"failed_action_index"`
	FailedReservation      *wire.Reservation `json:"failed_reservation"`
	FailedReservationIndex *int              `json:"failed_reservation_index"`
	Committed              []wire.Transition `json:"committed"`
	Kept                   []string          `json:"kept"`
	Cleaned                []string          `json:"cleaned"`
	FailedStep             []string          `json:"failed_step"`
	Cause                  *diagnosisJSON    `json:"cause"`
}

func strs(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

func toLifetimesJSON(ls []Lifetime) []lifetimeJSON {
	out := make([]lifetimeJSON, 0, len(ls))
	for _, l := range ls {
		out = append(out, lifetimeJSON{Kind: l.Kind, ID: l.ID, Version: l.Version, Lease: nullable(l.Lease)})
	}
	return out
}

// toDiagnosisJSON is d's JSON form.
func toDiagnosisJSON(d Diagnosis) diagnosisJSON {
	out := diagnosisJSON{
		Class: d.Class, Message: d.Message, Meaning: d.Meaning, FirstAction: d.FirstAction,
		Operation: operationJSON{Kind: nullable(d.Op.Kind), Handle: nullable(d.Op.Handle.Name), Location: nullable(d.Op.Location),
			From: nullable(d.Op.From), Reservation: nullable(d.Op.Reservation)},
		StateVersion: d.StateVersion, ManagerID: d.ManagerID,
		Capture: captureJSON{StateVersion: d.Capture.StateVersion, TraceOldest: d.Capture.TraceOldest, TraceNewest: d.Capture.TraceNewest,
			OneView: d.Capture.OneView, AtFailure: d.Capture.AtFailure, Differences: strs(d.Capture.Differences)},
		Steps:     make([]stepJSON, 0, len(d.Steps)),
		Endpoints: make([]endpointJSON, 0, len(d.Endpoints)),
	}
	if d.Op.Reservation != "" {
		b := d.Op.Bytes
		out.Operation.Bytes = &b
	}
	for _, s := range d.Steps {
		sj := stepJSON{Number: s.Number, Title: s.Title, Findings: make([]findingJSON, 0, len(s.Findings))}
		for _, f := range s.Findings {
			fj := findingJSON{What: f.What, Figures: make([]figureJSON, 0, len(f.Figures)), Verdict: nullable(f.Verdict)}
			for _, x := range f.Figures {
				fj.Figures = append(fj.Figures, figureJSON(x))
			}
			sj.Findings = append(sj.Findings, fj)
		}
		out.Steps = append(out.Steps, sj)
	}
	for _, e := range d.Endpoints {
		ej := endpointJSON{Value: e.Value, Location: nullable(e.Location), Live: e.Live, Gone: nullable(e.Gone), Bytes: e.Bytes,
			Recoverable: e.Recoverable, HasSource: e.HasSource, SourceLocation: nullable(e.SourceLocation),
			Materializations: make([]wire.SnapshotMaterialization, 0, len(e.Materializations))}
		if e.Live {
			ej.ReplicaMode = nullable(e.ReplicaMode.String())
		}
		for _, m := range e.Materializations {
			ej.Materializations = append(ej.Materializations, wire.MaterializationOf(m))
		}
		if e.AtLocation != nil {
			m := wire.MaterializationOf(*e.AtLocation)
			ej.AtLocation = &m
		}
		out.Endpoints = append(out.Endpoints, ej)
	}
	if b := d.Budget; b != nil {
		out.Budget = toBudgetJSON(b)
	}
	if p := d.Protection; p != nil {
		out.Protection = toProtectionJSON(p)
	}
	if s := d.Search; s != nil {
		out.Search = toSearchJSON(s)
	}
	if s := d.Stale; s != nil {
		out.Stale = &staleJSON{ExpectedVersion: s.ExpectedVersion, ActualVersion: s.ActualVersion,
			Intervening: wire.TransitionsOf(s.Intervening, nil), Covered: s.Covered, Missing: s.Missing}
	}
	if e := d.Execution; e != nil {
		ej := &executionJSON{Phase: e.Phase, Committed: wire.TransitionsOf(e.Committed, nil),
			Kept: strs(e.Kept), Cleaned: strs(e.Cleaned), FailedStep: strs(e.FailedStep)}
		if e.FailedAction != nil {
			a := wire.ActionOf(*e.FailedAction)
			i := e.FailedActionIndex
			ej.FailedAction, ej.FailedActionIndex = &a, &i
		}
		if e.FailedReservation != nil {
			r := wire.ReservationOf(*e.FailedReservation)
			i := e.FailedReservationIndex
			ej.FailedReservation, ej.FailedReservationIndex = &r, &i
		}
		if e.Cause != nil {
			c := toDiagnosisJSON(*e.Cause)
			ej.Cause = &c
		}
		out.Execution = ej
	}
	return out
}

func toBudgetJSON(b *BudgetArithmetic) *budgetJSON {
	bj := &budgetJSON{Location: b.Location, BudgetBytes: b.BudgetBytes, UsedBytes: b.UsedBytes, ReservedBytes: b.ReservedBytes,
		RequestedBytes: b.RequestedBytes, CurrentCharged: b.CurrentCharged, NewPeak: b.NewPeak, MissingBytes: b.MissingBytes,
		Charge: string(b.Charge), ChargeReason: b.ChargeReason}
	if l := b.Now; l != nil {
		n := &locationNowJSON{Location: l.Location, UsedBytes: l.UsedBytes, TemporaryBytes: l.TemporaryBytes,
			ReservedBytes: l.ReservedBytes, PeakBytes: l.PeakBytes, Reservations: make([]wire.SnapshotReservation, 0, len(l.Reservations))}
		if l.HasBudget {
			v := l.BudgetBytes
			n.BudgetBytes = &v
		}
		for _, r := range l.Reservations {
			n.Reservations = append(n.Reservations, wire.SnapshotReservation{Name: r.Name, Bytes: r.Bytes, Owner: nullable(r.Owner)})
		}
		bj.Now = n
	}
	return bj
}

func toProtectionJSON(p *ProtectionOwners) *protectionJSON {
	pj := &protectionJSON{Value: p.Value, Location: p.Location, UseCount: p.UseCount, HoldCount: p.HoldCount,
		PendingEventCount: p.PendingEventCount, Leases: toLifetimesJSON(p.Leases), Holds: toLifetimesJSON(p.Holds),
		Events: toLifetimesJSON(p.Events), Complete: p.Complete}
	if p.Now != nil {
		m := wire.MaterializationOf(*p.Now)
		pj.Now = &m
	}
	return pj
}

func toSearchJSON(s *SearchEvidence) *searchJSON {
	sj := &searchJSON{RequestName: nullable(s.RequestName), ExploredStates: s.ExploredStates, Exhaustive: s.Exhaustive,
		ExpectedStateVersion: s.ExpectedStateVersion, Detail: nullable(s.Detail), Evictions: make([]wire.Eviction, 0, len(s.Evictions)),
		Feasible: s.Feasible, Reason: nullable(s.Reason), PredictedPeaks: make([]locationBytesJSON, 0, len(s.PredictedPeaks))}
	if s.StateLimit != 0 {
		l := s.StateLimit
		sj.StateLimit = &l
	}
	for _, e := range s.Evictions {
		sj.Evictions = append(sj.Evictions, wire.Eviction{Handle: e.Handle.Name, Location: e.Location, Bytes: e.Bytes, Reason: e.Reason})
	}
	if s.Plan != nil {
		p := wire.PlanOf(*s.Plan)
		sj.Plan = &p
	}
	for _, p := range s.PredictedPeaks {
		sj.PredictedPeaks = append(sj.PredictedPeaks, locationBytesJSON(p))
	}
	return sj
}
