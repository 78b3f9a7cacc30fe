package staging

import (
	"fmt"
	"slices"
	"sync"

	"github.com/residency-go/residency/cuda"
)

// This file holds a write task's state machine: the handle its callers
// share, the chunks it carries and the moves between its states. Every
// move is a method called directly by whoever makes it (the caller of
// Append or Submit, the copy queue, the committer), under the task's own
// mutex, one move at a time per task; there is no actor or message per
// task. The effects of a move (effects.go) run under that mutex and never
// wait for another task, nor take another task's mutex, except the first
// failure of the pipeline, which fails the pending tasks (see
// Pipeline.publishFailure): only one move in the pipeline's life does that,
// so no two tasks ever wait for each other. The channels a move closes are
// closed after the mutex is let go.

// taskRef is one write task: its identity (fixed at creation) and its
// state machine. Safe for concurrent use.
type taskRef struct {
	ID     TaskID
	Name   string // TaskSpec.Name
	ReqID  string
	WriteN int
	Mode   JoinMode
	// Seq orders tasks by the time they were opened (the enqueue time of
	// the seed): a smaller Seq is older.
	Seq uint64

	mu     sync.Mutex    // serializes the task's moves; guards the fields below
	state  stateMirror   // written under mu; read anywhere
	chunks []*taskChunk  // frozen once the copy stage is claimed
	chunk1 [1]*taskChunk // the array of chunks while there is one
	prio   int8          // priority of the newest copy job sent for the task (0: none)
	err    error         // the failure; written before the task is Failed
	handle Task          // the caller's handle (one allocation for both)

	// The wait channels are made by the first caller that asks for one
	// before its transition (most tasks are never waited on before they
	// are written); one asked for after it is closedCh.
	hostReady chan struct{} // closed on entering HostReady or Failed
	done      chan struct{} // closed on entering Written or Failed
}

// State returns the task's current state (it may be stale by the time the
// caller looks at it).
func (t *taskRef) State() TaskState { return t.state.load() }

// HostReady returns a channel closed when the task's rows are in host
// memory (HostReady) or the task failed. Only those transitions close it.
func (t *taskRef) HostReady() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.hostReady == nil {
		if t.state.load() >= HostReady {
			return closedCh
		}
		t.hostReady = make(chan struct{})
	}
	return t.hostReady
}

// Done returns a channel closed when the task is written to the CPU block
// pool or failed. Only those transitions close it.
func (t *taskRef) Done() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		if t.state.load().Terminal() {
			return closedCh
		}
		t.done = make(chan struct{})
	}
	return t.done
}

// Err returns the task's failure once it is done (Done is closed), nil
// before and for a written task.
func (t *taskRef) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state.load() != Failed {
		return nil
	}
	return t.err
}

func (t *taskRef) String() string {
	return fmt.Sprintf("%s (req %q, write %d, %s)", t.words(), t.ReqID, t.WriteN, t.Mode)
}

// words is how messages name the task (see taskWords).
func (t *taskRef) words() string { return taskWords(t.ID, t.Name) }

// taskChunk is what one save adds to a task: its rows and where their
// bytes are. The pipeline fills it before Append; after the task's copy
// stage is claimed the chunk list is frozen, and the copy stage may write
// Host (before the task enters HostReady). Readers learn of Host under the
// task's mutex, after that transition.
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

// ---- the moves ----

// set moves t to s (the caller holds t.mu).
func (t *taskRef) set(s TaskState) { t.state.store(s) }

// append takes c unless the copy stage is claimed (or the pipeline
// refuses it, e.g. for a row the task lost to a later task).
func (s *runner) append(t *taskRef, c *taskChunk) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.state.load()
	if st >= Copying {
		return &AppendRefusedError{Task: t.ID, TaskName: t.Name, State: st}
	}
	if err := s.p.accept(t, st, c); err != nil {
		return err
	}
	if t.chunks == nil {
		t.chunks = t.chunk1[:0]
	}
	t.chunks = append(t.chunks, c)
	return nil
}

// enqueue puts the task on the copy queue at prio: a pending task becomes
// queued; a task queued at low priority gets a new job at a higher prio
// (the older job becomes a duplicate that loses its claim); anything else
// — a task queued high already (a budget flush), at the front, claimed or
// done — is left alone. A failed task returns its failure.
func (s *runner) enqueue(t *taskRef, prio int8) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch st := t.state.load(); {
	case st == Pending:
		t.set(Queued)
		s.p.onQueued(t)
	case st == Queued && t.prio == prioLow && prio > t.prio:
	case st == Failed:
		return t.err
	default:
		return nil
	}
	t.prio = prio
	if !s.p.cfg.Eager {
		// Pushed under t.mu: the jobs of one task reach the queue in the
		// order of their priorities. A push never blocks.
		s.queue.push(job{t: t, prio: prio})
	}
	return nil
}

