package staging_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// newRuntimePinned is newRuntime with a budget on pinned-host, where the
// staging slots and the landing buffers of device clones are charged.
func newRuntimePinned(t testing.TB, pinned int64) *ledgerRuntime {
	t.Helper()
	be, err := soft.New(soft.Config{Locations: []string{"pageable-host", "pinned-host", "cuda:0"}})
	require.NoError(t, err)
	led, err := budget.New(budget.Config{ManagerID: "staging-test", Locations: []budget.LocationConfig{
		{Name: "pageable-host"}, {Name: "pinned-host", HasBudget: true, BudgetBytes: pinned}, {Name: "cuda:0"}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = be.Close() })
	return &ledgerRuntime{be: faulty.Wrap(be, soft.ErrorPrefix), led: led}
}

// Landing buffers (pinned host memory a device clone is copied into
// before the pool write) are bounded by the pinned budget: when the next
// one does not fit, the copy stage waits for the pipeline's own landing
// buffers to be released by their pool writes, instead of failing the
// task and poisoning the pipeline.
func TestLandingBuffersWaitForRoomInsteadOfFailing(t *testing.T) {
	cfg := baseConfig()
	const clone = 2 * rowBytes
	// Room for the slots and exactly one landing buffer.
	rt := newRuntimePinned(t, int64(cfg.Slots)*cfg.SlotBytes+clone)
	f := newFixture(t, cfg, rt)
	var tasks []*staging.Task
	for i := range 6 {
		data := append(fill(byte(10+i), rowBytes), fill(byte(20+i), rowBytes)...)
		tasks = append(tasks, f.deferredTask(data, "v", 2*i, 2*i+1))
	}
	require.NoError(t, f.p.Submit(f.ctx, tasks...))
	for i, task := range tasks {
		require.NoError(t, task.Wait(f.ctx), "task %d", i)
		assert.Equal(t, fill(byte(10+i), rowBytes), f.pool("v", 2*i))
		assert.Equal(t, fill(byte(20+i), rowBytes), f.pool("v", 2*i+1))
	}
	require.NoError(t, f.p.Err())
	assert.Equal(t, int64(cfg.Slots)*cfg.SlotBytes, rt.reserved("pinned-host"), "only the slots stay reserved")
}

// A task whose own landing buffers fill the pinned budget cannot wait for
// itself: its next landing buffer fails at once with the budget refusal.
func TestLandingBufferThatCanOnlyWaitForItselfFails(t *testing.T) {
	cfg := baseConfig()
	const chunk = 2 * rowBytes
	rt := newRuntimePinned(t, int64(cfg.Slots)*cfg.SlotBytes+chunk)
	f := newFixture(t, cfg, rt)
	task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "req", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	require.NoError(t, task.Append(f.ctx, staging.Chunk{Device: f.device(fill(1, chunk)), Rows: rowsAt("v", 0, 1)}))
	require.NoError(t, task.Append(f.ctx, staging.Chunk{Device: f.device(fill(2, chunk)), Rows: rowsAt("k", 0, 1)}))
	require.NoError(t, f.p.Submit(f.ctx, task))
	ctx, cancel := context.WithTimeout(f.ctx, 20*time.Second)
	defer cancel()
	err = task.Wait(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the task must fail, not wait for itself")
	var be *budget.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "pinned-host", be.Location)
}
