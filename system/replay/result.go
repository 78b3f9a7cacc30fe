package replay

import (
	"errors"
	"slices"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/wire"
)

// The JSON shapes of replay results (the records' shapes are package
// wire's). Field order is the order of the contract; encoding/json keeps
// struct order. A string that the runtime leaves empty because it does not
// apply (a reservation's handle, an unavailable location, a feasible
// plan's reason) is written as null.

// Result is the outcome of one op: its line, op, success and the state
// version after it, then at most one payload (or the error). Field order
// is the order of the JSON contract.
type Result struct {
	Line         int              `json:"line"`
	Op           string           `json:"op"`
	OK           bool             `json:"ok"`
	StateVersion uint64           `json:"state_version"`
	Error        *Error           `json:"error,omitempty"`
	Explanation  *Explanation     `json:"explanation,omitempty"`
	Report       *wire.Report     `json:"report,omitempty"`
	Decision     *Decision        `json:"decision,omitempty"`
	Snapshot     *Snapshot        `json:"snapshot,omitempty"`
	Trace        *[]Transition    `json:"trace,omitempty"`
	Load         *Load            `json:"load,omitempty"`
	Evicted      *bool            `json:"evicted,omitempty"`
	Stats        *wire.CacheStats `json:"stats,omitempty"`
	Staging      *Staging         `json:"staging,omitempty"`
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

// MarshalJSON writes {"type":…,"message":…, fields…}.
func (e *Error) MarshalJSON() ([]byte, error) {
	o := append([]Field{{Key: "type", Value: e.Type}, {Key: "message", Value: e.Message}}, e.Fields...)
	return Object(o).MarshalJSON()
}

// Field, Object and Marshal write ordered JSON objects without HTML
// escaping ([wire.Marshal]).
type (
	Field  = wire.Field
	Object = wire.Object
)

// Marshal is [wire.Marshal]: json.Marshal without HTML escaping.
func Marshal(v any) ([]byte, error) { return wire.Marshal(v) }

// The replay output's records, by their names in package wire.
type (
	Action      = wire.Action
	Explanation = wire.Explanation
	Transition  = wire.Transition
	Decision    = wire.Decision
	Snapshot    = wire.Snapshot
)

var nullable = wire.Nullable

// ActionOf is a in the JSON form of a plan's action.
func ActionOf(a system.Action) Action { return wire.ActionOf(a) }

// PlanOf is p in the JSON form of a decision's plan.
func PlanOf(p system.Plan) wire.Plan { return wire.PlanOf(p) }

// ReservationOf is r in the JSON form of a plan's reservation.
func ReservationOf(r system.ReservationSpec) wire.Reservation { return wire.ReservationOf(r) }

func (r *Runner) detail(t system.Transition) string {
	if r == nil {
		return t.Detail
	}
	return r.detailWords(t)
}

// Transitions is ts in the JSON form of a trace op, in the script's
// words (leases, holds and events by their script names).
func (r *Runner) Transitions(ts []system.Transition) []Transition {
	return wire.TransitionsOf(ts, r.detail)
}

func (r *Runner) toReport(rep system.Report) *wire.Report {
	return &wire.Report{Transitions: r.Transitions(rep.Transitions)}
}

func (r *Runner) toDecision(d system.Decision) *Decision { return wire.DecisionOf(d) }

// Snapshot is s in the JSON form of a snapshot op, in the script's words: reservations owned by
// a scope or a cache name their owner as the script does.
func (rn *Runner) Snapshot(s system.Snapshot) *Snapshot { return wire.SnapshotOf(s, rn.owner) }

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
		out.Fields = []Field{{Key: "location", Value: x.Location}, {Key: "budget_bytes", Value: x.BudgetBytes}, {Key: "used_bytes", Value: x.UsedBytes},
			{Key: "reserved_bytes", Value: x.ReservedBytes}, {Key: "requested_bytes", Value: x.RequestedBytes}}
	case *system.PlanError:
		out.Fields = []Field{{Key: "reason", Value: x.Reason}}
	case *system.SearchLimitError:
		out.Fields = []Field{{Key: "request_name", Value: x.RequestName}, {Key: "state_limit", Value: x.StateLimit},
			{Key: "explored_states", Value: x.ExploredStates}, {Key: "detail", Value: x.Detail}}
	case *system.StaleStateError:
		out.Fields = []Field{{Key: "expected_version", Value: x.ExpectedVersion}, {Key: "actual_version", Value: x.ActualVersion}}
	case *system.InUseError:
		out.Fields = []Field{{Key: "handle", Value: x.Handle}, {Key: "location", Value: x.Location}, {Key: "use_count", Value: x.UseCount},
			{Key: "hold_count", Value: x.HoldCount}, {Key: "pending_event_count", Value: x.PendingEventCount}}
	case *system.UnavailableError:
		out.Fields = []Field{{Key: "handle", Value: nullable(x.Handle)}, {Key: "location", Value: nullable(x.Location)}, {Key: "detail", Value: x.Detail}, {Key: "reason", Value: x.Reason.String()}}
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
		{Key: "phase", Value: x.Phase},
		{Key: "failed_action", Value: action},
		{Key: "failed_action_index", Value: actionIndex},
		{Key: "failed_reservation", Value: resv},
		{Key: "failed_reservation_index", Value: resvIndex},
		{Key: "partial_report", Value: r.toReport(x.PartialReport)},
		{Key: "cause", Value: cause},
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
