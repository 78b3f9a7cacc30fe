// Package messages holds the plain-data messages that residency's actors
// exchange. Messages carry no channels, closures or device objects: device
// buffers, loaders and consumer events are named by keys into tables the
// runtime owns, so every message here can be serialized (the cluster layer
// adds protobuf forms for those that cross nodes).
//
// Requests from the public API carry ReplyTo, the PID that receives exactly
// one reply; replies carry Err, nil on success, otherwise one of the typed
// errors of package budget (or a runtime sentinel).
package messages

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
)

// ---- requests to the supervisor ------------------------------------------

// Register registers a value. Data (optional) initializes a value
// registered At a location. LoaderKey (0: none) names the loader the caller
// parked in the runtime's loader table for this one call: from the moment
// the message is sent the supervisor owns that entry (it binds it to the
// new handle, or drops it when the registration is refused or fails).
type Register struct {
	Spec      budget.ValueSpec
	Data      []byte
	LoaderKey uint64
	ReplyTo   *actor.PID
}

// CheckRuntime checks what the runtime adds to the ledger's rules for a
// registration: a value with a source needs a loader and one without a
// source takes none, and initial data has the value's size.
func (m *Register) CheckRuntime() error {
	name := m.Spec.Name
	switch {
	case m.Spec.Source != "" && m.LoaderKey == 0:
		return &budget.InvalidInputError{Message: fmt.Sprintf("value %q: a source needs a loader", name)}
	case m.Spec.Source == "" && m.LoaderKey != 0:
		return &budget.InvalidInputError{Message: fmt.Sprintf("value %q: a loader needs a source location", name)}
	case m.Data != nil && int64(len(m.Data)) != m.Spec.Bytes:
		return &budget.InvalidInputError{Message: fmt.Sprintf("value %q: data has %d bytes, value has %d", name, len(m.Data), m.Spec.Bytes)}
	}
	return nil
}

// Transition asks for a direct place, copy, move, evict or discard.
type Transition struct {
	Kind    TransitionKind
	Handle  budget.Handle
	From    string
	To      string
	ReplyTo *actor.PID
}

// TransitionKind names a direct transition.
type TransitionKind int

// Direct transitions.
const (
	Place TransitionKind = iota
	Copy
	Move
	Evict
	Discard
)

func (k TransitionKind) String() string {
	return [...]string{"place", "copy", "move", "evict", "discard"}[k]
}

// Acquire asks for a lease on (Handle, Location).
type Acquire struct {
	Handle   budget.Handle
	Location string
	ReplyTo  *actor.PID
}

// Release releases a lease.
type Release struct {
	Lease   budget.LeaseID
	ReplyTo *actor.PID
}

// RecordEvent records a consumer event on a lease. EventKey names the
// device event in the runtime's event table.
type RecordEvent struct {
	Lease    budget.LeaseID
	EventKey uint64
	ReplyTo  *actor.PID
}

// EventDone reports that the device event of EventID has completed; the
// supervisor reaps it. ReplyTo (optional) is answered after the reap.
type EventDone struct {
	Event   budget.EventID
	ReplyTo *actor.PID
}

// AwaitReap is answered once Event is no longer pending (reaped).
type AwaitReap struct {
	Event   budget.EventID
	ReplyTo *actor.PID
}

// Hold asks for a hold on (Handle, Location).
type Hold struct {
	Handle   budget.Handle
	Location string
	ReplyTo  *actor.PID
}

// Unhold releases a hold.
type Unhold struct {
	Hold    budget.HoldID
	ReplyTo *actor.PID
}

// Reserve admits a named reservation.
type Reserve struct {
	Location string
	Name     string
	Bytes    int64
	ReplyTo  *actor.PID
}

// Unreserve releases a named reservation.
type Unreserve struct {
	Name    string
	ReplyTo *actor.PID
}

// Explain asks for the explanation of a plan.
type Explain struct {
	Plan    budget.Plan
	ReplyTo *actor.PID
}

// Decide asks the controller for a decision.
type Decide struct {
	Request    budget.Request
	StateLimit int
	ReplyTo    *actor.PID
}

// Execute runs a plan without a scope.
type Execute struct {
	Plan    budget.Plan
	ReplyTo *actor.PID
}

// EnterScope enters a scope: stale check, preflight, reclaim, reserve,
// enter, then one lease per entered endpoint.
type EnterScope struct {
	Scope           string
	Plan            budget.Plan
	CheckVersion    bool
	ExpectedVersion uint64
	ReplyTo         *actor.PID
}

// Admit decides Request and enters the decision's plan as scope Scope in
// one step of the supervisor, so the decision cannot go stale between the
// two. The reply is a RunReply carrying the Decision.
type Admit struct {
	Request    budget.Request
	StateLimit int
	Scope      string
	// Ordered: the call orders itself against the wait queue at the
	// locations it names (a cache's load), so room earlier waiters hold
	// there does not refuse it; elsewhere (a spill target, a source) it
	// does.
	Ordered bool
	// Class and Waiter say whose room the call must not take (unless
	// Ordered): the waiters of Class or higher when Waiter is 0 (a call
	// that does not wait is class 0), else those ahead of the queued
	// waiter Waiter (its turn).
	Class   int
	Waiter  uint64
	ReplyTo *actor.PID
}

// ExitScope releases a scope's leases and reservations.
type ExitScope struct {
	Scope        string
	Leases       []budget.LeaseID
	Reservations []string
	ReplyTo      *actor.PID
}

// Snapshot asks for an atomic snapshot.
type Snapshot struct{ ReplyTo *actor.PID }

