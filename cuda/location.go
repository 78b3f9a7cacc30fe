package cuda

import (
	"strconv"
	"strings"
)

// Kind is the kind of memory a location names.
type Kind int

const (
	// KindPageableHost is ordinary (pageable) host memory: "pageable-host".
	KindPageableHost Kind = iota
	// KindPinnedHost is page-locked host memory: "pinned-host".
	KindPinnedHost
	// KindCUDA is the memory of one GPU: "cuda:N".
	KindCUDA
)

// String returns "pageable-host", "pinned-host" or "cuda".
func (k Kind) String() string {
	switch k {
	case KindPageableHost:
		return "pageable-host"
	case KindPinnedHost:
		return "pinned-host"
	case KindCUDA:
		return "cuda"
	default:
		return "Kind(" + strconv.Itoa(int(k)) + ")"
	}
}

// IsHost reports whether k is host memory (pageable or pinned).
func (k Kind) IsHost() bool { return k == KindPageableHost || k == KindPinnedHost }

// maxOrdinalDigits bounds N in cuda:N (at most 999999).
const maxOrdinalDigits = 6

// LocationName is a parsed location name.
type LocationName struct {
	Kind    Kind
	Ordinal int    // N of cuda:N; 0 for host kinds
	Node    string // the node of a node-qualified name; "" otherwise
}

// String returns the canonical name, which ParseLocationName accepts and
// maps back to n: "pageable-host", "pinned-host" or "cuda:N", followed by
// "@node" when Node is set.
func (n LocationName) String() string {
	var s string
	if n.Kind == KindCUDA {
		s = "cuda:" + strconv.Itoa(n.Ordinal)
	} else {
		s = n.Kind.String()
	}
	if n.Node != "" {
		s += "@" + n.Node
	}
	return s
}

// Local returns n without its node: the name as the node itself knows it.
func (n LocationName) Local() LocationName {
	n.Node = ""
	return n
}

// ParseLocation parses a location name and returns its kind and, for
// cuda:N, the device ordinal N (0 for host kinds). A node suffix is
// accepted and ignored; use [ParseLocationName] to keep it.
//
// The accepted grammar is exactly that of ParseLocationName.
func ParseLocation(s string) (Kind, int, error) {
	n, err := ParseLocationName(s)
	if err != nil {
		return 0, 0, err
	}
	return n.Kind, n.Ordinal, nil
}

// ParseLocationName parses a location name. It accepts exactly
// "pageable-host", "pinned-host" and "cuda:N", each optionally followed by
// "@node". N is written in decimal with 1 to 6 digits, no sign and no
// leading zero ("cuda:0" and "cuda:10" are accepted; "cuda:01", "cuda:+1",
// "cuda:-1" and "cuda:" are not), so every ordinal has one spelling. node
// is a non-empty run of ASCII letters, digits, '-', '_' and '.'. Names are
// case-sensitive. Anything else returns a [*LocationError] naming s.
func ParseLocationName(s string) (LocationName, error) {
	var n LocationName
	base := s
	if i := strings.IndexByte(s, '@'); i >= 0 {
		base, n.Node = s[:i], s[i+1:]
		if !validNode(n.Node) {
			return LocationName{}, &LocationError{Name: s, Reason: "node must be a non-empty run of letters, digits, '-', '_' and '.'"}
		}
	}
	switch {
	case base == "pageable-host":
		n.Kind = KindPageableHost
	case base == "pinned-host":
		n.Kind = KindPinnedHost
	case strings.HasPrefix(base, "cuda:"):
		digits := base[len("cuda:"):]
		if !validOrdinal(digits) {
			return LocationName{}, &LocationError{Name: s, Reason: "want cuda:N with N a decimal device ordinal (no sign, no leading zero, at most 6 digits)"}
		}
		n.Kind = KindCUDA
		n.Ordinal, _ = strconv.Atoi(digits) // cannot fail: checked above
	default:
		return LocationName{}, &LocationError{Name: s, Reason: "want pageable-host, pinned-host or cuda:N"}
	}
	return n, nil
}

func validOrdinal(d string) bool {
	if d == "" || len(d) > maxOrdinalDigits || (len(d) > 1 && d[0] == '0') {
		return false
	}
	for i := 0; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return false
		}
	}
	return true
}

func validNode(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c == '-' || c == '_' || c == '.' ||
			(c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !ok {
			return false
		}
	}
	return true
}
