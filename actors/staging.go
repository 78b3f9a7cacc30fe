package actors

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/residency-go/residency/messages"
)

// This file holds the actors of the device→host write pipeline (package
// staging): the copy queue and the committer, both on priority mailboxes,
// and the plumbing that spawns and talks to task actors.
//
// Priority and the envelope gotcha: protoactor's priority mailbox reads
// GetPriority from the message it dequeues, but Request, RequestFuture and
// sender middleware wrap a message in *actor.MessageEnvelope, which has no
// GetPriority, so an enveloped job would silently fall to the default level.
// Every message to these actors is therefore sent with Send from contexts
// without sender middleware, and replies travel on channels carried in the
// messages, never through envelopes.

// StagingEnv is what package staging gives the pipeline's actors: the
// effects on the memory it owns. The actors decide when each runs; the
// environment does it. Methods other than CopyStage and PoolWrite are
// called from a task's actor and must not block on another task.
type StagingEnv interface {
	// CopyStage runs the copy stage of t, which is Copying: wait for each
	// chunk's step device→host event (JoinNextStep), or copy each chunk's
	// device clone into a host buffer it stores in the chunk's Host
	// (JoinOnFinish). An error fails the task.
	CopyStage(ctx context.Context, t *StagingTask, chunks []*StagingChunk) error
	// Accept is called by t's actor when it is about to take chunk c
	// (state is t's state, Pending or Queued): the environment may refuse
	// it (the error is Append's), and otherwise does what accepting the
	// chunk means before the chunk joins the task (hold the staging slot,
	// start the device clone's copy, take the chunk's rows from older
	// tasks). A refused chunk leaves nothing to undo.
	Accept(t *StagingTask, state messages.TaskState, c *StagingChunk) error
	// Queued is called as t leaves Pending for Queued.
	Queued(t *StagingTask, chunks []*StagingChunk)
	// HostReady is called as t enters HostReady: drop the device clones
	// and release their GPU-byte budget tickets.
	HostReady(t *StagingTask, chunks []*StagingChunk)
	// PoolWrite scatters the rows of plan into the CPU block pool. An
	// error fails the task.
	PoolWrite(ctx context.Context, t *StagingTask, chunks []*StagingChunk, plan []ScatterRow) error
	// Written is called as t enters Written: release its staging slot
	// holds and host buffers.
	Written(t *StagingTask, chunks []*StagingChunk)
	// Failed is called as t enters Failed, before any of its waiters is
	// woken: publish the failure record, release every budget ticket,
	// slot hold and buffer of the task.
	Failed(t *StagingTask, chunks []*StagingChunk, err error)
}

// StagingConfig configures [StartStaging].
type StagingConfig struct {
	Env StagingEnv
	// Eager: no copy queue and no committer; the caller runs a task's copy
	// stage and pool write inline with [Staging.RunInline].
	Eager  bool
	Logger zerolog.Logger
	// OnCommit, if set, is called by the committer (or RunInline) after
	// each pool write (or failed copy stage), with its outcome, before the
	// task's waiters are woken.
	OnCommit func(t *StagingTask, err error)
	// OnClaim, if set, is called by the copy queue (or RunInline) right
	// after it claimed a task's copy stage (tests observe queue order).
	OnClaim func(t *StagingTask)
}

// taskDispatcher runs the mailboxes of task actors on a few long-lived
// workers instead of a new goroutine per activation (protoactor's default):
// a task actor handles a handful of short messages, and a fresh goroutine
// for each grows its stack through the pipeline's call chain every time
// (a third of the CPU time of small steps). Task actors never block on
// one another (see StagingEnv), so a fixed number of workers cannot
// deadlock; a full queue, and anything scheduled after stop, falls back to
// a goroutine.
type taskDispatcher struct {
	work chan func()
	stop chan struct{}
	wg   sync.WaitGroup
}

func newTaskDispatcher(workers int) *taskDispatcher {
	d := &taskDispatcher{work: make(chan func(), 4096), stop: make(chan struct{})}
	d.wg.Add(workers)
	for range workers {
		go d.run()
	}
	return d
}

func (d *taskDispatcher) run() {
	defer d.wg.Done()
	for {
		select {
		case fn := <-d.work:
			fn()
		case <-d.stop:
			for { // drain what was scheduled before stop
				select {
				case fn := <-d.work:
					fn()
				default:
					return
				}
			}
		}
	}
}

func (d *taskDispatcher) Schedule(fn func()) {
	select {
	case <-d.stop:
		go fn()
		return
	default:
	}
	select {
	case d.work <- fn:
	default:
		go fn()
	}
}

func (d *taskDispatcher) Throughput() int { return 300 }