// StateVersion asks for the current state version (answered by a Reply
// whose Version is that version).
type StateVersion struct{ ReplyTo *actor.PID }

// Trace asks for the trace ring.
type Trace struct{ ReplyTo *actor.PID }

// Shutdown quiesces and releases everything (the runtime is closing).
type Shutdown struct{ ReplyTo *actor.PID }

// Lookup resolves a value name to its handle.
type Lookup struct {
	Name    string
	ReplyTo *actor.PID
}

// ---- replies ---------------------------------------------------------------

// Reply is the generic reply: Err nil on success.
type Reply struct {
	Err error
	// Version is the state version after the operation.
	Version uint64
}

// HandleReply answers Register and Lookup.
type HandleReply struct {
	Handle  budget.Handle
	Err     error
	Version uint64
}

// LeaseReply answers Acquire: the lease and the buffer key of its endpoint.
type LeaseReply struct {
	Lease   budget.LeaseID
	Err     error
	Version uint64
}

// EventReply answers RecordEvent.
type EventReply struct {
	Event   budget.EventID
	Err     error
	Version uint64
}

// HoldReply answers Hold.
type HoldReply struct {
	Hold    budget.HoldID
	Err     error
	Version uint64
}

// ExplainReply answers Explain.
type ExplainReply struct {
	Explanation budget.Explanation
}

// DecideReply answers Decide.
type DecideReply struct {
	Decision budget.Decision
	Err      error
}

// RunReply answers Execute, EnterScope, Admit and the direct transitions.
type RunReply struct {
	// Decision is set for Admit once the controller decided.
	Decision     *budget.Decision
	Report       budget.Report
	Leases       []budget.LeaseID
	Reservations []string
	Err          error
	Version      uint64
}

// SnapshotReply answers Snapshot with the frozen snapshot: the
// supervisor freezes (in time independent of the number of values), the
// caller renders it ([budget.FrozenSnapshot.Snapshot]) outside the
// supervisor.
type SnapshotReply struct{ Frozen *budget.FrozenSnapshot }

// TraceReply answers Trace.
type TraceReply struct{ Trace []budget.Transition }

// ShutdownReply answers Shutdown with what was still outstanding and the
// final snapshot.
type ShutdownReply struct {
	Outstanding budget.Outstanding
	Final       budget.Snapshot
	Err         error
}

// FatalReply answers any request once the supervisor has stopped the
// runtime on a fatal error (a panic while it handled a message): the ledger
// may be half-updated, so nothing more is admitted and every waiting and
// later caller receives Err.
type FatalReply struct{ Err error }

// Request is implemented by every message to the supervisor that expects a
// reply: Replier returns where the reply goes (nil: nobody waits).
type Request interface{ Replier() *actor.PID }

func (m *Register) Replier() *actor.PID     { return m.ReplyTo }
func (m *Transition) Replier() *actor.PID   { return m.ReplyTo }
func (m *Acquire) Replier() *actor.PID      { return m.ReplyTo }
func (m *Release) Replier() *actor.PID      { return m.ReplyTo }
func (m *RecordEvent) Replier() *actor.PID  { return m.ReplyTo }
func (m *EventDone) Replier() *actor.PID    { return m.ReplyTo }
func (m *AwaitReap) Replier() *actor.PID    { return m.ReplyTo }
func (m *Hold) Replier() *actor.PID         { return m.ReplyTo }
func (m *Unhold) Replier() *actor.PID       { return m.ReplyTo }
func (m *Reserve) Replier() *actor.PID      { return m.ReplyTo }
func (m *Unreserve) Replier() *actor.PID    { return m.ReplyTo }
func (m *Explain) Replier() *actor.PID      { return m.ReplyTo }
func (m *Decide) Replier() *actor.PID       { return m.ReplyTo }
func (m *Execute) Replier() *actor.PID      { return m.ReplyTo }
func (m *EnterScope) Replier() *actor.PID   { return m.ReplyTo }
func (m *Admit) Replier() *actor.PID        { return m.ReplyTo }
func (m *ExitScope) Replier() *actor.PID    { return m.ReplyTo }
func (m *Snapshot) Replier() *actor.PID     { return m.ReplyTo }
func (m *StateVersion) Replier() *actor.PID { return m.ReplyTo }
func (m *Trace) Replier() *actor.PID        { return m.ReplyTo }
func (m *Shutdown) Replier() *actor.PID     { return m.ReplyTo }
func (m *Lookup) Replier() *actor.PID       { return m.ReplyTo }

// ---- between actors --------------------------------------------------------

// DoTransfer asks a value actor to carry out one transfer effect (copy,
// reconstruct or initialize) of an admitted transition.
type DoTransfer struct {
	Admission budget.AdmissionID
	Effect    budget.Effect
	// Data initializes an EffectInitialize (nil: zero bytes).
	Data []byte
}

// TransferDone reports a transfer's outcome to the supervisor.
type TransferDone struct {
	Admission budget.AdmissionID
	Err       error
}

// Allocate asks a location actor for a buffer of Bytes for Key. The reply
// is an Allocated.
type Allocate struct {
	Key   BufferKey
	Bytes int64
}

// Allocated answers Allocate.
type Allocated struct {
	Key BufferKey
	Err error
}

// Free asks a location actor to free Key's buffer (fire and forget).
type Free struct {
	Key BufferKey
}

// Drain asks a location actor to reply once every earlier message has
// been processed.
type Drain struct{}

// Drained answers Drain.
type Drained struct{}

// BufferKey names a physical buffer: the value's id and location, and the
// admission for a temporary reconstruction buffer (0 otherwise).
type BufferKey struct {
	Value     uint64
	Location  string
	Temporary budget.AdmissionID
}
