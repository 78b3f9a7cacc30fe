package budget

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// ErrPlan is the category of plan errors: [*PlanError], [*SearchLimitError]
// and [*StaleStateError] all match errors.Is(err, ErrPlan).
// [*PlanExecutionError] is a sibling category and does not.
var ErrPlan = errors.New("residency plan error")

// ErrInvalidInput is matched by every [*InvalidInputError].
var ErrInvalidInput = errors.New("residency invalid input")

// ErrDiscarded is matched by an [*UnavailableError] about a discarded handle.
var ErrDiscarded = errors.New("residency handle discarded")

// ErrForeign is matched by an [*UnavailableError] about a handle of another
// manager.
var ErrForeign = errors.New("residency handle of another manager")

// ErrBusy is matched by refusals that are about something in use rather
// than over budget: every [*InUseError] (a lease, hold or pending event
// protects the materialization) and an [*UnavailableError] whose reason is
// [UnavailableInFlight] (a transition on the endpoint has not completed).
// Such a refusal can succeed later without any budget change: retry after
// the protection ends. A [*BudgetError] never matches it.
var ErrBusy = errors.New("residency busy")

// BudgetError: a direct materialization, a temporary reconstruction charge
// or a reservation would exceed one location's strict budget, or, with
// Shared set, the figure of the shared budget the location belongs to
// (the location's own figures are then those of a charge it admits). The
// figures are those at the refusal.
type BudgetError struct {
	Location       string
	BudgetBytes    int64
	UsedBytes      int64
	ReservedBytes  int64
	RequestedBytes int64
	// Shared names the shared budget that refused ("" when the location
	// did); SharedBytes is its figure, SharedUsedBytes its charged bytes
	// (used+reserved over its members) and SharedRequestedBytes what the
	// operation would add to it.
	Shared               string `json:",omitempty"`
	SharedBytes          int64  `json:",omitempty"`
	SharedUsedBytes      int64  `json:",omitempty"`
	SharedRequestedBytes int64  `json:",omitempty"`
}

func (e *BudgetError) Error() string {
	if e.Shared != "" {
		short := new(big.Int).Add(big.NewInt(e.SharedUsedBytes), big.NewInt(e.SharedRequestedBytes))
		short.Sub(short, big.NewInt(e.SharedBytes))
		return fmt.Sprintf("residency shared budget %q exceeded at %s: charged %d + requested %d > shared %d (short by %s bytes)",
			e.Shared, e.Location, e.SharedUsedBytes, e.SharedRequestedBytes, e.SharedBytes, short)
	}
	// Worked out exactly: figures decoded from saved evidence may hold any
	// int64, and a wrapped sum would say "short by" a negative number.
	short := new(big.Int).Add(big.NewInt(e.UsedBytes), big.NewInt(e.ReservedBytes))
	short.Add(short, big.NewInt(e.RequestedBytes))
	short.Sub(short, big.NewInt(e.BudgetBytes))
	return fmt.Sprintf("residency budget exceeded at %s: used %d + reserved %d + requested %d > budget %d (short by %s bytes)",
		e.Location, e.UsedBytes, e.ReservedBytes, e.RequestedBytes, e.BudgetBytes, short)
}

// PlanError: a plan or request is invalid or infeasible before any of its
// actions begin. Reason says what blocked, in words.
type PlanError struct {
	Reason string
	// Location and Shortfall: where, and by how many bytes, the first
	// assignment the controller found blocked by a budget was short
	// (after what its victims could free); "" and 0 when no budget
	// blocked it. A shared budget's shortfall names the first of its
	// members the assignment adds bytes at.
	Location  string `json:",omitempty"`
	Shortfall int64  `json:",omitempty"`
}

func (e *PlanError) Error() string { return "residency plan error: " + e.Reason }

// Is reports the ErrPlan category.
func (e *PlanError) Is(target error) bool { return target == ErrPlan }

// SearchLimitError: the controller's search reached its state limit before
// it found any feasible assignment. Feasibility is unknown.
type SearchLimitError struct {
	RequestName    string
	StateLimit     int
	ExploredStates int
	Detail         string
}

func (e *SearchLimitError) Error() string {
	return fmt.Sprintf("residency search limit reached for request %q: explored %d of limit %d states: %s",
		e.RequestName, e.ExploredStates, e.StateLimit, e.Detail)
}

// Is reports the ErrPlan category.
func (e *SearchLimitError) Is(target error) bool { return target == ErrPlan }

// StaleStateError: a decision or plan expected a state version that is no
// longer current. Detected before any mutation.
type StaleStateError struct {
	ExpectedVersion uint64
	ActualVersion   uint64
}

func (e *StaleStateError) Error() string {
	return fmt.Sprintf("residency stale state: expected version %d, actual %d", e.ExpectedVersion, e.ActualVersion)
}

// Is reports the ErrPlan category.
func (e *StaleStateError) Is(target error) bool { return target == ErrPlan }

// InUseError: a lease, hold or pending consumer event protects the
// materialization that a removal needed.
type InUseError struct {
	Handle            string
	Location          string
	UseCount          int
	HoldCount         int
	PendingEventCount int
}

// Is reports the ErrBusy category.
func (e *InUseError) Is(target error) bool { return target == ErrBusy }

func (e *InUseError) Error() string {
	return fmt.Sprintf("residency value %q at %s is in use: %d leases, %d holds, %d pending events",
		e.Handle, e.Location, e.UseCount, e.HoldCount, e.PendingEventCount)
}

// UnavailableReason classifies an [*UnavailableError].
type UnavailableReason int

