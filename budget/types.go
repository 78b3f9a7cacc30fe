package budget

import (
	"fmt"
	"strings"
)

// ReplicaMode says whether a value may be materialized at several
// locations at once.
type ReplicaMode int

const (
	// Exclusive values have one materialization (two during a move).
	Exclusive ReplicaMode = iota
	// Replicable values may be resident at several locations at once.
	Replicable
)

func (m ReplicaMode) String() string {
	if m == Replicable {
		return "replicable"
	}
	return "exclusive"
}

// ParseReplicaMode parses "exclusive" or "replicable" ("" means exclusive).
func ParseReplicaMode(s string) (ReplicaMode, error) {
	switch s {
	case "", "exclusive":
		return Exclusive, nil
	case "replicable":
		return Replicable, nil
	}
	return 0, invalidf("unknown replica mode %q: want exclusive or replicable", s)
}

// MatState is the state of a materialization.
type MatState int

const (
	// Entering: admitted and charged, transfer not yet complete.
	Entering MatState = iota
	// Resident: complete; may be leased and held.
	Resident
	// Leaving: the source of a move in flight; still charged.
	Leaving
)

func (s MatState) String() string {
	switch s {
	case Entering:
		return "entering"
	case Resident:
		return "resident"
	default:
		return "leaving"
	}
}

// Handle names a registered value. It is plain data (safe to copy and to
// send between actors or nodes). Manager and ID identify the value; Name is
// its registered name, carried for messages and errors.
type Handle struct {
	Manager string
	ID      uint64
	Name    string
}

func (h Handle) String() string { return h.Name }

// IsZero reports whether h is the zero Handle.
func (h Handle) IsZero() bool { return h.ID == 0 }

// LeaseID identifies a lease. IDs are never reused within a ledger.
type LeaseID uint64

// HoldID identifies a hold.
type HoldID uint64

// EventID identifies a recorded consumer event.
type EventID uint64

// AdmissionID identifies an admitted two-phase transition.
type AdmissionID uint64

// ValueSpec describes a value to register. Exactly one of At (the location
// the value's bytes are first materialized at) and Source (the location
// where reconstruction loads it temporarily) must be set.
type ValueSpec struct {
	Name   string
	Bytes  int64
	Mode   ReplicaMode
	At     string
	Source string
}

// EffectKind is a physical effect the runtime must carry out.
type EffectKind int

const (
	// EffectInitialize: allocate Bytes at Location and fill it with the
	// value's initial bytes (registration at a location).
	EffectInitialize EffectKind = iota
	// EffectCopy: allocate Bytes at Location and copy them from the
	// resident materialization at From.
	EffectCopy
	// EffectReconstruct: allocate Bytes at Location and run the value's
	// loader; when TempAt is set, load into a temporary buffer at TempAt
	// (the source location), copy it to Location, then free it.
	EffectReconstruct
	// EffectFree: release the buffer of the value at Location.
	EffectFree
	// EffectDropCharge: ask Owner to drop the idle cache entry whose
	// charge is Charge (Bytes at Location), then settle the pending step:
	// [Run.Complete] when it dropped it, [Run.FailStep] when it refused
	// because the entry became busy (doc_cache.go). Handle is zero.
	// With To set it is a demotion of the charge (charges_spill.go): the
	// owner keeps the entry at To under the charge Demoted, already
	// admitted there, and settles with [Run.Complete] (demoted),
	// [Run.CompleteDropped] (its copy failed: dropped) or [Run.FailStep]
	// (refused).
	EffectDropCharge
)

func (k EffectKind) String() string {
	switch k {
	case EffectInitialize:
		return "initialize"
	case EffectCopy:
		return "copy"
	case EffectReconstruct:
		return "reconstruct"
	case EffectDropCharge:
		return "drop_charge"
	default:
		return "free"
	}
}

// Effect is one physical step, plain data.
type Effect struct {
	Kind     EffectKind
	Handle   Handle
	Location string
	From     string
	TempAt   string
	Bytes    int64
	// Owner and Charge name the charge of an EffectDropCharge ("" for
	// every other kind).
	Owner  string
	Charge string
	// To and Demoted: an EffectDropCharge that demotes the charge names
	// the spill target and the owner's new charge there ("" otherwise).
	To      string
	Demoted string
}

func (e Effect) String() string {
	switch e.Kind {
	case EffectCopy:
		return fmt.Sprintf("copy %s %s→%s (%d bytes)", e.Handle.Name, e.From, e.Location, e.Bytes)
	case EffectReconstruct:
		if e.TempAt != "" {
			return fmt.Sprintf("reconstruct %s into %s via temporary buffer at %s (%d bytes)", e.Handle.Name, e.Location, e.TempAt, e.Bytes)
		}
		return fmt.Sprintf("reconstruct %s into %s (%d bytes)", e.Handle.Name, e.Location, e.Bytes)
	case EffectDropCharge:
		if e.To != "" {
			return fmt.Sprintf("demote charge %s of %s %s→%s as %s (%d bytes)", e.Charge, e.Owner, e.Location, e.To, e.Demoted, e.Bytes)
		}
		return fmt.Sprintf("drop charge %s of %s at %s (%d bytes)", e.Charge, e.Owner, e.Location, e.Bytes)
	default:
		return fmt.Sprintf("%s %s at %s (%d bytes)", e.Kind, e.Handle.Name, e.Location, e.Bytes)
	}
}

