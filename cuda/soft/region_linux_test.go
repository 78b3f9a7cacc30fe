package soft

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoadWithoutPagemap: where the kernel cannot say which pages a
// loader touched, every chunk is examined, and the loader's bytes are
// still found exactly (and nothing else is kept).
func TestLoadWithoutPagemap(t *testing.T) {
	old := pagemapPath
	pagemapPath = "/nonexistent/pagemap"
	defer func() { pagemapPath = old }()
	page := int64(os.Getpagesize())
	b, err := NewSparse(Config{Locations: []string{"cuda:0"}}, 1, page)
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()
	const n = 40000
	buf, err := b.Allocate(ctx, "cuda:0", n)
	require.NoError(t, err)
	require.NoError(t, b.Load(ctx, buf, "", func(context.Context, []byte) error { return nil }))
	require.Zero(t, b.RealBytes(), "a loader that wrote nothing")
	require.NoError(t, b.Load(ctx, buf, "", func(_ context.Context, dst []byte) error {
		dst[3*page+1] = 7
		dst[n-1] = 8
		return nil
	}))
	require.Equal(t, page+(n-(n/page)*page), b.RealBytes(), "two chunks, the last one short")
	got, err := b.Read(ctx, buf)
	require.NoError(t, err)
	want := make([]byte, n)
	want[3*page+1], want[n-1] = 7, 8
	require.Equal(t, want, got)
}
