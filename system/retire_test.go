package system

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
)

// Retired values leave nothing behind: a discarded
// value, or one whose registration failed, keeps no ledger record, no
// value actor, no goroutine and no loader; its handle keeps answering
// Unavailable (discarded).

// retireCycles is the number of register+discard cycles of
// TestRetiredValuesLeaveNothing: 20,000 (2,000 with -short);
// RESIDENCY_RETIRE_CYCLES sets it (1000000 for the full count).
func retireCycles(t *testing.T) int {
	if s := os.Getenv("RESIDENCY_RETIRE_CYCLES"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "RESIDENCY_RETIRE_CYCLES")
		return n
	}
	if testing.Short() {
		return 2000
	}
	return 20000
}

// localActors counts the processes registered in the actor system: the
// supervisor, location and value actors, reply slots and futures.
func localActors(s *System) int {
	n := 0
	for _, m := range s.eng.System.ProcessRegistry.LocalPIDs.LocalPIDs {
		n += m.Count()
	}
	return n
}

// retireCycle registers a value and retires it: every 8th registration is
// resident at cuda:0 (a buffer), every 64th fails there (an injected
// allocation fault: the handle is retired by the failure), the others
// have a source and a loader; every one that succeeded is discarded.
// It returns the retired handle.
func retireCycle(ctx context.Context, s *System, i int) (Handle, error) {
	loader := func(context.Context, []byte) error { return nil }
	v := Value{Name: "v" + strconv.Itoa(i%1024), Bytes: 64, Source: "pageable-host", Loader: loader}
	if i%8 == 0 {
		v = Value{Name: v.Name, Bytes: 64, At: "cuda:0"}
	}
	if i%64 == 0 {
		testsys.Faults(s).Arm(cuda.FaultAlloc, "cuda:0")
		_, err := s.Register(ctx, v)
		var pe *PlanExecutionError
		if !errors.As(err, &pe) {
			return Handle{}, fmt.Errorf("cycle %d: registration with an injected fault: %v", i, err)
		}
		return pe.FailedAction.Handle, nil
	}
	h, err := s.Register(ctx, v)
	if err != nil {
		return Handle{}, fmt.Errorf("cycle %d: register: %w", i, err)
	}
	if err := s.Discard(ctx, h); err != nil {
		return Handle{}, fmt.Errorf("cycle %d: discard: %w", i, err)
	}
	return h, nil
}

// warmRegistry brings protoactor's process registry to its steady size:
// it is 1,024 concurrent maps of 32 Go maps each, and each of those 32,768
// maps allocates its first group (about 270 bytes) the first time an actor
// id hashes to it: a fixed 8–9 MB that the first few hundred thousand
// actors ever spawned reach, whatever happens to them, and which would
// otherwise show as growth in a run of fewer cycles. Inserting and removing
// keys touches every map once.
func warmRegistry(s *System) {
	for _, m := range s.eng.System.ProcessRegistry.LocalPIDs.LocalPIDs {
		for i := range 400 {
			k := "warm-" + strconv.Itoa(i)
			m.Set(k, nil)
			m.Remove(k)
		}
	}
}

type retireFigures struct {
	heapPerRetired float64 // bytes
	actorsLeft     int
	goroutinesLeft int
}

// measureRetire runs n cycles after a warm-up and returns what they left
// behind once the actors they stopped are gone and the heap is collected.
func measureRetire(t testing.TB, s *System, n int) (retireFigures, Handle, Handle) {
	ctx := context.Background()
	for i := range 1024 { // warm-up: names, slots, maps at their steady size
		_, err := retireCycle(ctx, s, i)
		require.NoError(t, err)
	}
	settle := func(want int) int {
		// Stopped actors leave the registry asynchronously; wait for it
		// (a slow machine only makes this wait longer, never fail).
		n := localActors(s)
		for deadline := time.Now().Add(time.Minute); n > want && time.Now().Before(deadline); n = localActors(s) {
			time.Sleep(10 * time.Millisecond)
		}
		return n
	}
	warmRegistry(s)
	time.Sleep(50 * time.Millisecond)
	actors0 := localActors(s)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	var discarded, failed Handle
	for i := range n {
		h, err := retireCycle(ctx, s, i+1)
		require.NoError(t, err)
		if (i+1)%64 == 0 {
			failed = h
		} else {
			discarded = h
		}
	}
	actors1 := settle(actors0)
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return retireFigures{
		heapPerRetired: (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(n),
		actorsLeft:     actors1 - actors0,
		goroutinesLeft: runtime.NumGoroutine() - g0,
	}, discarded, failed
}

func TestRetiredValuesLeaveNothing(t *testing.T) {
	ctx := context.Background()
	s, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}})
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Close(ctx)) }()
	n := retireCycles(t)
	f, discarded, failed := measureRetire(t, s, n)
	t.Logf("%d retired values: heap growth %.1f B per retired value, %d actors and %d goroutines left", n, f.heapPerRetired, f.actorsLeft, f.goroutinesLeft)
	// Generous margins: the figures are 0 in a quiet runtime; the margins
	// absorb what the Go runtime and protoactor keep for their own reasons
	// (a scheduler goroutine, a map that has not shrunk yet).
	assert.Less(t, f.heapPerRetired, 100.0, "heap growth per retired value")
	assert.Less(t, f.actorsLeft, 1+n/1000, "actors left per retired value")
	assert.Less(t, f.goroutinesLeft, 1+n/1000, "goroutines left per retired value")
	assert.Equal(t, 0, s.eng.Bound(), "loaders bound to retired values")
	loaders, events := s.eng.Parked()
	assert.Equal(t, 0, loaders+events, "parked loaders and events")
	// Both kinds of retired handle still answer Unavailable (discarded),
	// everywhere, and snapshots list nothing of them.
	for _, h := range []Handle{discarded, failed} {
		require.NotZero(t, h.ID)
		err := s.Place(ctx, h, "cuda:0")
		var ue *UnavailableError
		require.ErrorAs(t, err, &ue, "place %s#%d", h.Name, h.ID)
		assert.Equal(t, UnavailableDiscarded, ue.Reason)
		assert.ErrorIs(t, err, ErrDiscarded)
		_, err = s.Acquire(ctx, h, "cuda:0")
		assert.ErrorIs(t, err, ErrDiscarded)
		assert.ErrorIs(t, s.Discard(ctx, h), ErrDiscarded)
	}
	snap, err := s.Snapshot(ctx)
	require.NoError(t, err)
	assert.Empty(t, snap.Values)
	for _, loc := range snap.Locations {
		assert.Zero(t, loc.UsedBytes, loc.Location)
	}
}

// BenchmarkRetire runs b.N register+discard cycles (as in
// TestRetiredValuesLeaveNothing) and reports what they left behind per
// retired value. The full count:
//
//	go test -run '^$' -bench BenchmarkRetire -benchtime 1000000x ./system/
func BenchmarkRetire(b *testing.B) {
	ctx := context.Background()
	s, err := startSoft(b, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(ctx)
	b.ResetTimer()
	t0 := time.Now()
	f, _, _ := measureRetire(b, s, b.N)
	b.ReportMetric(float64(time.Since(t0).Nanoseconds())/float64(b.N), "ns/cycle")
	b.ReportMetric(f.heapPerRetired, "heap-B/retired")
	b.ReportMetric(float64(f.actorsLeft), "actors-left")
	b.ReportMetric(float64(f.goroutinesLeft), "goroutines-left")
}
