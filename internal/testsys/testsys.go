// Package testsys opens the device backend of the project's tests: the
// soft backend (simulated devices), asked for by name as every runtime's
// backend must be, behind the fault-injecting decorator of cuda/faulty so
// that a test can arm faults. No user of the module can import it.
//
// A test that starts a runtime passes Soft's backend in
// system.Options.Backend; Soft closes it when the test ends, after the
// runtime (cleanups run last-registered first, so register the runtime's
// Close after calling Soft).
package testsys

import (
	"testing"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
)

// Option adjusts the soft backend's configuration.
type Option func(*soft.Config)

// Capacity gives locations a simulated capacity in bytes (soft.Config.Capacity).
func Capacity(c map[string]int64) Option {
	return func(cfg *soft.Config) { cfg.Capacity = c }
}

// Bandwidth delays every stream copy as at bytesPerSec
// (soft.Config.BandwidthBytesPerSec).
func Bandwidth(bytesPerSec int64) Option {
	return func(cfg *soft.Config) { cfg.BandwidthBytesPerSec = bytesPerSec }
}

// Soft opens the soft backend over the names of locs, each without its
// node (a cluster node's runtime knows its locations by their local
// names), behind the fault injector, and closes it when the test ends. It
// fails the test if the backend cannot be opened.
//
// Malformed and repeated names are left out, so that a test of Start's
// refusal of them gets the runtime's error, not the backend's; with no
// name left the backend has pageable-host alone.
func Soft(t testing.TB, locs []budget.LocationConfig, opts ...Option) *faulty.Backend {
	t.Helper()
	b, err := OpenSoft(locs, opts...)
	if err != nil {
		t.Fatalf("testsys: opening the soft backend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// OpenSoft is Soft for code without a testing.TB (examples): the caller
// closes the backend.
func OpenSoft(locs []budget.LocationConfig, opts ...Option) (*faulty.Backend, error) {
	cfg := soft.Config{Locations: budget.LocalNames(locs)}
	if len(cfg.Locations) == 0 {
		cfg.Locations = []string{"pageable-host"}
	}
	for _, o := range opts {
		o(&cfg)
	}
	b, err := soft.New(cfg)
	if err != nil {
		return nil, err
	}
	return faulty.Wrap(b, soft.ErrorPrefix), nil
}

// Faults returns the fault injector of a runtime's backend (anything with
// a Backend method: *system.System), which Soft made. It panics if the
// backend has no injector: the test did not start the runtime on Soft.
func Faults(sys interface{ Backend() cuda.Backend }) *cuda.Faults {
	f := faulty.Of(sys.Backend())
	if f == nil {
		panic("testsys: the runtime's backend has no fault injector (start it with testsys.Soft)")
	}
	return f
}
