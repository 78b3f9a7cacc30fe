package budget

// More reasons as data: why a transfer's admission failed, and which kind
// of lifetime (lease, hold, event) an id names. A [Transition] and an
// [*InvalidInputError] carry them next to their text, so that programs
// (diagnosis, replay) never read ids or kinds back out of the words.

// FailureKind says why a "fail" [Transition] failed ([Transition].Failure),
// next to its Detail in words. The zero value, FailureNone, is every other
// transition's.
type FailureKind uint8

// The kinds of failure.
const (
	// FailureNone: not a failure.
	FailureNone FailureKind = iota
	// FailureTransfer: a copy, move or reconstruction into a location
	// failed; its charge was released. Detail "transfer failed", then the
	// cause.
	FailureTransfer
	// FailureRegistration: the first materialization of a registration
	// failed; the handle was retired and its name freed. Detail
	// "registration failed; handle retired", then the cause.
	FailureRegistration
)

// String is the kind in snake case: "transfer", "registration" ("" for
// FailureNone, "other" for a value out of range).
func (k FailureKind) String() string {
	switch k {
	case FailureNone:
		return ""
	case FailureTransfer:
		return "transfer"
	case FailureRegistration:
		return "registration"
	}
	return "other"
}

// MarshalText writes the kind as [FailureKind.String].
func (k FailureKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind as [FailureKind.String] writes it; any other
// text reads as FailureNone.
func (k *FailureKind) UnmarshalText(b []byte) error {
	*k = FailureNone
	for _, x := range []FailureKind{FailureTransfer, FailureRegistration} {
		if string(b) == x.String() {
			*k = x
		}
	}
	return nil
}

// LifetimeKind says what an id names: a lease, a hold or an event
// ([*InvalidInputError].Inactive). The zero value, LifetimeNone, names
// nothing.
type LifetimeKind uint8

// The kinds of lifetime.
const (
	LifetimeNone LifetimeKind = iota
	LifetimeLease
	LifetimeHold
	LifetimeEvent
)

// String is the kind as the runtime's messages name it: "lease", "hold",
// "event" ("" for LifetimeNone, "other" for a value out of range).
func (k LifetimeKind) String() string {
	switch k {
	case LifetimeNone:
		return ""
	case LifetimeLease:
		return "lease"
	case LifetimeHold:
		return "hold"
	case LifetimeEvent:
		return "event"
	}
	return "other"
}

// MarshalText writes the kind as [LifetimeKind.String].
func (k LifetimeKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind as [LifetimeKind.String] writes it; any other
// text reads as LifetimeNone.
func (k *LifetimeKind) UnmarshalText(b []byte) error {
	*k = LifetimeNone
	for _, x := range []LifetimeKind{LifetimeLease, LifetimeHold, LifetimeEvent} {
		if string(b) == x.String() {
			*k = x
		}
	}
	return nil
}
