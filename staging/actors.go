package staging

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// This file holds the pipeline's actors other than the task actors
// (task_actor.go): the copy queue on a priority mailbox, the committer on
// a first-in-first-out one, and the plumbing that spawns and talks to
// task actors. The actors decide when each effect on the pipeline's memory
// runs; the Pipeline's effect methods (effects.go, copystage.go) do it.
// Effects other than the copy stage and the pool write are called from a
// task's actor and never block on another task.
//
// Priority and the envelope gotcha: protoactor's priority mailbox reads
// GetPriority from the message it dequeues, but Request, RequestFuture and
// sender middleware wrap a message in *actor.MessageEnvelope, which has no
// GetPriority, so an enveloped job would silently fall to the default level.
// Every message to these actors is therefore sent with Send from contexts
// without sender middleware, and replies travel on channels carried in the
// messages, never through envelopes.

// taskDispatcher runs the mailboxes of task actors on a few long-lived
// workers instead of a new goroutine per activation (protoactor's default):
// a task actor handles a handful of short messages, and a fresh goroutine
// for each grows its stack through the pipeline's call chain every time
// (a third of the CPU time of small steps). Task actors never block on
// one another (see the top of this file), so a fixed number of workers cannot
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

// actorSystem runs the actors of one pipeline: a task actor per write
// task, one copy queue and one committer (none in eager mode).
type actorSystem struct {
	p         *Pipeline
	system    *actor.ActorSystem
	root      *actor.RootContext
	queue     *actor.PID
	committer *actor.PID
	tasks     *taskDispatcher
	ctx       context.Context
	cancel    context.CancelFunc
	nextID    atomic.Uint64
	stopped   atomic.Bool
}

// startActors starts p's actor system, its copy queue and its committer
// (unless p is eager).
func startActors(p *Pipeline) (*actorSystem, error) {
	log := p.log
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(zerolog.NewSlogHandler(log.With().Str("component", "protoactor").Logger()))
	}))
	s := &actorSystem{p: p, system: sys, root: sys.Root}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.tasks = newTaskDispatcher(max(8, runtime.GOMAXPROCS(0)))
	if !p.cfg.Eager {
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

// claimed tells Config.onClaim (tests) of a claimed copy stage.
func (s *actorSystem) claimed(t *taskRef) {
	if f := s.p.cfg.onClaim; f != nil {
		f(t.ID)
	}
}

// committed tells Config.OnCommit of a pool write's (or failed copy
// stage's) outcome, before the task's waiters wake.
func (s *actorSystem) committed(t *taskRef, err error) {
	if f := s.p.cfg.OnCommit; f != nil {
		f(t.ID, err)
	}
}

// Context is cancelled by Abort: the copy stage and pool write stop
// waiting on it.
func (s *actorSystem) Context() context.Context { return s.ctx }

// NewTask spawns the actor of a new task, in state Pending.
func (s *actorSystem) NewTask(spec TaskSpec) (*taskRef, error) {
	if s.stopped.Load() {
		return nil, ErrClosed
	}
	id := TaskID(s.nextID.Add(1))
	t := &taskRef{ID: id, Name: spec.Name, ReqID: spec.ReqID, WriteN: spec.WriteN, Mode: spec.Mode, Seq: uint64(id),
		hostReady: make(chan struct{}), done: make(chan struct{})}
	pid, err := s.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &taskActor{st: s, p: s.p, t: t} }, actor.WithDispatcher(s.tasks)), "staging/task/"+itoa(uint64(id)))
	if err != nil {
		return nil, err
	}
	t.pid = pid
	return t, nil
}

