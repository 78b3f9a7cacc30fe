package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/residency-go/residency/system"
)

// The JSON shapes of replay results. Field order is the order of the
// contract; encoding/json keeps struct order. A string that the runtime
// leaves empty because it does not apply (a reservation's handle, an
// unavailable location, a feasible plan's reason) is written as null.

type result struct {
	Line         int               `json:"line"`
	Op           string            `json:"op"`
	OK           bool              `json:"ok"`
	StateVersion uint64            `json:"state_version"`
	Error        *errorJSON        `json:"error,omitempty"`
	Explanation  *explanationJSON  `json:"explanation,omitempty"`
	Report       *reportJSON       `json:"report,omitempty"`
	Decision     *decisionJSON     `json:"decision,omitempty"`
	Snapshot     *snapshotJSON     `json:"snapshot,omitempty"`
	Trace        *[]transitionJSON `json:"trace,omitempty"`
	Load         *loadJSON         `json:"load,omitempty"`
	Evicted      *bool             `json:"evicted,omitempty"`
	Stats        *cacheStatsJSON   `json:"stats,omitempty"`
	Staging      *stagingJSON      `json:"staging,omitempty"`
	// TaskTransitions: the write pipeline's task moves during a staging
	// op (staging_ops.go), shown whatever the op's outcome.
	TaskTransitions []taskTransitionJSON `json:"task_transitions,omitempty"`

	// Not printed: the error itself (for the table) and whether the
	// line's expectation held.
	err         error
	expectation string
}

// errorJSON is {type, message, field…}: the error's fields follow type and
// message in the order the contract lists them.
type errorJSON struct {
	Type    string
	Message string
	Fields  []kv
}

type kv struct {
	Key   string
	Value any
}

func (e *errorJSON) MarshalJSON() ([]byte, error) {
	o := append([]kv{{"type", e.Type}, {"message", e.Message}}, e.Fields...)
	return orderedObject(o).MarshalJSON()
}

// orderedObject marshals as a JSON object with keys in slice order.
type orderedObject []kv

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := marshal(f.Key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		v, err := marshal(f.Value)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// marshal is json.Marshal without HTML escaping: messages such as
// "used 3 + requested 6 > budget 8" stay readable.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return escapeJSONControls(bytes.TrimSuffix(b.Bytes(), []byte("\n"))), nil
}

