package staging

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// The pipeline's actors, on protoactor-go, in an actor system of the
// pipeline's own:
//
//   - the pipeline's actor, parent of one actor per write task
//     (task_actor.go), each named after its task ("task-<id>"), spawned
//     when the task is opened and stopped when it is terminal;
//   - the copy queue and the committer (copyqueue.go), each on a priority
//     mailbox, each on a goroutine of its own for the pipeline's life.
//
// The task actors and the pipeline's actor run on protoactor's
// synchronized dispatcher: a message is processed on the goroutine that
// sent it when the actor is idle (else by the goroutine processing the
// actor's mailbox at that time), one message at a time per actor as with
// every dispatcher. A task actor never waits, so this costs no goroutine
// switch per move and cannot deadlock. The copy queue and the committer
// wait for copies and write the pool: they keep their own goroutines.
//
// Priority and the envelope: protoactor's priority mailbox reads
// GetPriority from the message it dequeues, but Request, RequestFuture and
// sender middleware wrap a message in *actor.MessageEnvelope, which has no
// GetPriority, so an enveloped job would silently fall to the default
// level. Every message of the pipeline is therefore sent with Send, from
// contexts without sender middleware, and replies travel on channels
// carried in the messages.

// runner runs the actors of one pipeline and hands out task ids. Its
// methods are the calls through which the pipeline moves its tasks: each
// is a message to the task's actor.
type runner struct {
	p         *Pipeline
	system    *actor.ActorSystem
	root      *actor.RootContext
	pipeline  *actor.PID    // parent of the task actors
	queue     *actor.PID    // the copy queue: copy stages and demotions (nil when eager)
	committer *actor.PID    // pool writes (nil when eager)
	locations *ownLocations // the pipeline's own location actors (nil: the runtime's)
	queueRun  *ownGoroutine
	commitRun *ownGoroutine
	ctx       context.Context
	cancel    context.CancelFunc
	nextID    atomic.Uint64
	stopped   atomic.Bool
	down      chan struct{} // closed by Stop once the pipeline's actor is stopped
}

// startRunner starts p's actor system: the pipeline's actor, and (unless
// p is eager) the copy queue and the committer.
func startRunner(p *Pipeline) (*runner, error) {
	log := p.log
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(zerolog.NewSlogHandler(log.With().Str("component", "protoactor").Logger()))
	}))
	s := &runner{p: p, system: sys, root: sys.Root, down: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	inline := actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))
	pa := &pipelineActor{}
	pa.taskProps = actor.PropsFromProducer(func() actor.Actor { return &taskActor{st: s, t: pa.spawning} }, inline)
	var err error
	s.pipeline, err = s.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return pa }, inline,
		actor.WithSupervisor(actor.NewOneForOneStrategy(0, 0, resumeTask))), "pipeline")
	if err == nil {
		err = s.startLocations()
	}
	if err == nil && !p.cfg.Eager {
		err = s.startWorkers()
	}
	if err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// resumeTask is the decision for a task actor whose Receive panicked: it
// goes on with its state as it was (the message is dropped).
func resumeTask(any) actor.Directive { return actor.ResumeDirective }

// pipelineActor is the parent of the pipeline's task actors. It spawns
// one per spawnTask; protoactor removes a child from its children when
// the child stops (and tells the parent with *actor.Terminated).
type pipelineActor struct {
	taskProps *actor.Props
	spawning  *taskRef      // the task whose actor taskProps produces now
	awaiting  []*awaitTasks // answered once the task actors are few enough
}

// spawnTask asks the pipeline's actor for the actor of task t.
type spawnTask struct {
	t     *taskRef
	reply chan error
}

// countTasks asks the pipeline's actor how many task actors it has.
type countTasks struct{ reply chan int }

// awaitTasks asks the pipeline's actor to answer once it has at most n
// task actors (with how many it has then).
type awaitTasks struct {
	n     int
	reply chan int
}

