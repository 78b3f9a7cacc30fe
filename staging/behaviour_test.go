package staging_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// stepTask stages data as one step and opens a JOIN_NEXT_STEP task with
// rows of key at pool slots (one per row of data, in order).
func (f *fixture) stepTask(data []byte, freeze cuda.Event, key string, slots ...int) (*staging.Step, *staging.Task) {
	f.t.Helper()
	step, err := f.p.Stage(f.ctx, f.device(data), freeze)
	require.NoError(f.t, err)
	task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "req", WriteN: 1, Mode: staging.JoinNextStep})
	require.NoError(f.t, err)
	require.NoError(f.t, task.Append(f.ctx, staging.Chunk{Step: step, Rows: rowsAt(key, slots...)}))
	return step, task
}

// deferredTask opens a JOIN_ON_FINISH task holding data as one chunk.
func (f *fixture) deferredTask(data []byte, key string, slots ...int) *staging.Task {
	f.t.Helper()
	task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "req", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(f.t, err)
	require.NoError(f.t, task.Append(f.ctx, staging.Chunk{Device: f.device(data), Rows: rowsAt(key, slots...)}))
	return task
}

func (f *fixture) pool(key string, slot int) []byte {
	f.t.Helper()
	b, err := f.p.ReadPool(key, slot)
	require.NoError(f.t, err)
	return b
}

func fill(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// The lifecycle is a strict chain plus FAILED from any non-terminal state.
func TestLifecycleTransitions(t *testing.T) {
	chain := []staging.TaskState{staging.Pending, staging.Queued, staging.Copying, staging.HostReady, staging.Written}
	all := append(chain, staging.Failed)
	for _, from := range all {
		for _, to := range all {
			want := false
			if !from.Terminal() {
				want = to == staging.Failed || to == from+1
			}
			assert.Equal(t, want, staging.CanTransition(from, to), "%s -> %s", from, to)
		}
	}
	assert.Equal(t, "HOST_READY", staging.HostReady.String())
}

// Identity: tid, request id and the nth write; several keys in one task.
func TestTaskIdentityAndSeveralKeys(t *testing.T) {
	f := newFixture(t, baseConfig(), nil)
	a, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "req-7", WriteN: 3, Mode: staging.JoinNextStep})
	require.NoError(t, err)
	b, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "req-7", WriteN: 4, Mode: staging.JoinNextStep})
	require.NoError(t, err)
	assert.NotEqual(t, a.ID(), b.ID())
	assert.Equal(t, "req-7", a.ReqID())
	assert.Equal(t, 3, a.WriteN())
	assert.Equal(t, staging.JoinNextStep, a.Mode())
	assert.Equal(t, staging.Pending, a.State())

	data := append(fill(1, rowBytes), fill(2, rowBytes)...)
	step, err := f.p.Stage(f.ctx, f.device(data), nil)
	require.NoError(t, err)
	require.NoError(t, a.Append(f.ctx, staging.Chunk{Step: step, Rows: []staging.Row{{Key: "k", Slot: 5}, {Key: "v", Slot: 5, Offset: rowBytes}}}))
	require.NoError(t, f.p.Submit(f.ctx, a, b))
	require.NoError(t, a.Wait(f.ctx))
	require.NoError(t, b.Wait(f.ctx))
	require.NoError(t, step.Release())
	assert.Equal(t, fill(1, rowBytes), f.pool("k", 5))
	assert.Equal(t, fill(2, rowBytes), f.pool("v", 5))
	assert.Equal(t, staging.Written, a.State())
}

// A step larger than a slot is a configuration error; leftover-only saves
// still take a slot; a full pool fails at once with a claim timeout <= 0
// and after the timeout otherwise.
func TestSlotOverflowLeftoverAndClaimTimeout(t *testing.T) {
	cfg := baseConfig()
	f := newFixture(t, cfg, nil)
	_, err := f.p.Stage(f.ctx, f.device(make([]byte, cfg.SlotBytes+1)), nil)
	var over *staging.SlotOverflowError
	require.ErrorAs(t, err, &over)
	require.ErrorIs(t, err, staging.ErrConfig)
	assert.Equal(t, cfg.SlotBytes+1, over.StepBytes)
	assert.Equal(t, cfg.Slots, f.p.Stats().FreeSlots, "an overflow takes no slot")

	s1, err := f.p.Stage(f.ctx, nil, nil) // leftover-only
	require.NoError(t, err)
	s2, err := f.p.Stage(f.ctx, nil, nil)
	require.NoError(t, err)
	assert.Zero(t, f.p.Stats().FreeSlots)
	start := time.Now()
	_, err = f.p.Stage(f.ctx, nil, nil)
	var te *staging.SlotTimeoutError
	require.ErrorAs(t, err, &te)
	require.ErrorIs(t, err, staging.ErrNoSlot)
	assert.Less(t, time.Since(start), time.Second, "timeout <= 0 fails at once")
	require.NoError(t, s1.Release())
	require.Error(t, s1.Release(), "releasing twice")
	s3, err := f.p.Stage(f.ctx, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, s1.Slot(), s3.Slot())
	require.NoError(t, s2.Release())
	require.NoError(t, s3.Release())
}