// escapeJSONControls escapes DEL, the C1 control characters (U+0080 to
// U+009F) and the bidirectional overrides (U+202A–U+202E, U+2066–U+2069),
// which encoding/json leaves raw but a terminal may obey (U+009B starts
// an escape sequence) or use to show text out of order. They can only
// occur inside strings, so the result is the same JSON value. C0 controls
// are escaped by the encoder.
func escapeJSONControls(b []byte) []byte {
	i := 0
	for i < len(b) && b[i] != 0x7f && b[i] != 0xc2 && b[i] != 0xe2 {
		i++
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	out = append(out, b[:i]...)
	for ; i < len(b); i++ {
		switch {
		case b[i] == 0x7f:
			out = append(out, `\u007f`...)
		case b[i] == 0xc2 && i+1 < len(b) && b[i+1] >= 0x80 && b[i+1] <= 0x9f:
			out = append(out, fmt.Sprintf(`\u%04x`, b[i+1])...)
			i++
		case b[i] == 0xe2 && i+2 < len(b) && needsEscape(decodeRune3(b[i:i+3])):
			out = append(out, fmt.Sprintf(`\u%04x`, decodeRune3(b[i:i+3]))...)
			i += 2
		default:
			out = append(out, b[i])
		}
	}
	return out
}

// decodeRune3 decodes a three-byte UTF-8 sequence (or returns 0).
func decodeRune3(b []byte) rune {
	if b[1]&0xc0 != 0x80 || b[2]&0xc0 != 0x80 {
		return 0
	}
	return rune(b[0]&0x0f)<<12 | rune(b[1]&0x3f)<<6 | rune(b[2]&0x3f)
}

// locationInts marshals a map from location to bytes in location order.
type locationInts map[string]int64

func (m locationInts) MarshalJSON() ([]byte, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortLocations(keys)
	o := make(orderedObject, len(keys))
	for i, k := range keys {
		o[i] = kv{k, m[k]}
	}
	return o.MarshalJSON()
}

// nullable returns nil (JSON null) for an empty string.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

type actionJSON struct {
	Handle   string  `json:"handle"`
	Location string  `json:"location"`
	From     *string `json:"from,omitempty"`
}

type reservationJSON struct {
	Name     string `json:"name"`
	Location string `json:"location"`
	Bytes    int64  `json:"bytes"`
}

type planJSON struct {
	Reclaim      []actionJSON      `json:"reclaim"`
	Reservations []reservationJSON `json:"reservations"`
	Enter        []actionJSON      `json:"enter"`
}

type explanationJSON struct {
	Feasible           bool         `json:"feasible"`
	Reason             *string      `json:"reason"`
	PredictedPeakBytes locationInts `json:"predicted_peak_bytes"`
}

type transitionJSON struct {
	Version  uint64  `json:"version"`
	Kind     string  `json:"kind"`
	Handle   *string `json:"handle"`
	Location *string `json:"location"`
	Bytes    int64   `json:"bytes"`
	Detail   string  `json:"detail"`
}

type reportJSON struct {
	Transitions []transitionJSON `json:"transitions"`
}

type evictionJSON struct {
	Handle   string `json:"handle"`
	Location string `json:"location"`
	Bytes    int64  `json:"bytes"`
	Reason   string `json:"reason"`
}

type decisionJSON struct {
	ExpectedStateVersion uint64          `json:"expected_state_version"`
	ExploredStates       int             `json:"explored_states"`
	Evictions            []evictionJSON  `json:"evictions"`
	Plan                 planJSON        `json:"plan"`
	Explanation          explanationJSON `json:"explanation"`
	Exhaustive           bool            `json:"exhaustive"`
}

type snapReservationJSON struct {
	Name  string  `json:"name"`
	Bytes int64   `json:"bytes"`
	Owner *string `json:"owner,omitempty"` // a scope or a cache, in the script's words
}

type snapLocationJSON struct {
	Location      string                `json:"location"`
	BudgetBytes   *int64                `json:"budget_bytes"`
	UsedBytes     int64                 `json:"used_bytes"`
	ReservedBytes int64                 `json:"reserved_bytes"`
	PeakBytes     int64                 `json:"peak_bytes"`
	Reservations  []snapReservationJSON `json:"reservations"`
}

type snapMaterializationJSON struct {
	Location          string `json:"location"`
	State             string `json:"state"`
	ChargedBytes      int64  `json:"charged_bytes"`
	UseCount          int    `json:"use_count"`
	HoldCount         int    `json:"hold_count"`
	PendingEventCount int    `json:"pending_event_count"`
}

type snapValueJSON struct {
	Handle           string                    `json:"handle"`
	Bytes            int64                     `json:"bytes"`
	ReplicaMode      string                    `json:"replica_mode"`
	HasSource        bool                      `json:"has_source"`
	SourceLocation   *string                   `json:"source_location"`
	Discarded        bool                      `json:"discarded"`
	Recoverable      bool                      `json:"recoverable"`
	Materializations []snapMaterializationJSON `json:"materializations"`
}

type snapshotJSON struct {
	StateVersion uint64             `json:"state_version"`
	ManagerID    string             `json:"manager_id"`
	Locations    []snapLocationJSON `json:"locations"`
	Values       []snapValueJSON    `json:"values"`
}

func toAction(a system.Action) actionJSON {
	return actionJSON{Handle: a.Handle.Name, Location: a.Location, From: nullable(a.From)}
}

func toPlan(p system.Plan) planJSON {
	out := planJSON{
		Reclaim:      make([]actionJSON, 0, len(p.Reclaim)),
		Reservations: make([]reservationJSON, 0, len(p.Reservations)),
		Enter:        make([]actionJSON, 0, len(p.Enter)),
	}
	for _, a := range p.Reclaim {
		out.Reclaim = append(out.Reclaim, toAction(a))
	}
	for _, r := range p.Reservations {
		out.Reservations = append(out.Reservations, toReservation(r))
	}
	for _, a := range p.Enter {
		out.Enter = append(out.Enter, toAction(a))
	}
	return out
}

func toReservation(r system.ReservationSpec) reservationJSON {
	return reservationJSON{Name: r.Name, Location: r.Location, Bytes: r.Bytes}
}

// wording puts the runtime's words into the script's: its ids of leases,
// holds, events and scopes become the script's names (see runner.words).
// A nil *runner leaves everything as the runtime wrote it.
func (r *runner) message(s string) string {
	if r == nil {
		return s
	}
	return r.words(s)
}

func (r *runner) detail(s string) string {
	if r == nil {
		return s
	}
	return r.detailWords(s)
}

func (r *runner) toExplanation(e system.Explanation) explanationJSON {
	peaks := locationInts{}
	for k, v := range e.PredictedPeakBytes {
		peaks[k] = v
	}
	return explanationJSON{Feasible: e.Feasible, Reason: nullable(r.message(e.Reason)), PredictedPeakBytes: peaks}
}

func (r *runner) toTransitions(ts []system.Transition) []transitionJSON {
	out := make([]transitionJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, transitionJSON{
			Version: t.Version, Kind: t.Kind, Handle: nullable(t.Handle),
			Location: nullable(t.Location), Bytes: t.Bytes, Detail: r.detail(t.Detail),
		})
	}
	return out
}

