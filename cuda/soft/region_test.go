package soft_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
)

// residentBytes returns the process's resident set now (VmRSS), or -1
// where /proc/self/status has none.
func residentBytes(t *testing.T) int64 {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			_, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb)
			require.NoError(t, err)
			return kb << 10
		}
	}
	return -1
}

// TestRegionMemory checks the package doc's promise for large buffers
// (from 32 MiB up), whose bytes are made in 64 KiB chunks as they are
// written: a loader that writes nothing, and a copy of what it loaded,
// make nothing; a loader or a Write that sets a few bytes makes only their
// chunks, and a copy copies only those; zeros written or copied over them
// give them back. RealBytes follows every step, and on Linux the process's
// resident set grows by far less than the 1 GiB buffers (the whole buffer
// is never read: Read would make 1 GiB of the caller's memory).
func TestRegionMemory(t *testing.T) {
	defer goleak.VerifyNone(t)
	const size = 1 << 30
	const chunk = 64 << 10
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	ctx := context.Background()
	rss0 := residentBytes(t)

	host := mustAlloc(t, b, "pageable-host", size)
	dev := mustAlloc(t, b, "cuda:0", size)
	s := mustStream(t, b, "cuda:0")
	defer mustClose(t, s)
	copyWait := func(dst, src cuda.Buffer) {
		t.Helper()
		mustCopy(t, s, dst, src)
		require.NoError(t, mustRecord(t, s).Wait(ctx))
	}
	real := func(want int64, what string) {
		t.Helper()
		require.Equal(t, want, b.RealBytes(), "RealBytes %s", what)
	}

	require.NoError(t, b.Load(ctx, host, "cuda:0", func(context.Context, []byte) error { return nil }))
	real(0, "after a loader that wrote nothing")
	copyWait(dev, host)
	real(0, "after a copy of what it loaded")

	require.NoError(t, b.Load(ctx, host, "cuda:0", func(_ context.Context, dst []byte) error {
		dst[5] = 1
		dst[size/2+chunk] = 2 // the first byte of a chunk
		dst[size-1] = 3
		return nil
	}))
	real(3*chunk, "after a loader wrote 3 bytes in 3 chunks")
	copyWait(dev, host)
	real(6*chunk, "after a copy of them")
	for off, want := range map[int64]byte{5: 1, size/2 + chunk: 2, size - 1: 3, 6: 0, size/2 + chunk - 1: 0} {
		p := []byte{0xee}
		require.NoError(t, b.ReadAt(ctx, dev, off, p))
		require.Equal(t, want, p[0], "byte %d of the copy", off)
	}
	if rss0 > 0 {
		grown := residentBytes(t) - rss0
		t.Logf("resident set grew by %d MiB for two 1 GiB buffers", grown>>20)
		require.Less(t, grown, int64(64<<20), "resident set growth")
	}

	mustWrite(t, b, dev, make([]byte, size))
	real(3*chunk, "after zeros were written over the copy")
	never := mustAlloc(t, b, "pinned-host", size)
	copyWait(host, never)
	real(0, "after a copy of a buffer never written")
}
