package actors

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// This file holds the write task of the device→host write pipeline
// (package staging): the handle its callers share, the chunks it carries
// and the actor that owns its state machine. Every change of a task's state
// is made by its actor, one message at a time; the handle only mirrors the
// state for cheap reads and offers the two wait channels.

// StagingTask is the shared handle of one write task. Its fields are fixed
// at creation; its state is owned by the task's actor, which publishes it
// here. Safe for concurrent use.
type StagingTask struct {
	ID     messages.TaskID
	ReqID  string
	WriteN int
	Mode   messages.JoinMode
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
func (t *StagingTask) State() messages.TaskState { return t.state.load() }

// HostReady returns a channel closed when the task's rows are in host
// memory (HostReady) or the task failed. Only those transitions close it.
func (t *StagingTask) HostReady() <-chan struct{} { return t.hostReady }

// Done returns a channel closed when the task is written to the CPU block
// pool or failed. Only those transitions close it.
func (t *StagingTask) Done() <-chan struct{} { return t.done }

// Err returns the task's failure once Done is closed, nil before and for a
// written task.
func (t *StagingTask) Err() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

func (t *StagingTask) String() string {
	return fmt.Sprintf("task %d (req %q, write %d, %s)", t.ID, t.ReqID, t.WriteN, t.Mode)
}

// StagingChunk is what one save adds to a task: its rows and where their
// bytes are. The pipeline fills it before Append; after the task's copy
// stage is claimed the chunk list is frozen, and the copy stage may write
// Host (before the task enters HostReady). Readers learn of Host from the
// task's actor, after that transition.
type StagingChunk struct {
	Rows []messages.StagingRow

	// JoinNextStep: the staging slot the step landed in, its pinned buffer
	// and the event of the whole-step device→host copy.
	Slot      int
	SlotBuf   cuda.Buffer
	StepEvent cuda.Event

	// JoinNextStep: the staged step (owned by package staging).
	Step any

	// JoinOnFinish: the device clone, the event of the clone copy and the
	// GPU-byte budget ticket that charges it (owned by package staging).
	// Src and Freeze are the device rows and the event after which they
	// are final: package staging starts the clone copy when the task
	// accepts the chunk (CloneEvent is set then), or before in eager mode.
	Clone      cuda.Buffer
	CloneEvent cuda.Event
	Ticket     any
	Src        cuda.Buffer
	Freeze     cuda.Event

	// JoinOnFinish: the host buffer the copy stage landed the clone in,
	// and what charges it (owned by package staging).
	Host       cuda.Buffer
	HostTicket any
}

// ScatterRow is one row of a pool write: chunk Chunk of the task holds the
// bytes of (Key, Slot) at Offset.
type ScatterRow struct {
	Key    string
	Slot   int
	Chunk  int
	Offset int64
}

// RowSource says where the bytes of one row of a task are now.
type RowSource struct {
	State messages.TaskState
	// Found is false when no chunk of the task has the row.
	Found bool
	// Buf holds the row at Offset once Event (if not nil) has completed.
	Buf    cuda.Buffer
	Offset int64
	Event  cuda.Event
	// OnDevice: Buf is the device clone (the copy to host has not landed).
	OnDevice bool
}

// IllegalTransitionError: a task was asked to move in a way its lifecycle
// does not allow (a skip, a step back, leaving a terminal state).
type IllegalTransitionError struct {
	Task     messages.TaskID
	From, To messages.TaskState
}

func (e *IllegalTransitionError) Error() string {
	return fmt.Sprintf("staging: task %d: illegal transition %s -> %s", e.Task, e.From, e.To)
}

// AppendRefusedError: a chunk cannot be added to the task any more. State
// is the state that closed it (Copying or later), or the task's current
// state when Reassigned is true: the task already lost one of the chunk's
// rows to a later task. Open a fresh task for the chunk.
type AppendRefusedError struct {
	Task       messages.TaskID
	State      messages.TaskState
	Reassigned bool
}

func (e *AppendRefusedError) Error() string {
	if e.Reassigned {
		return fmt.Sprintf("staging: task %d: append refused: a later task took one of its rows; open a fresh task", e.Task)
	}
	return fmt.Sprintf("staging: task %d: append refused: the task is %s; open a fresh task", e.Task, e.State)
}

type rowKey struct {
	key  string
	slot int
}

// ---- the task actor's messages (local: they carry reply channels) ----

type taskAppend struct {
	chunk *StagingChunk
	reply chan error
}

type taskEnqueue struct {
	prio  int8
	reply chan error
}

type taskClaim struct{ reply chan claimResult }

type claimResult struct {
	chunks []*StagingChunk
	won    bool
}

type taskTransition struct {
	to    messages.TaskState
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
	rows      []ScatterRow
	hostReady bool
}

type taskSource struct {
	key   string
	slot  int
	reply chan RowSource
}

// stagingTaskActor owns one task's state machine.
type stagingTaskActor struct {
	st     *Staging
	t      *StagingTask
	state  messages.TaskState
	chunks []*StagingChunk
	prio   int8 // priority of the newest copy job sent for the task (0: none)
}

func (a *stagingTaskActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *taskAppend:
		m.reply <- a.append(m.chunk)
	case *taskEnqueue:
		m.reply <- a.enqueue(ctx, m.prio)
	case *taskClaim:
		if a.state == messages.TaskQueued {
			a.set(messages.TaskCopying)
			m.reply <- claimResult{chunks: a.chunks, won: true}
		} else {
			m.reply <- claimResult{} // a re-queued duplicate, or the task is gone
		}
	case *taskTransition:
		err, wake := a.transition(ctx, m.to)
		m.reply <- err // before waking: a caller must not take the wake-up for a refusal
		wake()
	case *taskHostReady:
		_, wake := a.transition(ctx, messages.TaskHostReady) // refused if failed meanwhile
		wake()
	case *taskWritten:
		_, wake := a.transition(ctx, messages.TaskWritten) // refused if failed meanwhile
		wake()
	case *taskFail:
		if m.unclaimed && a.state >= messages.TaskCopying {
			m.reply <- false
			return
		}
		moved, wake := a.fail(ctx, m.err)
		m.reply <- moved
		wake()
	case *taskPlan:
		m.reply <- planResult{rows: a.plan(), hostReady: a.state == messages.TaskHostReady}
	case *taskSource:
		m.reply <- a.source(m.key, m.slot)
	}
}

