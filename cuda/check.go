package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime/debug"
)

// Checker makes the argument checks that every backend shares, so that
// each bad input gets the same error from every backend. Prefix names the
// backend at the start of each message ("soft backend", "cu backend").
//
// A backend calls the checks in the order its methods document, before it
// charges, allocates or enqueues anything. Checker is a value with no
// state; its methods are safe for concurrent use.
type Checker struct {
	Prefix string
}

// Config checks a backend's configuration: at least one location, each
// well-formed and configured once, and capacities >= 0 given only for
// configured locations. It returns the parsed names in the order given,
// or an error matching [ErrInvalid] (a [*LocationError] for a malformed
// name).
func (c Checker) Config(locations []string, capacity map[string]int64) ([]LocationName, error) {
	if len(locations) == 0 {
		return nil, fmt.Errorf("%w: %s: no locations configured", ErrInvalid, c.Prefix)
	}
	names := make([]LocationName, len(locations))
	seen := make(map[string]bool, len(locations))
	for i, loc := range locations {
		n, err := ParseLocationName(loc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Prefix, err)
		}
		if seen[loc] {
			return nil, fmt.Errorf("%w: %s: location %q configured twice", ErrInvalid, c.Prefix, loc)
		}
		seen[loc], names[i] = true, n
	}
	for loc, bytes := range capacity {
		if !seen[loc] {
			return nil, fmt.Errorf("%w: %s: capacity given for %q, which is not in Locations", ErrInvalid, c.Prefix, loc)
		}
		if bytes < 0 {
			return nil, fmt.Errorf("%w: %s: negative capacity %d for %s", ErrInvalid, c.Prefix, bytes, loc)
		}
	}
	return names, nil
}

// Unconfigured is the error for a location the backend was not configured
// with: a [*LocationError] for a malformed name, otherwise an error
// matching [ErrUnknownLocation].
func (c Checker) Unconfigured(loc string) error {
	if _, err := ParseLocationName(loc); err != nil {
		return fmt.Errorf("%s: %w", c.Prefix, err)
	}
	return fmt.Errorf("%w: %s: %q", ErrUnknownLocation, c.Prefix, loc)
}

// Foreign is the error for a buffer argument that is not one of the
// backend's own: nil, of another type, or of another backend of the same
// type (other). what names the argument ("copy source").
func (c Checker) Foreign(what string, buf Buffer, other bool) error {
	if other {
		return fmt.Errorf("%w: %s: %s belongs to another backend", ErrInvalid, c.Prefix, what)
	}
	return fmt.Errorf("%w: %s: %s is %T, not a buffer of this backend", ErrInvalid, c.Prefix, what, buf)
}

// Size checks the size of an allocation at loc: bytes > 0.
func (c Checker) Size(loc string, bytes int64) error {
	if bytes <= 0 {
		return fmt.Errorf("%w: %s: allocation of %d bytes at %s", ErrInvalid, c.Prefix, bytes, loc)
	}
	return nil
}

// Copy checks the buffers of a copy, once both are known to be the
// backend's own: distinct, of the same size.
func (c Checker) Copy(dst, src Buffer) error {
	if dst == src {
		return fmt.Errorf("%w: %s: copy of %v onto itself", ErrInvalid, c.Prefix, dst)
	}
	if dst.Size() != src.Size() {
		return fmt.Errorf("%w: %s: copy size mismatch: %v -> %v", ErrInvalid, c.Prefix, src, dst)
	}
	return nil
}

// Write checks that n bytes can be written into buf: n == buf.Size().
func (c Checker) Write(buf Buffer, n int) error {
	if int64(n) != buf.Size() {
		return fmt.Errorf("%w: %s: write of %d bytes into %v", ErrInvalid, c.Prefix, n, buf)
	}
	return nil
}

// Loader checks the loader of a Load: not nil.
func (c Checker) Loader(loader Loader) error {
	if loader == nil {
		return fmt.Errorf("%w: %s: nil loader", ErrInvalid, c.Prefix)
	}
	return nil
}

// LoadTarget checks the target of a Load: empty (the buffer's own
// location) or well-formed. It need not be configured: it only names the
// location the value is reconstructed for.
func (c Checker) LoadTarget(target string) error {
	if target == "" {
		return nil
	}
	if _, err := ParseLocationName(target); err != nil {
		return fmt.Errorf("%s: load target: %w", c.Prefix, err)
	}
	return nil
}

// Event checks the event of a WaitEvent: neither nil nor a nil pointer.
func (c Checker) Event(ev Event) error {
	if ev == nil {
		return fmt.Errorf("%w: %s: WaitEvent(nil)", ErrInvalid, c.Prefix)
	}
	if v := reflect.ValueOf(ev); v.Kind() == reflect.Pointer && v.IsNil() {
		return fmt.Errorf("%w: %s: WaitEvent of a nil event", ErrInvalid, c.Prefix)
	}
	return nil
}

// RunLoader calls loader(ctx, dst) to load a value for target into a
// buffer at loc. A loader error is returned wrapped (errors.Is and
// errors.As see it), with the prefix, the size, loc and target in the
// message; a panic is recovered and returned as a [*LoaderPanicError]
// with the panicking goroutine's stack.
func (c Checker) RunLoader(ctx context.Context, loader Loader, dst []byte, loc, target string) error {
	panicked, err := runLoader(ctx, loader, dst)
	if panicked != nil {
		return panicked
	}
	if err != nil {
		return fmt.Errorf("%s: loading %d bytes at %s for %s: %w", c.Prefix, len(dst), loc, target, err)
	}
	return nil
}

// runLoader runs loader on a goroutine of its own and waits for it, so
// that a loader calling runtime.Goexit (t.FailNow in a test's loader)
// ends only that goroutine: it is reported as a [*LoaderPanicError] with
// Goexit set, like a panic.
func runLoader(ctx context.Context, loader Loader, dst []byte) (panicked *LoaderPanicError, err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		returned := false
		defer func() {
			if v := recover(); v != nil {
				panicked = &LoaderPanicError{Value: v, Stack: debug.Stack()}
			} else if !returned {
				panicked = &LoaderPanicError{Value: errGoexit, Stack: debug.Stack(), Goexit: true}
			}
		}()
		err = loader(ctx, dst)
		returned = true
	}()
	<-done
	return panicked, err
}

// errGoexit is the Value of a [*LoaderPanicError] for a loader that
// called runtime.Goexit.
var errGoexit = errors.New("the loader called runtime.Goexit (t.FailNow or t.SkipNow in a test's loader?)")

// FreeBytes is MemInfo.FreeBytes of a location with capacity bytes (0:
// unlimited) of which used are in use.
func FreeBytes(capacity, used int64) int64 {
	if capacity == 0 {
		return math.MaxInt64 - used
	}
	return capacity - used
}
