package staging_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// Regression tests of issue 18 (staging, seed 004), one per defect.

// openOnce returns a function that opens g once, registered as a cleanup
// too: a test that fails with g closed must not leave Close waiting for it.
func openOnce(t *testing.T, g *gate) func() {
	o := sync.OnceFunc(g.open)
	t.Cleanup(o)
	return o
}

// Defect 1: a JOIN_NEXT_STEP task whose append is refused keeps its hold
// on the slot its earlier chunk views; the slot is not handed to another
// step, and the task writes its own step's bytes.
func TestRefusedAppendKeepsTheTasksSlotHold(t *testing.T) {
	for _, refusal := range []string{"copying", "reassigned"} {
		t.Run(refusal, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Slots = 1
			claimed := make(chan staging.TaskID, 4)
			staging.OnClaim(&cfg, func(id staging.TaskID) { claimed <- id })
			f := newFixture(t, cfg, nil)
			freeze := newGate()
			open := openOnce(t, freeze)
			data := append(fill(1, rowBytes), fill(2, rowBytes)...)
			step, task := f.stepTask(data, freeze, "k", 0, 1)
			var err error
			if refusal == "copying" {
				require.NoError(t, f.p.Submit(f.ctx, task))
				<-claimed // its copy stage waits for the freeze event
				err = task.Append(f.ctx, staging.Chunk{Step: step, Rows: rowsAt("k", 2)})
			} else {
				f.deferredTask(fill(9, rowBytes), "k", 0) // takes (k, 0) from task
				err = task.Append(f.ctx, staging.Chunk{Step: step, Rows: rowsAt("k", 0)})
			}
			var refused *staging.AppendRefusedError
			require.ErrorAs(t, err, &refused)
			require.NoError(t, step.Release())

			_, err = f.p.Stage(f.ctx, f.device(fill(7, 2*rowBytes)), nil)
			require.ErrorIs(t, err, staging.ErrNoSlot, "the task still views the slot")
			assert.Equal(t, 1, f.p.Stats().SlotHolders)
			open()
			if refusal == "reassigned" {
				require.NoError(t, f.p.Submit(f.ctx, task))
			}
			require.NoError(t, task.Wait(f.ctx))
			assert.Equal(t, fill(2, rowBytes), f.pool("k", 1), "the task wrote its own step's bytes")
			assert.Equal(t, 1, f.p.Stats().FreeSlots)
		})
	}
}

// Defect 2: prioritize of a task already queued high (flushed by the
// GPU-byte budget) is a no-op: it keeps its place behind the task flushed
// before it.
func TestPrioritizeOfAFlushedTaskIsANoOp(t *testing.T) {
	cfg := baseConfig()
	cfg.CloneBudgetBytes = 4 * rowBytes
	var mu sync.Mutex
	var claims []staging.TaskID
	claimed := make(chan struct{}, 16)
	staging.OnClaim(&cfg, func(id staging.TaskID) {
		mu.Lock()
		claims = append(claims, id)
		mu.Unlock()
		claimed <- struct{}{}
	})
	f := newFixture(t, cfg, nil)
	freeze := newGate()
	open := openOnce(t, freeze)
	_, held := f.stepTask(fill(1, rowBytes), freeze, "k", 0)
	require.NoError(t, f.p.Submit(f.ctx, held))
	<-claimed // the copy queue is busy until the freeze event

	h1 := f.deferredTask(fill(2, 2*rowBytes), "k", 1, 2)
	h2 := f.deferredTask(fill(3, 2*rowBytes), "k", 3, 4)
	// Two blocking appends of two rows each: each flushes one deferred task.
	var appenders []*staging.Task
	errs := make(chan error, 2)
	for i, h := range []*staging.Task{h1, h2} {
		a, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "a", WriteN: i, Mode: staging.JoinOnFinish})
		require.NoError(t, err)
		appenders = append(appenders, a)
		dev := f.device(fill(byte(4+i), 2*rowBytes))
		go func() { errs <- a.Append(f.ctx, staging.Chunk{Device: dev, Rows: rowsAt("v", 2*i, 2*i+1)}) }()
		require.Eventually(t, func() bool { return h.State() == staging.Queued }, 10*time.Second, time.Millisecond)
	}
	require.NoError(t, f.p.Prioritize(f.ctx, h2.ID())) // queued high already: a no-op
	open()
	for range appenders {
		require.NoError(t, <-errs)
	}
	require.NoError(t, f.p.Submit(f.ctx, appenders...))
	for _, task := range append([]*staging.Task{held, h1, h2}, appenders...) {
		require.NoError(t, task.Wait(f.ctx))
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []staging.TaskID{held.ID(), h1.ID(), h2.ID()}, claims[:3])
	assert.Equal(t, int64(2), f.p.Stats().Flushes)
}