// claim moves a queued task to Copying for the caller and returns its
// chunks (frozen from now on); false for a re-queued duplicate, or a task
// that is not queued.
func (s *runner) claim(t *taskRef) ([]*taskChunk, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state.load() != Queued {
		return nil, false
	}
	t.set(Copying)
	return t.chunks, true
}

// advance makes one step of the chain (not Failed: see fail); an illegal
// one is an *IllegalTransitionError and changes nothing. When it returns
// nil the channels the step closes are closed.
func (s *runner) advance(t *taskRef, to TaskState) error {
	t.mu.Lock()
	from := t.state.load()
	if !CanTransition(from, to) || to == Failed {
		t.mu.Unlock()
		return &IllegalTransitionError{Task: t.ID, TaskName: t.Name, From: from, To: to}
	}
	t.set(to)
	var wake chan struct{}
	switch to {
	case HostReady:
		s.p.onHostReady(t, t.chunks)
		wake = t.hostReady
	case Written:
		s.p.onWritten(t, t.chunks)
		// The pool write is over: nobody holds the chunks any more.
		t.chunks, t.chunk1 = nil, [1]*taskChunk{}
		wake = t.done
	}
	t.mu.Unlock()
	if wake != nil {
		close(wake)
	}
	return nil
}

// fail moves a non-terminal task to Failed (with unclaimed, only a task
// whose copy stage is not claimed: Pending or Queued) and reports whether
// it did. The failure record is published (the task's and, through
// onFailed, the pipeline's) and its resources released before any waiter
// is woken: when it returns true, HostReady and Done are closed.
func (s *runner) fail(t *taskRef, err error, unclaimed bool) bool {
	t.mu.Lock()
	st := t.state.load()
	if st.Terminal() || unclaimed && st >= Copying {
		t.mu.Unlock()
		return false
	}
	t.set(Failed)
	t.err = err
	chunks := t.chunks
	t.chunks = nil // (a claimer may still read chunk1: it is left alone)
	s.p.onFailed(t, chunks, err)
	hostReady, done := t.hostReady, t.done
	t.mu.Unlock()
	if st < HostReady && hostReady != nil {
		close(hostReady)
	}
	if done != nil {
		close(done)
	}
	return true
}

// planOfTask is the plan of a task's pool write and whether the task is HostReady (the
// state in which it may be written).
func (s *runner) planOfTask(t *taskRef) ([]scatterRow, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return planOf(t.chunks), t.state.load() == HostReady
}

// planOf lists the rows of a pool write of chunks: one per (key, slot),
// the later chunk's row when the task wrote a slot twice. (Rows a later
// task took are skipped by the pool write itself, which sees who owns each
// row then.)
func planOf(chunks []*taskChunk) []scatterRow { return planInto(nil, chunks) }

// planInto is planOf, appended to out[:0] (reusing its array).
func planInto(out []scatterRow, chunks []*taskChunk) []scatterRow {
	n := 0
	for _, c := range chunks {
		n += len(c.Rows)
	}
	out = slices.Grow(out[:0], n)
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

// source says where the bytes of the task's row (key, slot) are now.
func (t *taskRef) source(key string, slot int) rowSource {
	t.mu.Lock()
	defer t.mu.Unlock()
	state := t.state.load()
	src := rowSource{State: state}
	// The newest row wins, as in the pool write: the last chunk's, and in
	// it the last of the row's entries.
	for i := len(t.chunks) - 1; i >= 0; i-- {
		c := t.chunks[i]
		for j := len(c.Rows) - 1; j >= 0; j-- {
			r := c.Rows[j]
			if r.Key != key || r.Slot != slot {
				continue
			}
			src.Found, src.Offset = true, r.Offset
			switch {
			case t.Mode == JoinNextStep:
				src.Buf, src.Event = c.SlotBuf, c.StepEvent
			case state >= HostReady:
				src.Buf = c.Host
			default:
				src.Buf, src.Event, src.OnDevice = c.Clone, c.CloneEvent, true
			}
			return src
		}
	}
	return src
}
