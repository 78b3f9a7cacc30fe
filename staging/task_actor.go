package staging

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
)

// A write task's actor: the only owner of the task's state machine and
// chunks. Every move of the task is a message to it (from the callers of
// Append, Submit and Prioritize, the budget flush, the copy queue, the
// committer, Close and the pipeline's first failure), and its Receive
// refuses every move the strict chain does not allow. After each move it
// publishes the new state on the task's handle (taskRef.state), and closes
// the handle's wait channels on entering HostReady, Written or Failed.
// Once terminal it stops itself: a later message goes to the dead
// letters, and its sender learns the outcome from the handle.
//
// The effects of a move on the pipeline's memory (effects.go) run in the
// Receive and never wait for another task.

// ---- messages (local: they carry reply channels) ----

type taskAppend struct {
	chunk *taskChunk
	reply chan error
}

type taskEnqueue struct {
	prio  int8
	reply chan error
}

type taskClaim struct{ reply chan claimResult }

type claimResult struct {
	chunks []*taskChunk
	won    bool
}

type taskTransition struct {
	to    TaskState
	reply chan error
}

// taskHostReady (from the copy queue, no reply): the copy stage of the
// task succeeded; move to HostReady (refused if it failed meanwhile).
type taskHostReady struct{}

// taskWritten (from the committer, no reply): the pool write succeeded;
// move to Written.
type taskWritten struct{}

type taskFail struct {
	err   error
	reply chan bool // nil: nobody waits for the answer
	// unclaimed: only if the copy stage is not claimed (Pending, Queued).
	unclaimed bool
}

type taskPlan struct{ reply chan []scatterRow }

type taskSource struct {
	key   string
	slot  int
	reply chan rowSource
}

// taskActor owns one task's state machine.
type taskActor struct {
	st     *runner
	t      *taskRef
	state  TaskState
	chunks []*taskChunk  // frozen once the copy stage is claimed
	chunk1 [1]*taskChunk // the array of chunks while there is one
	prio   int8          // priority of the newest copy job sent for the task (0: none)
	jobs   [2]copyJob    // the copy jobs sent for the task (at most two: low, then higher)
	sent   int           // how many of jobs were sent
}

// Receive makes one move of the task per message.
func (a *taskActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *taskAppend:
		m.reply <- a.append(m.chunk)
	case *taskEnqueue:
		m.reply <- a.enqueue(ctx, m.prio)
	case *taskClaim:
		if a.state != Queued {
			m.reply <- claimResult{} // a re-queued duplicate, or the task is gone
			return
		}
		a.set(Copying)
		m.reply <- claimResult{chunks: a.chunks, won: true}
	case *taskTransition:
		wake, err := a.transition(ctx, m.to)
		m.reply <- err // before waking: a caller must not take the wake-up for a refusal
		wake()
	case *taskHostReady:
		wake, _ := a.transition(ctx, HostReady) // refused if failed meanwhile
		wake()
	case *taskWritten:
		wake, _ := a.transition(ctx, Written) // refused if failed meanwhile
		wake()
	case *taskFail:
		moved, wake := false, nop
		if !m.unclaimed || a.state < Copying {
			moved, wake = a.fail(ctx, m.err)
		}
		if m.reply != nil {
			m.reply <- moved
		}
		wake()
	case *taskPlan:
		m.reply <- planOf(a.chunks)
	case *taskSource:
		m.reply <- a.source(m.key, m.slot)
	}
}

// set moves the task to s and publishes it.
func (a *taskActor) set(s TaskState) {
	a.state = s
	a.t.state.store(s)
}

// append takes c unless the copy stage is claimed (or the pipeline
// refuses it, e.g. for a row the task lost to a later task).
func (a *taskActor) append(c *taskChunk) error {
	if a.state >= Copying {
		return &AppendRefusedError{Task: a.t.ID, TaskName: a.t.Name, State: a.state}
	}
	if err := a.st.p.accept(a.t, a.state, c); err != nil {
		return err
	}
	if a.chunks == nil {
		a.chunks = a.chunk1[:0]
	}
	a.chunks = append(a.chunks, c)
	return nil
}

