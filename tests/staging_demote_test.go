package tests

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// How a demotion runs with a staging pipeline on the runtime: a runtime
// whose cuda:0 spills to pinned-host, a pipeline serving cuda:0, value a
// (4 KiB, from a source) resident at cuda:0 and x needing its place.

var _ staging.DemotionServer = (*system.System)(nil)

const demoBytes = 4 << 10

type demoteRig struct {
	t     *testing.T
	sys   *system.System
	p     *staging.Pipeline
	a, x  system.Handle
	data  []byte
	loads atomic.Int64
	mu    sync.Mutex
	trace []string // the copy queue's work, in order
	// cutClose: the test closed the runtime with a cut-short wait (its
	// Close keeps returning that error).
	cutClose bool
}

func newDemoteRig(t *testing.T) *demoteRig {
	t.Helper()
	ctx := context.Background()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("pinned-host", 1<<20), system.Limit("cuda:0", 6000)}
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: testsys.Soft(t, locs), Spill: map[string]string{"cuda:0": "pinned-host"}})
	require.NoError(t, err)
	r := &demoteRig{t: t, sys: sys, data: bytes.Repeat([]byte{0x5a, 0xc3, 0x01}, demoBytes/3+1)[:demoBytes]}
	t.Cleanup(func() {
		if err := sys.Close(context.Background()); !r.cutClose {
			require.NoError(t, err)
		}
	})
	cfg := stagingConfig("st")
	cfg.OnCopyStarted = func(id staging.TaskID) { r.note(fmt.Sprintf("task %d", id)) }
	cfg.OnDemotion = func(value string, _ int64, _ error) { r.note("demote " + value) }
	cfg.DemotionMaxWait = -1 // the tests hold demotions behind write tasks on purpose
	r.p = newPipeline(t, sys, cfg)
	r.a, err = sys.Register(ctx, system.Value{Name: "a", Bytes: demoBytes, Source: "pageable-host", Loader: func(_ context.Context, dst []byte) error {
		r.loads.Add(1)
		copy(dst, r.data)
		return nil
	}})
	require.NoError(t, err)
	require.NoError(t, sys.Place(ctx, r.a, "cuda:0"))
	r.x, err = sys.Register(ctx, system.Value{Name: "x", Bytes: demoBytes, Source: "pageable-host", Loader: func(context.Context, []byte) error { return nil }})
	require.NoError(t, err)
	return r
}

func (r *demoteRig) note(s string) {
	r.mu.Lock()
	r.trace = append(r.trace, s)
	r.mu.Unlock()
}

func (r *demoteRig) queueTrace() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.trace...)
}

// plan is the controller's plan for x at cuda:0: a demoted to pinned-host.
func (r *demoteRig) plan() system.Plan {
	r.t.Helper()
	d, err := r.sys.Decide(context.Background(), system.Request{Name: "x", Requirements: []system.Requirement{{Handle: r.x, Tiers: [][]string{{"cuda:0"}}}}})
	require.NoError(r.t, err)
	require.Len(r.t, d.Evictions, 1)
	require.Equal(r.t, "pinned-host", d.Evictions[0].To)
	return d.Plan
}

// execute runs plan on a goroutine of its own.
func (r *demoteRig) execute(ctx context.Context, plan system.Plan) <-chan error {
	out := make(chan error, 1)
	go func() {
		_, err := r.sys.Execute(ctx, plan)
		out <- err
	}()
	return out
}

// blockQueue submits a write task whose copy stage waits for the gate it
// returns, and waits until the copy queue is busy with it.
func (r *demoteRig) blockQueue() (*staging.Task, *staging.Step, *stGate) {
	r.t.Helper()
	ctx := context.Background()
	g := newStGate()
	step, err := r.p.Stage(ctx, devBuf(r.t, r.sys, bytes.Repeat([]byte{1}, stRow)), g)
	require.NoError(r.t, err)
	task := r.stepTask(step, 0)
	r.waitStats("the blocking task's copy stage", func(s staging.Stats) bool { return s.Tasks[staging.Copying] == 1 })
	return task, step, g
}

func (r *demoteRig) stepTask(step *staging.Step, slot int) *staging.Task {
	r.t.Helper()
	ctx := context.Background()
	task, err := r.p.Open(ctx, staging.TaskSpec{ReqID: "req", WriteN: 1, Mode: staging.JoinNextStep})
	require.NoError(r.t, err)
	require.NoError(r.t, task.Append(ctx, staging.Chunk{Step: step, Rows: []staging.Row{{Key: "k", Slot: slot}}}))
	require.NoError(r.t, r.p.Submit(ctx, task))
	return task
}

// waitStats waits (yielding, never sleeping) until cond holds.
func (r *demoteRig) waitStats(what string, cond func(staging.Stats) bool) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(r.p.Stats()) {
		require.True(r.t, time.Now().Before(deadline), "timed out waiting for %s", what)
		runtime.Gosched()
	}
}

