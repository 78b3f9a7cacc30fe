package soft_test

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
)

// hostViewBackend returns a backend whose regions start at 4 chunks (of a
// page), with the size of a small buffer and of a large (chunked) one.
func hostViewBackend(t *testing.T) (b *soft.Backend, small, large int64) {
	t.Helper()
	chunk := int64(os.Getpagesize())
	b, err := soft.NewSparse(soft.Config{Locations: allLocations}, 4*chunk, chunk)
	require.NoError(t, err)
	return b, 3*chunk + 100, 8*chunk + 100 // the last chunk of the large one is short
}

// A host view written in place is what Read, ReadAt, Load and a stream
// copy see, for a small buffer and for a large one whose chunks were
// never written through the backend.
func TestHostBytesWrittenInPlaceIsWhatTheBackendSees(t *testing.T) {
	b, small, large := hostViewBackend(t)
	defer mustClose(t, b)
	ctx := context.Background()
	for _, n := range []int64{small, large} {
		for _, loc := range []string{"pageable-host", "pinned-host"} {
			buf := mustAlloc(t, b, loc, n)
			view, err := cuda.HostBytes(buf)
			require.NoError(t, err)
			require.Len(t, view, int(n))
			require.True(t, allZeroBytes(view), "a new buffer's view is zeros")
			again, err := cuda.HostBytes(buf)
			require.NoError(t, err)
			require.Same(t, &view[0], &again[0], "every call is the same memory")

			want := pattern(7, int(n))
			copy(view, want)
			got, err := b.Read(ctx, buf)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "Read of %d bytes at %s", n, loc)
			tail := make([]byte, 200)
			require.NoError(t, b.ReadAt(ctx, buf, n-200, tail))
			require.Equal(t, want[n-200:], tail)
			require.NoError(t, b.Load(ctx, buf, "", func(_ context.Context, p []byte) error {
				require.True(t, bytes.Equal(want, p), "Load sees the view's bytes")
				return nil
			}))

			dev := mustAlloc(t, b, "cuda:0", n)
			s := mustStream(t, b, "cuda:0")
			require.NoError(t, s.CopyAsync(dev, buf))
			require.NoError(t, s.Synchronize(ctx))
			got, err = b.Read(ctx, dev)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "a copy out of the buffer sees the view's bytes")
			require.NoError(t, s.Close())
			require.NoError(t, b.Free(dev))
			require.NoError(t, b.Free(buf))
		}
	}
	require.Zero(t, b.RealBytes())
}

// Writes, loads and copies into a buffer in place land in its view,
// zeros included: nothing the view holds is released or replaced.
func TestHostBytesSeesWritesLoadsAndCopiesIntoTheBuffer(t *testing.T) {
	b, small, large := hostViewBackend(t)
	defer mustClose(t, b)
	ctx := context.Background()
	for _, n := range []int64{small, large} {
		buf := mustAlloc(t, b, "pinned-host", n)
		view, err := cuda.HostBytes(buf)
		require.NoError(t, err)
		require.Equal(t, n, b.RealBytes(), "a buffer in place holds its whole size")

		want := pattern(3, int(n))
		require.NoError(t, b.Write(ctx, buf, want))
		require.True(t, bytes.Equal(want, view), "Write lands in the view")
		require.NoError(t, b.Write(ctx, buf, make([]byte, n)))
		require.True(t, allZeroBytes(view), "zeros written land in the view")
		require.Equal(t, n, b.RealBytes())

		require.NoError(t, b.Load(ctx, buf, "", func(_ context.Context, p []byte) error {
			p[n-1] = 9
			return nil
		}))
		require.Equal(t, byte(9), view[n-1], "Load writes the view's memory")

		dev := mustAlloc(t, b, "cuda:0", n)
		require.NoError(t, b.Write(ctx, dev, want))
		s := mustStream(t, b, "cuda:0")
		require.NoError(t, s.CopyAsync(buf, dev))
		require.NoError(t, s.Synchronize(ctx))
		require.True(t, bytes.Equal(want, view), "a copy into the buffer lands in the view")

		zeros := mustAlloc(t, b, "cuda:1", n) // never written: holds nothing
		require.NoError(t, s.CopyAsync(buf, zeros))
		require.NoError(t, s.Synchronize(ctx))
		require.True(t, allZeroBytes(view), "a copy of zeros lands in the view")
		copy(view, want) // the view still writes the buffer
		got, err := b.Read(ctx, buf)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got))

		require.NoError(t, s.Close())
		for _, x := range []cuda.Buffer{buf, dev, zeros} {
			require.NoError(t, b.Free(x))
		}
		require.Zero(t, b.RealBytes())
	}
}

// Only host buffers have views; a freed buffer has none; a decorator that
// hands out its backend's buffers (cuda/faulty) keeps them, and a
// reconstruction fault armed there does not touch them.
func TestHostBytesRefusals(t *testing.T) {
	b, small, _ := hostViewBackend(t)
	fb := faulty.Wrap(b, soft.ErrorPrefix)
	defer mustClose(t, fb)
	dev := mustAlloc(t, fb, "cuda:0", small)
	_, err := cuda.HostBytes(dev)
	require.ErrorIs(t, err, cuda.ErrNoHostMemory)
	_, err = cuda.HostBytes(nil)
	require.ErrorIs(t, err, cuda.ErrNoHostMemory)

	host := mustAlloc(t, fb, "pageable-host", small)
	fb.Faults().Arm(cuda.FaultReconstruct, "pageable-host")
	view, err := cuda.HostBytes(host)
	require.NoError(t, err)
	view[0] = 1
	assert.Equal(t, 1, fb.Faults().Armed(cuda.FaultReconstruct, "pageable-host"), "no fault is taken by a view")

	require.NoError(t, fb.Free(host))
	_, err = cuda.HostBytes(host)
	require.ErrorIs(t, err, cuda.ErrFreed)
	require.NoError(t, fb.Free(dev))
}

// A buffer of the default region size (32 MiB, chunks of 64 KiB) written
// in place a byte per chunk here and there: a stream copy and ReadAt see
// every byte, the last chunk's included.
func TestHostBytesOfADefaultRegion(t *testing.T) {
	b := newBackend(t, soft.Config{})
	defer mustClose(t, b)
	ctx := context.Background()
	const n = 32<<20 + 4096
	buf := mustAlloc(t, b, "pinned-host", n)
	view, err := cuda.HostBytes(buf)
	require.NoError(t, err)
	require.Len(t, view, n)
	for off := 0; off < n; off += 3 << 20 {
		view[off] = byte(off>>20) | 1
	}
	view[n-1] = 0xee
	dev := mustAlloc(t, b, "cuda:0", n)
	s := mustStream(t, b, "cuda:0")
	require.NoError(t, s.CopyAsync(dev, buf))
	require.NoError(t, s.Synchronize(ctx))
	for off := 0; off < n; off += 3 << 20 {
		p := make([]byte, 1)
		require.NoError(t, b.ReadAt(ctx, dev, int64(off), p))
		require.Equal(t, byte(off>>20)|1, p[0], "offset %d", off)
	}
	last := make([]byte, 1)
	require.NoError(t, b.ReadAt(ctx, dev, n-1, last))
	require.Equal(t, byte(0xee), last[0])
	require.NoError(t, s.Close())
	require.NoError(t, b.Free(buf))
	require.NoError(t, b.Free(dev))
}

func allZeroBytes(p []byte) bool { return bytes.Count(p, []byte{0}) == len(p) }
