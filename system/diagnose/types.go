package diagnose

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/system"
)

// Operation names the call that failed: its kind and the endpoint pair
// (value, location) it needed. Every field is optional; the more is known,
// the more precise the diagnosis (the kind of charge a [*BudgetError]
// refused, for one, depends on the call's destination).
type Operation struct {
	// Kind is the call: "register", "place", "copy", "move", "evict",
	// "discard", "acquire", "hold", "reserve", "execute", "enter", "exit",
	// "admit", "decide" or "explain".
	Kind string
	// Handle is the value. Only Name is needed; when Manager is set it is
	// checked against the snapshot's manager.
	Handle system.Handle
	// Location is the destination (place, copy, move, register), the
	// location acted on (evict, acquire, hold) or reserved at (reserve).
	Location string
	// From is the source of a copy or move, or an enter action's From.
	From string
	// Reservation and Bytes describe a reservation (reserve).
	Reservation string
	Bytes       int64
}

func (o Operation) String() string {
	var b strings.Builder
	b.WriteString(o.Kind)
	if b.Len() == 0 {
		b.WriteString("operation")
	}
	if o.Handle.Name != "" {
		b.WriteString(" " + o.Handle.Name)
	}
	if o.Reservation != "" {
		fmt.Fprintf(&b, " %q (%d bytes)", o.Reservation, o.Bytes)
	}
	switch {
	case o.From != "" && o.Location != "":
		fmt.Fprintf(&b, " %s→%s", o.From, o.Location)
	case o.Location != "":
		b.WriteString(" @" + o.Location)
	}
	return b.String()
}

// Evidence is everything a diagnosis reads: the error, the call that
// failed, and the state captured at the failure. Capture it before any
// cleanup (releasing leases, exiting scopes, retrying): afterwards the
// snapshot no longer shows the state that refused the call. Use
// [System.Capture] right after the failing call returns.
type Evidence struct {
	Err error
	// Op is the call that failed (optional).
	Op Operation
	// Snapshot and Trace are the state view taken at the failure.
	Snapshot system.Snapshot
	Trace    []system.Transition
	// Decision is the controller decision whose scope failed, for a stale
	// scope entry or a failed entry of a decided plan (optional).
	Decision *system.Decision
	// Plan is the plan that failed, for Execute or a scope (optional; a
	// Decision carries its own).
	Plan *system.Plan
	// Explanation is System.Explain of the plan that failed (optional).
	Explanation *system.Explanation
	// Devices are NVML observations of the device locations (optional;
	// cuda:N → the device, from package cuda/discover matched by UUID).
	// They are shown as diagnostics next to a budget refusal at that
	// location, never used as admission evidence: the runtime admits by
	// its budget, whatever the device reports free.
	Devices map[string]cuda.DeviceInfo
	// Names, when set, names leases, holds and events in the caller's
	// words (a replay script's names): the diagnosis shows a lifetime by
	// its name here, by its runtime id otherwise (optional). The trace's
	// transitions say which lifetime they are about in their ID and Lease
	// fields.
	Names map[LifetimeRef]string
}

// LifetimeRef is a lease, hold or event by its runtime id.
type LifetimeRef struct {
	Kind system.LifetimeKind
	ID   uint64
}

// lifetimeName is how the diagnosis shows a lifetime: its name in
// ev.Names, else its id.
func (ev Evidence) lifetimeName(kind system.LifetimeKind, id uint64) string {
	if n, ok := ev.Names[LifetimeRef{kind, id}]; ok {
		return n
	}
	return strconv.FormatUint(id, 10)
}

// plan is the failed plan: Plan, else the decision's.
func (ev Evidence) plan() *system.Plan {
	switch {
	case ev.Plan != nil:
		return ev.Plan
	case ev.Decision != nil:
		return &ev.Decision.Plan
	}
	return nil
}

func planEndpoints(p *system.Plan) [][2]string {
	if p == nil {
		return nil
	}
	var eps [][2]string
	for _, a := range p.Reclaim {
		eps = append(eps, [2]string{a.Handle.Name, a.Location})
	}
	for _, a := range p.Enter {
		eps = append(eps, [2]string{a.Handle.Name, a.Location})
	}
	return eps
}

// ChargeKind says what a refused charge was for.
type ChargeKind string

// The kinds of charge a [*BudgetError] can refuse.
const (
	ChargeUnknown         ChargeKind = "unknown"
	ChargeMaterialization ChargeKind = "materialization"
	ChargeReservation     ChargeKind = "reservation"
	ChargeTemporary       ChargeKind = "temporary reconstruction charge"
)

// Diagnosis is the result of [Diagnose]: the error's class, the steps of
// the diagnosis procedure that apply to it with the figures they found, and
// the first thing to do. The typed fields hold the same figures for
// programs; Steps hold them as text. A field that does not apply to the
// class is nil.
type Diagnosis struct {
	// Class is the name of the error's class, [system.ErrorClass] of it
	// ("ResidencyBudgetError", …, "InvalidInput" for bad input, "Error"
	// for anything else: a device failure, a context error); "" when
	// there is no error.
	Class       string
	Message     string
	Meaning     string
	FirstAction string
	Op          Operation

	StateVersion uint64
	ManagerID    string

	Steps []DiagnosisStep

	Capture    CaptureCheck
	Endpoints  []EndpointState
	Budget     *BudgetArithmetic
	Protection *ProtectionOwners
	Search     *SearchEvidence
	Stale      *StaleRange
	Execution  *ExecutionOutcome
}

