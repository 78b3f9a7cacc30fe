package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/residency-go/residency/internal/planjson"
	"github.com/residency-go/residency/system"
)

// The JSON shapes of replay results. Field order is the order of the
// contract; encoding/json keeps struct order. A string that the runtime
// leaves empty because it does not apply (a reservation's handle, an
// unavailable location, a feasible plan's reason) is written as null.

// Result is the outcome of one op: its line, op, success and the state
// version after it, then at most one payload (or the error). Field order
// is the order of the JSON contract.
type Result struct {
	Line         int           `json:"line"`
	Op           string        `json:"op"`
	OK           bool          `json:"ok"`
	StateVersion uint64        `json:"state_version"`
	Error        *Error        `json:"error,omitempty"`
	Explanation  *Explanation  `json:"explanation,omitempty"`
	Report       *Report       `json:"report,omitempty"`
	Decision     *Decision     `json:"decision,omitempty"`
	Snapshot     *Snapshot     `json:"snapshot,omitempty"`
	Trace        *[]Transition `json:"trace,omitempty"`
	Load         *Load         `json:"load,omitempty"`
	Evicted      *bool         `json:"evicted,omitempty"`
	Stats        *CacheStats   `json:"stats,omitempty"`
	Staging      *Staging      `json:"staging,omitempty"`
	// TaskTransitions: the write pipeline's task moves during a staging
	// op (staging_ops.go), shown whatever the op's outcome.
	TaskTransitions []TaskTransition `json:"task_transitions,omitempty"`

	// Expect is the line's expectation when it is checked (see Matches);
	// it is not part of the JSON.
	Expect string `json:"-"`

	err error // the op's error (Err)
}

// Err returns the op's error, nil when it succeeded. Error is the same
// error as the JSON shows it.
func (r *Result) Err() error { return r.err }

// Error is {type, message, field…}: the error's fields follow type and
// message in the order the contract lists them.
type Error struct {
	Type    string
	Message string
	Fields  []Field
}

// Field is one member of an ordered JSON object.
type Field struct {
	Key   string
	Value any
}

// MarshalJSON writes {"type":…,"message":…, fields…}.
func (e *Error) MarshalJSON() ([]byte, error) {
	o := append([]Field{{"type", e.Type}, {"message", e.Message}}, e.Fields...)
	return Object(o).MarshalJSON()
}

// Object marshals as a JSON object with keys in slice order.
type Object []Field

// MarshalJSON writes the fields in order.
func (o Object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := Marshal(f.Key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		v, err := Marshal(f.Value)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Marshal is json.Marshal without HTML escaping: messages such as
// "used 3 + requested 6 > budget 8" stay readable.
func Marshal(v any) ([]byte, error) {
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
		case b[i] == 0xe2 && i+2 < len(b) && bidiOrSeparator(decodeRune3(b[i:i+3])):
			out = append(out, fmt.Sprintf(`\u%04x`, decodeRune3(b[i:i+3]))...)
			i += 2
		default:
			out = append(out, b[i])
		}
	}
	return out
}

// bidiOrSeparator: the line and paragraph separators and the
// bidirectional overrides, which a terminal may obey.
func bidiOrSeparator(c rune) bool {
	return c == '\u2028' || c == '\u2029' || (c >= '\u202a' && c <= '\u202e') || (c >= '\u2066' && c <= '\u2069')
}

// decodeRune3 decodes a three-byte UTF-8 sequence (or returns 0).
func decodeRune3(b []byte) rune {
	if b[1]&0xc0 != 0x80 || b[2]&0xc0 != 0x80 {
		return 0
	}
	return rune(b[0]&0x0f)<<12 | rune(b[1]&0x3f)<<6 | rune(b[2]&0x3f)
}

// locationBytes marshals a map from location to bytes in location order.
type locationBytes map[string]int64

