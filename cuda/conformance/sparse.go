package conformance

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
)

// sparseSize is the size of the buffers of sparseContents: several 64 KiB
// pieces and a ragged end, so that a backend that keeps bytes in pieces
// has whole, partial and last pieces to get right.
const sparseSize = 5<<16 + 777

// sparseRuns returns the non-zero runs of sparseData(seed) by offset:
// inside the second 64 KiB piece, across the edge of the fourth and fifth,
// and the last byte.
func sparseRuns(seed uint64) map[int][]byte {
	return map[int][]byte{
		1<<16 + 100:    pattern(seed, 3000),
		4<<16 - 500:    pattern(seed+1, 1000),
		sparseSize - 1: {byte(seed) | 1},
	}
}

// sparseData returns sparseSize bytes that are zero except for the runs
// of sparseRuns(seed).
func sparseData(seed uint64) []byte {
	d := make([]byte, sparseSize)
	for off, run := range sparseRuns(seed) {
		copy(d[off:], run)
	}
	return d
}

// sparseContents checks buffers whose bytes are mostly zeros, as a
// backend that makes memory only for written bytes holds them: written,
// copied between every pair of locations, loaded by loaders that write a
// few bytes or none, overwritten by zeros (by Write and by a copy of a
// buffer never written), read whole and by ranges across the pieces.
// Every read must give exactly the bytes written, zeros everywhere else.
func (s *suite) sparseContents(t *testing.T) {
	b := s.backend(t, nil)
	for i, from := range s.locs {
		for j, to := range s.locs {
			t.Run(from+"->"+to, func(t *testing.T) {
				want := sparseData(uint64(100*i + j))
				src := alloc(t, b, from, sparseSize)
				dst := alloc(t, b, to, sparseSize)
				write(t, b, dst, pattern(uint64(7+j), sparseSize)) // to be replaced
				write(t, b, src, want)
				st := stream(t, b, to)
				copyAsync(t, st, dst, src)
				wait(t, record(t, st))
				sameBytes(t, "sparse copy", read(t, b, dst), want)
				sparseRanges(t, b, dst, want)
				loaderSees(t, b, dst, want)

				never := alloc(t, b, from, sparseSize) // never written: zeros
				copyAsync(t, st, dst, never)
				wait(t, record(t, st))
				sameBytes(t, "copy of a buffer never written", read(t, b, dst), make([]byte, sparseSize))
				sparseRanges(t, b, dst, make([]byte, sparseSize))
			})
		}
	}
	for _, loc := range s.locs {
		t.Run("load at "+loc, func(t *testing.T) { sparseLoads(t, b, loc) })
	}
}

// sparseLoads checks loaders that write part of a buffer, or nothing.
func sparseLoads(t *testing.T, b cuda.Backend, loc string) {
	buf := alloc(t, b, loc, sparseSize)
	want := sparseData(42)
	require.NoError(t, b.Load(bg, buf, "", func(_ context.Context, dst []byte) error {
		require.True(t, bytes.Equal(dst, make([]byte, sparseSize)), "a new buffer is not all zeros for its loader")
		for off, run := range sparseRuns(42) {
			copy(dst[off:], run)
		}
		return nil
	}))
	sameBytes(t, "a loader's scattered writes", read(t, b, buf), want)
	sparseRanges(t, b, buf, want)

	// A loader that writes nothing keeps what the buffer holds.
	loaderSees(t, b, buf, want)
	sameBytes(t, "after a loader that wrote nothing", read(t, b, buf), want)

	// One that writes a byte far from the rest adds it.
	require.NoError(t, b.Load(bg, buf, "", func(_ context.Context, dst []byte) error {
		dst[3<<16+5] = 9
		return nil
	}))
	want[3<<16+5] = 9
	sameBytes(t, "after a one-byte load", read(t, b, buf), want)

	// Bytes written over a full buffer replace all of it, for a loader too.
	write(t, b, buf, pattern(43, sparseSize))
	want = sparseData(44)
	write(t, b, buf, want)
	sameBytes(t, "sparse bytes written over a full buffer", read(t, b, buf), want)
	loaderSees(t, b, buf, want)

	// Zeros written over it leave zeros.
	write(t, b, buf, make([]byte, sparseSize))
	sameBytes(t, "after writing zeros", read(t, b, buf), make([]byte, sparseSize))
	require.NoError(t, b.Load(bg, buf, "", func(_ context.Context, dst []byte) error {
		require.True(t, bytes.Equal(dst, make([]byte, sparseSize)), "the loader saw old bytes after zeros were written")
		return nil
	}))
	sameBytes(t, "a loader that wrote nothing", read(t, b, buf), make([]byte, sparseSize))
}

// loaderSees checks that a loader of buf is handed exactly want.
func loaderSees(t *testing.T, b cuda.Backend, buf cuda.Buffer, want []byte) {
	t.Helper()
	require.NoError(t, b.Load(bg, buf, "", func(_ context.Context, dst []byte) error {
		sameBytes(t, "the loader's view of the buffer", dst, want)
		return nil
	}))
}

// sparseRanges checks ranged reads of buf, whose bytes are want, across
// the 64 KiB pieces.
func sparseRanges(t *testing.T, b cuda.Backend, buf cuda.Buffer, want []byte) {
	t.Helper()
	for _, r := range [][2]int64{{0, sparseSize}, {1<<16 - 10, 20}, {1<<16 + 50, 4000}, {4<<16 - 600, 1 << 16}, {sparseSize - 1, 1}, {2 << 16, 1 << 16}} {
		p := bytes.Repeat([]byte{0xee}, int(r[1]))
		require.NoError(t, cuda.ReadAt(bg, b, buf, r[0], p), "range %v", r)
		sameBytes(t, "ranged read", p, want[r[0]:r[0]+r[1]])
	}
}
