package staging

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/cuda"
)

// This file holds the actor side of a write task: the handle its callers
// share, the chunks it carries and the actor that owns its state machine.
// Every change of a task's state is made by its actor, one message at a
// time; the handle only mirrors the state for cheap reads and offers the
// two wait channels.

// taskRef is the shared handle of one write task. Its fields are fixed
// at creation; its state is owned by the task's actor, which publishes it
// here. Safe for concurrent use.
type taskRef struct {
	ID     TaskID
	Name   string // TaskSpec.Name
	ReqID  string
	WriteN int
	Mode   JoinMode
	// Seq orders tasks by the time they were opened (the enqueue time of
	// the seed): a smaller Seq is older.
	Seq uint64

	pid       *actor.PID
	state     stateMirror
	hostReady chan struct{} // closed on entering HostReady or Failed
	done      chan struct{} // closed on entering Written or Failed
	err       error         // the failure; written before done is closed
}

// State returns the task's current state (a mirror of its actor's state;
// it may be stale by the time the caller looks at it, never ahead).
func (t *taskRef) State() TaskState { return t.state.load() }

// HostReady returns a channel closed when the task's rows are in host
// memory (HostReady) or the task failed. Only those transitions close it.
func (t *taskRef) HostReady() <-chan struct{} { return t.hostReady }

// Done returns a channel closed when the task is written to the CPU block
// pool or failed. Only those transitions close it.
func (t *taskRef) Done() <-chan struct{} { return t.done }

// Err returns the task's failure once Done is closed, nil before and for a
// written task.
func (t *taskRef) Err() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

func (t *taskRef) String() string {
	return fmt.Sprintf("%s (req %q, write %d, %s)", t.words(), t.ReqID, t.WriteN, t.Mode)
}

// words is how messages name the task (see taskWords).
func (t *taskRef) words() string { return taskWords(t.ID, t.Name) }

// taskChunk is what one save adds to a task: its rows and where their
// bytes are. The pipeline fills it before Append; after the task's copy
// stage is claimed the chunk list is frozen, and the copy stage may write
// Host (before the task enters HostReady). Readers learn of Host from the
// task's actor, after that transition.
type taskChunk struct {
	Rows []Row

	// JoinNextStep: the staging slot the step landed in, its pinned buffer
	// and the event of the whole-step device→host copy.
	Slot      int
	SlotBuf   cuda.Buffer
	StepEvent cuda.Event

	// JoinNextStep: the staged step.
	Step *Step

	// JoinOnFinish: the device clone, the event of the clone copy and the
	// GPU-byte budget ticket that charges it. Src and Freeze are the
	// device rows and the event after which they are final: the clone copy
	// starts when the task accepts the chunk (CloneEvent is set then), or
	// before in eager mode.
	Clone      cuda.Buffer
	CloneEvent cuda.Event
	Ticket     *ticket
	Src        cuda.Buffer
	Freeze     cuda.Event

	// JoinOnFinish: the host buffer the copy stage landed the clone in,
	// and the ticket that charges it.
	Host       cuda.Buffer
	HostTicket *ticket
}

// scatterRow is one row of a pool write: chunk Chunk of the task holds the
// bytes of (Key, Slot) at Offset.
type scatterRow struct {
	Key    string
	Slot   int
	Chunk  int
	Offset int64
}

// rowSource says where the bytes of one row of a task are now.
type rowSource struct {
	State TaskState
	// Found is false when no chunk of the task has the row.
	Found bool
	// Buf holds the row at Offset once Event (if not nil) has completed.
	Buf    cuda.Buffer
	Offset int64
	Event  cuda.Event
	// OnDevice: Buf is the device clone (the copy to host has not landed).
	OnDevice bool
}

type rowKey struct {
	key  string
	slot int
}

// ---- the task actor's messages (local: they carry reply channels) ----

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
	reply chan bool
	// unclaimed: only if the copy stage is not claimed (Pending, Queued).
	unclaimed bool
}

type taskPlan struct{ reply chan planResult }

type planResult struct {
	rows      []scatterRow
	hostReady bool
}

type taskSource struct {
	key   string
	slot  int
	reply chan rowSource
}

// taskActor owns one task's state machine.
type taskActor struct {
	st     *actorSystem
	p      *Pipeline // the effects of its moves
	t      *taskRef
	state  TaskState
	chunks []*taskChunk
	prio   int8 // priority of the newest copy job sent for the task (0: none)
}

func (a *taskActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *taskAppend:
		m.reply <- a.append(m.chunk)
	case *taskEnqueue:
		m.reply <- a.enqueue(ctx, m.prio)
	case *taskClaim:
		if a.state == Queued {
			a.set(Copying)
			m.reply <- claimResult{chunks: a.chunks, won: true}
		} else {
			m.reply <- claimResult{} // a re-queued duplicate, or the task is gone
		}
	case *taskTransition:
		err, wake := a.transition(ctx, m.to)
		m.reply <- err // before waking: a caller must not take the wake-up for a refusal
		wake()
	case *taskHostReady:
		_, wake := a.transition(ctx, HostReady) // refused if failed meanwhile
		wake()
	case *taskWritten:
		_, wake := a.transition(ctx, Written) // refused if failed meanwhile
		wake()
	case *taskFail:
		if m.unclaimed && a.state >= Copying {
			m.reply <- false
			return
		}
		moved, wake := a.fail(ctx, m.err)
		m.reply <- moved
		wake()
	case *taskPlan:
		m.reply <- planResult{rows: a.plan(), hostReady: a.state == HostReady}
	case *taskSource:
		m.reply <- a.source(m.key, m.slot)
	}
}

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
	if err := a.p.accept(a.t, a.state, c); err != nil {
		return err
	}
	a.chunks = append(a.chunks, c)
	return nil
}