func (r *demoteRig) where(h system.Handle) []string {
	r.t.Helper()
	s, err := r.sys.Snapshot(context.Background())
	require.NoError(r.t, err)
	v, _ := s.Value(h.Name)
	var out []string
	for _, m := range v.Materializations {
		out = append(out, m.Location+":"+m.State.String())
	}
	return out
}

func (r *demoteRig) used(loc string) int64 {
	r.t.Helper()
	s, err := r.sys.Snapshot(context.Background())
	require.NoError(r.t, err)
	l, ok := s.Location(loc)
	require.True(r.t, ok)
	return l.UsedBytes
}

// device is the backend's own count of bytes allocated at loc.
func (r *demoteRig) device(loc string) int64 {
	r.t.Helper()
	mi, err := r.sys.Backend().MemInfo(loc)
	require.NoError(r.t, err)
	return mi.UsedBytes
}

// assertDemotedIntact checks that a is at pinned-host alone, with its
// bytes, charged once, and came from cuda:0 (not from its source).
func (r *demoteRig) assertDemotedIntact() {
	r.t.Helper()
	assert.Equal(r.t, []string{"pinned-host:resident"}, r.where(r.a))
	assert.Equal(r.t, []string{"cuda:0:resident"}, r.where(r.x))
	got, err := r.sys.Read(context.Background(), r.a, "pinned-host")
	require.NoError(r.t, err)
	assert.Equal(r.t, r.data, got, "bytes intact at pinned-host")
	assert.Equal(r.t, int64(demoBytes), r.used("pinned-host"), "a charged once at pinned-host")
	assert.Equal(r.t, int64(demoBytes), r.used("cuda:0"), "x alone at cuda:0")
	assert.Equal(r.t, int64(1), r.loads.Load(), "a was loaded once")
}

func TestStagingDemotionGoesThroughThePipeline(t *testing.T) {
	r := newDemoteRig(t)
	rep, err := r.sys.Execute(context.Background(), r.plan())
	require.NoError(t, err)
	r.assertDemotedIntact()
	st := r.p.Stats()
	assert.Equal(t, int64(1), st.Demotions)
	assert.Equal(t, int64(demoBytes), st.DemotedBytes)
	assert.Equal(t, []string{"demote a"}, r.queueTrace())
	var kinds []string
	for _, x := range rep.Transitions {
		kinds = append(kinds, x.Kind+" "+x.Handle+" @"+x.Location)
	}
	assert.Equal(t, []string{"admit a @pinned-host", "complete a @pinned-host", "remove a @cuda:0", "admit x @cuda:0", "complete x @cuda:0"}, kinds,
		"the move's transitions and charges, whoever copies")
}

// The demotion waits on the copy queue behind the write tasks queued
// after it: off the critical path of the pipeline's own writes.
func TestStagingDemotionRunsBehindWriteTasks(t *testing.T) {
	r := newDemoteRig(t)
	ctx := context.Background()
	blocker, sa, g := r.blockQueue()
	done := r.execute(ctx, r.plan())
	r.waitStats("the demotion on the copy queue", func(s staging.Stats) bool { return s.DemotionsQueued == 1 })
	sb, err := r.p.Stage(ctx, devBuf(t, r.sys, bytes.Repeat([]byte{2}, stRow)), nil)
	require.NoError(t, err)
	later := r.stepTask(sb, 1)
	g.open()
	require.NoError(t, <-done)
	require.NoError(t, blocker.Wait(ctx))
	require.NoError(t, later.Wait(ctx))
	assert.Equal(t, []string{fmt.Sprintf("task %d", blocker.ID()), fmt.Sprintf("task %d", later.ID()), "demote a"}, r.queueTrace())
	r.assertDemotedIntact()
	require.NoError(t, sa.Release())
	require.NoError(t, sb.Release())
}

// A demotion whose copy fails on the pipeline's path leaves the value
// dropped, exactly as without spill; nothing stays at pinned-host (in the
// ledger or the device), and the pipeline is healthy.
func TestStagingDemotionFailedCopyDropsTheValue(t *testing.T) {
	r := newDemoteRig(t)
	slots := r.device("pinned-host") // the pipeline's staging slots
	testsys.Faults(r.sys).Arm(cuda.FaultCopy, "pinned-host")
	_, err := r.sys.Execute(context.Background(), r.plan())
	require.NoError(t, err, "a failed demotion does not fail the plan")
	assert.Zero(t, testsys.Faults(r.sys).Armed(cuda.FaultCopy, "pinned-host"), "the copy met the fault")
	st := r.p.Stats()
	assert.Equal(t, int64(1), st.DemotionFailures)
	assert.Zero(t, st.Demotions)
	require.NoError(t, r.p.Err())
	assert.Empty(t, r.where(r.a), "dropped, not half-moved")
	assert.Zero(t, r.used("pinned-host"), "nothing charged at the target")
	assert.Equal(t, int64(demoBytes), r.used("cuda:0"), "a's charge released once, x's taken")
	waitDevice(t, r, "pinned-host", slots)
	waitDevice(t, r, "cuda:0", demoBytes)
}

