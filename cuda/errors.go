package cuda

import (
	"errors"
	"fmt"

	"github.com/residency-go/residency/budget"
)

// Sentinel errors. Backends wrap them with detail; match them with
// errors.Is.
var (
	// ErrClosed is returned by a closed backend or stream.
	ErrClosed = errors.New("cuda: closed")
	// ErrFreed is returned for a buffer that was already freed.
	ErrFreed = errors.New("cuda: buffer already freed")
	// ErrInvalid is returned for bad input: a negative or zero size,
	// mismatched sizes, a nil or foreign buffer, a nil loader, a malformed
	// location (see [LocationError]) or an unknown fault kind.
	ErrInvalid = errors.New("cuda: invalid argument")
	// ErrUnknownLocation is returned for a well-formed location that the
	// backend was not configured with.
	ErrUnknownLocation = errors.New("cuda: location not configured")
	// ErrOutOfMemory matches every [*OutOfMemoryError].
	ErrOutOfMemory = errors.New("cuda: out of memory")
	// ErrInjectedFault matches every [*InjectedFaultError].
	ErrInjectedFault = errors.New("cuda: injected fault")
)

// OutOfMemoryError is returned by Allocate when the location cannot hold the
// request. It matches errors.Is(err, ErrOutOfMemory).
type OutOfMemoryError struct {
	Location  string // the location asked for
	Requested int64  // bytes requested
	Free      int64  // bytes free at the location when the request failed
}

func (e *OutOfMemoryError) Error() string {
	return fmt.Sprintf("cuda: out of memory at %s: requested %d bytes, %d free", e.Location, e.Requested, e.Free)
}

// Is reports whether target is ErrOutOfMemory.
func (e *OutOfMemoryError) Is(target error) bool { return target == ErrOutOfMemory }

// InjectedFaultError is the failure produced by an armed fault (see
// [Faults] and the decorator in package cuda/faulty). It matches
// errors.Is(err, ErrInjectedFault).
type InjectedFaultError struct {
	Kind     FaultKind // which operation failed
	Location string    // the location the fault was armed at
	// Backend names the backend whose operation was made to fail, as the
	// message's prefix ("soft backend", "cu backend"). Empty reads as
	// "cuda".
	Backend string
}

func (e *InjectedFaultError) Error() string {
	by := e.Backend
	if by == "" {
		by = "cuda"
	}
	return fmt.Sprintf("%s: injected %s fault at %s", by, e.Kind, e.Location)
}

// Is reports whether target is ErrInjectedFault.
func (e *InjectedFaultError) Is(target error) bool { return target == ErrInjectedFault }

// LoaderPanicError is returned by Load when the loader panicked or called
// runtime.Goexit. Value is the value passed to panic (for a Goexit, an
// error saying so), Stack the loader goroutine's stack; Goexit is true
// when the loader called runtime.Goexit instead of returning.
type LoaderPanicError struct {
	Value  any
	Stack  []byte
	Goexit bool
}

func (e *LoaderPanicError) Error() string {
	if e.Goexit {
		return fmt.Sprintf("cuda: loader did not return: %v", e.Value)
	}
	return fmt.Sprintf("cuda: loader panicked: %v", e.Value)
}

// Unwrap returns the panic value if it is an error, and nil otherwise.
func (e *LoaderPanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// LocationError reports a malformed location name. It matches
// errors.Is(err, ErrInvalid); Unwrap returns the ledger's parse error (a
// [*budget.InvalidInputError] saying what is wrong with the name).
type LocationError struct {
	Name string // the string as given
	Err  error  // why it is malformed
}

func (e *LocationError) Error() string {
	var ie *budget.InvalidInputError
	if errors.As(e.Err, &ie) {
		return "cuda: " + ie.Message
	}
	return fmt.Sprintf("cuda: malformed location %q: %v", e.Name, e.Err)
}

// Is reports whether target is ErrInvalid.
func (e *LocationError) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns the parse error.
func (e *LocationError) Unwrap() error { return e.Err }