func (r *runner) toReport(rep system.Report) *reportJSON {
	return &reportJSON{Transitions: r.toTransitions(rep.Transitions)}
}

func (r *runner) toDecision(d system.Decision) *decisionJSON {
	out := &decisionJSON{
		ExpectedStateVersion: d.ExpectedStateVersion,
		ExploredStates:       d.ExploredStates,
		Evictions:            make([]evictionJSON, 0, len(d.Evictions)),
		Plan:                 toPlan(d.Plan),
		Explanation:          r.toExplanation(d.Explanation),
		Exhaustive:           d.Exhaustive,
	}
	for _, e := range d.Evictions {
		out.Evictions = append(out.Evictions, evictionJSON{Handle: e.Handle.Name, Location: e.Location, Bytes: e.Bytes, Reason: r.message(e.Reason)})
	}
	return out
}

// toSnapshot is the snapshot in the script's words: reservations owned by
// a scope or a cache name their owner as the script does.
func (rn *runner) toSnapshot(s system.Snapshot) *snapshotJSON {
	out := &snapshotJSON{
		StateVersion: s.StateVersion,
		ManagerID:    s.ManagerID,
		Locations:    make([]snapLocationJSON, 0, len(s.Locations)),
		Values:       make([]snapValueJSON, 0, len(s.Values)),
	}
	for _, l := range s.Locations {
		lj := snapLocationJSON{
			Location: l.Location, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes,
			PeakBytes: l.PeakBytes, Reservations: make([]snapReservationJSON, 0, len(l.Reservations)),
		}
		if l.HasBudget {
			b := l.BudgetBytes
			lj.BudgetBytes = &b
		}
		for _, res := range l.Reservations {
			lj.Reservations = append(lj.Reservations, snapReservationJSON{Name: rn.message(res.Name), Bytes: res.Bytes, Owner: nullable(rn.message(res.Owner))})
		}
		out.Locations = append(out.Locations, lj)
	}
	for _, v := range s.Values {
		vj := snapValueJSON{
			Handle: v.Handle.Name, Bytes: v.Bytes, ReplicaMode: v.ReplicaMode.String(),
			HasSource: v.HasSource, Discarded: v.Discarded, Recoverable: v.Recoverable,
			Materializations: make([]snapMaterializationJSON, 0, len(v.Materializations)),
		}
		if v.HasSource {
			vj.SourceLocation = nullable(v.SourceLocation)
		}
		for _, m := range v.Materializations {
			vj.Materializations = append(vj.Materializations, snapMaterializationJSON{
				Location: m.Location, State: m.State.String(), ChargedBytes: m.ChargedBytes,
				UseCount: m.UseCount, HoldCount: m.HoldCount, PendingEventCount: m.PendingEventCount,
			})
		}
		out.Values = append(out.Values, vj)
	}
	return out
}