// DiagnosisStep is one step of the procedure as it applied.
type DiagnosisStep struct {
	Number   int
	Title    string
	Findings []Finding
}

// Finding is one check of a step: what was checked, the figures read or
// computed, and the verdict.
type Finding struct {
	What    string
	Figures []Figure
	Verdict string
}

// Figure is one named figure of a finding.
type Figure struct {
	Name  string
	Value string
}

// CaptureCheck says whether the snapshot and trace form one state view
// taken at the failure.
type CaptureCheck struct {
	StateVersion uint64
	// TraceOldest and TraceNewest are the versions of the trace's ends
	// (0 when the trace is empty).
	TraceOldest, TraceNewest uint64
	// OneView: the trace ends at the snapshot's version (unknown, false,
	// when the trace is empty).
	OneView bool
	// AtFailure: the snapshot still shows the figures the error reported.
	// Nil when the error carries nothing to compare.
	AtFailure *bool
	// Differences lists what changed since the failure.
	Differences []string
}

// EndpointState is a (value, location) pair a failed call needed and the
// value's state in the snapshot.
type EndpointState struct {
	Value    string
	Location string
	// Live: the value is in the snapshot. Otherwise Gone says what the
	// trace shows about it ("" when nothing).
	Live             bool
	Gone             string
	Bytes            int64
	ReplicaMode      system.ReplicaMode
	Recoverable      bool
	HasSource        bool
	SourceLocation   string
	Materializations []system.MaterializationRecord
	// AtLocation is the materialization at Location, if any.
	AtLocation *system.MaterializationRecord
}

// BudgetArithmetic is the admission arithmetic of a [*BudgetError].
type BudgetArithmetic struct {
	Location                                              string
	BudgetBytes, UsedBytes, ReservedBytes, RequestedBytes int64
	// CurrentCharged is UsedBytes+ReservedBytes; NewPeak adds
	// RequestedBytes; MissingBytes is NewPeak−BudgetBytes. Each is
	// worked out exactly and saturated to the int64 range (only figures
	// no runtime reports, from edited evidence, reach it; the diagnosis
	// text shows the exact sums).
	CurrentCharged, NewPeak, MissingBytes int64
	Charge                                ChargeKind
	// ChargeReason says how Charge was worked out.
	ChargeReason string
	// Now is the location's record in the snapshot.
	Now *system.LocationRecord
}

// Lifetime is one lease, hold or pending event found in the trace.
type Lifetime struct {
	Kind string // "lease", "hold" or "event"
	// ID is the lifetime as the diagnosis shows it: its name in
	// [Evidence].Names (a replay script's), else the runtime's id.
	ID string
	// Version is when it was taken (acquire, hold, record_event).
	Version uint64
	// Lease is the lease an event was recorded on.
	Lease string
}

func (t Lifetime) String() string {
	if t.Kind == "event" {
		return fmt.Sprintf("event %s (recorded on lease %s at v%d)", t.ID, t.Lease, t.Version)
	}
	return fmt.Sprintf("%s %s (taken at v%d)", t.Kind, t.ID, t.Version)
}

// ProtectionOwners is an [*InUseError]'s counts and the lifetimes the
// trace shows owning them.
type ProtectionOwners struct {
	Value, Location                        string
	UseCount, HoldCount, PendingEventCount int
	// Leases, Holds and Events are open in the trace (taken, not yet
	// released or reaped) at the endpoint, oldest first.
	Leases, Holds, Events []Lifetime
	// Complete: the trace reaches back to version 1, so the lists hold
	// every open lifetime.
	Complete bool
	// Now is the materialization in the snapshot (nil if gone).
	Now *system.MaterializationRecord
}

// SearchEvidence is the controller's evidence: from a decision, an
// explanation and/or a [*SearchLimitError].
type SearchEvidence struct {
	RequestName          string
	StateLimit           int // SearchLimitError only
	ExploredStates       int
	Exhaustive           bool
	ExpectedStateVersion uint64
	Detail               string
	Evictions            []system.Eviction
	Plan                 *system.Plan
	Feasible             bool
	Reason               string
	// PredictedPeaks lists the predicted peak per location, in the
	// snapshot's location order.
	PredictedPeaks []LocationBytes
}

// LocationBytes is a figure of bytes at one location.
type LocationBytes struct {
	Location string
	Bytes    int64
}

// StaleRange is a [*StaleStateError]'s version gap and what the trace
// shows of it.
type StaleRange struct {
	ExpectedVersion, ActualVersion uint64
	// Intervening lists the transitions of versions Expected+1…Actual the
	// trace still holds, oldest first.
	Intervening []system.Transition
	// Covered: the trace holds every one of them.
	Covered bool
	// Missing counts the versions of the range the trace no longer holds.
	Missing uint64
}

// ExecutionOutcome is a [*PlanExecutionError]'s committed prefix sorted by
// what became of it, and its cause diagnosed.
type ExecutionOutcome struct {
	Phase                  string
	FailedAction           *system.Action
	FailedActionIndex      int
	FailedReservation      *system.ReservationSpec
	FailedReservationIndex int
	Committed              []system.Transition
	// Kept lists the committed effects that were not rolled back and
	// still hold, in words; Cleaned lists what the failure's cleanup
	// undid; FailedStep what the failed step itself left (nothing is
	// charged for it any more).
	Kept, Cleaned, FailedStep []string
	Cause                     *Diagnosis
}

// Diagnose runs the diagnosis procedure for err on the state view snap and
// trace, captured at the failure. It is Diagnose of [Evidence] without the
// optional parts; see [DiagnoseEvidence].
