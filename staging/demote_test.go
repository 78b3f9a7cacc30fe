package staging_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// demoteRuntime is a ledgerRuntime that also serves demotions: it keeps
// the copier a pipeline registers, as the runtime's value actors would.
type demoteRuntime struct {
	*ledgerRuntime
	mu      sync.Mutex
	route   [2]string
	copier  actors.DemotionCopier
	stopped int
}

var _ staging.DemotionServer = (*demoteRuntime)(nil)

func (r *demoteRuntime) ServeDemotions(from, to string, c actors.DemotionCopier) (func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.route, r.copier = [2]string{from, to}, c
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.copier = nil
		r.stopped++
	}, nil
}

// served returns the copier registered now (nil once unregistered).
func (r *demoteRuntime) served() actors.DemotionCopier {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.copier
}

// demoteFixture is a fixture whose runtime serves demotions, and whose
// copy queue's work is logged in order (write tasks' copy stages as
// "task N", demotion copies as "demote NAME"). It keeps a copy of the
// copier: a test may use it after Close unregistered it.
type demoteFixture struct {
	*fixture
	dr     *demoteRuntime
	copier actors.DemotionCopier
	mu     sync.Mutex
	log    []string
}

func newDemoteFixture(t *testing.T, cfg staging.Config) *demoteFixture {
	t.Helper()
	df := &demoteFixture{dr: &demoteRuntime{ledgerRuntime: newRuntime(t, 0, soft.Config{})}}
	cfg.OnCopyStarted = func(id staging.TaskID) { df.note(fmt.Sprintf("task %d", id)) }
	cfg.OnDemotion = func(value string, _ int64, _ error) { df.note("demote " + value) }
	if cfg.DemotionMaxWait == 0 {
		cfg.DemotionMaxWait = -1 // the tests hold demotions behind write tasks on purpose
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	p, err := staging.New(ctx, df.dr, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	df.fixture = &fixture{t: t, rt: df.dr.ledgerRuntime, p: p, cfg: cfg, ctx: ctx}
	df.copier = df.dr.served()
	require.NotNil(t, df.copier, "the pipeline registered itself")
	assert.Equal(t, [2]string{"cuda:0", "pinned-host"}, df.dr.route)
	return df
}

func (df *demoteFixture) note(s string) {
	df.mu.Lock()
	df.log = append(df.log, s)
	df.mu.Unlock()
}

func (df *demoteFixture) trace() []string {
	df.mu.Lock()
	defer df.mu.Unlock()
	return append([]string(nil), df.log...)
}

// demotion is a demotion of data from cuda:0 into a fresh pinned buffer.
func (df *demoteFixture) demotion(name string, data []byte) actors.Demotion {
	df.t.Helper()
	dst, err := df.rt.be.Allocate(df.ctx, "pinned-host", int64(len(data)))
	require.NoError(df.t, err)
	df.t.Cleanup(func() { _ = df.rt.be.Free(dst) })
	return actors.Demotion{Value: name, From: "cuda:0", To: "pinned-host", Bytes: int64(len(data)), Src: df.device(data), Dst: dst}
}

type demoteResult struct {
	served bool
	err    error
}

// start hands d to the copier on a goroutine of its own (as a value
// actor would) and returns its outcome's channel.
func (df *demoteFixture) start(ctx context.Context, d actors.Demotion) <-chan demoteResult {
	out := make(chan demoteResult, 1)
	go func() {
		served, err := df.copier.CopyDemotion(ctx, d)
		out <- demoteResult{served, err}
	}()
	return out
}

// waitStats waits (yielding, never sleeping) until cond holds for the
// pipeline's Stats.
func (df *demoteFixture) waitStats(what string, cond func(staging.Stats) bool) {
	df.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(df.p.Stats()) {
		require.True(df.t, time.Now().Before(deadline), "timed out waiting for %s", what)
		runtime.Gosched()
	}
}

// blockQueue submits task a, whose copy stage waits for the returned
// freeze gate, and waits until the copy queue is busy with it.
func (df *demoteFixture) blockQueue() (*staging.Step, *staging.Task, *gate) {
	df.t.Helper()
	freeze := newGate()
	sa, a := df.stepTask(fill(1, rowBytes), freeze, "k", 0)
	require.NoError(df.t, df.p.Submit(df.ctx, a))
	df.waitStats("task a's copy stage", func(s staging.Stats) bool { return s.Tasks[staging.Copying] == 1 })
	return sa, a, freeze
}

func (df *demoteFixture) read(b cuda.Buffer) []byte {
	df.t.Helper()
	got, err := df.rt.be.Read(df.ctx, b)
	require.NoError(df.t, err)
	return got
}

// A demotion queued behind a busy copy queue runs after every write task
// queued later: it is served at the lowest priority. Its bytes arrive.
func TestDemotionRunsBehindQueuedWriteTasks(t *testing.T) {
	cfg := baseConfig()
	cfg.Slots = 4
	df := newDemoteFixture(t, cfg)
	sa, a, freeze := df.blockQueue()

	data := fill(9, 3*rowBytes)
	d := df.demotion("v", data)
	res := df.start(df.ctx, d)
	df.waitStats("the demotion on the copy queue", func(s staging.Stats) bool { return s.DemotionsQueued == 1 })
	sb, b := df.stepTask(fill(2, rowBytes), nil, "k", 1)
	sc, c := df.stepTask(fill(3, rowBytes), nil, "k", 2)
	require.NoError(t, df.p.Submit(df.ctx, b, c))
	freeze.open()

	r := <-res
	require.True(t, r.served)
	require.NoError(t, r.err)
	for _, task := range []*staging.Task{a, b, c} {
		require.NoError(t, task.Wait(df.ctx))
	}
	want := []string{fmt.Sprintf("task %d", a.ID()), fmt.Sprintf("task %d", b.ID()), fmt.Sprintf("task %d", c.ID()), "demote v"}
	assert.Equal(t, want, df.trace(), "the demotion waits for every write task's copy stage")
	assert.Equal(t, data, df.read(d.Dst), "bytes intact at pinned-host")
	st := df.p.Stats()
	assert.Equal(t, int64(1), st.Demotions)
	assert.Equal(t, int64(len(data)), st.DemotedBytes)
	assert.Zero(t, st.DemotionFailures+st.DemotionsDeclined)
	assert.Zero(t, st.DemotionsQueued)
	for _, s := range []*staging.Step{sa, sb, sc} {
		require.NoError(t, s.Release())
	}
}

// A failed demotion copy is the demotion's failure, reported to the
// runtime (which drops the value); the pipeline stays healthy.
func TestDemotionCopyFailureIsTheDemotions(t *testing.T) {
	df := newDemoteFixture(t, baseConfig())
	d := df.demotion("v", fill(4, rowBytes))
	df.rt.be.Faults().Arm(cuda.FaultCopy, "pinned-host")
	r := <-df.start(df.ctx, d)
	assert.True(t, r.served)
	require.Error(t, r.err)
	assert.Zero(t, df.rt.be.Faults().Armed(cuda.FaultCopy, "pinned-host"), "the copy met the fault")
	st := df.p.Stats()
	assert.Equal(t, int64(1), st.DemotionFailures)
	assert.Zero(t, st.Demotions)
	require.NoError(t, df.p.Err(), "a demotion is not a write task: the pipeline is healthy")

	s, task := df.stepTask(fill(5, rowBytes), nil, "k", 0)
	require.NoError(t, df.p.Submit(df.ctx, task))
	require.NoError(t, task.Wait(df.ctx))
	require.NoError(t, s.Release())
	assert.Equal(t, fill(5, rowBytes), df.pool("k", 0))
}

// Close declines the demotions still waiting on the copy queue (the
// runtime then copies them itself) without waiting for the write tasks
// ahead of them, unregisters the pipeline, and declines what comes later.
func TestDemotionQueuedAtCloseIsDeclined(t *testing.T) {
	df := newDemoteFixture(t, baseConfig())
	sa, a, freeze := df.blockQueue()
	d := df.demotion("v", fill(7, rowBytes))
	res := df.start(df.ctx, d)
	df.waitStats("the demotion on the copy queue", func(s staging.Stats) bool { return s.DemotionsQueued == 1 })

	require.NoError(t, sa.Release())
	closed := make(chan error, 1)
	go func() { closed <- df.p.Close(df.ctx) }()
	r := <-res // while task a still waits for its freeze
	assert.False(t, r.served, "declined: the runtime copies itself")
	require.NoError(t, r.err)
	assert.Equal(t, make([]byte, rowBytes), df.read(d.Dst), "the pipeline never touched the buffer")
	assert.Nil(t, df.dr.served(), "unregistered")

	served, err := df.copier.CopyDemotion(df.ctx, df.demotion("w", fill(8, rowBytes)))
	assert.False(t, served, "a closing pipeline declines")
	require.NoError(t, err)
	freeze.open()
	require.NoError(t, <-closed)
	require.NoError(t, a.Wait(df.ctx))
	st := df.p.Stats()
	assert.Equal(t, int64(2), st.DemotionsDeclined)
	assert.Zero(t, st.Demotions+st.DemotionFailures)
	assert.Equal(t, []string{fmt.Sprintf("task %d", a.ID())}, df.trace(), "the declined demotion never ran")
	assert.Equal(t, 1, df.dr.stopped)
}

// A demotion whose caller gives up while it waits on the copy queue never
// runs; one that runs is seen through.
func TestDemotionGivenUpBeforeItRunsNeverRuns(t *testing.T) {
	df := newDemoteFixture(t, baseConfig())
	sa, a, freeze := df.blockQueue()
	ctx, cancel := context.WithCancel(df.ctx)
	d := df.demotion("v", fill(7, rowBytes))
	res := df.start(ctx, d)
	df.waitStats("the demotion on the copy queue", func(s staging.Stats) bool { return s.DemotionsQueued == 1 })
	cancel()
	r := <-res
	assert.True(t, r.served)
	require.ErrorIs(t, r.err, context.Canceled)

	// The queue reaches the given-up job after a and b, and skips it.
	sb, b := df.stepTask(fill(2, rowBytes), nil, "k", 1)
	require.NoError(t, df.p.Submit(df.ctx, b))
	freeze.open()
	require.NoError(t, a.Wait(df.ctx))
	require.NoError(t, b.Wait(df.ctx))
	e := df.demotion("e", fill(6, rowBytes))
	r = <-df.start(df.ctx, e) // behind the given-up job in the queue
	require.True(t, r.served)
	require.NoError(t, r.err)
	assert.Equal(t, []string{fmt.Sprintf("task %d", a.ID()), fmt.Sprintf("task %d", b.ID()), "demote e"}, df.trace())
	assert.Equal(t, make([]byte, rowBytes), df.read(d.Dst), "the given-up demotion never copied")
	st := df.p.Stats()
	assert.Equal(t, int64(1), st.DemotionFailures)
	assert.Equal(t, int64(1), st.Demotions)
	for _, s := range []*staging.Step{sa, sb} {
		require.NoError(t, s.Release())
	}
}

// An eager pipeline has no copy queue: it does not serve demotions.
func TestDemotionNotServedByAnEagerPipeline(t *testing.T) {
	dr := &demoteRuntime{ledgerRuntime: newRuntime(t, 0, soft.Config{})}
	cfg := baseConfig()
	cfg.Eager = true
	p, err := staging.New(context.Background(), dr, cfg)
	require.NoError(t, err)
	assert.Nil(t, dr.served())
	require.NoError(t, p.Close(context.Background()))
	assert.Zero(t, dr.stopped)
}

// A demotion that waits on the copy queue behind write tasks longer than
// DemotionMaxWait is declined (the runtime then copies it itself), so a
// steady stream of writes cannot hold the admission that demotes back;
// the write tasks are not disturbed.
func TestDemotionWaitingTooLongIsDeclined(t *testing.T) {
	cfg := baseConfig()
	cfg.Slots = 4
	cfg.DemotionMaxWait = time.Nanosecond
	df := newDemoteFixture(t, cfg)
	sa, a, freeze := df.blockQueue()

	d := df.demotion("v", fill(9, rowBytes))
	r := <-df.start(df.ctx, d)
	assert.False(t, r.served, "declined: the runtime copies it")
	require.NoError(t, r.err)
	st := df.p.Stats()
	assert.Equal(t, int64(1), st.DemotionsDeclined)
	assert.Zero(t, st.DemotionsQueued)
	assert.Zero(t, st.Demotions)

	freeze.open()
	require.NoError(t, a.Wait(df.ctx))
	require.NoError(t, sa.Release())
	assert.NotContains(t, df.trace(), "demote v", "a declined demotion never runs")
}