func (a *stagingTaskActor) set(s messages.TaskState) {
	a.state = s
	a.t.state.store(s)
}

// append takes c unless the copy stage is claimed (or the environment
// refuses it, e.g. for a row the task lost to a later task).
func (a *stagingTaskActor) append(c *StagingChunk) error {
	if a.state >= messages.TaskCopying {
		return &AppendRefusedError{Task: a.t.ID, State: a.state}
	}
	if err := a.st.env.Accept(a.t, a.state, c); err != nil {
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
func (a *stagingTaskActor) enqueue(ctx actor.Context, prio int8) error {
	switch {
	case a.state == messages.TaskPending:
		a.set(messages.TaskQueued)
		a.st.env.Queued(a.t, a.chunks)
	case a.state == messages.TaskQueued && a.prio == messages.PriorityLow && prio > a.prio:
	case a.state == messages.TaskFailed:
		return a.t.err
	default:
		return nil
	}
	a.prio = prio
	if !a.st.eager {
		ctx.Send(a.st.queue, &copyJob{t: a.t, prio: prio})
	}
	return nil
}

// transition makes one step of the chain. It returns the outcome and the
// wake-up to run once the requester has its answer.
func (a *stagingTaskActor) transition(ctx actor.Context, to messages.TaskState) (error, func()) {
	if to == messages.TaskFailed {
		_, wake := a.fail(ctx, fmt.Errorf("staging: task %d failed", a.t.ID))
		return nil, wake
	}
	if !messages.CanTransition(a.state, to) {
		return &IllegalTransitionError{Task: a.t.ID, From: a.state, To: to}, nop
	}
	a.set(to)
	switch to {
	case messages.TaskHostReady:
		a.st.env.HostReady(a.t, a.chunks)
		return nil, func() { close(a.t.hostReady) }
	case messages.TaskWritten:
		a.st.env.Written(a.t, a.chunks)
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
// published (the task's and, through the environment, the pipeline's)
// and its resources released before any waiter is woken.
func (a *stagingTaskActor) fail(ctx actor.Context, err error) (bool, func()) {
	if a.state.Terminal() {
		return false, nop
	}
	wasHostReady := a.state >= messages.TaskHostReady
	a.set(messages.TaskFailed)
	a.t.err = err
	a.st.env.Failed(a.t, a.chunks, err)
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
func (a *stagingTaskActor) plan() []ScatterRow {
	n := 0
	for _, c := range a.chunks {
		n += len(c.Rows)
	}
	out := make([]ScatterRow, 0, n)
	if len(a.chunks) == 1 && strictlyIncreasing(a.chunks[0].Rows) {
		// The common case: one save, no row twice, none lost.
		for _, r := range a.chunks[0].Rows {
			out = append(out, ScatterRow{Key: r.Key, Slot: r.Slot, Offset: r.Offset})
		}
		return out
	}
	idx := make(map[rowKey]int, n)
	for ci, c := range a.chunks {
		for _, r := range c.Rows {
			k := rowKey{r.Key, r.Slot}
			row := ScatterRow{Key: r.Key, Slot: r.Slot, Chunk: ci, Offset: r.Offset}
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
func strictlyIncreasing(rows []messages.StagingRow) bool {
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

func (a *stagingTaskActor) source(key string, slot int) RowSource {
	src := RowSource{State: a.state}
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
			case a.t.Mode == messages.JoinNextStep:
				src.Buf, src.Event = c.SlotBuf, c.StepEvent
			case a.state >= messages.TaskHostReady:
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
