package staging

import (
	"fmt"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/cuda"
)

// This file holds what a write task's handle shares with its readers and
// what its chunks carry. The task's state machine is its actor's
// (task_actor.go): the actor alone changes the task's state and chunks,
// one message at a time; the handle holds only what the actor publishes
// for readers — the state, the failure, and the two wait channels it
// closes.

// taskRef is the shared handle of one write task: its identity (fixed at
// creation), the PID of its actor and what that actor publishes. Safe for
// concurrent use.
type taskRef struct {
	ID     TaskID
	Name   string // TaskSpec.Name
	ReqID  string
	WriteN int
	Mode   JoinMode
	// Seq orders tasks by the time they were opened (the enqueue time of
	// the seed): a smaller Seq is older.
	Seq uint64

	pid    *actor.PID  // the task's actor, a child of the pipeline's actor
	state  stateMirror // published by the actor after each move
	err    error       // the failure; written by the actor before done is closed
	handle Task        // the caller's handle (one allocation for both)

	hostReady chan struct{} // closed by the actor on entering HostReady or Failed
	done      chan struct{} // closed by the actor on entering Written or Failed
}

// State returns the task's current state (the state its actor published
// last; it may be stale by the time the caller looks at it, never ahead).
func (t *taskRef) State() TaskState { return t.state.load() }

// HostReady returns a channel closed when the task's rows are in host
// memory (HostReady) or the task failed. Only those transitions close it.
func (t *taskRef) HostReady() <-chan struct{} { return t.hostReady }

// Done returns a channel closed when the task is written to the CPU block
// pool or failed. Only those transitions close it.
func (t *taskRef) Done() <-chan struct{} { return t.done }

// Err returns the task's failure once it is done (Done is closed), nil
// before and for a written task.
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
