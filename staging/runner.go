package staging

import (
	"context"
	"fmt"
	"sync/atomic"
)

// This file holds the pipeline's two workers: the copy queue, served
// highest priority first, and the committer, first in first out, each one
// long-lived goroutine over a queue of jobs (queue.go); and the calls
// through which the pipeline and its workers move write tasks (whose state
// machine is in task_machine.go). The workers decide when the copy stage
// and the pool write run; the Pipeline's effect methods (effects.go,
// copystage.go) do them. The effects of a task's other moves run under the
// task's mutex and never block on another task.

// runner runs the workers of one pipeline, one copy queue and one
// committer (none in eager mode), and hands out task ids.
type runner struct {
	p         *Pipeline
	queue     *jobQueue // the copy queue: copy stages and demotions
	committer *jobQueue // pool writes
	// The committer's scratch (its goroutine's alone).
	writer  *poolWriter
	plan    []scatterRow
	ctx     context.Context
	cancel  context.CancelFunc
	nextID  atomic.Uint64
	stopped atomic.Bool
}

// startRunner starts p's copy queue and committer (unless p is eager).
func startRunner(p *Pipeline) *runner {
	s := &runner{p: p}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if !p.cfg.Eager {
		s.writer = p.newPoolWriter()
		s.committer = startJobQueue(s.commit)
		s.queue = startJobQueue(s.copy)
	}
	return s
}

// claimed tells Config.onClaim (tests) of a claimed copy stage.
func (s *runner) claimed(t *taskRef) {
	if f := s.p.cfg.onClaim; f != nil {
		f(t.ID)
	}
}

// committed tells Config.OnCommit of a pool write's (or failed copy
// stage's) outcome, before the task's waiters wake.
func (s *runner) committed(t *taskRef, err error) {
	if f := s.p.cfg.OnCommit; f != nil {
		f(t.ID, err)
	}
}

// Context is cancelled by Abort: the copy stage and pool write stop
// waiting on it.
func (s *runner) Context() context.Context { return s.ctx }

// NewTask makes a new task, in state Pending.
func (s *runner) NewTask(spec TaskSpec) (*taskRef, error) {
	if s.stopped.Load() {
		return nil, ErrClosed
	}
	id := TaskID(s.nextID.Add(1))
	t := &taskRef{ID: id, Name: spec.Name, ReqID: spec.ReqID, WriteN: spec.WriteN, Mode: spec.Mode, Seq: uint64(id)}
	t.handle = Task{p: s.p, t: t}
	return t, nil
}

// The calls below are the moves of a task (task_machine.go). None of them
// waits for anything but the task's mutex, which every move holds only for
// its own bookkeeping, so they take no context; the ctx parameters are
// those of their callers.

// Append adds c to t. Refusals: *AppendRefusedError.
func (s *runner) Append(_ context.Context, t *taskRef, c *taskChunk) error {
	return s.append(t, c)
}

// Enqueue puts t on the copy queue at prio (see prioLow and its
// siblings): Pending becomes Queued; a task Queued at prioLow gets a new
// job at a higher prio; a task already queued higher than low, whose copy
// stage is claimed, or that is written, is left alone. A failed task
// returns its failure.
func (s *runner) Enqueue(_ context.Context, t *taskRef, prio int8) error {
	return s.enqueue(t, prio)
}

// Claim moves t from Queued to Copying for the caller and returns its
// chunks; false when another caller already claimed it (or it is not
// queued).
func (s *runner) Claim(_ context.Context, t *taskRef) ([]*taskChunk, bool, error) {
	chunks, won := s.claim(t)
	return chunks, won, nil
}

// Transition makes one step of t's chain; an illegal one is an
// *IllegalTransitionError and changes nothing. To Failed, a non-terminal
// task fails with a failure naming it. When it returns nil, the channels
// the step closes are closed: [taskRef.HostReady] after HostReady,
// [taskRef.Done] after Written or Failed.
func (s *runner) Transition(_ context.Context, t *taskRef, to TaskState) error {
	if to != Failed {
		return s.advance(t, to)
	}
	if !s.fail(t, fmt.Errorf("staging: %s failed", t.words()), false) {
		return &IllegalTransitionError{Task: t.ID, TaskName: t.Name, From: t.State(), To: to}
	}
	return nil
}

// Fail moves t to Failed with err unless it is terminal; it reports whether
// it did. When it returns true, [taskRef.HostReady] and [taskRef.Done] are
// closed.
func (s *runner) Fail(t *taskRef, err error) bool { return s.fail(t, err, false) }

// FailAsync fails t with err only if t's copy stage is not claimed by then
// (a claimed task's chunks belong to its copy stage or its pool write,
// which end it). It is the call of the pipeline's first failure for the
// tasks still pending, made under the failing task's mutex; it waits for
// nothing but t's mutex.
func (s *runner) FailAsync(t *taskRef, err error) { s.fail(t, err, true) }

