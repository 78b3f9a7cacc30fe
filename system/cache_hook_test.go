package system_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// The loader cache for the internal tests (export_test.go): they cannot
// import package system/cache, which imports this package.
func init() {
	system.NewTestCache = func(t *testing.T, s *system.System, loc string) system.TestCache {
		c, err := cache.New(context.Background(), s, cache.Options{Location: loc})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return testCache{c}
	}
}

type testCache struct{ c *cache.Cache }

func (tc testCache) Load(ctx context.Context, key string, bytes int64, opts ...system.WaitOption) (func() error, error) {
	l, err := cache.Load(ctx, tc.c, key, bytes, nil, func(context.Context) ([]byte, int64, error) {
		return make([]byte, bytes), bytes, nil
	}, cache.Wait(opts...))
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (tc testCache) Resources(ctx context.Context) (int, error) {
	st, err := tc.c.Statistics(ctx)
	return st.Resources, err
}