func TestSlotClaimWaitsThenTimesOut(t *testing.T) {
	cfg := baseConfig()
	cfg.Slots = 1
	cfg.ClaimTimeout = 20 * time.Millisecond
	f := newFixture(t, cfg, nil)
	s, err := f.p.Stage(f.ctx, nil, nil)
	require.NoError(t, err)
	start := time.Now()
	_, err = f.p.Stage(f.ctx, nil, nil)
	require.ErrorIs(t, err, staging.ErrNoSlot)
	assert.GreaterOrEqual(t, time.Since(start), cfg.ClaimTimeout)

	// A waiting claim gets the slot as soon as it is released.
	cfg2 := baseConfig()
	cfg2.Slots = 1
	cfg2.ClaimTimeout = time.Minute
	g := newFixture(t, cfg2, nil)
	held, err := g.p.Stage(g.ctx, nil, nil)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		s, err := g.p.Stage(g.ctx, nil, nil)
		if err == nil {
			err = s.Release()
		}
		got <- err
	}()
	require.NoError(t, held.Release())
	require.NoError(t, <-got)
	require.NoError(t, s.Release())
}

// A slot is reused only after every holder released it: the step (until
// Release) and each task bound to it (until its pool write).
func TestSlotReuseOnlyAfterEveryHolder(t *testing.T) {
	cfg := baseConfig()
	cfg.Slots = 1
	f := newFixture(t, cfg, nil)
	freeze := newGate()
	step, a := f.stepTask(fill(9, 2*rowBytes), freeze, "k", 0, 1)
	b, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "other", Mode: staging.JoinNextStep})
	require.NoError(t, err)
	require.NoError(t, b.Append(f.ctx, staging.Chunk{Step: step, Rows: []staging.Row{{Key: "v", Slot: 3, Offset: rowBytes}}}))
	require.NoError(t, f.p.Submit(f.ctx, a, b))
	assert.Equal(t, 3, f.p.Stats().SlotHolders) // the step and two tasks

	require.NoError(t, step.Release())
	_, err = f.p.Stage(f.ctx, nil, nil)
	require.ErrorIs(t, err, staging.ErrNoSlot, "the tasks still hold the slot")

	freeze.open()
	require.NoError(t, a.Wait(f.ctx))
	require.NoError(t, b.Wait(f.ctx))
	assert.Equal(t, 1, f.p.Stats().FreeSlots)
	s, err := f.p.Stage(f.ctx, nil, nil)
	require.NoError(t, err)
	require.NoError(t, s.Release())
	assert.Equal(t, fill(9, rowBytes), f.pool("v", 3))
}

// JOIN_ON_FINISH: the clone stays (charged to the budget, visible as a
// reservation on the device location) until the task is submitted; then
// the committer copies it to host and writes the pool.
func TestJoinOnFinishCloneUntilSubmit(t *testing.T) {
	f := newFixture(t, baseConfig(), nil)
	data := append(fill(3, rowBytes), fill(4, rowBytes)...)
	task := f.deferredTask(data, "v", 10, 11)
	assert.Equal(t, staging.Pending, task.State())
	st := f.p.Stats()
	assert.Equal(t, int64(len(data)), st.CloneBytes)
	assert.Equal(t, int64(len(data)), f.rt.reserved("cuda:0"), "the clone's bytes are a reservation on cuda:0")
	select {
	case <-waitCh(f.ctx, task.WaitHostReady):
		t.Fatal("a deferred task must not be host-ready before it is submitted")
	default:
	}
	require.NoError(t, f.p.Submit(f.ctx, task))
	require.NoError(t, task.WaitHostReady(f.ctx))
	require.NoError(t, task.Wait(f.ctx))
	assert.Equal(t, fill(3, rowBytes), f.pool("v", 10))
	assert.Equal(t, fill(4, rowBytes), f.pool("v", 11))
	assert.Zero(t, f.p.Stats().CloneBytes)
	assert.Zero(t, f.rt.reserved("cuda:0"))
}