// enqueue puts the task on a copy queue at prio: a pending task becomes
// queued; a task queued at low priority gets a new job at a higher prio
// (the older job becomes a duplicate that loses its claim); anything else
// — a task queued high already (a budget flush), at the front, claimed or
// done — is left alone.
func (a *taskActor) enqueue(ctx actor.Context, prio int8) error {
	switch {
	case a.state == Pending:
		a.set(Queued)
		a.p.onQueued(a.t)
	case a.state == Queued && a.prio == prioLow && prio > a.prio:
	case a.state == Failed:
		return a.t.err
	default:
		return nil
	}
	a.prio = prio
	if !a.p.cfg.Eager {
		ctx.Send(a.st.queue, &copyJob{t: a.t, prio: prio})
	}
	return nil
}

// transition makes one step of the chain. It returns the outcome and the
// wake-up to run once the requester has its answer.
func (a *taskActor) transition(ctx actor.Context, to TaskState) (error, func()) {
	if to == Failed {
		_, wake := a.fail(ctx, fmt.Errorf("staging: %s failed", a.t.words()))
		return nil, wake
	}
	if !CanTransition(a.state, to) {
		return &IllegalTransitionError{Task: a.t.ID, TaskName: a.t.Name, From: a.state, To: to}, nop
	}
	a.set(to)
	switch to {
	case HostReady:
		a.p.onHostReady(a.t, a.chunks)
		return nil, func() { close(a.t.hostReady) }
	case Written:
		a.p.onWritten(a.t, a.chunks)
		a.chunks = nil
		return nil, func() {
			close(a.t.done)
			ctx.Stop(ctx.Self())
		}
	}
	return nil, nop
}

func nop() {}

// fail moves a non-terminal task to Failed: the failure record is
// published (the task's and, through onFailed, the pipeline's)
// and its resources released before any waiter is woken.
func (a *taskActor) fail(ctx actor.Context, err error) (bool, func()) {
	if a.state.Terminal() {
		return false, nop
	}
	wasHostReady := a.state >= HostReady
	a.set(Failed)
	a.t.err = err
	a.p.onFailed(a.t, a.chunks, err)
	a.chunks = nil
	return true, func() {
		if !wasHostReady {
			close(a.t.hostReady)
		}
		close(a.t.done)
		ctx.Stop(ctx.Self())
	}
}

// plan lists the rows of the pool write: one per (key, slot), the later
// chunk's row when the task wrote a slot twice. (Rows a later task took are
// skipped by the pool write itself, which sees who owns each row then.)
func (a *taskActor) plan() []scatterRow { return planOf(a.chunks) }

// planOf is the plan of a task's chunks (see taskActor.plan).
func planOf(chunks []*taskChunk) []scatterRow {
	n := 0
	for _, c := range chunks {
		n += len(c.Rows)
	}
	out := make([]scatterRow, 0, n)
	if len(chunks) == 1 && strictlyIncreasing(chunks[0].Rows) {
		// The common case: one save, no row twice, none lost.
		for _, r := range chunks[0].Rows {
			out = append(out, scatterRow{Key: r.Key, Slot: r.Slot, Offset: r.Offset})
		}
		return out
	}
	idx := make(map[rowKey]int, n)
	for ci, c := range chunks {
		for _, r := range c.Rows {
			k := rowKey{r.Key, r.Slot}
			row := scatterRow{Key: r.Key, Slot: r.Slot, Chunk: ci, Offset: r.Offset}
			if i, seen := idx[k]; seen {
				out[i] = row
				continue
			}
			idx[k] = len(out)
			out = append(out, row)
		}
	}
	return out
}

// strictlyIncreasing reports whether rows are in strictly increasing
// (key, slot) order, which rules out a row written twice.
func strictlyIncreasing(rows []Row) bool {
	for i := 1; i < len(rows); i++ {
		p, r := rows[i-1], rows[i]
		if p.Key == r.Key {
			if p.Slot >= r.Slot {
				return false
			}
		} else if p.Key > r.Key {
			return false
		}
	}
	return true
}

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
// terminal); its sender learns the answer from the task's done channel, so
// such dead letters are expected and not logged.
func (*taskAppend) IgnoreDeadLetterLogging()     {}
func (*taskEnqueue) IgnoreDeadLetterLogging()    {}
func (*taskClaim) IgnoreDeadLetterLogging()      {}
func (*taskTransition) IgnoreDeadLetterLogging() {}
func (*taskFail) IgnoreDeadLetterLogging()       {}
func (*taskHostReady) IgnoreDeadLetterLogging()  {}
func (*taskWritten) IgnoreDeadLetterLogging()    {}
func (*taskPlan) IgnoreDeadLetterLogging()       {}
func (*taskSource) IgnoreDeadLetterLogging()     {}