// Defect 3: the committer writes the pool in the order the copy stages
// finished; a task prioritized later does not overtake one whose copy
// finished earlier.
func TestPoolWritesFollowCopyOrder(t *testing.T) {
	cfg := baseConfig()
	cfg.Slots = 4
	var mu sync.Mutex
	var commits []staging.TaskID
	first, hold := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)
	cfg.OnCommit = func(id staging.TaskID, err error) {
		mu.Lock()
		commits = append(commits, id)
		n := len(commits)
		mu.Unlock()
		if n == 1 {
			close(first)
			<-hold // the committer stays busy with the first write
		}
	}
	f := newFixture(t, cfg, nil)
	s0, w0 := f.stepTask(fill(1, rowBytes), nil, "k", 0)
	require.NoError(t, f.p.Submit(f.ctx, w0))
	<-first
	s1, a := f.stepTask(fill(2, rowBytes), nil, "k", 1)
	require.NoError(t, f.p.Submit(f.ctx, a))
	require.NoError(t, a.WaitHostReady(f.ctx)) // a's copy stage finished
	s2, b := f.stepTask(fill(3, rowBytes), nil, "k", 2)
	require.NoError(t, f.p.Prioritize(f.ctx, b.ID()))
	require.NoError(t, b.WaitHostReady(f.ctx))
	release()
	for _, task := range []*staging.Task{w0, a, b} {
		require.NoError(t, task.Wait(f.ctx))
	}
	for _, s := range []*staging.Step{s0, s1, s2} {
		require.NoError(t, s.Release())
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []staging.TaskID{w0.ID(), a.ID(), b.ID()}, commits)
}

// Defect 4: ReadRow returns ErrNoRow for a row the task does not have,
// whether it is pending, written, or JOIN_NEXT_STEP, and for a row a later
// task took before its pool write. A row a chunk names twice reads as its
// later entry, as the pool write writes it.
func TestReadRowReadsOnlyTheTasksRows(t *testing.T) {
	f := newFixture(t, baseConfig(), nil)
	step, next := f.stepTask(append(fill(1, rowBytes), fill(2, rowBytes)...), nil, "k", 0, 3)
	f.deferredTask(fill(9, rowBytes), "k", 3) // takes (k, 3) before next is written
	require.NoError(t, f.p.Submit(f.ctx, next))
	require.NoError(t, next.Wait(f.ctx))
	require.NoError(t, step.Release())

	fin, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "r", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	twice := []staging.Row{{Key: "v", Slot: 4, Offset: 0}, {Key: "v", Slot: 4, Offset: rowBytes}}
	require.NoError(t, fin.Append(f.ctx, staging.Chunk{Device: f.device(append(fill(5, rowBytes), fill(6, rowBytes)...)), Rows: twice}))
	b, err := fin.ReadRow(f.ctx, "v", 4)
	require.NoError(t, err)
	assert.Equal(t, fill(6, rowBytes), b, "the later entry of the row, from the clone")
	_, err = fin.ReadRow(f.ctx, "v", 5)
	require.ErrorIs(t, err, staging.ErrNoRow, "pending, a row it does not have")
	require.NoError(t, f.p.Submit(f.ctx, fin))
	require.NoError(t, fin.Wait(f.ctx))

	b, err = next.ReadRow(f.ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, fill(1, rowBytes), b)
	for _, c := range []struct {
		task *staging.Task
		key  string
		slot int
		what string
	}{
		{next, "k", 5, "JOIN_NEXT_STEP, a row it never had"},
		{next, "k", 3, "JOIN_NEXT_STEP, a row a later task took"},
		{fin, "v", 5, "written JOIN_ON_FINISH, a row it never had"},
		{fin, "k", 0, "written JOIN_ON_FINISH, another task's row"},
	} {
		_, err := c.task.ReadRow(f.ctx, c.key, c.slot)
		assert.ErrorIs(t, err, staging.ErrNoRow, c.what)
	}
	b, err = fin.ReadRow(f.ctx, "v", 4)
	require.NoError(t, err)
	assert.Equal(t, fill(6, rowBytes), b, "written: the pool holds the later entry")
}

