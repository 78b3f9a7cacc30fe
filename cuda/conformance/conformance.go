// Package conformance is the test suite every [cuda.Backend] must pass: the
// contract documented in package cuda, checked the same way against the
// soft (simulated) backend and against the cu backend on a real GPU.
//
// A backend's own test calls [Run] with a [Factory] and the locations to
// exercise:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(t *testing.T, capacity map[string]int64) cuda.Backend {
//			b, err := soft.New(soft.Config{Locations: locs, Capacity: capacity})
//			require.NoError(t, err)
//			return b
//		}, locs...)
//	}
//
// The suite checks what the contract promises and nothing a backend may do
// differently: allocation limits and out-of-memory errors under a
// configured capacity, the order of input checks, byte-exact copies in
// every direction between the given locations on streams of either end,
// FIFO order within a stream, event ordering across two streams through
// WaitEvent, errors after Free (use after free), fault injection by the
// decorator of package cuda/faulty over the backend (alloc, copy,
// reconstruct; each consumed once and reported once, in stream order with
// the backend's own failures), loaders (errors wrapped, panics recovered),
// ranged reads (cuda.ReadAt: bounds, errors), stream and backend
// Close, and concurrent use under the race detector. It never relies on
// timing: it waits on events, and checks only orderings that must hold
// whatever the speed of the device. Every subtest ends with a goroutine
// leak check once its backends are closed.
package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Factory returns a new backend configured with the locations given to
// [Run] and the given capacities (bytes per location; a location absent
// from capacity has the backend's default limit). The suite closes every
// backend it creates; a Factory should fail t if it cannot make one.
type Factory func(t *testing.T, capacity map[string]int64) cuda.Backend

// Run runs the conformance suite as subtests of t against the backends
// newBackend makes, exercising locations (at least one; well-formed,
// distinct, each configured by newBackend). Put host and device locations
// in it: copies are checked between every ordered pair.
func Run(t *testing.T, newBackend Factory, locations ...string) {
	t.Helper()
	require.NotEmpty(t, locations, "conformance.Run needs at least one location")
	for _, l := range locations {
		_, err := cuda.ParseLocationName(l)
		require.NoError(t, err)
	}
	require.Len(t, locations, len(uniq(locations)), "duplicate locations")
	s := &suite{newBackend: newBackend, locs: slices.Clone(locations)}
	for _, tc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Identity", s.identity},
		{"AllocationLimits", s.allocationLimits},
		{"MemInfoInvariant", s.memInfoInvariant},
		{"BadInputFailsAtOnce", s.badInput},
		{"CopiesAllDirections", s.copiesAllDirections},
		{"CopyChainAcrossLocations", s.copyChain},
		{"StreamIsFIFO", s.streamFIFO},
		{"EventOrderingAcrossTwoStreams", s.eventOrdering},
		{"UseAfterFree", s.useAfterFree},
		{"AllocFault", s.allocFault},
		{"CopyFault", s.copyFault},
		{"FailureReportedExactlyOnce", s.failureOnce},
		{"ReconstructFault", s.reconstructFault},
		{"Load", s.load},
		{"RangeRead", s.rangeRead},
		{"StreamClose", s.streamClose},
		{"BackendClose", s.backendClose},
		{"ConcurrentUse", s.concurrent},
	} {
		runCase(t, tc.name, tc.run)
	}
}

// RunZeroed runs the checks of a backend whose new buffers hold zeros and
// whose Load hands the loader the buffer's own bytes (the soft
// simulation; not a device, whose memory starts undefined and whose
// loads go through a staging buffer): buffers that are mostly zeros,
// written, copied, loaded in part and zeroed, read whole and by ranges.
func RunZeroed(t *testing.T, newBackend Factory, locations ...string) {
	t.Helper()
	s := &suite{newBackend: newBackend, locs: slices.Clone(locations)}
	runCase(t, "SparseContents", s.sparseContents)
}