func (a *pipelineActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *spawnTask:
		a.spawning = m.t
		pid, err := ctx.SpawnNamed(a.taskProps, taskActorName(m.t.ID))
		a.spawning = nil
		m.t.pid = pid
		m.reply <- err
	case *countTasks:
		m.reply <- len(ctx.Children())
	case *awaitTasks:
		a.awaiting = append(a.awaiting, m)
		a.answerAwaiting(ctx)
	case *actor.Terminated:
		if len(a.awaiting) > 0 {
			a.answerAwaiting(ctx)
		}
	}
}

func (a *pipelineActor) answerAwaiting(ctx actor.Context) {
	n := len(ctx.Children())
	kept := a.awaiting[:0]
	for _, w := range a.awaiting {
		if n <= w.n {
			w.reply <- n
		} else {
			kept = append(kept, w)
		}
	}
	a.awaiting = kept
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

// NewTask makes a new task, in state Pending, and its actor (a child of
// the pipeline's actor).
func (s *runner) NewTask(spec TaskSpec) (*taskRef, error) {
	if s.stopped.Load() {
		return nil, ErrClosed
	}
	id := TaskID(s.nextID.Add(1))
	t := &taskRef{ID: id, Name: spec.Name, ReqID: spec.ReqID, WriteN: spec.WriteN, Mode: spec.Mode, Seq: uint64(id),
		hostReady: make(chan struct{}), done: make(chan struct{})}
	t.handle = Task{p: s.p, t: t}
	a := newErrAsk()
	s.root.Send(s.pipeline, &spawnTask{t: t, reply: a.reply})
	select {
	case err := <-a.reply:
		a.put()
		if err != nil {
			return nil, err
		}
		return t, nil
	case <-s.down:
		return nil, ErrClosed // the pipeline's actor stopped before it spawned the task's
	}
}

// liveTasks returns how many task actors the pipeline's actor has.
func (s *runner) liveTasks() int {
	reply := make(chan int, 1)
	s.root.Send(s.pipeline, &countTasks{reply: reply})
	return <-reply
}

// awaitLiveTasks waits until the pipeline's actor has at most n task
// actors and returns how many it has then (or ctx's error).
func (s *runner) awaitLiveTasks(ctx context.Context, n int) (int, error) {
	reply := make(chan int, 1)
	s.root.Send(s.pipeline, &awaitTasks{n: n, reply: reply})
	select {
	case got := <-reply:
		return got, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// ask sends m to t's actor and waits for its reply on reply, for t's end
// (a terminal task's actor has stopped: gone is called for the answer) or
// for ctx. A request whose answer came goes back to its pool (its reply
// channel is empty again, and the actor is done with the message: it
// answers last); one that got no answer is left to the garbage collector.
func ask[R any](ctx context.Context, s *runner, t *taskRef, m any, reply chan R, req pooled, gone func() R) (R, error) {
	select {
	case <-t.done:
		req.put()          // never sent: nobody else has it
		return gone(), nil // its actor has stopped
	default:
	}
	s.root.Send(t.pid, m)
	select {
	case r := <-reply:
		req.put()
		return r, nil
	case <-t.done:
		select {
		case r := <-reply: // answered before it stopped
			req.put()
			return r, nil
		default:
			return gone(), nil
		}
	case <-ctx.Done():
		var zero R
		return zero, ctx.Err()
	}
}

// pooled is a request that goes back to its pool once answered.
type pooled interface{ put() }

// errAsk is a request answered with an error, with its reply channel
// (capacity 1), from a pool.
type errAsk struct {
	append     taskAppend
	enqueue    taskEnqueue
	transition taskTransition
	reply      chan error
}

var errAsks = sync.Pool{New: func() any { return &errAsk{reply: make(chan error, 1)} }}

func newErrAsk() *errAsk { return errAsks.Get().(*errAsk) }

func (a *errAsk) put() {
	a.append, a.enqueue, a.transition = taskAppend{}, taskEnqueue{}, taskTransition{}
	errAsks.Put(a)
}

// claimAsk is a claim with its reply channel, from a pool.
type claimAsk struct {
	claim taskClaim
	reply chan claimResult
}

var claimAsks = sync.Pool{New: func() any {
	a := &claimAsk{reply: make(chan claimResult, 1)}
	a.claim.reply = a.reply
	return a
}}

func (a *claimAsk) put() { claimAsks.Put(a) }

// unpooled is a request made for one ask.
type unpooled struct{}

func (unpooled) put() {}

// Append adds c to t. Refusals: *AppendRefusedError.
func (s *runner) Append(ctx context.Context, t *taskRef, c *taskChunk) error {
	a := newErrAsk()
	a.append = taskAppend{chunk: c, reply: a.reply}
	res, err := ask(ctx, s, t, &a.append, a.reply, a, func() error {
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
func (s *runner) Enqueue(ctx context.Context, t *taskRef, prio int8) error {
	a := newErrAsk()
	a.enqueue = taskEnqueue{prio: prio, reply: a.reply}
	res, err := ask(ctx, s, t, &a.enqueue, a.reply, a, func() error { return t.Err() })
	if err != nil {
		return err
	}
	return res
}

// Claim moves t from Queued to Copying for the caller and returns its
// chunks; false when another caller already claimed it (or it is not
// queued). It waits for the actor's answer whatever ctx does (the actor
// answers a claim at once): a claim the actor granted is always known to
// its caller, who then owns the task's end (a claim given up on ctx after
// the actor granted it would leave the task claimed and never ended, and
// Close's drain waiting for it for ever). ctx's error comes back when ctx
// has ended, with the claim's result.
func (s *runner) Claim(ctx context.Context, t *taskRef) ([]*taskChunk, bool, error) {
	a := claimAsks.Get().(*claimAsk)
	res, _ := ask(context.Background(), s, t, &a.claim, a.reply, a, func() claimResult { return claimResult{} })
	return res.chunks, res.won, ctx.Err()
}

// Transition asks t's actor for one step of the chain; an illegal one is
// an *IllegalTransitionError and changes nothing. To Failed, a
// non-terminal task fails with a failure naming it. When it returns nil,
// the channels the step closes are closed: [taskRef.HostReady] after
// HostReady, [taskRef.Done] after Written or Failed.
func (s *runner) Transition(ctx context.Context, t *taskRef, to TaskState) error {
	a := newErrAsk()
	a.transition = taskTransition{to: to, reply: a.reply}
	res, err := ask(ctx, s, t, &a.transition, a.reply, a, func() error {
		return &IllegalTransitionError{Task: t.ID, TaskName: t.Name, From: t.State(), To: to}
	})
	if err != nil {
		return err
	}
	if res != nil {
		return res
	}
	switch to {
	case HostReady:
		return waitClosed(ctx, t.hostReady)
	case Written, Failed:
		return waitClosed(ctx, t.done)
	}
	return nil
}

// waitClosed waits for ch, which the task actor closes right after it has
// answered (it answers first, so that [ask] never takes the wake-up for
// the actor having stopped before answering).
func waitClosed(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Fail moves t to Failed with err unless it is terminal; it reports whether
// it did. When it returns true, [taskRef.HostReady] and [taskRef.Done] are
// closed.
func (s *runner) Fail(t *taskRef, err error) bool { return s.fail(t, err, false) }

// FailAsync sends t's actor a failure without waiting for the answer. It
// fails t only if t's copy stage is not claimed by then (a claimed task's
// chunks belong to its copy stage or its pool write, which end it). It is
// the call of the pipeline's first failure for the tasks still pending.
func (s *runner) FailAsync(t *taskRef, err error) {
	select {
	case <-t.done:
		return
	default:
	}
	s.root.Send(t.pid, &taskFail{err: err, unclaimed: true})
}

// FailUnclaimed is Fail for a task whose copy stage is not claimed: it
// leaves a claimed task alone (false), to the copy stage or pool write
// that ends it.
func (s *runner) FailUnclaimed(t *taskRef, err error) bool { return s.fail(t, err, true) }

func (s *runner) fail(t *taskRef, err error, unclaimed bool) bool {
	r := make(chan bool, 1)
	res, _ := ask(context.Background(), s, t, &taskFail{err: err, reply: r, unclaimed: unclaimed}, r, unpooled{}, func() bool { return false })
	if res {
		<-t.done // closed by the actor right after its answer
	}
	return res
}

// Plan returns the rows of t's pool write (see scatterRow).
func (s *runner) Plan(ctx context.Context, t *taskRef) ([]scatterRow, error) {
	r := make(chan []scatterRow, 1)
	return ask(ctx, s, t, &taskPlan{reply: r}, r, unpooled{}, func() []scatterRow { return nil })
}

// Source says where the bytes of t's row (key, slot) are now.
func (s *runner) Source(ctx context.Context, t *taskRef, key string, slot int) (rowSource, error) {
	r := make(chan rowSource, 1)
	return ask(ctx, s, t, &taskSource{key: key, slot: slot, reply: r}, r, unpooled{}, func() rowSource { return rowSource{State: t.State()} })
}

// RunInline runs t's copy stage and pool write on the caller (eager mode,
// or a test): claim, copy stage, HostReady, pool write, Written. A task
// already claimed by someone else is left to them. It returns the task's
// failure, if this call failed it.
func (s *runner) RunInline(ctx context.Context, t *taskRef) error {
	chunks, ok, err := s.Claim(ctx, t)
	if !ok {
		return err
	}
	// Claimed: this call ends the task, written or failed, on every path.
	s.claimed(t)
	if err == nil {
		err = s.p.copyStage(ctx, t, chunks)
	}
	if err == nil {
		err = s.Transition(ctx, t, HostReady)
	}
	var plan []scatterRow
	if err == nil {
		plan, err = s.Plan(ctx, t)
	}
	if err == nil {
		err = s.p.newPoolWriter().write(ctx, t, chunks, plan)
	}
	if err != nil {
		s.committed(t, err) // before the task's waiters wake
		s.Fail(t, err)      // unless a transition ctx gave up on did end it
		return err
	}
	s.committed(t, nil)
	if err := s.Transition(ctx, t, Written); err != nil {
		s.Fail(t, err) // a no-op if the move to Written was made
		return err
	}
	return nil
}

// Abort cancels the context of the copy stage and pool write: waits in
// progress end with context.Canceled (and fail their tasks).
func (s *runner) Abort() { s.cancel() }

// Stop stops the copy queue and the committer (each ends the job it is
// running, if any, and drops those still queued), then the pipeline's
// actor and the actor system. Call it once no task is in flight: what is
// left is duplicates of claimed jobs, and demotions the pipeline
// declined. Idempotent.
func (s *runner) Stop() {
	if s.stopped.Swap(true) {
		return
	}
	s.cancel()
	for _, pid := range []*actor.PID{s.queue, s.committer, s.pipeline} {
		if pid != nil {
			_ = s.root.StopFuture(pid).Wait()
		}
	}
	close(s.down)
	if s.locations != nil {
		s.locations.stop()
	}
	s.system.Shutdown()
	s.queueRun.close()
	s.commitRun.close()
}

// startLocations makes the pipeline allocate through the runtime's
// location actors, or through location actors of its own.
func (s *runner) startLocations() error {
	if la, ok := s.p.rt.(LocationAllocator); ok {
		s.p.alloc = la
		return nil
	}
	cfg := s.p.cfg
	locs, err := startOwnLocations(s.root, s.p.be, cfg.Device, cfg.Pinned, cfg.Host)
	if err != nil {
		return err
	}
	s.locations, s.p.alloc = locs, locs
	return nil
}

// errNotSpawned: an actor of the pipeline could not be spawned.
func errNotSpawned(what string, err error) error {
	return fmt.Errorf("staging: spawning the %s: %w", what, err)
}

// stateMirror publishes a task's state to readers of its handle.
type stateMirror struct{ v atomic.Int32 }

func (m *stateMirror) load() TaskState   { return TaskState(m.v.Load()) }
func (m *stateMirror) store(s TaskState) { m.v.Store(int32(s)) }

// taskActorName is the name of task id's actor: "task-<id>".
func taskActorName(id TaskID) string {
	var b [25]byte
	n := copy(b[:], "task-")
	i := len(b)
	for v := uint64(id); ; v /= 10 {
		i--
		b[i] = byte('0' + v%10)
		if v < 10 {
			break
		}
	}
	n += copy(b[n:], b[i:])
	return string(b[:n])
}

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