// waitCh runs a wait on a goroutine only if it returns at once; it is used
// to check that a wait would block, without leaving a goroutine behind.
func waitCh(ctx context.Context, wait func(context.Context) error) <-chan struct{} {
	c, cancel := context.WithCancel(ctx)
	cancel()
	ch := make(chan struct{})
	if err := wait(c); err == nil {
		close(ch)
	}
	return ch
}

// Budget pressure: a reserve that does not fit flushes the deferred task
// with the oldest enqueue time and waits for its release.
func TestBudgetPressureFlushesOldestDeferred(t *testing.T) {
	cfg := baseConfig()
	cfg.CloneBudgetBytes = 4 * rowBytes
	f := newFixture(t, cfg, nil)
	oldest := f.deferredTask(fill(1, 2*rowBytes), "k", 0, 1)
	younger := f.deferredTask(fill(2, 2*rowBytes), "k", 2, 3)
	assert.Equal(t, int64(4*rowBytes), f.p.Stats().CloneBytes)

	third := f.deferredTask(fill(3, 2*rowBytes), "k", 4, 5) // blocks until oldest is copied out
	require.NoError(t, oldest.Wait(f.ctx))
	st := f.p.Stats()
	assert.Equal(t, int64(1), st.Flushes)
	assert.Equal(t, staging.Pending, younger.State(), "only the oldest deferred task is flushed")
	assert.Equal(t, int64(4*rowBytes), st.CloneBytes)
	assert.Equal(t, fill(1, rowBytes), f.pool("k", 1))
	require.NoError(t, f.p.Submit(f.ctx, younger, third))
	require.NoError(t, younger.Wait(f.ctx))
	require.NoError(t, third.Wait(f.ctx))
}

// Try-reserve fails at once, counted by reason: the pipeline's own budget,
// or the device location's budget in the runtime (shared with resident
// values).
func TestTryReserveDropsByReason(t *testing.T) {
	cfg := baseConfig()
	cfg.CloneBudgetBytes = 4 * rowBytes
	rt := newRuntime(t, 6*rowBytes, soft.Config{})
	f := newFixture(t, cfg, rt)
	task := f.deferredTask(fill(1, 3*rowBytes), "k", 0, 1, 2)
	other, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "b", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	err = other.Append(f.ctx, staging.Chunk{Device: f.device(fill(2, 2*rowBytes)), Rows: rowsAt("k", 3, 4), NoWait: true})
	var drop *staging.DropError
	require.ErrorAs(t, err, &drop)
	require.ErrorIs(t, err, staging.ErrDropped)
	assert.Equal(t, staging.DropBudget, drop.Reason)

	// Someone else's reservation fills cuda:0 in the runtime.
	require.NoError(t, rt.Reserve(f.ctx, "cuda:0", "tenant", 3*rowBytes))
	err = other.Append(f.ctx, staging.Chunk{Device: f.device(fill(2, rowBytes)), Rows: rowsAt("k", 3), NoWait: true})
	require.ErrorAs(t, err, &drop)
	assert.Equal(t, staging.DropLocation, drop.Reason)
	var be *budget.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, map[string]int64{staging.DropBudget: 1, staging.DropLocation: 1}, f.p.Stats().Drops)
	assert.Equal(t, int64(3*rowBytes), f.p.Stats().CloneBytes, "drops reserve nothing")
	require.NoError(t, rt.Unreserve(f.ctx, "tenant"))
	require.NoError(t, f.p.Submit(f.ctx, task, other))
	require.NoError(t, task.Wait(f.ctx))
}

// A blocking reserve refused by the location, with nothing of the
// pipeline's to flush or wait for, returns the runtime's BudgetError.
func TestReserveRefusedByLocationWithNothingToFlush(t *testing.T) {
	rt := newRuntime(t, 2*rowBytes, soft.Config{})
	f := newFixture(t, baseConfig(), rt)
	task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "a", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	err = task.Append(f.ctx, staging.Chunk{Device: f.device(fill(1, 3*rowBytes)), Rows: rowsAt("k", 0)})
	var be *budget.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "cuda:0", be.Location)
}

