package staging_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// The clone cap's figures in Stats: CloneBytes follows every reserve and
// release; PeakCloneBytes is the most the clones held at once, and a save
// dropped (by the cap or by the location) or refused as too large for the
// whole cap neither reserves nor raises it.
func TestCloneCapFigures(t *testing.T) {
	cfg := baseConfig()
	cfg.CloneBudgetBytes = 4 * rowBytes
	rt := newRuntime(t, 6*rowBytes, soft.Config{})
	f := newFixture(t, cfg, rt)
	figures := func() [3]int64 {
		st := f.p.Stats()
		return [3]int64{st.CloneBytes, st.PeakCloneBytes, st.CloneBudgetBytes}
	}
	assert.Equal(t, [3]int64{0, 0, 4 * rowBytes}, figures())

	a := f.deferredTask(fill(1, rowBytes), "k", 0)
	b := f.deferredTask(fill(2, 2*rowBytes), "k", 1, 2)
	assert.Equal(t, [3]int64{3 * rowBytes, 3 * rowBytes, 4 * rowBytes}, figures())

	// Larger than the whole cap: a configuration error, waiting or not.
	other, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "o", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	for _, noWait := range []bool{false, true} {
		err = other.Append(f.ctx, staging.Chunk{Device: f.device(fill(3, 5*rowBytes)), Rows: rowsAt("k", 3), NoWait: noWait})
		require.ErrorIs(t, err, staging.ErrConfig, "no wait %v", noWait)
		assert.ErrorContains(t, err, "a device clone of 320 bytes exceeds the whole GPU-byte budget (256)")
	}
	// The cap is full for 2 rows: dropped.
	err = other.Append(f.ctx, staging.Chunk{Device: f.device(fill(3, 2*rowBytes)), Rows: rowsAt("k", 3, 4), NoWait: true})
	require.ErrorIs(t, err, staging.ErrDropped)
	// The cap has room for 1 row, the location has not: dropped, the peak unchanged.
	require.NoError(t, rt.Reserve(f.ctx, "cuda:0", "tenant", 3*rowBytes))
	err = other.Append(f.ctx, staging.Chunk{Device: f.device(fill(3, rowBytes)), Rows: rowsAt("k", 3), NoWait: true})
	require.ErrorIs(t, err, staging.ErrDropped)
	assert.Equal(t, [3]int64{3 * rowBytes, 3 * rowBytes, 4 * rowBytes}, figures(), "drops and refusals reserve nothing")
	assert.Equal(t, map[string]int64{staging.DropBudget: 1, staging.DropLocation: 1}, f.p.Stats().Drops)
	require.NoError(t, rt.Unreserve(f.ctx, "tenant"))

	// Releases: the peak stays.
	require.NoError(t, f.p.Submit(f.ctx, a))
	require.NoError(t, a.Wait(f.ctx))
	assert.Equal(t, [3]int64{2 * rowBytes, 3 * rowBytes, 4 * rowBytes}, figures())
	require.NoError(t, other.Append(f.ctx, staging.Chunk{Device: f.device(fill(3, 2*rowBytes)), Rows: rowsAt("k", 3, 4)}))
	assert.Equal(t, [3]int64{4 * rowBytes, 4 * rowBytes, 4 * rowBytes}, figures(), "the cap is full, not over")
	require.NoError(t, f.p.Submit(f.ctx, b, other))
	require.NoError(t, b.Wait(f.ctx))
	require.NoError(t, other.Wait(f.ctx))
	assert.Equal(t, [3]int64{0, 4 * rowBytes, 4 * rowBytes}, figures())
	assert.Zero(t, rt.reserved("cuda:0"))
}