// close stops the workers once they have run what was scheduled.
func (d *taskDispatcher) close() {
	close(d.stop)
	d.wg.Wait()
}

// Staging runs the actors of one write pipeline: a task actor per write
// task, one copy queue and one committer (none in eager mode).
type Staging struct {
	system    *actor.ActorSystem
	root      *actor.RootContext
	queue     *actor.PID
	committer *actor.PID
	env       StagingEnv
	eager     bool
	log       zerolog.Logger
	onCommit  func(*StagingTask, error)
	onClaim   func(*StagingTask)
	tasks     *taskDispatcher
	ctx       context.Context
	cancel    context.CancelFunc
	nextID    atomic.Uint64
	stopped   atomic.Bool
}

// ErrStagingStopped is returned for requests made after Stop.
var ErrStagingStopped = errors.New("staging: pipeline actors stopped")

// StartStaging starts the pipeline's actor system, its copy queue and its
// committer (unless eager).
func StartStaging(cfg StagingConfig) (*Staging, error) {
	if cfg.Env == nil {
		return nil, errors.New("staging: an environment is required")
	}
	log := cfg.Logger
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(zerolog.NewSlogHandler(log.With().Str("component", "protoactor").Logger()))
	}))
	s := &Staging{system: sys, root: sys.Root, env: cfg.Env, eager: cfg.Eager, log: log, onCommit: cfg.OnCommit, onClaim: cfg.OnClaim}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.tasks = newTaskDispatcher(max(8, runtime.GOMAXPROCS(0)))
	if !cfg.Eager {
		prio := actor.WithMailbox(actor.UnboundedPriority())
		// The committer writes in the order the copy stages finished (the
		// order its jobs arrive): a plain first-in-first-out mailbox.
		fifo := actor.WithMailbox(actor.Unbounded())
		var err error
		s.committer, err = s.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &committerActor{st: s} }, fifo), "staging/committer")
		if err == nil {
			s.queue, err = s.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &copyQueueActor{st: s} }, prio), "staging/copy-queue")
		}
		if err != nil {
			s.cancel()
			sys.Shutdown()
			s.tasks.close()
			return nil, err
		}
	}
	return s, nil
}

// Context is cancelled by Abort: the copy stage and pool write stop
// waiting on it.
func (s *Staging) Context() context.Context { return s.ctx }

// NewTask spawns the actor of a new task, in state Pending.
func (s *Staging) NewTask(reqID string, writeN int, mode messages.JoinMode) (*StagingTask, error) {
	if s.stopped.Load() {
		return nil, ErrStagingStopped
	}
	id := messages.TaskID(s.nextID.Add(1))
	t := &StagingTask{ID: id, ReqID: reqID, WriteN: writeN, Mode: mode, Seq: uint64(id),
		hostReady: make(chan struct{}), done: make(chan struct{})}
	pid, err := s.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &stagingTaskActor{st: s, t: t} }, actor.WithDispatcher(s.tasks)), "staging/task/"+itoa(uint64(id)))
	if err != nil {
		return nil, err
	}
	t.pid = pid
	return t, nil
}

// ask sends m to t's actor and waits for its reply on reply, for t's end
// (a terminal task's actor has stopped: gone is called for the answer) or
// for ctx.
func ask[R any](ctx context.Context, s *Staging, t *StagingTask, m any, reply chan R, gone func() R) (R, error) {
	select {
	case <-t.done:
		return gone(), nil // its actor has stopped
	default:
	}
	s.root.Send(t.pid, m)
	select {
	case r := <-reply:
		return r, nil
	case <-t.done:
		select {
		case r := <-reply: // answered before it stopped
			return r, nil
		default:
			return gone(), nil
		}
	case <-ctx.Done():
		var zero R
		return zero, ctx.Err()
	}
}

// Append adds c to t. Refusals: *AppendRefusedError.
func (s *Staging) Append(ctx context.Context, t *StagingTask, c *StagingChunk) error {
	r := make(chan error, 1)
	res, err := ask(ctx, s, t, &taskAppend{chunk: c, reply: r}, r, func() error {
		return &AppendRefusedError{Task: t.ID, State: t.State()}
	})
	if err != nil {
		return err
	}
	return res
}

// Enqueue puts t on the copy queue at prio (see messages.PriorityLow and
// friends): Pending becomes Queued; a task Queued at PriorityLow gets a new
// job at a higher prio; a task already queued higher than low, whose copy
// stage is claimed, or that is written, is left alone. A failed task
// returns its failure.
func (s *Staging) Enqueue(ctx context.Context, t *StagingTask, prio int8) error {
	r := make(chan error, 1)
	res, err := ask(ctx, s, t, &taskEnqueue{prio: prio, reply: r}, r, func() error { return t.Err() })
	if err != nil {
		return err
	}
	return res
}

