package conformance

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
)

// withoutRange hides a backend's RangeReader.
type withoutRange struct{ cuda.Backend }

// rangeRead checks ranged reads (cuda.ReadAt: through the backend's
// RangeReader, through the fault decorator, and through Read with the
// RangeReader hidden) at every
// location: the bytes of every range inside the buffer, a *RangeError for
// every range outside it with the destination untouched, and the errors
// of a foreign, nil or freed buffer, a done ctx and a closed backend.
func (s *suite) rangeRead(t *testing.T) {
	b := s.backend(t, nil)
	other := s.backend(t, nil)
	decorated := faulty.Wrap(b, "")
	plain := withoutRange{b} // cuda.ReadAt's fallback: a whole Read
	const n = 1000
	for i, loc := range s.locs {
		t.Run(loc, func(t *testing.T) {
			want := pattern(uint64(700+i), n)
			buf := alloc(t, b, loc, n)
			write(t, b, buf, want)
			for _, be := range []cuda.Backend{b, decorated, plain} {
				for _, r := range [][2]int64{{0, n}, {0, 0}, {n, 0}, {13, 500}, {n - 1, 1}, {1, n - 1}} {
					p := bytes.Repeat([]byte{0xee}, int(r[1]))
					require.NoError(t, cuda.ReadAt(bg, be, buf, r[0], p), "range %v", r)
					sameBytes(t, "ranged read", p, want[r[0]:r[0]+r[1]])
				}
				for _, r := range [][2]int64{{-1, 1}, {-1, 0}, {n + 1, 0}, {n, 1}, {900, 101}, {0, n + 1}} {
					p := bytes.Repeat([]byte{0xee}, int(r[1]))
					err := cuda.ReadAt(bg, be, buf, r[0], p)
					var re *cuda.RangeError
					require.ErrorAs(t, err, &re, "range %v", r)
					require.ErrorIs(t, err, cuda.ErrInvalid)
					require.Equal(t, cuda.RangeError{Offset: r[0], Length: r[1], Size: n}, *re)
					require.Equal(t, bytes.Repeat([]byte{0xee}, int(r[1])), p, "a refused read wrote into p")
				}
			}
			foreign := alloc(t, other, loc, n)
			require.ErrorIs(t, cuda.ReadAt(bg, b, foreign, 0, make([]byte, 8)), cuda.ErrInvalid, "foreign")
			require.ErrorIs(t, cuda.ReadAt(bg, b, nil, 0, make([]byte, 8)), cuda.ErrInvalid, "nil")
			cancelled, cancel := context.WithCancel(bg)
			cancel()
			require.ErrorIs(t, cuda.ReadAt(cancelled, b, buf, 0, make([]byte, 8)), context.Canceled)
			require.NoError(t, b.Free(buf))
			require.ErrorIs(t, cuda.ReadAt(bg, b, buf, 0, make([]byte, 8)), cuda.ErrFreed)
			require.ErrorIs(t, cuda.ReadAt(bg, decorated, buf, 0, make([]byte, 8)), cuda.ErrFreed)
			require.ErrorIs(t, cuda.ReadAt(bg, plain, buf, 0, make([]byte, 8)), cuda.ErrFreed)
			require.ErrorIs(t, cuda.ReadAt(bg, plain, nil, 0, make([]byte, 8)), cuda.ErrInvalid, "nil, fallback")
		})
	}
	closed := s.newBackend(t, nil)
	buf := alloc(t, closed, s.locs[0], 8)
	require.NoError(t, closed.Close())
	require.ErrorIs(t, cuda.ReadAt(bg, closed, buf, 0, make([]byte, 8)), cuda.ErrClosed)
}