// enqueue puts the task on the copy queue at prio: a pending task becomes
// queued; a task queued at low priority gets a new job at a higher prio
// (the older job becomes a duplicate that loses its claim); anything else
// — a task queued high already (a budget flush), at the front, claimed or
// done — is left alone. A failed task returns its failure.
func (a *taskActor) enqueue(ctx actor.Context, prio int8) error {
	switch {
	case a.state == Pending:
		a.set(Queued)
		a.st.p.onQueued(a.t)
	case a.state == Queued && a.prio == prioLow && prio > a.prio:
	case a.state == Failed:
		return a.t.err
	default:
		return nil
	}
	a.prio = prio
	if !a.st.p.cfg.Eager {
		// Sent from this Receive: the jobs of one task reach the copy
		// queue in the order of their priorities.
		j := &copyJob{}
		if a.sent < len(a.jobs) {
			j = &a.jobs[a.sent] // written once here, then read by the copy queue only
		}
		a.sent++
		*j = copyJob{t: a.t, prio: prio}
		ctx.Send(a.st.queue, j)
	}
	return nil
}

// transition makes one step of the chain. It returns the wake-up to run once
// the requester has its answer, and the outcome.
func (a *taskActor) transition(ctx actor.Context, to TaskState) (func(), error) {
	if to == Failed {
		if a.state.Terminal() {
			return nop, &IllegalTransitionError{Task: a.t.ID, TaskName: a.t.Name, From: a.state, To: to}
		}
		_, wake := a.fail(ctx, fmt.Errorf("staging: %s failed", a.t.words()))
		return wake, nil
	}
	if !CanTransition(a.state, to) {
		return nop, &IllegalTransitionError{Task: a.t.ID, TaskName: a.t.Name, From: a.state, To: to}
	}
	a.set(to)
	switch to {
	case HostReady:
		a.st.p.onHostReady(a.t, a.chunks)
		return func() { close(a.t.hostReady) }, nil
	case Written:
		a.st.p.onWritten(a.t, a.chunks)
		// The pool write is over: nobody holds the chunks any more.
		a.chunks, a.chunk1 = nil, [1]*taskChunk{}
		return func() {
			close(a.t.done)
			ctx.Stop(ctx.Self())
		}, nil
	}
	return nop, nil
}

func nop() {}

// fail moves a non-terminal task to Failed: the failure record is
// published (the task's and, through onFailed, the pipeline's) and its
// resources released before any waiter is woken.
func (a *taskActor) fail(ctx actor.Context, err error) (bool, func()) {
	if a.state.Terminal() {
		return false, nop
	}
	wasHostReady := a.state >= HostReady
	a.set(Failed)
	a.t.err = err
	chunks := a.chunks
	a.chunks = nil // (a claimer may still read chunk1: it is left alone)
	a.st.p.onFailed(a.t, chunks, err)
	return true, func() {
		if !wasHostReady {
			close(a.t.hostReady)
		}
		close(a.t.done)
		ctx.Stop(ctx.Self())
	}
}

// source says where the bytes of the task's row (key, slot) are now.
func (a *taskActor) source(key string, slot int) rowSource {
	src := rowSource{State: a.state}
	// The newest row wins, as in the pool write: the last chunk's, and in
	// it the last of the row's entries.
	for i := len(a.chunks) - 1; i >= 0; i-- {
		c := a.chunks[i]
		for j := len(c.Rows) - 1; j >= 0; j-- {
			r := c.Rows[j]
			if r.Key != key || r.Slot != slot {
				continue
			}
			src.Found, src.Offset = true, r.Offset
			switch {
			case a.t.Mode == JoinNextStep:
				src.Buf, src.Event = c.SlotBuf, c.StepEvent
			case a.state >= HostReady:
				src.Buf = c.Host
			default:
				src.Buf, src.Event, src.OnDevice = c.Clone, c.CloneEvent, true
			}
			return src
		}
	}
	return src
}

// A message may reach a task actor that has just stopped (the task became
// terminal); its sender learns the answer from the task's handle, so such
// dead letters are expected and not logged.
func (*taskAppend) IgnoreDeadLetterLogging()     {}
func (*taskEnqueue) IgnoreDeadLetterLogging()    {}
func (*taskClaim) IgnoreDeadLetterLogging()      {}
func (*taskTransition) IgnoreDeadLetterLogging() {}
func (*taskFail) IgnoreDeadLetterLogging()       {}
func (*taskHostReady) IgnoreDeadLetterLogging()  {}
func (*taskWritten) IgnoreDeadLetterLogging()    {}
func (*taskPlan) IgnoreDeadLetterLogging()       {}
func (*taskSource) IgnoreDeadLetterLogging()     {}
