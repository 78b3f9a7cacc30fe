package cuda

import "github.com/residency-go/residency/budget"

// The location grammar is the ledger's: package budget parses location
// names ([budget.ParseLocation]) and this package reuses its types, so a
// name the runtime accepts is exactly a name every backend accepts.
type (
	// Kind is the kind of memory a location names.
	Kind = budget.LocationKind
	// LocationName is a parsed location name: its kind, the device
	// ordinal N of cuda:N (Device; 0 for host kinds) and the node of a
	// node-qualified name ("" otherwise). Its String is the canonical
	// spelling, which ParseLocationName maps back to the same value.
	LocationName = budget.LocationName
)

// The location kinds.
const (
	// KindPageableHost is ordinary (pageable) host memory: "pageable-host".
	KindPageableHost = budget.PageableHost
	// KindPinnedHost is page-locked host memory: "pinned-host".
	KindPinnedHost = budget.PinnedHost
	// KindCUDA is the memory of one GPU: "cuda:N".
	KindCUDA = budget.CUDA
)

// ParseLocation parses a location name and returns its kind and, for
// cuda:N, the device ordinal N (0 for host kinds). A node suffix is
// accepted and ignored; use [ParseLocationName] to keep it.
func ParseLocation(s string) (Kind, int, error) {
	n, err := ParseLocationName(s)
	if err != nil {
		return 0, 0, err
	}
	return n.Kind, n.Device, nil
}

// ParseLocationName parses a location name with the grammar of
// [budget.ParseLocation]: exactly "pageable-host", "pinned-host" and
// "cuda:N" (N decimal, 1 to 6 digits, no sign, no leading zero), each
// optionally followed by "@node" (a non-empty run of ASCII letters,
// digits, '-', '_' and '.'), case-sensitive, so that every location has one
// spelling. Anything else returns a [*LocationError] naming s, which
// matches [ErrInvalid] and wraps the ledger's [*budget.InvalidInputError].
func ParseLocationName(s string) (LocationName, error) {
	n, err := budget.ParseLocation(s)
	if err != nil {
		return LocationName{}, &LocationError{Name: s, Err: err}
	}
	return n, nil
}
