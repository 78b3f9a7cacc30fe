package cache_test

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