// runCase runs one check as a subtest that ends with a goroutine leak
// check.
func runCase(t *testing.T, name string, run func(*testing.T)) {
	t.Run(name, func(t *testing.T) {
		// Registered first, so it runs last: after the cleanups that
		// close the subtest's streams and backends.
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
		run(t)
	})
}

type suite struct {
	newBackend Factory
	locs       []string
}

// backend returns a new backend that is closed when the subtest ends
// (before its leak check).
func (s *suite) backend(t *testing.T, capacity map[string]int64) cuda.Backend {
	t.Helper()
	b := s.newBackend(t, capacity)
	require.NotNil(t, b, "Factory returned nil")
	t.Cleanup(func() { assert.NoError(t, b.Close()) })
	return b
}

// deviceLocs returns the cuda:N locations, or all locations if there are
// none.
func (s *suite) deviceLocs() []string {
	var out []string
	for _, l := range s.locs {
		if k, _, _ := cuda.ParseLocation(l); k == cuda.KindCUDA {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return s.locs
	}
	return out
}

// hostLoc returns a host location (pinned preferred), or the first location.
func (s *suite) hostLoc() string {
	best := s.locs[0]
	for _, l := range s.locs {
		switch k, _, _ := cuda.ParseLocation(l); k {
		case cuda.KindPinnedHost:
			return l
		case cuda.KindPageableHost:
			best = l
		}
	}
	return best
}

// ---- helpers ------------------------------------------------------------

var bg = context.Background()

func alloc(t *testing.T, b cuda.Backend, loc string, n int64) cuda.Buffer {
	t.Helper()
	buf, err := b.Allocate(bg, loc, n)
	require.NoError(t, err, "Allocate(%s, %d)", loc, n)
	require.Equal(t, loc, buf.Location())
	require.Equal(t, n, buf.Size())
	return buf
}

func stream(t *testing.T, b cuda.Backend, loc string) cuda.Stream {
	t.Helper()
	s, err := b.NewStream(loc)
	require.NoError(t, err, "NewStream(%s)", loc)
	require.Equal(t, loc, s.Location())
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func record(t *testing.T, s cuda.Stream) cuda.Event {
	t.Helper()
	ev, err := s.Record()
	require.NoError(t, err, "Record")
	return ev
}

func copyAsync(t *testing.T, s cuda.Stream, dst, src cuda.Buffer) {
	t.Helper()
	require.NoError(t, s.CopyAsync(dst, src), "CopyAsync(%s <- %s) on a stream of %s", dst.Location(), src.Location(), s.Location())
}

func write(t *testing.T, b cuda.Backend, buf cuda.Buffer, data []byte) {
	t.Helper()
	require.NoError(t, b.Write(bg, buf, data), "Write")
}

func read(t *testing.T, b cuda.Backend, buf cuda.Buffer) []byte {
	t.Helper()
	data, err := b.Read(bg, buf)
	require.NoError(t, err, "Read")
	return data
}

func memInfo(t *testing.T, b cuda.Backend, loc string) cuda.MemInfo {
	t.Helper()
	mi, err := b.MemInfo(loc)
	require.NoError(t, err, "MemInfo(%s)", loc)
	return mi
}

func wait(t *testing.T, ev cuda.Event) {
	t.Helper()
	require.NoError(t, ev.Wait(bg), "event")
	require.True(t, ev.Query(), "Query false after Wait returned")
	select {
	case <-ev.Done():
	default:
		t.Fatal("Done not closed after Wait returned")
	}
}

// pattern returns n pseudo-random bytes determined by seed.
func pattern(seed uint64, n int64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]byte, n)
	for i := 0; i+8 <= len(out); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			out[i+j] = byte(v >> (8 * j))
		}
	}
	for i := len(out) &^ 7; i < len(out); i++ {
		out[i] = byte(r.Uint32())
	}
	return out
}