func (m locationBytes) MarshalJSON() ([]byte, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	SortLocations(keys)
	o := make(Object, len(keys))
	for i, k := range keys {
		o[i] = Field{k, m[k]}
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

// Action, Reservation and Plan are the JSON form of a plan: one form,
// which a diagnosis's evidence reads and writes too (package
// diagnose).
type (
	Action      = planjson.Action
	Reservation = planjson.Reservation
	Plan        = planjson.Plan
)

type Explanation struct {
	Feasible           bool          `json:"feasible"`
	Reason             *string       `json:"reason"`
	PredictedPeakBytes locationBytes `json:"predicted_peak_bytes"`
}

type Transition struct {
	Version  uint64  `json:"version"`
	Kind     string  `json:"kind"`
	Handle   *string `json:"handle"`
	Location *string `json:"location"`
	Bytes    int64   `json:"bytes"`
	Detail   string  `json:"detail"`
}

type Report struct {
	Transitions []Transition `json:"transitions"`
}

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

type Decision struct {
	ExpectedStateVersion uint64      `json:"expected_state_version"`
	ExploredStates       int         `json:"explored_states"`
	Evictions            []Eviction  `json:"evictions"`
	Plan                 Plan        `json:"plan"`
	Explanation          Explanation `json:"explanation"`
	Exhaustive           bool        `json:"exhaustive"`
}

type SnapshotReservation struct {
	Name  string  `json:"name"`
	Bytes int64   `json:"bytes"`
	Owner *string `json:"owner,omitempty"` // a scope or a cache, in the script's words
}

type SnapshotLocation struct {
	Location      string                `json:"location"`
	BudgetBytes   *int64                `json:"budget_bytes"`
	UsedBytes     int64                 `json:"used_bytes"`
	ReservedBytes int64                 `json:"reserved_bytes"`
	PeakBytes     int64                 `json:"peak_bytes"`
	Reservations  []SnapshotReservation `json:"reservations"`
}

type SnapshotMaterialization struct {
	Location          string `json:"location"`
	State             string `json:"state"`
	ChargedBytes      int64  `json:"charged_bytes"`
	UseCount          int    `json:"use_count"`
	HoldCount         int    `json:"hold_count"`
	PendingEventCount int    `json:"pending_event_count"`
}

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

type Snapshot struct {
	StateVersion uint64             `json:"state_version"`
	ManagerID    string             `json:"manager_id"`
	Locations    []SnapshotLocation `json:"locations"`
	Values       []SnapshotValue    `json:"values"`
}

// ActionOf is a in the JSON form of a plan's action.
func ActionOf(a system.Action) Action { return planjson.ActionOf(a) }

// PlanOf is p in the JSON form of a decision's plan.
func PlanOf(p system.Plan) Plan { return planjson.PlanOf(p) }

// ReservationOf is r in the JSON form of a plan's reservation.
func ReservationOf(r system.ReservationSpec) Reservation { return planjson.ReservationOf(r) }

func (r *Runner) detail(t system.Transition) string {
	if r == nil {
		return t.Detail
	}
	return r.detailWords(t)
}

func (r *Runner) toExplanation(e system.Explanation) Explanation {
	peaks := locationBytes{}
	for k, v := range e.PredictedPeakBytes {
		peaks[k] = v
	}
	return Explanation{Feasible: e.Feasible, Reason: nullable(e.Reason), PredictedPeakBytes: peaks}
}

// Transitions is ts in the JSON form of a trace op, in the script's
// words (leases, holds and events by their script names).
func (r *Runner) Transitions(ts []system.Transition) []Transition {
	out := make([]Transition, 0, len(ts))
	for _, t := range ts {
		out = append(out, Transition{
			Version: t.Version, Kind: t.Kind, Handle: nullable(t.Handle),
			Location: nullable(t.Location), Bytes: t.Bytes, Detail: r.detail(t),
		})
	}
	return out
}

func (r *Runner) toReport(rep system.Report) *Report {
	return &Report{Transitions: r.Transitions(rep.Transitions)}
}

func (r *Runner) toDecision(d system.Decision) *Decision {
	out := &Decision{
		ExpectedStateVersion: d.ExpectedStateVersion,
		ExploredStates:       d.ExploredStates,
		Evictions:            make([]Eviction, 0, len(d.Evictions)),
		Plan:                 PlanOf(d.Plan),
		Explanation:          r.toExplanation(d.Explanation),
		Exhaustive:           d.Exhaustive,
	}
	for _, e := range d.Evictions {
		out.Evictions = append(out.Evictions, Eviction{Handle: e.Handle.Name, Location: e.Location, Bytes: e.Bytes, Reason: e.Reason, To: e.To, Owner: e.Owner, Charge: e.Charge})
	}
	return out
}

// Snapshot is s in the JSON form of a snapshot op, in the script's words: reservations owned by
// a scope or a cache name their owner as the script does.
func (rn *Runner) Snapshot(s system.Snapshot) *Snapshot {
	out := &Snapshot{
		StateVersion: s.StateVersion,
		ManagerID:    s.ManagerID,
		Locations:    make([]SnapshotLocation, 0, len(s.Locations)),
		Values:       make([]SnapshotValue, 0, len(s.Values)),
	}
	for _, l := range s.Locations {
		lj := SnapshotLocation{
			Location: l.Location, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes,
			PeakBytes: l.PeakBytes, Reservations: make([]SnapshotReservation, 0, len(l.Reservations)),
		}
		if l.HasBudget {
			b := l.BudgetBytes
			lj.BudgetBytes = &b
		}
		for _, res := range l.Reservations {
			lj.Reservations = append(lj.Reservations, SnapshotReservation{Name: res.Name, Bytes: res.Bytes, Owner: nullable(rn.owner(res.Owner))})
		}
		out.Locations = append(out.Locations, lj)
	}
	for _, v := range s.Values {
		vj := SnapshotValue{
			Handle: v.Handle.Name, Bytes: v.Bytes, ReplicaMode: v.ReplicaMode.String(),
			HasSource: v.HasSource, Discarded: v.Discarded, Recoverable: v.Recoverable,
			Materializations: make([]SnapshotMaterialization, 0, len(v.Materializations)),
		}
		if v.HasSource {
			vj.SourceLocation = nullable(v.SourceLocation)
		}
		for _, m := range v.Materializations {
			vj.Materializations = append(vj.Materializations, SnapshotMaterialization{
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
func (r *Runner) errorObject(err error) *Error {
	typ, e := classify(err)
	out := &Error{Type: typ, Message: err.Error()}
	switch x := e.(type) {
	case *system.BudgetError:
		out.Fields = []Field{{"location", x.Location}, {"budget_bytes", x.BudgetBytes}, {"used_bytes", x.UsedBytes},
			{"reserved_bytes", x.ReservedBytes}, {"requested_bytes", x.RequestedBytes}}
	case *system.PlanError:
		out.Fields = []Field{{"reason", x.Reason}}
	case *system.SearchLimitError:
		out.Fields = []Field{{"request_name", x.RequestName}, {"state_limit", x.StateLimit},
			{"explored_states", x.ExploredStates}, {"detail", x.Detail}}
	case *system.StaleStateError:
		out.Fields = []Field{{"expected_version", x.ExpectedVersion}, {"actual_version", x.ActualVersion}}
	case *system.InUseError:
		out.Fields = []Field{{"handle", x.Handle}, {"location", x.Location}, {"use_count", x.UseCount},
			{"hold_count", x.HoldCount}, {"pending_event_count", x.PendingEventCount}}
	case *system.UnavailableError:
		out.Fields = []Field{{"handle", nullable(x.Handle)}, {"location", nullable(x.Location)}, {"detail", x.Detail}, {"reason", x.Reason.String()}}
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

func (r *Runner) planExecutionFields(x *system.PlanExecutionError) []Field {
	var action, actionIndex, resv, resvIndex any
	if x.FailedAction != nil {
		a := ActionOf(*x.FailedAction)
		action = a
		if x.FailedActionIndex >= 0 {
			actionIndex = x.FailedActionIndex
		}
	}
	if x.FailedReservation != nil {
		resv = ReservationOf(*x.FailedReservation)
		if x.FailedReservationIndex >= 0 {
			resvIndex = x.FailedReservationIndex
		}
	}
	var cause any
	if x.Cause != nil {
		cause = r.errorObject(x.Cause) // with its fields: evidence reads them
	}
	return []Field{
		{"phase", x.Phase},
		{"failed_action", action},
		{"failed_action_index", actionIndex},
		{"failed_reservation", resv},
		{"failed_reservation_index", resvIndex},
		{"partial_report", r.toReport(x.PartialReport)},
		{"cause", cause},
	}
}

// Matches reports whether a result satisfies an expectation. An expected
// ResidencyPlanError also accepts its two specializations.
func Matches(expect string, r *Result) bool {
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

// SnapshotOf is s in the JSON form of a snapshot op, in the runtime's words.
func SnapshotOf(s system.Snapshot) *Snapshot { return (*Runner)(nil).Snapshot(s) }

// TransitionsOf is ts in the JSON form of a trace op, in the runtime's
// words.
func TransitionsOf(ts []system.Transition) []Transition { return (*Runner)(nil).Transitions(ts) }

// errorTypes are the names an expect may use besides "ok".
var errorTypes = []string{
	"ResidencyBudgetError",
	"ResidencyPlanError",
	"ResidencySearchLimitError",
	"ResidencyStaleStateError",
	"ResidencyInUseError",
	"ResidencyUnavailableError",
	"ResidencyPlanExecutionError",
	"InvalidInput",
	"Error",
	// The loader cache's (ops_cache.go).
	"ResidencyCacheBusyError",
	"ResidencyCacheLoadError",
	// The write pipeline's (ops_staging.go).
	"StagingConfigError",
	"StagingSlotOverflowError",
	"StagingSlotTimeoutError",
	"StagingDropError",
	"StagingAppendRefusedError",
	"StagingFailedError",
	"StagingNoRowError",
	"StagingStepReleasedError",
	"StagingClosedError",
}

// ErrorTypes returns the error types of the contract: the values of an
// error's "type", and of an expect besides "ok".
func ErrorTypes() []string { return slices.Clone(errorTypes) }

// ErrorOf is err as the error object of a failed op, in the runtime's
// words (what a result's Error would show for it).
func ErrorOf(err error) *Error { return (*Runner)(nil).errorObject(err) }
