package staging

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// The copy queue and the committer: two actors on protoactor's priority
// mailbox (actor.UnboundedPriority), each run by a goroutine of its own
// for the pipeline's life (ownGoroutine).
//
// The copy queue's messages carry their priority (actor.PriorityMessage):
// prioFront (Prioritize) > prioHigh (budget flush) > prioLow (Submit) >
// prioDemote (the runtime's demotions); within one priority, first in
// first out. Its turn for a task's job claims the task (a message to the
// task's actor), runs the copy stage, sends the task its move to
// HostReady, then the committer its pool write. With Config.Serial it
// then waits for the task's end before it serves the next job.
//
// The committer's jobs all carry one priority, so its mailbox serves them
// in the order they came: the order in which the copy stages finished. It
// is the single writer of the CPU block pool.

// copyJob asks the copy queue to run a task's copy stage. Duplicates (a
// task re-queued at a higher priority) are harmless: only the first job to
// claim the task runs it.
type copyJob struct {
	t    *taskRef
	prio int8
}

// GetPriority is the job's priority in the copy queue's mailbox.
func (j *copyJob) GetPriority() int8 { return j.prio }

// GetPriority is a demotion's priority in the copy queue's mailbox: below
// every write task.
func (*demoteJob) GetPriority() int8 { return prioDemote }

// commitJob asks the committer to write a host-ready task to the pool.
type commitJob struct {
	t      *taskRef
	chunks []*taskChunk // frozen since the claim
}

// prioCommit is the one priority of the committer's jobs.
const prioCommit int8 = actor.DefaultPriority

// GetPriority is the committer's one priority: its mailbox is first in
// first out.
func (*commitJob) GetPriority() int8 { return prioCommit }

// startWorkers spawns the copy queue and the committer.
func (s *runner) startWorkers() error {
	s.queueRun, s.commitRun = newOwnGoroutine(), newOwnGoroutine()
	var err error
	s.committer, err = s.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &committerActor{st: s, writer: s.p.newPoolWriter()} },
		actor.WithMailbox(actor.UnboundedPriority()), actor.WithDispatcher(s.commitRun)), "committer")
	if err != nil {
		return errNotSpawned("committer", err)
	}
	s.queue, err = s.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &copyQueueActor{st: s} },
		actor.WithMailbox(actor.UnboundedPriority()), actor.WithDispatcher(s.queueRun)), "copy-queue")
	if err != nil {
		return errNotSpawned("copy queue", err)
	}
	return nil
}

// sendDemotion puts a demotion's copy on the copy queue.
func (s *runner) sendDemotion(j *demoteJob) { s.root.Send(s.queue, j) }

// copyQueueActor serves copy jobs highest priority first.
type copyQueueActor struct{ st *runner }

func (a *copyQueueActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *demoteJob:
		a.st.p.runDemotion(m)
	case *copyJob:
		a.copy(ctx, m.t)
	}
}

// copy claims t, runs its copy stage, moves it to HostReady and hands it
// to the committer.
func (a *copyQueueActor) copy(ctx actor.Context, t *taskRef) {
	s := a.st
	if s.p.serial() {
		s.p.budget.waitLooks(s.ctx) // a reserve woken by the last task's end looks first
	}
	chunks, won, err := s.Claim(s.ctx, t)
	if !won {
		return
	}
	s.claimed(t) // claimed: the copy stage, the committer or a failure here ends the task
	if err == nil {
		err = s.p.copyStage(s.ctx, t, chunks)
	}
	if err != nil {
		s.p.log.Debug().Err(err).Uint64("task", uint64(t.ID)).Str("task_name", t.Name).Msg("copy stage failed")
		s.committed(t, err)
		s.Fail(t, err)
		return
	}
	// No round trip: the task's actor gets the move to HostReady, then the
	// committer the job, in this order; the queue goes on with the next
	// job at once (Serial: once the task is terminal), and the committer
	// writes in the order the copy stages finished.
	ctx.Send(t.pid, &taskHostReady{})
	ctx.Send(s.committer, &commitJob{t: t, chunks: chunks})
	if s.p.serial() {
		// The committer and the task's actor end the task without the
		// copy queue: waiting here cannot deadlock.
		select {
		case <-t.done:
		case <-s.ctx.Done():
		}
	}
}

// committerActor is the single writer of the CPU block pool. Its scratch
// is its own.
type committerActor struct {
	st     *runner
	writer *poolWriter
	plan   []scatterRow
}

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
		a.plan = planInto(a.plan[:0], j.chunks)
		err = a.writer.write(s.ctx, j.t, j.chunks, a.plan)
	}
	s.committed(j.t, err) // before the task's waiters wake
	if err != nil {
		s.p.log.Debug().Err(err).Uint64("task", uint64(j.t.ID)).Str("task_name", j.t.Name).Msg("pool write failed")
		s.Fail(j.t, err)
		return
	}
	// The move to Written (release of the task's slot holds and buffers,
	// then its waiters) is the task actor's.
	ctx.Send(j.t.pid, &taskWritten{})
}

// ownGoroutine is a protoactor dispatcher that runs one actor's mailbox
// on one goroutine for the actor's life (protoactor's default starts a
// goroutine whenever a mailbox goes from idle to busy, whose stack then
// grows down the pipeline's call chain again). A mailbox schedules at most
// one run at a time; a run scheduled after close goes on a goroutine of
// its own, as by default.
type ownGoroutine struct {
	mu     sync.Mutex
	closed bool
	work   chan func()
	done   chan struct{}
}

var _ actor.Dispatcher = (*ownGoroutine)(nil)

func newOwnGoroutine() *ownGoroutine {
	d := &ownGoroutine{work: make(chan func(), 4), done: make(chan struct{})}
	go d.run()
	return d
}

func (d *ownGoroutine) run() {
	defer close(d.done)
	for fn := range d.work {
		fn()
	}
}

// Schedule runs fn on the dispatcher's goroutine.
func (d *ownGoroutine) Schedule(fn func()) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		go fn()
		return
	}
	d.work <- fn // one run at a time per mailbox: never full
	d.mu.Unlock()
}

// Throughput is the number of messages a mailbox processes before it
// yields (protoactor's default).
func (*ownGoroutine) Throughput() int { return 300 }

// close ends the goroutine once it has run what was scheduled. A nil
// dispatcher has nothing to close.
func (d *ownGoroutine) close() {
	if d == nil {
		return
	}
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		close(d.work)
	}
	d.mu.Unlock()
	<-d.done
}