func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Fatalf("%s: bytes differ (len %d vs %d, first difference at %d)", what, len(got), len(want), i)
}

func uniq(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return slices.Compact(c)
}

// ---- the suite ----------------------------------------------------------

func (s *suite) identity(t *testing.T) {
	b := s.backend(t, nil)
	assert.NotEmpty(t, b.Name())
	for _, l := range s.locs {
		st := stream(t, b, l)
		require.NoError(t, st.Synchronize(bg), "Synchronize of an empty stream")
		wait(t, record(t, st))
	}
}

// Under a configured capacity, allocations are charged exactly and a
// request that does not fit is an *OutOfMemoryError that changes nothing.
func (s *suite) allocationLimits(t *testing.T) {
	const capacity = 1 << 16
	caps := map[string]int64{}
	for _, l := range s.locs {
		caps[l] = capacity
	}
	b := s.backend(t, caps)
	for _, loc := range s.locs {
		t.Run(loc, func(t *testing.T) {
			want := func(free, used int64) {
				t.Helper()
				require.Equal(t, cuda.MemInfo{FreeBytes: free, TotalBytes: capacity, UsedBytes: used}, memInfo(t, b, loc))
			}
			want(capacity, 0)
			big := alloc(t, b, loc, 40000)
			want(capacity-40000, 40000)

			_, err := b.Allocate(bg, loc, capacity-40000+1)
			var oom *cuda.OutOfMemoryError
			require.ErrorAs(t, err, &oom)
			require.ErrorIs(t, err, cuda.ErrOutOfMemory)
			require.Equal(t, cuda.OutOfMemoryError{Location: loc, Requested: capacity - 40000 + 1, Free: capacity - 40000}, *oom)
			want(capacity-40000, 40000) // a refusal charges nothing

			rest := alloc(t, b, loc, capacity-40000) // exactly fills it
			want(0, capacity)
			_, err = b.Allocate(bg, loc, 1)
			require.ErrorIs(t, err, cuda.ErrOutOfMemory)
			_, err = b.Allocate(bg, loc, math.MaxInt64)
			require.ErrorIs(t, err, cuda.ErrOutOfMemory)

			require.NoError(t, b.Free(big))
			want(40000, capacity-40000)
			again := alloc(t, b, loc, 40000)
			want(0, capacity)
			require.NoError(t, b.Free(rest))
			require.NoError(t, b.Free(again))
			want(capacity, 0)
		})
	}
	// Locations are independent.
	if len(s.locs) > 1 {
		buf := alloc(t, b, s.locs[0], 1000)
		for _, l := range s.locs[1:] {
			require.Zero(t, memInfo(t, b, l).UsedBytes, "an allocation at %s charged %s", s.locs[0], l)
		}
		require.NoError(t, b.Free(buf))
	}
}

// Without a configured capacity MemInfo is still self-consistent.
func (s *suite) memInfoInvariant(t *testing.T) {
	b := s.backend(t, nil)
	for _, loc := range s.locs {
		buf := alloc(t, b, loc, 1<<20)
		mi := memInfo(t, b, loc)
		if mi.Unlimited() {
			assert.Equal(t, int64(math.MaxInt64)-mi.UsedBytes, mi.FreeBytes, "%s: %+v", loc, mi)
			assert.GreaterOrEqual(t, mi.UsedBytes, int64(1<<20), "%s: %+v", loc, mi)
		} else {
			assert.Equal(t, mi.TotalBytes, mi.FreeBytes+mi.UsedBytes, "%s: %+v", loc, mi)
			assert.GreaterOrEqual(t, mi.UsedBytes, int64(1<<20), "%s: %+v", loc, mi)
			assert.GreaterOrEqual(t, mi.FreeBytes, int64(0), "%s: %+v", loc, mi)
		}
		require.NoError(t, b.Free(buf))
	}
}

