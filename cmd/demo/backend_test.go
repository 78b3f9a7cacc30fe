package main

import (
	"context"
	"testing"

	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// startSoft is system.Start on the soft backend behind the fault injector
// (testsys.Soft, closed when the test ends) when opts names no backend.
func startSoft(tb testing.TB, ctx context.Context, opts system.Options) (*system.System, error) {
	tb.Helper()
	if opts.Backend == nil {
		opts.Backend = testsys.Soft(tb, opts.Locations)
	}
	return system.Start(ctx, opts)
}

// The demo's runtimes run on simulated devices and say so: the backend
// reports itself simulated, through the fault injector too.
func TestDemoBackendsAreSimulated(t *testing.T) {
	b, err := newSoftBackend([]system.LocationConfig{system.NoLimit("pageable-host"), system.NoLimit("cuda:0@node-a")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Simulated() {
		t.Errorf("%s: not simulated", b.Name())
	}
	if _, err := b.MemInfo("cuda:0"); err != nil {
		t.Errorf("a node's own location is served by its local name: %v", err)
	}
}