// FailUnclaimed is Fail for a task whose copy stage is not claimed: it
// leaves a claimed task alone (false), to the copy stage or pool write
// that ends it.
func (s *runner) FailUnclaimed(t *taskRef, err error) bool { return s.fail(t, err, true) }

// Plan returns the rows of t's pool write (see scatterRow).
func (s *runner) Plan(_ context.Context, t *taskRef) ([]scatterRow, error) {
	rows, _ := s.planOfTask(t)
	return rows, nil
}

// Source says where the bytes of t's row (key, slot) are now.
func (s *runner) Source(_ context.Context, t *taskRef, key string, slot int) (rowSource, error) {
	return t.source(key, slot), nil
}

// RunInline runs t's copy stage and pool write on the caller (eager mode,
// or a test): claim, copy stage, HostReady, pool write, Written. A task
// already claimed by someone else is left to them. It returns the task's
// failure, if this call failed it.
func (s *runner) RunInline(ctx context.Context, t *taskRef) error {
	chunks, ok, err := s.Claim(ctx, t)
	if err != nil || !ok {
		return err
	}
	s.claimed(t)
	if err := s.p.copyStage(ctx, t, chunks); err != nil {
		s.Fail(t, err)
		return err
	}
	if err := s.Transition(ctx, t, HostReady); err != nil {
		return err
	}
	return s.write(ctx, t, chunks)
}

func (s *runner) write(ctx context.Context, t *taskRef, chunks []*taskChunk) error {
	plan, err := s.Plan(ctx, t)
	if err == nil {
		err = s.p.newPoolWriter().write(ctx, t, chunks, plan)
	}
	s.committed(t, err) // before the task's waiters wake
	if err != nil {
		s.Fail(t, err)
		return err
	}
	return s.Transition(ctx, t, Written)
}

// Abort cancels the context of the copy stage and pool write: waits in
// progress end with context.Canceled (and fail their tasks).
func (s *runner) Abort() { s.cancel() }

// Stop stops the copy queue and the committer: each ends the job it is
// running, if any, and drops those still queued (call it once no task is
// in flight: what is left is duplicates of claimed jobs, and demotions the
// pipeline declined). Idempotent.
func (s *runner) Stop() {
	if s.stopped.Swap(true) {
		return
	}
	s.cancel()
	for _, q := range []*jobQueue{s.queue, s.committer} {
		if q != nil {
			q.stop()
		}
	}
}

// ---- copy queue and committer ----

// copy is the copy queue's turn for one job, highest priority first: a
// demotion's copy, or a task's copy stage: it claims the task, runs its
// copy stage, moves it to HostReady and hands it to the committer.
func (s *runner) copy(j job) {
	if j.demote != nil {
		s.p.runDemotion(j.demote)
		return
	}
	chunks, won, err := s.Claim(s.ctx, j.t)
	if err != nil || !won {
		return
	}
	s.claimed(j.t)
	if err := s.p.copyStage(s.ctx, j.t, chunks); err != nil {
		s.p.log.Debug().Err(err).Uint64("task", uint64(j.t.ID)).Str("task_name", j.t.Name).Msg("copy stage failed")
		s.committed(j.t, err)
		s.Fail(j.t, err)
		return
	}
	// The move to HostReady (refused if the task failed meanwhile), then
	// the committer's job: the committer writes in the order the copy
	// stages finished.
	_ = s.advance(j.t, HostReady)
	s.committer.push(job{t: j.t, chunks: chunks})
}

// commit is the committer's turn for one job, in the order they came
// (the order in which the copy stages finished; priority decides only
// which copy stage is claimed next): the committer is the single writer of
// the CPU block pool.
func (s *runner) commit(j job) {
	// The copy queue moved the task to HostReady (or it failed) before it
	// sent this job. The chunks are frozen since the claim, so the plan is
	// made here, from them.
	var err error
	select {
	case <-j.t.HostReady():
	case <-s.ctx.Done():
		err = s.ctx.Err()
	}
	if err == nil && j.t.State() != HostReady {
		return // the task failed before (or since) its move to HostReady: nothing to write
	}
	if err == nil {
		s.plan = planInto(s.plan[:0], j.chunks)
		err = s.writer.write(s.ctx, j.t, j.chunks, s.plan)
	}
	s.committed(j.t, err) // before the task's waiters wake
	if err != nil {
		s.p.log.Debug().Err(err).Uint64("task", uint64(j.t.ID)).Str("task_name", j.t.Name).Msg("pool write failed")
		s.Fail(j.t, err)
		return
	}
	// The move to Written: the task's slot holds and buffers are released,
	// then its waiters wake.
	_ = s.advance(j.t, Written) // refused if the task failed meanwhile
}

// stateMirror publishes a task's state to readers of its handle.
type stateMirror struct{ v atomic.Int32 }

func (m *stateMirror) load() TaskState   { return TaskState(m.v.Load()) }
func (m *stateMirror) store(s TaskState) { m.v.Store(int32(s)) }

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