func (s *suite) badInput(t *testing.T) {
	b := s.backend(t, nil)
	other := s.backend(t, nil)
	loc := s.locs[0]
	st := stream(t, b, loc)
	a := alloc(t, b, loc, 8)
	c := alloc(t, b, s.locs[len(s.locs)-1], 8)
	foreign := alloc(t, other, loc, 8)

	var le *cuda.LocationError
	_, err := b.Allocate(bg, "cuda:x", 8)
	require.ErrorAs(t, err, &le)
	require.Equal(t, "cuda:x", le.Name)
	_, err = b.Allocate(bg, "cuda:999999", 8)
	require.ErrorIs(t, err, cuda.ErrUnknownLocation)
	_, err = b.NewStream("cuda:999999")
	require.ErrorIs(t, err, cuda.ErrUnknownLocation)
	_, err = b.MemInfo("nowhere")
	require.ErrorIs(t, err, cuda.ErrInvalid)
	for _, n := range []int64{0, -1} {
		_, err = b.Allocate(bg, loc, n)
		require.ErrorIs(t, err, cuda.ErrInvalid, "Allocate of %d bytes", n)
	}
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	_, err = b.Allocate(cancelled, loc, 8)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, st.Synchronize(cancelled), context.Canceled)
	require.ErrorIs(t, b.Write(bg, a, make([]byte, 7)), cuda.ErrInvalid)

	for name, err := range map[string]error{
		"foreign dst":   st.CopyAsync(foreign, a),
		"foreign src":   st.CopyAsync(a, foreign),
		"nil dst":       st.CopyAsync(nil, a),
		"nil src":       st.CopyAsync(a, nil),
		"self copy":     st.CopyAsync(a, a),
		"size mismatch": st.CopyAsync(a, alloc(t, b, loc, 9)),
		"nil event":     st.WaitEvent(nil),
		"Free foreign":  b.Free(foreign),
		"Free nil":      b.Free(nil),
		"Read foreign":  func() error { _, err := b.Read(bg, foreign); return err }(),
		"Write foreign": b.Write(bg, foreign, make([]byte, 8)),
		"Load foreign":  b.Load(bg, foreign, "", func(context.Context, []byte) error { return nil }),
		"Load nil":      b.Load(bg, a, "", nil),
		"Load target":   b.Load(bg, a, "gpu:0", func(context.Context, []byte) error { return nil }),
	} {
		require.ErrorIs(t, err, cuda.ErrInvalid, name)
	}
	// None of that disturbed the stream or the buffers.
	write(t, b, a, pattern(40, 8))
	copyAsync(t, st, c, a)
	require.NoError(t, st.Synchronize(bg))
	sameBytes(t, "copy after bad input", read(t, b, c), pattern(40, 8))
	sameBytes(t, "foreign buffer", read(t, other, foreign), read(t, other, foreign))
}

// Every ordered pair of locations, on a stream of either end, copies
// exactly: the destination gets the source's bytes and the source is
// unchanged.
func (s *suite) copiesAllDirections(t *testing.T) {
	b := s.backend(t, nil)
	streams := map[string]cuda.Stream{}
	for _, l := range s.locs {
		streams[l] = stream(t, b, l)
	}
	seed := uint64(1000)
	for _, n := range []int64{1, 4097, 1<<20 + 3} {
		for _, from := range s.locs {
			for _, to := range s.locs {
				for _, on := range uniq([]string{from, to}) {
					t.Run(fmt.Sprintf("%d B %s to %s on %s", n, from, to, on), func(t *testing.T) {
						seed += 2
						src, dst := alloc(t, b, from, n), alloc(t, b, to, n)
						want, old := pattern(seed, n), pattern(seed+1, n)
						write(t, b, src, want)
						write(t, b, dst, old)
						copyAsync(t, streams[on], dst, src)
						wait(t, record(t, streams[on]))
						sameBytes(t, "destination", read(t, b, dst), want)
						sameBytes(t, "source", read(t, b, src), want)
						require.NoError(t, b.Free(src))
						require.NoError(t, b.Free(dst))
					})
				}
			}
		}
	}
}