// ask sends m to t's actor and waits for its reply on reply, for t's end
// (a terminal task's actor has stopped: gone is called for the answer) or
// for ctx.
func ask[R any](ctx context.Context, s *actorSystem, t *taskRef, m any, reply chan R, gone func() R) (R, error) {
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
func (s *actorSystem) Append(ctx context.Context, t *taskRef, c *taskChunk) error {
	r := make(chan error, 1)
	res, err := ask(ctx, s, t, &taskAppend{chunk: c, reply: r}, r, func() error {
		return &AppendRefusedError{Task: t.ID, TaskName: t.Name, State: t.State()}
	})
	if err != nil {
		return err
	}
	return res
}

// Enqueue puts t on the copy queue at prio (see prioLow and its
// siblings): Pending becomes Queued; a task Queued at prioLow gets a new
// job at a higher prio; a task already queued higher than low, whose copy
// stage is claimed, or that is written, is left alone. A failed task
// returns its failure.
func (s *actorSystem) Enqueue(ctx context.Context, t *taskRef, prio int8) error {
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
func (s *actorSystem) Claim(ctx context.Context, t *taskRef) ([]*taskChunk, bool, error) {
	r := make(chan claimResult, 1)
	res, err := ask(ctx, s, t, &taskClaim{reply: r}, r, func() claimResult { return claimResult{} })
	return res.chunks, res.won, err
}

// Transition asks t's actor for one step of the chain; an illegal one is an
// *IllegalTransitionError and changes nothing. When it returns nil, the
// channels the step closes are closed: [taskRef.HostReady] after
// HostReady, [taskRef.Done] after Written or Failed.
func (s *actorSystem) Transition(ctx context.Context, t *taskRef, to TaskState) error {
	r := make(chan error, 1)
	res, err := ask(ctx, s, t, &taskTransition{to: to, reply: r}, r, func() error {
		return &IllegalTransitionError{Task: t.ID, TaskName: t.Name, From: t.State(), To: to}
	})
	if err != nil || res != nil {
		return firstError(err, res)
	}
	switch to {
	case HostReady:
		return waitClosed(ctx, t.hostReady)
	case Written, Failed:
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
// true, [taskRef.HostReady] and [taskRef.Done] are closed.
func (s *actorSystem) Fail(t *taskRef, err error) bool {
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
func (s *actorSystem) FailAsync(t *taskRef, err error) {
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
func (s *actorSystem) FailUnclaimed(t *taskRef, err error) bool {
	r := make(chan bool, 1)
	res, _ := ask(context.Background(), s, t, &taskFail{err: err, reply: r, unclaimed: true}, r, func() bool { return false })
	if res {
		<-t.done
	}
	return res
}

// Plan returns the rows of t's pool write (see scatterRow).
func (s *actorSystem) Plan(ctx context.Context, t *taskRef) ([]scatterRow, error) {
	rows, _, err := s.plan(ctx, t)
	return rows, err
}

// plan returns the rows of t's pool write and whether t is HostReady (the
// state in which it may be written).
func (s *actorSystem) plan(ctx context.Context, t *taskRef) ([]scatterRow, bool, error) {
	r := make(chan planResult, 1)
	res, err := ask(ctx, s, t, &taskPlan{reply: r}, r, func() planResult { return planResult{} })
	return res.rows, res.hostReady, err
}

// Source says where the bytes of t's row (key, slot) are now.
func (s *actorSystem) Source(ctx context.Context, t *taskRef, key string, slot int) (rowSource, error) {
	r := make(chan rowSource, 1)
	return ask(ctx, s, t, &taskSource{key: key, slot: slot, reply: r}, r, func() rowSource { return rowSource{State: t.State()} })
}

// RunInline runs t's copy stage and pool write on the caller (eager mode,
// or a test): claim, copy stage, HostReady, pool write, Written. A task
// already claimed by someone else is left to them. It returns the task's
// failure, if this call failed it.
func (s *actorSystem) RunInline(ctx context.Context, t *taskRef) error {
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

func (s *actorSystem) write(ctx context.Context, t *taskRef, chunks []*taskChunk) error {
	plan, err := s.Plan(ctx, t)
	if err == nil {
		err = s.p.poolWrite(ctx, t, chunks, plan)
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
func (s *actorSystem) Abort() { s.cancel() }

// Stop stops the copy queue, the committer and every task actor, then the
// actor system. Call it once no task is in flight. Idempotent.
func (s *actorSystem) Stop() {
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
	t    *taskRef
	prio int8
}

// GetPriority makes the job's priority visible to the priority mailbox.
func (j *copyJob) GetPriority() int8 { return j.prio }

// commitJob asks the committer to write a host-ready task to the pool.
// The committer takes its jobs in the order they come: the order in which
// the copy stages finished. (Priority decides only which copy stage is
// claimed next.)
type commitJob struct {
	t      *taskRef
	chunks []*taskChunk
}

// copyQueueActor serves copy jobs highest priority first: it claims the
// task, runs its copy stage, moves it to HostReady and hands it to the
// committer at the same priority.
type copyQueueActor struct{ st *actorSystem }

func (a *copyQueueActor) Receive(ctx actor.Context) {
	if d, ok := ctx.Message().(*demoteJob); ok {
		a.st.p.runDemotion(d)
		return
	}
	j, ok := ctx.Message().(*copyJob)
	if !ok {
		return
	}
	s := a.st
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
	// No round trip: the task's actor gets the move to HostReady, then the
	// committer the job, in this order (the committer's first message to
	// the task comes after the move in the task's mailbox); the queue goes
	// on with the next job at once, and the committer writes in the order
	// the copy stages finished.
	ctx.Send(j.t.pid, &taskHostReady{})
	ctx.Send(s.committer, &commitJob{t: j.t, chunks: chunks})
}

// committerActor is the single writer of the CPU block pool.
type committerActor struct{ st *actorSystem }

func (a *committerActor) Receive(ctx actor.Context) {
	j, ok := ctx.Message().(*commitJob)
	if !ok {
		return
	}
	s := a.st
	// The copy queue sent the task its move to HostReady before this job;
	// the task closes HostReady once it has moved (or failed). The chunks
	// are frozen since the claim, so the plan is made here, without a
	// round trip to the task's actor.
	var err error
	select {
	case <-j.t.hostReady:
	case <-s.ctx.Done():
		err = s.ctx.Err()
	}
	if err == nil && j.t.State() != HostReady {
		return // the task failed before (or since) its move to HostReady: nothing to write
	}
	if err == nil {
		err = s.p.poolWrite(s.ctx, j.t, j.chunks, planOf(j.chunks))
	}
	s.committed(j.t, err) // before the task's waiters wake
	if err != nil {
		s.p.log.Debug().Err(err).Uint64("task", uint64(j.t.ID)).Str("task_name", j.t.Name).Msg("pool write failed")
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