// Claim moves t from Queued to Copying for the caller and returns its
// chunks; false when another caller already claimed it (or it is not
// queued).
func (s *Staging) Claim(ctx context.Context, t *StagingTask) ([]*StagingChunk, bool, error) {
	r := make(chan claimResult, 1)
	res, err := ask(ctx, s, t, &taskClaim{reply: r}, r, func() claimResult { return claimResult{} })
	return res.chunks, res.won, err
}

// Transition asks t's actor for one step of the chain; an illegal one is an
// *IllegalTransitionError and changes nothing. When it returns nil, the
// channels the step closes are closed: [StagingTask.HostReady] after
// HostReady, [StagingTask.Done] after Written or Failed.
func (s *Staging) Transition(ctx context.Context, t *StagingTask, to messages.TaskState) error {
	r := make(chan error, 1)
	res, err := ask(ctx, s, t, &taskTransition{to: to, reply: r}, r, func() error {
		return &IllegalTransitionError{Task: t.ID, From: t.State(), To: to}
	})
	if err != nil || res != nil {
		return firstError(err, res)
	}
	switch to {
	case messages.TaskHostReady:
		return waitClosed(ctx, t.hostReady)
	case messages.TaskWritten, messages.TaskFailed:
		return waitClosed(ctx, t.done)
	}
	return nil
}