// Bytes travel through every location in turn on one stream per hop,
// each hop waiting for the previous hop's event.
func (s *suite) copyChain(t *testing.T) {
	b := s.backend(t, nil)
	const n = 1<<20 + 5
	want := pattern(2, n)
	bufs := make([]cuda.Buffer, 0, len(s.locs)+1)
	for _, l := range append(slices.Clone(s.locs), s.locs[0]) {
		bufs = append(bufs, alloc(t, b, l, n))
	}
	write(t, b, bufs[0], want)
	var prev cuda.Event
	for i := 1; i < len(bufs); i++ {
		st := stream(t, b, bufs[i].Location())
		if prev != nil {
			require.NoError(t, st.WaitEvent(prev))
		}
		copyAsync(t, st, bufs[i], bufs[i-1])
		prev = record(t, st)
	}
	wait(t, prev)
	for i, buf := range bufs {
		sameBytes(t, fmt.Sprintf("hop %d (%s)", i, buf.Location()), read(t, b, buf), want)
	}
}

// Work on one stream runs in order: the last of several copies into one
// buffer wins.
func (s *suite) streamFIFO(t *testing.T) {
	b := s.backend(t, nil)
	for _, loc := range s.deviceLocs() {
		st := stream(t, b, loc)
		const n = 64 << 10
		dst := alloc(t, b, loc, n)
		var last []byte
		for i := range 16 {
			src := alloc(t, b, s.hostLoc(), n)
			last = pattern(uint64(100+i), n)
			write(t, b, src, last)
			copyAsync(t, st, dst, src)
		}
		require.NoError(t, st.Synchronize(bg))
		sameBytes(t, "destination", read(t, b, dst), last)
	}
}

// A copy on one stream that waits (WaitEvent) for an event of another
// stream sees the bytes of the copy before that event, round after round;
// and an event behind the wait never completes before the awaited event.
func (s *suite) eventOrdering(t *testing.T) {
	b := s.backend(t, nil)
	devs := s.deviceLocs()
	locA, locB := devs[0], devs[len(devs)-1] // two streams, on two devices if there are two
	s0, s1 := stream(t, b, locA), stream(t, b, locB)
	const n = 8 << 20
	host := alloc(t, b, s.hostLoc(), n)
	mid := alloc(t, b, locA, n)
	out := alloc(t, b, locB, n)
	back := alloc(t, b, s.hostLoc(), n)
	for round := range 6 {
		want := pattern(uint64(500+round), n)
		write(t, b, host, want)
		copyAsync(t, s0, mid, host) // host -> A
		e0 := record(t, s0)
		require.NoError(t, s1.WaitEvent(e0))
		copyAsync(t, s1, out, mid) // A -> B, only after e0
		copyAsync(t, s1, back, out)
		e1 := record(t, s1)
		wait(t, e1)
		require.True(t, e0.Query(), "round %d: an event behind WaitEvent completed before the awaited event", round)
		require.NoError(t, e0.Err())
		sameBytes(t, fmt.Sprintf("round %d: %s after the waiting stream's copy", round, locB), read(t, b, out), want)
		sameBytes(t, fmt.Sprintf("round %d: host copy back", round), read(t, b, back), want)

		// And the other way round: s0 waits for s1 before overwriting mid.
		require.NoError(t, s0.WaitEvent(e1))
		copyAsync(t, s0, mid, back)
		wait(t, record(t, s0))
	}
}