// waitDevice waits (yielding) until the backend's bytes at loc are want:
// the frees the runtime sent reach the location actor after the reply.
func waitDevice(t *testing.T, r *demoteRig, loc string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.device(loc) != want {
		require.True(t, time.Now().Before(deadline), "device bytes at %s: %d, want %d", loc, r.device(loc), want)
		runtime.Gosched()
	}
}

// A pipeline closed while the demotion waits on its copy queue hands it
// back: the runtime copies itself, and the demotion completes.
func TestStagingDemotionPipelineClosedMidDemotion(t *testing.T) {
	r := newDemoteRig(t)
	ctx := context.Background()
	blocker, sa, g := r.blockQueue()
	done := r.execute(ctx, r.plan())
	r.waitStats("the demotion on the copy queue", func(s staging.Stats) bool { return s.DemotionsQueued == 1 })
	require.NoError(t, sa.Release())
	closed := make(chan error, 1)
	go func() { closed <- r.p.Close(ctx) }()
	require.NoError(t, <-done, "the demotion completed while the pipeline's task still waits")
	r.assertDemotedIntact()
	g.open()
	require.NoError(t, <-closed)
	require.NoError(t, blocker.Wait(ctx))
	st := r.p.Stats()
	assert.Equal(t, int64(1), st.DemotionsDeclined)
	assert.Zero(t, st.Demotions+st.DemotionFailures)
	assert.Equal(t, []string{fmt.Sprintf("task %d", blocker.ID())}, r.queueTrace())
}

// Without a pipeline serving cuda:0 (this one is closed) the value
// actor's move carries the demotion out.
func TestStagingDemotionWithoutPipelineUsesTheMove(t *testing.T) {
	r := newDemoteRig(t)
	require.NoError(t, r.p.Close(context.Background()))
	_, err := r.sys.Execute(context.Background(), r.plan())
	require.NoError(t, err)
	r.assertDemotedIntact()
	st := r.p.Stats()
	assert.Zero(t, st.Demotions+st.DemotionFailures+st.DemotionsDeclined, "the pipeline was not asked")
	assert.Empty(t, r.queueTrace())
}

// The runtime closed (its wait cut short) while the demotion waits on the
// copy queue: the runtime's Close closes the pipeline first, which hands
// the demotion back before it runs; the pipeline's close, cut short by a
// copy waiting for a freeze event, finishes once the event fires, and
// nothing leaks.
func TestStagingDemotionRuntimeClosedWhileQueued(t *testing.T) {
	r := newDemoteRig(t)
	ctx := context.Background()
	blocker, sa, g := r.blockQueue()
	done := r.execute(ctx, r.plan())
	r.waitStats("the demotion on the copy queue", func(s staging.Stats) bool { return s.DemotionsQueued == 1 })
	cut, cancel := context.WithCancel(ctx)
	cancel()
	r.cutClose = true
	// The runtime's Close closes the pipeline first, with its context: the
	// blocker's copy waits for a freeze event the test has not fired, so
	// the pipeline's close is cut short and says so; the rest of it runs
	// once the event fires.
	err := r.sys.Close(cut)
	require.Error(t, err, "close stopped waiting for the transfer in flight")
	var inc *staging.CloseIncompleteError
	require.ErrorAs(t, err, &inc, "the pipeline's close names what it left running")
	assert.ErrorIs(t, err, context.Canceled)
	<-done // answered, one way or another
	r.waitStats("the demotion given up", func(s staging.Stats) bool { return s.DemotionsQueued == 0 })
	g.open()
	assert.ErrorIs(t, blocker.Wait(ctx), context.Canceled, "the claimed task stopped on the pipeline's cancellation")
	_ = sa // its slot is released by the close, which began before the test could
	assert.ErrorIs(t, r.p.Close(ctx), context.Canceled, "a later Close waits for the rest of the close and returns its context's error")
	st := r.p.Stats()
	assert.Equal(t, int64(1), st.DemotionsDeclined, "handed back by the pipeline's close (the runtime closes the pipeline first) before it ran")
	assert.Zero(t, st.DemotionFailures)
	assert.Zero(t, st.Demotions)
	assert.Equal(t, []string{fmt.Sprintf("task %d", blocker.ID())}, r.queueTrace(), "the copy never ran")
	assert.Zero(t, r.device("pinned-host"), "device bytes left at pinned-host")
	assert.Equal(t, int64(stRow), r.device("cuda:0"), "only the test's own step buffer is left at cuda:0")
}
