package system

import (
	"context"
	"testing"

	"github.com/residency-go/residency/internal/testsys"
)

// startSoft is Start on the soft backend behind the fault injector
// (testsys.Soft, closed when the test ends) when opts names no backend.
func startSoft(tb testing.TB, ctx context.Context, opts Options) (*System, error) {
	tb.Helper()
	if opts.Backend == nil {
		opts.Backend = testsys.Soft(tb, opts.Locations)
	}
	return Start(ctx, opts)
}
