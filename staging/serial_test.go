package staging_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// only keeps the entries of log whose name starts with one of prefixes.
func only(log []string, prefixes ...string) []string {
	var out []string
	for _, e := range log {
		for _, p := range prefixes {
			if strings.HasPrefix(e[1:], p) {
				out = append(out, e)
				break
			}
		}
	}
	return out
}

// waitCloneCopies waits until no device clone copy of f's pipeline is in
// flight but the n that wait for a gate.
func (f *fixture) waitCloneCopies(n int) {
	f.t.Helper()
	require.Eventually(f.t, func() bool { return f.p.Stats().CloneCopies == n }, 10*time.Second, 100*time.Microsecond)
}

// A Serial pipeline copies one task at a time: each task's landing buffer
// is released (its pool write done) before the next task's is reserved,
// so the pinned peak is the largest landing buffer, on every run.
func TestSerialCopiesOneTaskAtATime(t *testing.T) {
	for run := range 10 {
		cfg := baseConfig()
		cfg.Serial = true
		rt := newRuntimePinned(t, 1<<20)
		f := newFixture(t, cfg, rt)
		log := rt.record()
		var tasks []*staging.Task
		for i := range 3 {
			tasks = append(tasks, f.deferredTask(fill(byte(i+1), (i+1)*rowBytes), "k", slotsFrom(4*i, i+1)...))
		}
		f.waitCloneCopies(0)
		require.NoError(t, f.p.Submit(f.ctx, tasks...))
		for _, task := range tasks {
			require.NoError(t, task.Wait(f.ctx))
		}
		assert.Equal(t, []string{
			"+staging/clone/1", "+staging/clone/2", "+staging/clone/3",
			"+staging/host/1", "-staging/clone/1", "-staging/host/1",
			"+staging/host/2", "-staging/clone/2", "-staging/host/2",
			"+staging/host/3", "-staging/clone/3", "-staging/host/3",
		}, only(log(), "staging/host/", "staging/clone/"), "run %d: the clones' reservations, then each task in turn", run)
		assert.Equal(t, int64(cfg.Slots)*cfg.SlotBytes+3*rowBytes, pinnedPeak(rt), "run %d", run)
	}
}

// slotsFrom returns the n pool slots first, first+1, …
func slotsFrom(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

func pinnedPeak(rt *ledgerRuntime) int64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, l := range rt.led.Snapshot().Locations {
		if l.Location == "pinned-host" {
			return l.PeakBytes
		}
	}
	return -1
}

// gatedTask opens a JOIN_ON_FINISH task with two chunks of n bytes each:
// the first cloned after g, the second (behind it on the clone stream)
// after nothing.
func (f *fixture) gatedTask(g *gate, n int, slot int) *staging.Task {
	f.t.Helper()
	task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "req", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(f.t, err)
	require.NoError(f.t, task.Append(f.ctx, staging.Chunk{Device: f.device(fill(1, n)), Freeze: g, Rows: rowsAt("v", slot)}))
	require.NoError(f.t, task.Append(f.ctx, staging.Chunk{Device: f.device(fill(2, n)), Rows: rowsAt("k", slot)}))
	return task
}

// failLanding submits a gatedTask whose second landing buffer does not
// fit the pinned budget (room for one chunk beside the slots) and waits
// for it to fail with the budget refusal.
func failLanding(t *testing.T, serial bool) (*fixture, *gate) {
	cfg := baseConfig()
	cfg.Serial = serial
	const chunk = 2 * rowBytes
	rt := newRuntimePinned(t, int64(cfg.Slots)*cfg.SlotBytes+chunk)
	f := newFixture(t, cfg, rt)
	g := newGate()
	task := f.gatedTask(g, chunk, 0)
	f.waitCloneCopies(2) // the first waits for g, the second behind it
	require.NoError(t, f.p.Submit(f.ctx, task))
	err := task.Wait(f.ctx)
	var be *budget.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "pinned-host", be.Location)
	return f, g
}

// A copy stage refused a landing buffer has enqueued no copy: the landing
// buffer it took before is released with the failure, not once the gated
// clone it would have copied lands; only the two clones wait for their
// copies.
func TestLandingRefusalLeavesNoCopyInFlight(t *testing.T) {
	f, g := failLanding(t, false)
	cfg := f.cfg
	assert.Equal(t, int64(cfg.Slots)*cfg.SlotBytes, f.rt.reserved("pinned-host"), "only the slots stay reserved")
	assert.Equal(t, 2, f.p.Stats().PendingFrees, "the two clones, not a landing buffer")
	g.open()
	require.Eventually(t, func() bool { return f.p.Stats().PendingFrees == 0 }, 10*time.Second, 100*time.Microsecond)
	assert.Equal(t, int64(0), f.rt.reserved("cuda:0"))
}