// Priority: high before low; Prioritize moves queued-low and pending tasks
// to the front; a re-queued duplicate is harmless (each task runs once).
func TestPriorityOrderAndPrioritize(t *testing.T) {
	cfg := baseConfig()
	cfg.Slots = 6
	var mu sync.Mutex
	var claims []staging.TaskID
	claimed := make(chan struct{}, 16)
	staging.OnClaim(&cfg, func(id staging.TaskID) {
		mu.Lock()
		claims = append(claims, id)
		mu.Unlock()
		claimed <- struct{}{}
	})
	commits := map[staging.TaskID]int{}
	cfg.OnCommit = func(id staging.TaskID, err error) {
		mu.Lock()
		commits[id]++
		mu.Unlock()
	}
	f := newFixture(t, cfg, nil)
	freeze := newGate()
	sa, a := f.stepTask(fill(1, rowBytes), freeze, "k", 0)
	require.NoError(t, f.p.Submit(f.ctx, a))
	<-claimed // the copy queue is busy with a, which waits for its freeze

	sb, b := f.stepTask(fill(2, rowBytes), nil, "k", 1)
	sc, c := f.stepTask(fill(3, rowBytes), nil, "k", 2)
	sd, d := f.stepTask(fill(4, rowBytes), nil, "k", 3)
	e := f.deferredTask(fill(5, rowBytes), "k", 4) // pending, never submitted
	require.NoError(t, f.p.Submit(f.ctx, b, c, d))
	require.NoError(t, f.p.Prioritize(f.ctx, d.ID(), e.ID()))
	require.NoError(t, f.p.Prioritize(f.ctx, d.ID())) // already at the front: no-op
	assert.Equal(t, staging.Queued, e.State())
	freeze.open()
	for _, task := range []*staging.Task{a, b, c, d, e} {
		require.NoError(t, task.Wait(f.ctx))
	}
	mu.Lock()
	assert.Equal(t, []staging.TaskID{a.ID(), d.ID(), e.ID(), b.ID(), c.ID()}, claims)
	for _, task := range []*staging.Task{a, b, c, d, e} {
		assert.Equal(t, 1, commits[task.ID()], "task %d written once", task.ID())
	}
	mu.Unlock()
	for _, s := range []*staging.Step{sa, sb, sc, sd} {
		require.NoError(t, s.Release())
	}
	// Prioritizing a written task changes nothing.
	require.NoError(t, f.p.Prioritize(f.ctx, a.ID()))
}

// Reassigned rows: a later task taking the same (slot, key) wins; the
// older task's pool write skips them, and it refuses chunks for them. A
// slot written twice by one task keeps the later row.
func TestReassignedRowsAndSlotWrittenTwice(t *testing.T) {
	f := newFixture(t, baseConfig(), nil)
	older := f.deferredTask(append(fill(1, rowBytes), fill(1, rowBytes)...), "k", 7, 8)
	sNew, newer := f.stepTask(fill(2, rowBytes), nil, "k", 7)
	require.NoError(t, f.p.Submit(f.ctx, newer))
	require.NoError(t, newer.Wait(f.ctx))
	require.NoError(t, sNew.Release())

	err := older.Append(f.ctx, staging.Chunk{Device: f.device(fill(5, rowBytes)), Rows: rowsAt("k", 7)})
	var refused *staging.AppendRefusedError
	require.ErrorAs(t, err, &refused)
	assert.True(t, refused.Reassigned)
	// Slot 9 written twice by one task: the later chunk's row stays.
	require.NoError(t, older.Append(f.ctx, staging.Chunk{Device: f.device(fill(6, rowBytes)), Rows: rowsAt("k", 9)}))
	require.NoError(t, older.Append(f.ctx, staging.Chunk{Device: f.device(fill(7, rowBytes)), Rows: rowsAt("k", 9)}))
	require.NoError(t, f.p.Submit(f.ctx, older))
	require.NoError(t, older.Wait(f.ctx))
	assert.Equal(t, fill(2, rowBytes), f.pool("k", 7), "the older write skipped the reassigned row")
	assert.Equal(t, fill(1, rowBytes), f.pool("k", 8))
	assert.Equal(t, fill(7, rowBytes), f.pool("k", 9))
}

