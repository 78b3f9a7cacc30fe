package staging_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// capWatchRuntime is a *system.System that keeps the refusals its
// supervisor gave to the pipeline's clone reservations.
type capWatchRuntime struct {
	*system.System
	mu       sync.Mutex
	refusals []error
}

func (r *capWatchRuntime) ReserveCapped(ctx context.Context, loc, name, capName string, capBytes, bytes int64) error {
	err := r.System.ReserveCapped(ctx, loc, name, capName, capBytes, bytes)
	if err != nil {
		r.mu.Lock()
		r.refusals = append(r.refusals, err)
		r.mu.Unlock()
	}
	return err
}

func (r *capWatchRuntime) refused() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.refusals...)
}

// The pipeline's cap over its clones is a cap of the runtime's ledger, and
// its only book: each clone's reservation is admitted in its group by the
// supervisor (the first sets the cap), in one state version; the snapshot
// shows the cap while clones hold bytes. The pipeline keeps no second
// book: the cap refusals that drop a try-reserve and make a blocking
// append flush are the supervisor's *CapError, with the snapshot's
// figures, and the pipeline's figures are the snapshot's.
func TestCardCloneCapIsAdmittedInTheLedger(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.NoLimit("pinned-host"), system.Limit("cuda:0", 1<<20)}
	be, err := system.SoftBackend(locs, soft.Config{})
	require.NoError(t, err)
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: be})
	require.NoError(t, err)
	defer func() { require.NoError(t, sys.Close(ctx)) }()
	rt := &capWatchRuntime{System: sys}

	cfg := baseConfig()
	cfg.CloneBudgetBytes = 4 * rowBytes
	p, err := staging.New(ctx, rt, cfg)
	require.NoError(t, err)
	caps := func() []system.CapRecord {
		t.Helper()
		snap, err := sys.Snapshot(ctx)
		require.NoError(t, err)
		return snap.Caps
	}
	// sameFigures: the pipeline's figures are the cap's in the snapshot.
	sameFigures := func() {
		t.Helper()
		st, c := p.Stats(), caps()
		require.Len(t, c, 1)
		assert.Equal(t, [2]int64{c[0].UsedBytes, c[0].PeakBytes}, [2]int64{st.CloneBytes, st.PeakCloneBytes}, "the pipeline's figures are the ledger's")
		assert.Equal(t, c[0].CapBytes, st.CloneBudgetBytes)
	}
	assert.Nil(t, caps(), "no clone yet")
	dev := func(n int64) cuda.Buffer {
		b, err := be.Allocate(ctx, "cuda:0", n)
		require.NoError(t, err)
		t.Cleanup(func() { _ = be.Free(b) })
		return b
	}

	a, err := p.Open(ctx, staging.TaskSpec{ReqID: "a", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	require.NoError(t, a.Append(ctx, staging.Chunk{Device: dev(2 * rowBytes), Rows: rowsAt("k", 0, 1)}))
	assert.Equal(t, []system.CapRecord{{Name: "staging/clones", CapBytes: cfg.CloneBudgetBytes,
		UsedBytes: 2 * rowBytes, PeakBytes: 2 * rowBytes, Reservations: []string{"staging/clone/1"}}}, caps())
	sameFigures()

	// The supervisor refuses a reservation of the group past the cap.
	var ce *system.CapError
	require.ErrorAs(t, sys.ReserveCapped(ctx, "cuda:0", "intruder", "staging/clones", cfg.CloneBudgetBytes, cfg.CloneBudgetBytes), &ce)

	// A try-reserve past the cap is dropped for the cap: the supervisor
	// refused it, with the group's figures.
	b, err := p.Open(ctx, staging.TaskSpec{ReqID: "b", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	err = b.Append(ctx, staging.Chunk{Device: dev(3 * rowBytes), Rows: rowsAt("v", 0, 1, 2), NoWait: true})
	var drop *staging.DropError
	require.ErrorAs(t, err, &drop)
	assert.Equal(t, staging.DropBudget, drop.Reason)
	want := system.CapError{Cap: "staging/clones", CapBytes: 4 * rowBytes, UsedBytes: 2 * rowBytes, RequestedBytes: 3 * rowBytes}
	refused := rt.refused()
	require.Len(t, refused, 1)
	require.ErrorAs(t, refused[0], &ce)
	assert.Equal(t, want, *ce)
	assert.Equal(t, map[string]int64{staging.DropBudget: 1}, p.Stats().Drops)
	sameFigures()

	// A blocking append past the cap: refused by the supervisor for 1 row,
	// it flushes a (the oldest deferred task; its 2 rows on their way out
	// cover the row), and gets its bytes once a's clone is released.
	require.NoError(t, b.Append(ctx, staging.Chunk{Device: dev(3 * rowBytes), Rows: rowsAt("v", 0, 1, 2)}))
	refused = rt.refused()
	require.Len(t, refused, 2, "one refusal: the flush answered it")
	require.ErrorAs(t, refused[1], &ce)
	assert.Equal(t, want, *ce)
	assert.Equal(t, int64(rowBytes), ce.Shortfall())
	assert.Equal(t, int64(1), p.Stats().Flushes)
	require.NoError(t, a.Wait(ctx), "flushed and written")
	assert.Equal(t, []system.CapRecord{{Name: "staging/clones", CapBytes: cfg.CloneBudgetBytes,
		UsedBytes: 3 * rowBytes, PeakBytes: 3 * rowBytes, Reservations: []string{"staging/clone/2"}}}, caps(),
		"set again by b's clone (a's left the group empty); the refused asks took no name")
	sameFigures()

	require.NoError(t, p.Submit(ctx, b))
	require.NoError(t, b.Wait(ctx))
	assert.Nil(t, caps(), "the clones were released at HOST_READY: the cap bounds nothing")
	st := p.Stats()
	assert.Zero(t, st.CloneBytes)
	assert.Equal(t, int64(3*rowBytes), st.PeakCloneBytes)
	require.NoError(t, p.Close(ctx))
}