// A Serial pipeline holds the frees that wait for a copy until FreeHeld:
// the failed task's clones stay reserved after their copies land, and
// FreeHeld frees them in the order of their reservations.
func TestSerialHoldsFreesUntilFreeHeld(t *testing.T) {
	f, g := failLanding(t, true)
	log := f.rt.record()
	assert.Equal(t, 0, f.p.FreeHeld(), "their copies wait for the gate")
	g.open()
	f.waitCloneCopies(0)
	st := f.p.Stats()
	assert.Equal(t, 2, st.PendingFrees, "held, copies done")
	assert.Equal(t, int64(4*rowBytes), f.rt.reserved("cuda:0"))
	assert.Empty(t, log())
	assert.Equal(t, 2, f.p.FreeHeld())
	assert.Equal(t, []string{"-staging/clone/1", "-staging/clone/2"}, log())
	assert.Equal(t, 0, f.p.Stats().PendingFrees)
	assert.Equal(t, int64(0), f.rt.reserved("cuda:0"))
	assert.Equal(t, 0, f.p.FreeHeld())
}

// Close frees what a Serial pipeline holds, once the copies land.
func TestSerialCloseFreesHeld(t *testing.T) {
	f, g := failLanding(t, true)
	g.open()
	require.NoError(t, f.p.Close(f.ctx))
	assert.Equal(t, 0, f.p.Stats().PendingFrees)
	assert.Equal(t, int64(0), f.rt.reserved("cuda:0"))
	assert.Equal(t, int64(0), f.rt.reserved("pinned-host"))
}

// Stats.CloneCopies counts the clone copies in flight: a gated one and
// the one behind it on the clone stream, until the gate opens.
func TestStatsCloneCopies(t *testing.T) {
	f := newFixture(t, baseConfig(), nil)
	assert.Equal(t, 0, f.p.Stats().CloneCopies)
	g := newGate()
	f.gatedTask(g, rowBytes, 0)
	assert.Equal(t, 2, f.p.Stats().CloneCopies)
	g.open()
	f.waitCloneCopies(0)
}

// The pipeline's first failure fails the pending tasks oldest first: their
// landed clones are released in the order the tasks were opened.
func TestFailureFailsPendingTasksOldestFirst(t *testing.T) {
	for run := range 5 {
		rt := newRuntime(t, 0, soft.Config{})
		f := newFixture(t, baseConfig(), rt)
		var pending []*staging.Task
		for i := range 6 {
			pending = append(pending, f.deferredTask(fill(byte(i), rowBytes), "k", i))
		}
		f.waitCloneCopies(0)
		log := rt.record()
		rt.be.Faults().Arm(cuda.FaultCopy, "pinned-host") // the step's device→host copy
		_, failing := f.stepTask(fill(9, rowBytes), nil, "v", 0)
		require.NoError(t, f.p.Submit(f.ctx, failing))
		require.Error(t, failing.Wait(f.ctx))
		for _, task := range pending {
			require.Error(t, task.Wait(f.ctx))
		}
		var want []string
		for i := range pending {
			want = append(want, fmt.Sprintf("-staging/clone/%d", i+1))
		}
		assert.Equal(t, want, only(log(), "staging/clone/"), "run %d", run)
	}
}

// A blocking Append woken by a flushed task's end looks at the budget
// before a Serial pipeline's copy queue claims the next flushed task: it
// takes its bytes after the last task it flushed is written, never while
// that task's copy stage runs (its clone bytes are back at HOST_READY).
func TestSerialAppendLooksBeforeTheNextCopyStage(t *testing.T) {
	for run := range 10 {
		cfg := baseConfig()
		cfg.Serial = true
		cfg.CloneBudgetBytes = 4 * rowBytes
		rt := newRuntime(t, 0, soft.Config{})
		f := newFixture(t, cfg, rt)
		f.deferredTask(fill(1, rowBytes), "k", 0)         // clone 1
		f.deferredTask(fill(2, 3*rowBytes), "k", 1, 2, 3) // clone 2
		f.waitCloneCopies(0)
		log := rt.record()
		task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "req", WriteN: 1, Mode: staging.JoinOnFinish})
		require.NoError(t, err)
		require.NoError(t, task.Append(f.ctx, staging.Chunk{Device: f.device(fill(3, 4*rowBytes)), Rows: rowsAt("v", 0, 1, 2, 3)}))
		got := only(log(), "staging/host/", "staging/clone/")
		i := slices.Index(got, "+staging/clone/3")
		require.GreaterOrEqual(t, i, 0, "run %d: %v", run, got)
		assert.Equal(t, []string{
			"+staging/host/1", "-staging/clone/1", "-staging/host/1",
			"+staging/host/2", "-staging/clone/2", "-staging/host/2",
			"+staging/clone/3",
		}, got[:i+1], "run %d", run)
		assert.Equal(t, int64(2), f.p.Stats().Flushes, "run %d", run)
		require.NoError(t, f.p.Close(context.Background()))
	}
}