// Defect 5 (the pipeline's part): a refused append takes nothing. Appending
// to a written task under a full budget is refused at once, without
// flushing anyone; a refused append under a freeze event starts no clone
// copy and holds no budget (which would hold back every later clone on the
// clone stream, and fill the budget, until that event).
func TestRefusedAppendTakesNothing(t *testing.T) {
	t.Run("written task, full budget", func(t *testing.T) {
		cfg := baseConfig()
		cfg.CloneBudgetBytes = 2 * rowBytes
		f := newFixture(t, cfg, nil)
		d := f.deferredTask(fill(1, 2*rowBytes), "k", 0, 1)
		w, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "w", Mode: staging.JoinOnFinish})
		require.NoError(t, err)
		require.NoError(t, f.p.Submit(f.ctx, w))
		require.NoError(t, w.Wait(f.ctx))
		err = w.Append(f.ctx, staging.Chunk{Device: f.device(fill(2, rowBytes)), Rows: rowsAt("v", 0)})
		var refused *staging.AppendRefusedError
		require.ErrorAs(t, err, &refused)
		assert.Equal(t, staging.Written, refused.State)
		assert.Equal(t, staging.Pending, d.State(), "nothing was flushed for a refused append")
		assert.Zero(t, f.p.Stats().Flushes)
	})
	t.Run("copying task, freeze event", func(t *testing.T) {
		cfg := baseConfig()
		cfg.CloneBudgetBytes = 4 * rowBytes
		claimed := make(chan staging.TaskID, 4)
		staging.OnClaim(&cfg, func(id staging.TaskID) { claimed <- id })
		f := newFixture(t, cfg, nil)
		g1, g2 := newGate(), newGate()
		open1, _ := openOnce(t, g1), openOnce(t, g2)
		task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "t", Mode: staging.JoinOnFinish})
		require.NoError(t, err)
		require.NoError(t, task.Append(f.ctx, staging.Chunk{Device: f.device(fill(1, rowBytes)), Freeze: g1, Rows: rowsAt("k", 0)}))
		require.NoError(t, f.p.Submit(f.ctx, task))
		<-claimed // copying: it waits for its clone, which waits for g1
		err = task.Append(f.ctx, staging.Chunk{Device: f.device(fill(2, rowBytes)), Freeze: g2, Rows: rowsAt("k", 1), NoWait: true})
		var refused *staging.AppendRefusedError
		require.ErrorAs(t, err, &refused)
		assert.Equal(t, staging.Copying, refused.State)
		assert.Equal(t, int64(rowBytes), f.p.Stats().CloneBytes, "the refused clone holds no budget")
		assert.Equal(t, int64(rowBytes), f.rt.reserved("cuda:0"))

		other := f.deferredTask(fill(3, 3*rowBytes), "v", 0, 1, 2) // fits beside the first clone
		open1()
		require.NoError(t, task.Wait(f.ctx))
		assert.Equal(t, fill(1, rowBytes), f.pool("k", 0))
		require.NoError(t, f.p.Submit(f.ctx, other))
		require.NoError(t, other.Wait(f.ctx), "later clones were not held back behind g2")
	})
}

// Defect 6 (the pipeline's part): a blocking reserve flushes just the
// deferred tasks whose bytes it needs, whatever the moment their clones
// come back: a task released chunk by chunk does not make it flush the
// next one too.
func TestFlushesDoNotDependOnTiming(t *testing.T) {
	for range 20 {
		cfg := baseConfig()
		cfg.CloneBudgetBytes = 7 * rowBytes
		rt := newRuntime(t, 0, soft.Config{})
		f := newFixture(t, cfg, rt)
		d1, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "d1", Mode: staging.JoinOnFinish})
		require.NoError(t, err)
		for i := range 6 {
			require.NoError(t, d1.Append(f.ctx, staging.Chunk{Device: f.device(fill(byte(i), rowBytes)), Rows: rowsAt("k", i)}))
		}
		d2 := f.deferredTask(fill(7, rowBytes), "v", 0)
		x, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "x", Mode: staging.JoinOnFinish})
		require.NoError(t, err)
		require.NoError(t, x.Append(f.ctx, staging.Chunk{Device: f.device(fill(8, 6*rowBytes)), Rows: rowsAt("v", 1, 2, 3, 4, 5, 6)}))
		require.NoError(t, d1.Wait(f.ctx))
		assert.Equal(t, int64(1), f.p.Stats().Flushes, "d1 alone frees what the append needs")
		assert.Equal(t, staging.Pending, d2.State())
		require.NoError(t, f.p.Close(f.ctx))
	}
}

