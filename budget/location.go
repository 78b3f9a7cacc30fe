package budget

import (
	"strconv"
	"strings"
)

// LocationKind is the kind of memory a location names.
type LocationKind int

const (
	// PageableHost is ordinary host memory.
	PageableHost LocationKind = iota
	// PinnedHost is page-locked host memory (DMA-capable).
	PinnedHost
	// CUDA is the memory of one GPU.
	CUDA
)

// String returns "pageable-host", "pinned-host" or "cuda".
func (k LocationKind) String() string {
	switch k {
	case PageableHost:
		return "pageable-host"
	case PinnedHost:
		return "pinned-host"
	case CUDA:
		return "cuda"
	default:
		return "LocationKind(" + strconv.Itoa(int(k)) + ")"
	}
}

// LocationName is a parsed, canonical location name.
type LocationName struct {
	Kind   LocationKind
	Device int    // N of cuda:N; 0 otherwise
	Node   string // "" unless node-qualified
}

// String gives the canonical name: "pageable-host", "pinned-host",
// "cuda:N", each optionally followed by "@node".
func (n LocationName) String() string {
	var s string
	if n.Kind == CUDA {
		s = "cuda:" + strconv.Itoa(n.Device)
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

// LocalNames returns the names a device backend must serve for locs: the
// distinct well-formed names among them, in order, each without its node
// (a cluster node's runtime knows its own locations by their local
// names). Malformed names are left out: the ledger refuses them.
func LocalNames(locs []LocationConfig) []string {
	var names []string
	seen := map[string]bool{}
	for _, l := range locs {
		n, err := ParseLocation(l.Name)
		if err != nil {
			continue
		}
		if name := n.Local().String(); !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names
}

// ParseLocation parses a location name. It accepts exactly
// `pageable-host`, `pinned-host` and `cuda:N` (N decimal, no sign, no
// leading zeros, at most 6 digits), each optionally followed by `@node`
// where node is a non-empty run of letters, digits, '-', '_' and '.'.
// Anything else is an [*InvalidInputError] naming the string.
func ParseLocation(s string) (LocationName, error) {
	var n LocationName
	base := s
	if i := strings.IndexByte(s, '@'); i >= 0 {
		base, n.Node = s[:i], s[i+1:]
		if !validNode(n.Node) {
			return LocationName{}, invalidf("malformed location %q: bad node name", s)
		}
	}
	switch {
	case base == "pageable-host":
		n.Kind = PageableHost
	case base == "pinned-host":
		n.Kind = PinnedHost
	case strings.HasPrefix(base, "cuda:"):
		digits := base[len("cuda:"):]
		if digits == "" || len(digits) > 6 || (len(digits) > 1 && digits[0] == '0') {
			return LocationName{}, invalidf("malformed location %q: want cuda:N with N a decimal device index", s)
		}
		for _, c := range digits {
			if c < '0' || c > '9' {
				return LocationName{}, invalidf("malformed location %q: want cuda:N with N a decimal device index", s)
			}
		}
		n.Kind = CUDA
		n.Device, _ = strconv.Atoi(digits)
	default:
		return LocationName{}, invalidf("malformed location %q: want pageable-host, pinned-host or cuda:N", s)
	}
	return n, nil
}

func validNode(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		ok := c == '-' || c == '_' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !ok {
			return false
		}
	}
	return true
}

// locationLess is the location order: unqualified before node-qualified,
// then by node, then pageable-host, pinned-host, cuda:0, cuda:1, ….
func locationLess(a, b LocationName) bool {
	if a.Node != b.Node {
		return a.Node < b.Node // "" sorts first
	}
	if a.Kind != b.Kind {
		return a.Kind < b.Kind
	}
	return a.Device < b.Device
}

// sourceRank orders candidate sources of a transfer: pinned-host,
// pageable-host, cuda:0, cuda:1, … (node as in locationLess).
func sourceLess(a, b LocationName) bool {
	if a.Node != b.Node {
		return a.Node < b.Node
	}
	ra, rb := sourceKindRank(a.Kind), sourceKindRank(b.Kind)
	if ra != rb {
		return ra < rb
	}
	return a.Device < b.Device
}

func sourceKindRank(k LocationKind) int {
	switch k {
	case PinnedHost:
		return 0
	case PageableHost:
		return 1
	default:
		return 2
	}
}