// classify finds the outermost residency error in err's chain and returns
// its script type name with that error: the pipeline's own errors, and
// otherwise the runtime's classes (system.ErrorClass).
func classify(err error) (string, error) {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if typ, ok := classifyStaging(e); ok {
			return typ, e
		}
		if k, x := system.ClassifiedError(e); k != system.ErrorOther && x == e {
			return k.String(), e
		}
	}
	return system.ErrorOther.String(), err
}

// errorObject renders err as the contract's error object, in the
// script's words.
func (r *runner) errorObject(err error) *errorJSON {
	typ, e := classify(err)
	out := &errorJSON{Type: typ, Message: r.message(err.Error())}
	switch x := e.(type) {
	case *system.BudgetError:
		out.Fields = []kv{{"location", x.Location}, {"budget_bytes", x.BudgetBytes}, {"used_bytes", x.UsedBytes},
			{"reserved_bytes", x.ReservedBytes}, {"requested_bytes", x.RequestedBytes}}
	case *system.PlanError:
		out.Fields = []kv{{"reason", x.Reason}}
	case *system.SearchLimitError:
		out.Fields = []kv{{"request_name", x.RequestName}, {"state_limit", x.StateLimit},
			{"explored_states", x.ExploredStates}, {"detail", x.Detail}}
	case *system.StaleStateError:
		out.Fields = []kv{{"expected_version", x.ExpectedVersion}, {"actual_version", x.ActualVersion}}
	case *system.InUseError:
		out.Fields = []kv{{"handle", x.Handle}, {"location", x.Location}, {"use_count", x.UseCount},
			{"hold_count", x.HoldCount}, {"pending_event_count", x.PendingEventCount}}
	case *system.UnavailableError:
		out.Fields = []kv{{"handle", nullable(x.Handle)}, {"location", nullable(x.Location)}, {"detail", x.Detail}, {"reason", x.Reason.String()}}
	case *system.PlanExecutionError:
		out.Fields = r.planExecutionFields(x)
	default:
		out.Fields = r.cacheErrorFields(e)
		if out.Fields == nil && r != nil {
			out.Fields = r.stagingErrorFields(e)
		}
	}
	return out
}

func (r *runner) planExecutionFields(x *system.PlanExecutionError) []kv {
	var action, actionIndex, resv, resvIndex any
	if x.FailedAction != nil {
		a := toAction(*x.FailedAction)
		action = a
		if x.FailedActionIndex >= 0 {
			actionIndex = x.FailedActionIndex
		}
	}
	if x.FailedReservation != nil {
		resv = toReservation(*x.FailedReservation)
		if x.FailedReservationIndex >= 0 {
			resvIndex = x.FailedReservationIndex
		}
	}
	var cause any
	if x.Cause != nil {
		cause = r.errorObject(x.Cause) // with its fields: evidence reads them
	}
	return []kv{
		{"phase", x.Phase},
		{"failed_action", action},
		{"failed_action_index", actionIndex},
		{"failed_reservation", resv},
		{"failed_reservation_index", resvIndex},
		{"partial_report", r.toReport(x.PartialReport)},
		{"cause", cause},
	}
}

// matches reports whether a result satisfies an expectation. An expected
// ResidencyPlanError also accepts its two specializations.
func matches(expect string, r *result) bool {
	if expect == "ok" {
		return r.OK
	}
	if r.OK || r.Error == nil {
		return false
	}
	got := r.Error.Type
	if got == expect {
		return true
	}
	return expect == "ResidencyPlanError" && (got == "ResidencySearchLimitError" || got == "ResidencyStaleStateError")
}
