package system

import (
	"context"
	"testing"
)

// TestCache is what this package's internal tests need of a loader cache
// at the GPU of startGPU. The cache lives in package system/cache, which
// imports this package, so an internal test cannot import it: the
// external test file cache_hook_test.go installs NewTestCache.
type TestCache interface {
	// Load is cache.Load of a []byte of bytes (peak = resident = bytes),
	// with cache.Wait(opts...); it returns the lease's Release.
	Load(ctx context.Context, key string, bytes int64, opts ...WaitOption) (release func() error, err error)
	// Resources is Statistics().Resources.
	Resources(ctx context.Context) (int, error)
}

// NewTestCache opens a cache at gpu in s, closed when the test ends.
var NewTestCache func(t *testing.T, s *System, loc string) TestCache