// append_chunk is refused once the copy stage is claimed.
func TestAppendRefusedOnceCopyClaimed(t *testing.T) {
	cfg := baseConfig()
	claimed := make(chan staging.TaskID, 4)
	staging.OnClaim(&cfg, func(id staging.TaskID) { claimed <- id })
	f := newFixture(t, cfg, nil)
	freeze := newGate()
	step, task := f.stepTask(fill(1, 2*rowBytes), freeze, "k", 0)
	require.NoError(t, f.p.Submit(f.ctx, task))
	assert.Equal(t, task.ID(), <-claimed)
	err := task.Append(f.ctx, staging.Chunk{Step: step, Rows: []staging.Row{{Key: "k", Slot: 1, Offset: rowBytes}}})
	var refused *staging.AppendRefusedError
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, staging.Copying, refused.State)
	freeze.open()
	require.NoError(t, task.Wait(f.ctx))
	require.NoError(t, step.Release())
	assert.Equal(t, cfg.Slots, f.p.Stats().FreeSlots) // the task's hold is gone too
	err = task.Append(f.ctx, staging.Chunk{Step: step, Rows: rowsAt("k", 1)})
	require.Error(t, err)
}

// A failed copy: the task is FAILED, the failure record is published
// before any waiter wakes, every waiter (host-ready and done, and the
// waiters of pending tasks) returns the failure, budget tickets and slot
// holds are released, and every later entry returns the failure.
func TestCopyFailureWakesAllWaitersAndPoisons(t *testing.T) {
	cfg := baseConfig()
	f := newFixture(t, cfg, nil)
	pending := f.deferredTask(fill(8, rowBytes), "v", 0)
	_, err := pending.ReadRow(f.ctx, "v", 0) // its clone has landed on the device
	require.NoError(t, err)
	freeze := newGate()
	f.rt.be.Faults().Arm(cuda.FaultCopy, "pinned-host") // the next copy into pinned memory fails
	step, task := f.stepTask(fill(1, rowBytes), freeze, "k", 0)
	require.NoError(t, f.p.Submit(f.ctx, task))

	type woke struct {
		err, record error
	}
	results := make(chan woke, 5)
	waits := []func(context.Context) error{task.WaitHostReady, task.Wait, task.Wait, pending.Wait, pending.WaitHostReady}
	for _, w := range waits {
		go func() {
			err := w(f.ctx)
			results <- woke{err, f.p.Err()}
		}()
	}
	freeze.open()
	for range waits {
		r := <-results
		var inj *cuda.InjectedFaultError
		require.ErrorAs(t, r.err, &inj)
		require.Error(t, r.record, "the failure record is published before the waiter wakes")
	}
	assert.Equal(t, staging.Failed, task.State())
	assert.Equal(t, staging.Failed, pending.State())
	st := f.p.Stats()
	assert.Zero(t, st.CloneBytes, "budget tickets released (the clone copy had completed)")
	assert.Zero(t, f.rt.reserved("cuda:0"))
	assert.Equal(t, 1, st.SlotHolders, "only the step still holds its slot")
	require.NoError(t, step.Release())

	var failed *staging.FailedError
	_, err = f.p.Stage(f.ctx, nil, nil)
	require.ErrorAs(t, err, &failed)
	assert.Equal(t, task.ID(), failed.Task)
	_, err = f.p.Open(f.ctx, staging.TaskSpec{Mode: staging.JoinNextStep})
	require.ErrorAs(t, err, &failed)
	require.ErrorAs(t, f.p.Submit(f.ctx, task), &failed)
	require.ErrorAs(t, f.p.Prioritize(f.ctx, task.ID()), &failed)
	_, err = f.p.ReadPool("k", 0)
	require.ErrorAs(t, err, &failed)
	require.NoError(t, f.p.Close(f.ctx))
	assert.Equal(t, cfg.Slots, f.p.Stats().FreeSlots)
}

// A failed pool write fails the task the same way.
func TestPoolWriteFailure(t *testing.T) {
	f := newFixture(t, baseConfig(), nil)
	step, task := f.stepTask(fill(1, rowBytes), nil, "k", 0)
	require.NoError(t, step.Event().Wait(f.ctx))
	// The committer reads the pinned slot in place through Backend.Load:
	// a reconstruct fault there fails the pool write.
	f.rt.be.Faults().Arm(cuda.FaultReconstruct, "pinned-host")
	require.NoError(t, f.p.Submit(f.ctx, task))
	err := task.Wait(f.ctx)
	var inj *cuda.InjectedFaultError
	require.ErrorAs(t, err, &inj)
	require.ErrorIs(t, f.p.Err(), cuda.ErrInjectedFault)
	require.NoError(t, step.Release())
	assert.Equal(t, 2, f.p.Stats().FreeSlots)
}