// After Free every use of the buffer fails with ErrFreed, and a second
// Free returns nothing.
func (s *suite) useAfterFree(t *testing.T) {
	caps := map[string]int64{}
	for _, l := range s.locs {
		caps[l] = 1000
	}
	b := s.backend(t, caps)
	for _, loc := range s.locs {
		t.Run(loc, func(t *testing.T) {
			buf := alloc(t, b, loc, 600)
			other := alloc(t, b, loc, 400)
			require.NoError(t, b.Free(buf))
			require.ErrorIs(t, b.Free(buf), cuda.ErrFreed)
			require.Equal(t, cuda.MemInfo{FreeBytes: 600, TotalBytes: 1000, UsedBytes: 400}, memInfo(t, b, loc),
				"the second Free returned bytes")
			require.Equal(t, int64(600), buf.Size())
			require.Equal(t, loc, buf.Location())
			_, err := b.Read(bg, buf)
			require.ErrorIs(t, err, cuda.ErrFreed, "Read")
			require.ErrorIs(t, b.Write(bg, buf, make([]byte, 600)), cuda.ErrFreed, "Write")
			require.ErrorIs(t, b.Load(bg, buf, "", func(context.Context, []byte) error { return nil }), cuda.ErrFreed, "Load")
			st := stream(t, b, loc)
			peer := alloc(t, b, s.hostLoc(), 600)
			require.ErrorIs(t, st.CopyAsync(buf, peer), cuda.ErrFreed, "CopyAsync into")
			require.ErrorIs(t, st.CopyAsync(peer, buf), cuda.ErrFreed, "CopyAsync from")
			wait(t, record(t, st)) // the refused copies left nothing behind
			require.NoError(t, b.Free(peer))
			require.NoError(t, b.Free(other))
			require.Equal(t, cuda.MemInfo{FreeBytes: 1000, TotalBytes: 1000, UsedBytes: 0}, memInfo(t, b, loc))
		})
	}
}

type ctxKey struct{}

func (s *suite) load(t *testing.T) {
	b := s.backend(t, nil)
	for _, loc := range s.locs {
		t.Run(loc, func(t *testing.T) {
			const n = 300_001
			buf := alloc(t, b, loc, n)
			ctx := context.WithValue(bg, ctxKey{}, "mine")
			want := pattern(30, n)
			require.NoError(t, b.Load(ctx, buf, "", func(ctx context.Context, dst []byte) error {
				assert.Equal(t, "mine", ctx.Value(ctxKey{}), "the loader did not get the caller's context")
				assert.Len(t, dst, n)
				copy(dst, want)
				return nil
			}))
			sameBytes(t, "loaded buffer", read(t, b, buf), want)

			cause := errors.New("source unreadable")
			err := b.Load(bg, buf, "", func(context.Context, []byte) error { return cause })
			require.ErrorIs(t, err, cause)
			var p *cuda.LoaderPanicError
			require.False(t, errors.As(err, &p), "a returned error was reported as a panic")

			err = b.Load(bg, buf, "", func(context.Context, []byte) error { panic("boom") })
			require.ErrorAs(t, err, &p)
			require.Equal(t, "boom", p.Value)
			err = b.Load(bg, buf, "", func(context.Context, []byte) error { panic(cause) })
			require.ErrorAs(t, err, &p)
			require.ErrorIs(t, err, cause)

			write(t, b, buf, pattern(31, n)) // the buffer is still served
			sameBytes(t, "buffer after a panicking loader", read(t, b, buf), pattern(31, n))
		})
	}
}

func (s *suite) streamClose(t *testing.T) {
	b := s.backend(t, nil)
	dev := s.deviceLocs()[0]
	st, err := b.NewStream(dev)
	require.NoError(t, err)
	const n = 4 << 20
	src, dst := alloc(t, b, s.hostLoc(), n), alloc(t, b, dev, n)
	want := pattern(4, n)
	write(t, b, src, want)
	copyAsync(t, st, dst, src)
	copyAsync(t, st, src, dst)
	ev := record(t, st)
	require.NoError(t, st.Close(), "Close drains")
	require.True(t, ev.Query(), "an event recorded before Close did not complete")
	require.NoError(t, ev.Err())
	sameBytes(t, "destination after Close", read(t, b, dst), want)
	require.NoError(t, st.Close(), "second Close")
	require.ErrorIs(t, st.CopyAsync(dst, src), cuda.ErrClosed)
	_, err = st.Record()
	require.ErrorIs(t, err, cuda.ErrClosed)
	require.ErrorIs(t, st.WaitEvent(ev), cuda.ErrClosed)
	require.ErrorIs(t, st.Synchronize(bg), cuda.ErrClosed)
}