func firstError(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// waitClosed waits for ch, which the task actor closes right after it has
// answered (it answers first, so that [ask] never takes the wake-up for the
// actor having stopped before answering).
func waitClosed(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Fail moves t to Failed with err unless it is terminal; it reports whether
// it did. It waits for the actor (which answers at once); when it returns
// true, [StagingTask.HostReady] and [StagingTask.Done] are closed.
func (s *Staging) Fail(t *StagingTask, err error) bool {
	r := make(chan bool, 1)
	res, _ := ask(context.Background(), s, t, &taskFail{err: err, reply: r}, r, func() bool { return false })
	if res {
		<-t.done // closed by the actor right after its answer
	}
	return res
}

// FailAsync sends t's actor a failure without waiting (for callers that
// are themselves task actors, which must never wait for each other). It
// fails t only if t's copy stage is not claimed by then: a claimed task's
// chunks belong to its copy stage or its pool write, which end it.
func (s *Staging) FailAsync(t *StagingTask, err error) {
	select {
	case <-t.done:
		return
	default:
	}
	s.root.Send(t.pid, &taskFail{err: err, reply: make(chan bool, 1), unclaimed: true})
}

// FailUnclaimed is Fail for a task whose copy stage is not claimed: it
// leaves a claimed task alone (false), to the copy stage or pool write
// that ends it.
func (s *Staging) FailUnclaimed(t *StagingTask, err error) bool {
	r := make(chan bool, 1)
	res, _ := ask(context.Background(), s, t, &taskFail{err: err, reply: r, unclaimed: true}, r, func() bool { return false })
	if res {
		<-t.done
	}
	return res
}

// Plan returns the rows of t's pool write (see ScatterRow).
func (s *Staging) Plan(ctx context.Context, t *StagingTask) ([]ScatterRow, error) {
	rows, _, err := s.plan(ctx, t)
	return rows, err
}

// plan returns the rows of t's pool write and whether t is HostReady (the
// state in which it may be written).
func (s *Staging) plan(ctx context.Context, t *StagingTask) ([]ScatterRow, bool, error) {
	r := make(chan planResult, 1)
	res, err := ask(ctx, s, t, &taskPlan{reply: r}, r, func() planResult { return planResult{} })
	return res.rows, res.hostReady, err
}

// Source says where the bytes of t's row (key, slot) are now.
func (s *Staging) Source(ctx context.Context, t *StagingTask, key string, slot int) (RowSource, error) {
	r := make(chan RowSource, 1)
	return ask(ctx, s, t, &taskSource{key: key, slot: slot, reply: r}, r, func() RowSource { return RowSource{State: t.State()} })
}

// RunInline runs t's copy stage and pool write on the caller (eager mode,
// or a test): claim, copy stage, HostReady, pool write, Written. A task
// already claimed by someone else is left to them. It returns the task's
// failure, if this call failed it.
func (s *Staging) RunInline(ctx context.Context, t *StagingTask) error {
	chunks, ok, err := s.Claim(ctx, t)
	if err != nil || !ok {
		return err
	}
	if s.onClaim != nil {
		s.onClaim(t)
	}
	if err := s.env.CopyStage(ctx, t, chunks); err != nil {
		s.Fail(t, err)
		return err
	}
	if err := s.Transition(ctx, t, messages.TaskHostReady); err != nil {
		return err
	}
	return s.write(ctx, t, chunks)
}

func (s *Staging) write(ctx context.Context, t *StagingTask, chunks []*StagingChunk) error {
	plan, err := s.Plan(ctx, t)
	if err == nil {
		err = s.env.PoolWrite(ctx, t, chunks, plan)
	}
	if s.onCommit != nil {
		s.onCommit(t, err) // before the task's waiters wake
	}
	if err != nil {
		s.Fail(t, err)
		return err
	}
	return s.Transition(ctx, t, messages.TaskWritten)
}

// Abort cancels the context of the copy stage and pool write: waits in
// progress end with context.Canceled (and fail their tasks).
func (s *Staging) Abort() { s.cancel() }

// Stop stops the copy queue, the committer and every task actor, then the
// actor system. Call it once no task is in flight. Idempotent.
func (s *Staging) Stop() {
	if s.stopped.Swap(true) {
		return
	}
	s.cancel()
	for _, pid := range []*actor.PID{s.queue, s.committer} {
		if pid != nil {
			_ = s.root.StopFuture(pid).Wait()
		}
	}
	s.system.Shutdown()
	s.tasks.close()
}

// ---- copy queue and committer ----

// copyJob asks the copy queue to run a task's copy stage. Duplicates (a
// task re-queued at a higher priority) are harmless: only the first job to
// claim the task runs it.
type copyJob struct {
	t    *StagingTask
	prio int8
}

// GetPriority makes the job's priority visible to the priority mailbox.
func (j *copyJob) GetPriority() int8 { return j.prio }

// commitJob asks the committer to write a host-ready task to the pool.
// The committer takes its jobs in the order they come: the order in which
// the copy stages finished. (Priority decides only which copy stage is
// claimed next.)
type commitJob struct {
	t      *StagingTask
	chunks []*StagingChunk
}

// copyQueueActor serves copy jobs highest priority first: it claims the
// task, runs its copy stage, moves it to HostReady and hands it to the
// committer at the same priority.
type copyQueueActor struct{ st *Staging }

func (a *copyQueueActor) Receive(ctx actor.Context) {
	j, ok := ctx.Message().(*copyJob)
	if !ok {
		return
	}
	s := a.st
	chunks, won, err := s.Claim(s.ctx, j.t)
	if err != nil || !won {
		return
	}
	if s.onClaim != nil {
		s.onClaim(j.t)
	}
	if err := s.env.CopyStage(s.ctx, j.t, chunks); err != nil {
		s.log.Debug().Err(err).Uint64("task", uint64(j.t.ID)).Msg("copy stage failed")
		if s.onCommit != nil {
			s.onCommit(j.t, err)
		}
		s.Fail(j.t, err)
		return
	}
	// No round trip: the task's actor gets the move to HostReady, then the
	// committer the job, in this order (the committer's first message to
	// the task comes after the move in the task's mailbox); the queue goes
	// on with the next job at once, and the committer writes in the order
	// the copy stages finished.
	ctx.Send(j.t.pid, &taskHostReady{})
	ctx.Send(s.committer, &commitJob{t: j.t, chunks: chunks})
}

// committerActor is the single writer of the CPU block pool.
type committerActor struct{ st *Staging }

func (a *committerActor) Receive(ctx actor.Context) {
	j, ok := ctx.Message().(*commitJob)
	if !ok {
		return
	}
	s := a.st
	plan, ready, err := s.plan(s.ctx, j.t)
	if err == nil && !ready {
		return // the task failed before its move to HostReady: nothing to write
	}
	if err == nil {
		err = s.env.PoolWrite(s.ctx, j.t, j.chunks, plan)
	}
	if s.onCommit != nil {
		s.onCommit(j.t, err) // before the task's waiters wake
	}
	if err != nil {
		s.log.Debug().Err(err).Uint64("task", uint64(j.t.ID)).Msg("pool write failed")
		s.Fail(j.t, err)
		return
	}
	// The move to Written (release of the task's slot holds and buffers,
	// then its waiters) is the task actor's; the committer does not wait
	// for it before the next pool write.
	ctx.Send(j.t.pid, &taskWritten{})
}

// stateMirror publishes a task's state to readers of its handle.
type stateMirror struct{ v atomic.Int32 }

func (m *stateMirror) load() messages.TaskState   { return messages.TaskState(m.v.Load()) }
func (m *stateMirror) store(s messages.TaskState) { m.v.Store(int32(s)) }

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
