package system

import "github.com/residency-go/residency/budget"

// The kinds of reasons, re-exported from the ledger: a "remove"
// transition's [Transition].Removal and a decision's [Eviction].Kind.
// They are the data; Transition.Detail and Eviction.Reason say the same
// in words, for people, and nothing parses those words.
type (
	RemovalKind  = budget.RemovalKind
	EvictionKind = budget.EvictionKind
	// FailureKind is a "fail" transition's [Transition].Failure.
	FailureKind = budget.FailureKind
	// LifetimeKind says what an [*InvalidInputError]'s ID names when the
	// refusal is of an inactive lease, hold or event (its Inactive).
	LifetimeKind = budget.LifetimeKind
)

// Kinds of failure ([Transition].Failure).
const (
	FailureNone         = budget.FailureNone
	FailureTransfer     = budget.FailureTransfer
	FailureRegistration = budget.FailureRegistration
)

// Kinds of lifetime ([*InvalidInputError].Inactive).
const (
	LifetimeNone  = budget.LifetimeNone
	LifetimeLease = budget.LifetimeLease
	LifetimeHold  = budget.LifetimeHold
	LifetimeEvent = budget.LifetimeEvent
)

// Kinds of removal ([Transition].Removal; [Snapshot].RemovalCounts).
const (
	RemovalNone       = budget.RemovalNone
	RemovalEvict      = budget.RemovalEvict
	RemovalReclaim    = budget.RemovalReclaim
	RemovalMoveSource = budget.RemovalMoveSource
	RemovalDiscard    = budget.RemovalDiscard
	RemovalShutdown   = budget.RemovalShutdown
)

// Kinds of eviction ([Eviction].Kind).
const (
	EvictionOther          = budget.EvictionOther
	EvictionLowestPriority = budget.EvictionLowestPriority
	EvictionDemoted        = budget.EvictionDemoted
	EvictionIdleCacheEntry = budget.EvictionIdleCacheEntry
)

// RemovalKinds lists every kind of removal (RemovalNone excluded).
func RemovalKinds() []RemovalKind { return budget.RemovalKinds() }

// ParseUnavailableReason reads an [*UnavailableError]'s reason as
// UnavailableReason's String writes it ("endpoint", "location", "source",
// "discarded", "foreign", "in_flight").
func ParseUnavailableReason(s string) (UnavailableReason, bool) {
	return budget.ParseUnavailableReason(s)
}

// TieBreak is a request's [Request].TieBreak: how the controller chooses
// among equally ranked assignments within a tier.
type TieBreak = budget.TieBreak

// Tie-breaks ([Request].TieBreak).
const (
	// TieFirstListed (the default): the first listed location of a tier wins a tie.
	TieFirstListed = budget.TieFirstListed
	// TieMostFree: the chosen location with the most free bytes wins a tie.
	TieMostFree = budget.TieMostFree
)