// Admission is an admitted transition: the effects to carry out now and,
// when Pending, an ID to pass to [Ledger.Complete] or [Ledger.Fail] once
// they are done. A zero-ID admission with no effects is a no-op (the
// endpoint was already resident; nothing was committed).
type Admission struct {
	ID      AdmissionID
	Pending bool
	Effects []Effect
}

// Action is one reclaim or enter step of a plan. From is optional (enter
// only): the resident materialization to copy (replicable) or move
// (exclusive) from. To is optional (reclaim only): it makes the reclaim a
// demotion, a move of the materialization at Location to To carried out
// in the reclaim phase with the move's charges (see spill.go). Charge and
// Owner (reclaim only, with no Handle, From or To) make the reclaim the
// eviction of an offered charge of a cache at Location, carried out by
// its owner (doc_cache.go).
type Action struct {
	Handle   Handle
	Location string
	From     string
	To       string
	Owner    string
	Charge   string
}

func (a Action) String() string {
	if a.Charge != "" {
		if a.To != "" {
			return fmt.Sprintf("charge %s of %s %s→%s (demotion)", a.Charge, a.Owner, a.Location, a.To)
		}
		return fmt.Sprintf("charge %s of %s at %s", a.Charge, a.Owner, a.Location)
	}
	if a.To != "" {
		return fmt.Sprintf("%s %s→%s (demotion)", a.Handle.Name, a.Location, a.To)
	}
	if a.From != "" {
		return fmt.Sprintf("%s %s→%s", a.Handle.Name, a.From, a.Location)
	}
	return fmt.Sprintf("%s at %s", a.Handle.Name, a.Location)
}

// ReservationSpec is a named reservation of a plan. Owner, when set,
// admits it as that owner's charge (as [Ledger.ReserveOwned]), whatever
// the run: a cache load's charge, for which a [Request] asks the
// controller to make room (doc_cache.go). It is then the owner's to
// release: a failed scope entry keeps it and [Run.Reservations] does not
// list it.
type ReservationSpec struct {
	Name     string
	Location string
	Bytes    int64
	Owner    string
}

func (r ReservationSpec) String() string {
	return fmt.Sprintf("%s: %d bytes at %s", r.Name, r.Bytes, r.Location)
}

// Plan is reclaim → reservations → enter, carried out in that order.
type Plan struct {
	Reclaim      []Action
	Reservations []ReservationSpec
	Enter        []Action
}

// Transition is one committed state transition.
type Transition struct {
	Version  uint64
	Kind     string
	Handle   string
	Location string
	Bytes    int64
	Detail   string
	// Removal is why a "remove" transition removed the materialization
	// (RemovalNone for every other kind); Detail says it in words.
	Removal RemovalKind
	// ID is the lease (acquire, release), hold (hold, unhold) or event
	// (record_event, reap_event) the transition is about; 0 for every
	// other kind. Detail names it in words ("lease 3").
	ID uint64
	// Lease is the lease a record_event's event was recorded on; 0 for
	// every other kind.
	Lease uint64
	// Name is the reservation a reserve or unreserve is about ("" for
	// every other kind); Detail is the same name.
	Name string
	// Failure is why a "fail" transition failed (FailureNone for every
	// other kind); Detail says it in words, with the cause.
	Failure FailureKind
}

func (t Transition) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "v%d %s", t.Version, t.Kind)
	if t.Handle != "" {
		b.WriteString(" " + t.Handle)
	}
	if t.Location != "" {
		b.WriteString(" @" + t.Location)
	}
	if t.Bytes != 0 {
		fmt.Fprintf(&b, " %dB", t.Bytes)
	}
	if t.Detail != "" {
		b.WriteString(" (" + t.Detail + ")")
	}
	return b.String()
}

// Report lists the transitions a plan, a scope or a direct operation
// committed, in order.
type Report struct {
	Transitions []Transition
}

// Explanation is the result of [Ledger.Explain].
type Explanation struct {
	Feasible bool
	// Reason is the first failure in words ("" when feasible).
	Reason string
	// PredictedPeakBytes is, for every location, the highest used+reserved
	// over the simulated sequence, starting from the current figures.
	PredictedPeakBytes map[string]int64
}

// LocationConfig configures one location.
type LocationConfig struct {
	Name        string
	HasBudget   bool
	BudgetBytes int64
	// SpillTo optionally names the location's spill target: a configured
	// location other than this one, where the controller demotes a
	// victim's only resident copy instead of dropping it when there is
	// room (see spill.go). "" (the default) means none.
	SpillTo string
}

// Config configures a [Ledger].
type Config struct {
	// ManagerID identifies the ledger; handles carry it. Required.
	ManagerID string
	// Locations is the fixed set of locations.
	Locations []LocationConfig
	// TraceCapacity is the size of the trace ring; 0 disables the trace.
	TraceCapacity int
	// SharedBudgets are figures over groups of locations that share one
	// memory (sharedbudgets.go); none by default.
	SharedBudgets []SharedBudget
}

// DefaultTraceCapacity is the trace ring size runtimes use by default.
const DefaultTraceCapacity = 1024

// DefaultStateLimit is the controller's default search state limit.
const DefaultStateLimit = 100000