// Defect 15: New checks sizes before it reserves or allocates anything:
// no panic, no allocation sized by a bad Config, a typed error, nothing
// reserved.
func TestNewChecksSizesBeforeAllocating(t *testing.T) {
	rt := newRuntime(t, 0, soft.Config{})
	for _, c := range []struct {
		name string
		edit func(*staging.Config)
	}{
		{"2^63-1 slots", func(c *staging.Config) { c.Slots = math.MaxInt }},
		{"1e9 slots", func(c *staging.Config) { c.Slots = 1e9; c.SlotBytes = 1 }},
		{"slots × slot bytes overflow", func(c *staging.Config) { c.Slots = 4; c.SlotBytes = math.MaxInt64 / 2 }},
		{"pool rows overflow", func(c *staging.Config) { c.PoolSlots = math.MaxInt }},
		{"pool bytes overflow", func(c *staging.Config) { c.PoolSlots = 1 << 20; c.RowBytes = 1 << 50 }},
		{"too many pool rows", func(c *staging.Config) { c.PoolSlots = staging.MaxPoolRows; c.RowBytes = 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseConfig()
			c.edit(&cfg)
			p, err := staging.New(t.Context(), rt, cfg)
			require.ErrorIs(t, err, staging.ErrConfig)
			assert.Nil(t, p)
			for _, loc := range []string{"pageable-host", "pinned-host", "cuda:0"} {
				assert.Zero(t, rt.reserved(loc), "nothing reserved at %s", loc)
			}
		})
	}
}

// Defect 5 (the pipeline's part): a stage never waits for the last copy of
// a free slot it could avoid. A free slot whose buffer has another size and
// whose last copy has not landed (it waits for a freeze event) is not ready:
// the claim takes a ready slot; with none ready, it waits up to a positive
// ClaimTimeout (or under its context).
func TestStagePrefersASlotReadyForTheStep(t *testing.T) {
	cfg := baseConfig()
	cfg.Slots = 2
	f := newFixture(t, cfg, nil)
	g := newGate()
	open := openOnce(t, g)
	s0, err := f.p.Stage(f.ctx, f.device(fill(1, 2*rowBytes)), g)
	require.NoError(t, err)
	require.Equal(t, 0, s0.Slot())
	require.NoError(t, s0.Release()) // free, its copy still waits for g

	stage := func(rows int) (*staging.Step, error) {
		ctx, cancel := context.WithTimeout(f.ctx, 200*time.Millisecond)
		defer cancel()
		return f.p.Stage(ctx, f.device(fill(2, rows*rowBytes)), nil)
	}
	s1, err := stage(1)
	require.NoError(t, err, "slot 1 has no buffer yet: ready")
	assert.Equal(t, 1, s1.Slot())
	require.NoError(t, s1.Release())
	s2, err := stage(2)
	require.NoError(t, err, "slot 0's buffer has the step's size: ready")
	assert.Equal(t, 0, s2.Slot())
	require.NoError(t, s2.Release())
	_, err = stage(3) // no free slot is ready; ClaimTimeout 0: waits under ctx
	require.ErrorIs(t, err, context.DeadlineExceeded)

	c2 := baseConfig()
	c2.Name, c2.Slots, c2.ClaimTimeout = "timeout", 1, 20*time.Millisecond
	f2 := newFixture(t, c2, f.rt)
	g2 := newGate()
	openOnce(t, g2)
	s, err := f2.p.Stage(f.ctx, f.device(fill(1, 2*rowBytes)), g2)
	require.NoError(t, err)
	require.NoError(t, s.Release())
	_, err = f2.p.Stage(f.ctx, f.device(fill(1, rowBytes)), nil)
	var st *staging.SlotTimeoutError
	require.ErrorAs(t, err, &st)
	assert.True(t, st.NotLanded)

	open()
	s3, err := stage(3)
	require.NoError(t, err)
	require.NoError(t, s3.Release())
}

// Stats.WaitingAppends counts blocking appends asleep in the budget with
// no release on its way.
func TestWaitingAppendsIsCounted(t *testing.T) {
	cfg := baseConfig()
	cfg.CloneBudgetBytes = 2 * rowBytes
	f := newFixture(t, cfg, nil)
	g := newGate()
	open := openOnce(t, g)
	d, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "d", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	require.NoError(t, d.Append(f.ctx, staging.Chunk{Device: f.device(fill(1, 2*rowBytes)), Freeze: g, Rows: rowsAt("k", 0, 1)}))
	x, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "x", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	dev := f.device(fill(2, rowBytes))
	done := make(chan error, 1)
	go func() { done <- x.Append(f.ctx, staging.Chunk{Device: dev, Rows: rowsAt("v", 0)}) }()
	// It flushes d, whose copy waits for g: nothing comes back.
	require.Eventually(t, func() bool { return f.p.Stats().WaitingAppends == 1 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int64(1), f.p.Stats().Flushes)
	open()
	require.NoError(t, <-done)
	assert.Zero(t, f.p.Stats().WaitingAppends)
	require.NoError(t, f.p.Submit(f.ctx, x))
	require.NoError(t, x.Wait(f.ctx))
}
