package cuda

import (
	"fmt"
	"sync"
)

// FaultKind names the operation an injected fault makes fail.
type FaultKind int

const (
	// FaultAlloc fails the next Allocate at the location.
	FaultAlloc FaultKind = iota
	// FaultCopy fails the next stream copy into the location.
	FaultCopy
	// FaultReconstruct fails the next Load whose target is the location.
	FaultReconstruct
)

// String returns "alloc", "copy" or "reconstruct".
func (k FaultKind) String() string {
	switch k {
	case FaultAlloc:
		return "alloc"
	case FaultCopy:
		return "copy"
	case FaultReconstruct:
		return "reconstruct"
	default:
		return fmt.Sprintf("FaultKind(%d)", int(k))
	}
}

// ParseFaultKind is the inverse of [FaultKind.String]: it accepts exactly
// "alloc", "copy" and "reconstruct". Anything else returns an error naming
// the string that matches errors.Is(err, ErrInvalid).
func ParseFaultKind(s string) (FaultKind, error) {
	switch s {
	case "alloc":
		return FaultAlloc, nil
	case "copy":
		return FaultCopy, nil
	case "reconstruct":
		return FaultReconstruct, nil
	}
	return 0, fmt.Errorf("%w: unknown fault kind %q (want alloc, copy or reconstruct)", ErrInvalid, s)
}

type faultKey struct {
	kind FaultKind
	loc  string
}

// Faults counts armed failures per (kind, location). Each Arm adds one
// failure; each Take consumes one. Locations are compared as exact strings:
// a fault armed at "cuda:0" does not fire for "cuda:0@node-b".
//
// The zero value is ready to use. A Faults is safe for concurrent use; Take
// is atomic, so an armed failure is consumed by exactly one operation.
type Faults struct {
	mu    sync.Mutex
	armed map[faultKey]int // guarded by mu; no zero counts are stored
}

// NewFaults returns an empty fault injector.
func NewFaults() *Faults { return &Faults{} }

// Arm arms one more failure of kind at loc. Arming twice makes the next two
// matching operations fail.
func (f *Faults) Arm(kind FaultKind, loc string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.armed == nil {
		f.armed = make(map[faultKey]int)
	}
	f.armed[faultKey{kind, loc}]++
}

// Take consumes one armed failure of kind at loc and reports whether there
// was one. Backends call it; tests and tools normally only Arm.
func (f *Faults) Take(kind FaultKind, loc string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := faultKey{kind, loc}
	n := f.armed[k]
	if n == 0 {
		return false
	}
	if n == 1 {
		delete(f.armed, k)
	} else {
		f.armed[k] = n - 1
	}
	return true
}

// Armed returns how many failures of kind are armed at loc.
func (f *Faults) Armed(kind FaultKind, loc string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.armed[faultKey{kind, loc}]
}

// Reset disarms every fault.
func (f *Faults) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.armed)
}