const (
	// UnavailableEndpoint: no resident materialization at the location.
	UnavailableEndpoint UnavailableReason = iota
	// UnavailableLocation: the location is well formed but not configured.
	UnavailableLocation
	// UnavailableSource: no resident copy and no source to reconstruct from.
	UnavailableSource
	// UnavailableDiscarded: the handle was discarded.
	UnavailableDiscarded
	// UnavailableForeign: the handle belongs to another manager.
	UnavailableForeign
	// UnavailableInFlight: a transition on this endpoint has not completed.
	UnavailableInFlight
)

// UnavailableError: a direct operation needs an endpoint, a location or a
// source that is absent. Handle or Location is empty when not relevant.
type UnavailableError struct {
	Handle   string
	Location string
	Detail   string
	Reason   UnavailableReason
}

func (e *UnavailableError) Error() string {
	var b strings.Builder
	b.WriteString("residency unavailable")
	if e.Handle != "" {
		fmt.Fprintf(&b, ": value %q", e.Handle)
	}
	if e.Location != "" {
		fmt.Fprintf(&b, " at %s", e.Location)
	}
	b.WriteString(": ")
	b.WriteString(e.Detail)
	return b.String()
}

// Is matches ErrDiscarded, ErrForeign and ErrBusy (in flight) by reason.
func (e *UnavailableError) Is(target error) bool {
	switch target {
	case ErrBusy:
		return e.Reason == UnavailableInFlight
	case ErrDiscarded:
		return e.Reason == UnavailableDiscarded
	case ErrForeign:
		return e.Reason == UnavailableForeign
	}
	return false
}

// Phases of a [*PlanExecutionError].
const (
	PhaseExecute = "execute"
	PhaseReclaim = "reclaim"
	PhaseReserve = "reserve"
	PhaseEnter   = "enter"
	PhaseExit    = "exit"
)

// PlanExecutionError: execution failed after preflight succeeded. The
// transitions in PartialReport stay committed (no rollback); reservations
// that a failed scope entry admitted have been released (those of a plain
// execute stay active, like any named reservation), and PartialReport
// lists those releases too: it is every transition the run committed. FailedAction is set for
// reclaim and enter failures (FailedActionIndex counts within that list);
// FailedReservation for reservation failures. Unused indexes are -1.
type PlanExecutionError struct {
	Phase                  string
	FailedAction           *Action
	FailedActionIndex      int
	FailedReservation      *ReservationSpec
	FailedReservationIndex int
	PartialReport          Report
	Cause                  error
}

func (e *PlanExecutionError) Error() string {
	var what string
	switch {
	case e.FailedAction != nil:
		what = fmt.Sprintf("action %d (%s)", e.FailedActionIndex, e.FailedAction)
	case e.FailedReservation != nil:
		what = fmt.Sprintf("reservation %d (%s)", e.FailedReservationIndex, e.FailedReservation)
	default:
		what = "plan"
	}
	return fmt.Sprintf("residency plan execution failed in phase %s at %s after %d committed transitions: %v",
		e.Phase, what, len(e.PartialReport.Transitions), e.Cause)
}

// Unwrap returns the cause — except that PlanExecutionError is a sibling
// category of PlanError: when the cause is itself a plan error (a reclaim
// refused as data loss, say), Unwrap returns a wrapper of it that
// errors.Is(err, ErrPlan) does not match, while errors.As(err, &planErr)
// and errors.Is(err, cause) still find it. Cause holds the cause itself.
func (e *PlanExecutionError) Unwrap() error {
	if e.Cause != nil && errors.Is(e.Cause, ErrPlan) {
		return causeOf{e.Cause}
	}
	return e.Cause
}

// causeOf carries a PlanExecutionError's cause through the error chain
// without its plan category.
type causeOf struct{ err error }

func (c causeOf) Error() string { return c.err.Error() }

func (c causeOf) Is(target error) bool {
	if target == ErrPlan {
		return false
	}
	return errors.Is(c.err, target)
}

func (c causeOf) As(target any) bool { return errors.As(c.err, target) }

// InvalidInputError: malformed or unknown input; nothing changed.
type InvalidInputError struct {
	Message string
	// Inactive and ID name the lease, hold or event the input referred to
	// when that was what was wrong: it is not active (released or reaped
	// already, or never issued). Inactive is LifetimeNone otherwise. The
	// Message says the same in words.
	Inactive LifetimeKind
	ID       uint64

	// before and after are the Message's words around the lifetime it
	// names ("lease 3"), for MessageNaming; empty for any other refusal.
	before, after string
}

// MessageNaming is the Message with the inactive lease, hold or event the
// error refuses shown as name (a caller's words for it, `lease "L"` say)
// where the Message shows its kind and id. It is the Message itself when
// the error names no such lifetime, or was not made by the ledger
// (decoded from JSON, say).
func (e *InvalidInputError) MessageNaming(name string) string {
	if e.Inactive == LifetimeNone || e.before == "" && e.after == "" {
		return e.Message
	}
	return e.before + name + e.after
}

func (e *InvalidInputError) Error() string { return "residency invalid input: " + e.Message }

// Is matches ErrInvalidInput.
func (e *InvalidInputError) Is(target error) bool { return target == ErrInvalidInput }

func invalidf(format string, args ...any) error {
	return &InvalidInputError{Message: fmt.Sprintf(format, args...)}
}

// inactive is the refusal of an id that names no active lease, hold or
// event; its message is before, the lifetime ("lease 3"), after.
func inactive(kind LifetimeKind, id uint64, before, after string) error {
	return &InvalidInputError{Message: before + kind.String() + " " + strconv.FormatUint(id, 10) + after,
		Inactive: kind, ID: id, before: before, after: after}
}

func planf(format string, args ...any) error {
	return &PlanError{Reason: fmt.Sprintf(format, args...)}
}