// Eager mode: Submit waits and writes inline.
func TestEagerSubmitWritesInline(t *testing.T) {
	cfg := baseConfig()
	cfg.Eager = true
	f := newFixture(t, cfg, nil)
	step, task := f.stepTask(fill(4, rowBytes), nil, "v", 2)
	d := f.deferredTask(fill(5, rowBytes), "v", 3)
	require.NoError(t, f.p.Submit(f.ctx, task, d))
	assert.Equal(t, staging.Written, task.State(), "written when Submit returns")
	assert.Equal(t, staging.Written, d.State())
	assert.Equal(t, fill(4, rowBytes), f.pool("v", 2))
	assert.Equal(t, fill(5, rowBytes), f.pool("v", 3))
	require.NoError(t, step.Release())
}

// Reads of a not-yet-done JOIN_ON_FINISH task: the device clone while its
// copy has not landed, the committer-written host rows once it has, the
// pool once written.
func TestReadRowOfDeferredTask(t *testing.T) {
	cfg := baseConfig()
	block := make(chan struct{})
	var once sync.Once
	blocker := make(chan staging.TaskID, 1)
	cfg.OnCommit = func(id staging.TaskID, err error) {
		once.Do(func() {
			blocker <- id
			<-block // hold the committer after its first write
		})
	}
	f := newFixture(t, cfg, nil)
	r := rand.New(rand.NewPCG(3, 4))
	data := randBytes(r, 2*rowBytes)
	task := f.deferredTask(data, "k", 5, 6)

	row, err := task.ReadRow(f.ctx, "k", 6) // from the device clone
	require.NoError(t, err)
	assert.Equal(t, data[rowBytes:], row)
	_, err = task.ReadRow(f.ctx, "v", 6)
	require.ErrorIs(t, err, staging.ErrNoRow)

	// Occupy the committer, then let task reach HOST_READY behind it.
	s0, t0 := f.stepTask(fill(1, rowBytes), nil, "v", 0)
	require.NoError(t, f.p.Submit(f.ctx, t0))
	assert.Equal(t, t0.ID(), <-blocker)
	require.NoError(t, f.p.Submit(f.ctx, task))
	require.NoError(t, task.WaitHostReady(f.ctx))
	assert.Equal(t, staging.HostReady, task.State())
	assert.Zero(t, f.p.Stats().CloneBytes, "the clone is dropped at HOST_READY")
	row, err = task.ReadRow(f.ctx, "k", 5) // from the landed host rows
	require.NoError(t, err)
	assert.Equal(t, data[:rowBytes], row)
	assert.Equal(t, make([]byte, rowBytes), f.pool("k", 5), "not in the pool yet")
	close(block)
	require.NoError(t, task.Wait(f.ctx))
	row, err = task.ReadRow(f.ctx, "k", 5) // from the pool
	require.NoError(t, err)
	assert.Equal(t, data[:rowBytes], row)
	require.NoError(t, s0.Release())
}

// Close writes pending tasks, releases forgotten steps and every
// reservation; later entries get ErrClosed.
func TestCloseDrainsAndReleases(t *testing.T) {
	cfg := baseConfig()
	rt := newRuntime(t, 0, soft.Config{})
	f := newFixture(t, cfg, rt)
	assert.Equal(t, int64(cfg.Slots)*cfg.SlotBytes, rt.reserved("pinned-host"))
	assert.Equal(t, int64(len(cfg.Keys)*cfg.PoolSlots)*cfg.RowBytes, rt.reserved("pageable-host"))
	_, task := f.stepTask(fill(1, rowBytes), nil, "k", 0) // never submitted, step never released
	d := f.deferredTask(fill(2, rowBytes), "k", 1)
	require.NoError(t, f.p.Close(f.ctx))
	require.NoError(t, f.p.Close(f.ctx), "idempotent")
	require.NoError(t, task.Wait(f.ctx))
	require.NoError(t, d.Wait(f.ctx))
	for _, loc := range []string{"cuda:0", "pinned-host", "pageable-host"} {
		assert.Zero(t, rt.reserved(loc), loc)
		mi, err := rt.be.MemInfo(loc)
		require.NoError(t, err)
		if loc != "cuda:0" {
			assert.Zero(t, mi.UsedBytes, loc)
		}
	}
	_, err := f.p.Stage(f.ctx, nil, nil)
	require.ErrorIs(t, err, staging.ErrClosed)
	st := f.p.Stats()
	assert.Equal(t, int64(2), st.Written)
	assert.Equal(t, cfg.Slots, st.FreeSlots)
	assert.True(t, errors.Is(err, staging.ErrClosed))
}