func (s *suite) backendClose(t *testing.T) {
	b := s.newBackend(t, nil)
	dev := s.deviceLocs()[0]
	const n = 1 << 20
	buf := alloc(t, b, dev, n)
	other := alloc(t, b, s.hostLoc(), n)
	var streams []cuda.Stream
	for _, l := range s.locs {
		st, err := b.NewStream(l)
		require.NoError(t, err)
		streams = append(streams, st)
	}
	st := streams[0]
	copyAsync(t, st, other, buf)
	pending := record(t, st)

	var wg sync.WaitGroup
	for range 4 { // concurrent Closes all return once everything stopped
		wg.Go(func() {
			assert.NoError(t, b.Close())
			assert.True(t, pending.Query(), "Close returned before the stream drained")
		})
	}
	wg.Wait()
	require.NoError(t, b.Close(), "another Close")
	require.NoError(t, pending.Err(), "the drained copy failed")

	checks := map[string]error{}
	_, checks["Allocate"] = b.Allocate(bg, dev, 1)
	checks["Free"] = b.Free(buf)
	_, checks["NewStream"] = b.NewStream(dev)
	checks["Load"] = b.Load(bg, buf, "", func(context.Context, []byte) error { return nil })
	_, checks["Read"] = b.Read(bg, buf)
	checks["Write"] = b.Write(bg, buf, make([]byte, n))
	_, checks["MemInfo"] = b.MemInfo(dev)
	checks["CopyAsync"] = st.CopyAsync(other, buf)
	_, checks["Record"] = st.Record()
	checks["WaitEvent"] = st.WaitEvent(pending)
	checks["Synchronize"] = st.Synchronize(bg)
	for op, err := range checks {
		require.ErrorIs(t, err, cuda.ErrClosed, "%s after Close", op)
	}
	for _, st := range streams {
		require.NoError(t, st.Close(), "Stream.Close after Backend.Close")
	}
}

// Many goroutines allocate, write, copy on their own streams, wait, read
// back and free at once, with every buffer's bytes checked.
func (s *suite) concurrent(t *testing.T) {
	b := s.backend(t, nil)
	const workers, rounds = 8, 12
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			from := s.locs[r.IntN(len(s.locs))]
			to := s.locs[r.IntN(len(s.locs))]
			st, err := b.NewStream(to)
			if !assert.NoError(t, err) {
				return
			}
			defer func() { assert.NoError(t, st.Close()) }()
			for i := range rounds {
				n := 1 + r.Int64N(256<<10)
				src, err := b.Allocate(bg, from, n)
				if !assert.NoError(t, err) {
					return
				}
				dst, err := b.Allocate(bg, to, n)
				if !assert.NoError(t, err) {
					return
				}
				want := pattern(uint64(w*1000+i), n)
				if !assert.NoError(t, b.Write(bg, src, want)) ||
					!assert.NoError(t, st.CopyAsync(dst, src)) {
					return
				}
				ev, err := st.Record()
				if !assert.NoError(t, err) || !assert.NoError(t, ev.Wait(bg)) {
					return
				}
				got, err := b.Read(bg, dst)
				if !assert.NoError(t, err) || !assert.True(t, bytes.Equal(got, want), "worker %d round %d: %s -> %s bytes differ", w, i, from, to) {
					return
				}
				assert.NoError(t, b.Free(src))
				assert.NoError(t, b.Free(dst))
			}
		})
	}
	wg.Wait()
}
