package budget

// Reasons as data: a removal and a decision's eviction carry a kind, an
// enum for programs (metrics, diagnosis), next to their text for people.
// Nothing reads the text back.

// RemovalKind says why a materialization was removed: the kind of a
// "remove" [Transition] ([Transition].Removal), next to its Detail in
// words. The zero value, RemovalNone, is every other transition's.
type RemovalKind uint8

// The kinds of removal.
const (
	// RemovalNone: not a removal.
	RemovalNone RemovalKind = iota
	// RemovalEvict: an explicit eviction (Evict). Detail "evict".
	RemovalEvict
	// RemovalReclaim: a plan's reclaim step, a decision's victim among
	// them. Detail "reclaim".
	RemovalReclaim
	// RemovalMoveSource: the source of a completed move. Detail "move
	// source", or "move source (destination already resident)".
	RemovalMoveSource
	// RemovalDiscard: the value was discarded. Detail "discard".
	RemovalDiscard
	// RemovalShutdown: the runtime closed. Detail "shutdown".
	RemovalShutdown

	numRemovalKinds
)

// RemovalKinds lists every kind of removal (RemovalNone excluded), in
// order.
func RemovalKinds() []RemovalKind {
	out := make([]RemovalKind, 0, numRemovalKinds-1)
	for k := RemovalEvict; k < numRemovalKinds; k++ {
		out = append(out, k)
	}
	return out
}

// String is the kind in snake case: "evict", "reclaim", "move_source",
// "discard", "shutdown" ("" for RemovalNone, "other" for a value out of
// range).
func (k RemovalKind) String() string {
	switch k {
	case RemovalNone:
		return ""
	case RemovalEvict:
		return "evict"
	case RemovalReclaim:
		return "reclaim"
	case RemovalMoveSource:
		return "move_source"
	case RemovalDiscard:
		return "discard"
	case RemovalShutdown:
		return "shutdown"
	}
	return "other"
}

// detail is the kind's Detail text (a move source's detail may say more).
func (k RemovalKind) detail() string {
	if k == RemovalMoveSource {
		return "move source"
	}
	return k.String()
}

// MarshalText writes the kind as [RemovalKind.String].
func (k RemovalKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind as [RemovalKind.String] writes it; any
// other text reads as RemovalNone.
func (k *RemovalKind) UnmarshalText(b []byte) error {
	*k = RemovalNone
	for _, x := range RemovalKinds() {
		if x.String() == string(b) {
			*k = x
		}
	}
	return nil
}

// EvictionKind says why the controller chose a victim ([Eviction].Kind),
// next to its Reason in words.
type EvictionKind uint8

// The kinds of eviction.
const (
	// EvictionOther: a reason the runtime does not name (the zero value,
	// for an Eviction built or read by a caller).
	EvictionOther EvictionKind = iota
	// EvictionLowestPriority: the victim had the lowest priority H (last
	// use) among the candidates at its location.
	EvictionLowestPriority
	// EvictionDemoted: a victim chosen like EvictionLowestPriority whose
	// value had no other resident copy and is demoted to its location's
	// spill target ([Eviction].To) instead of dropped (spill.go).
	EvictionDemoted
	// EvictionIdleCacheEntry: an idle cache entry's offered charge
	// ([Eviction].Owner, [Eviction].Charge), chosen by the same rule as
	// EvictionLowestPriority: the least valuable at its location.
	EvictionIdleCacheEntry
)

// String is the kind in snake case: "lowest_priority", "demoted",
// "idle_cache_entry", "other".
func (k EvictionKind) String() string {
	switch k {
	case EvictionLowestPriority:
		return "lowest_priority"
	case EvictionDemoted:
		return "demoted"
	case EvictionIdleCacheEntry:
		return "idle_cache_entry"
	}
	return "other"
}

// MarshalText writes the kind as [EvictionKind.String].
func (k EvictionKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind as [EvictionKind.String] writes it; any
// other text reads as EvictionOther.
func (k *EvictionKind) UnmarshalText(b []byte) error {
	*k = EvictionOther
	for _, x := range []EvictionKind{EvictionLowestPriority, EvictionDemoted, EvictionIdleCacheEntry} {
		if string(b) == x.String() {
			*k = x
		}
	}
	return nil
}

// String is the reason in snake case: "endpoint", "location", "source",
// "discarded", "foreign", "in_flight" ("" for a value out of range).
func (r UnavailableReason) String() string {
	if r < 0 || int(r) >= len(unavailableReasonNames) {
		return ""
	}
	return unavailableReasonNames[r]
}

var unavailableReasonNames = [...]string{
	UnavailableEndpoint:  "endpoint",
	UnavailableLocation:  "location",
	UnavailableSource:    "source",
	UnavailableDiscarded: "discarded",
	UnavailableForeign:   "foreign",
	UnavailableInFlight:  "in_flight",
}

// ParseUnavailableReason reads a reason as [UnavailableReason.String]
// writes it.
func ParseUnavailableReason(s string) (UnavailableReason, bool) {
	for i, n := range unavailableReasonNames {
		if n == s {
			return UnavailableReason(i), true
		}
	}
	return 0, false
}
