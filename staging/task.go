package staging

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/residency-go/residency/cuda"
)

// Write tasks: opening them, appending saves, submitting and
// prioritizing them, and the budget flush.

// TaskSpec is the identity of a write: the request it belongs to and the
// how-many-th time that request opened a write.
type TaskSpec struct {
	ReqID  string
	WriteN int
	Mode   JoinMode
	// Name (optional) is the caller's name for the task. The pipeline's
	// messages that name the task use it (`task "t1"`, else `task 3`), and
	// its errors that name the task carry it (their TaskName field). At
	// most MaxTaskNameBytes of valid UTF-8 (else Open refuses the spec with
	// a *TaskNameError); it need not be unique: the id stays the task's
	// identity.
	Name string
}

// Task is one write task: rows of (slot, key) for one request, in one join
// mode, possibly over several keys and several saves. Its state machine
// is its actor's (task_actor.go).
type Task struct {
	p *Pipeline
	t *taskRef

	// Guarded by p.mu. Rows are pool row indexes (see poolRow).
	has   []int            // rows its accepted chunks write, increasing, each once
	lost  map[int]struct{} // rows a later append took before its pool write (nil: none)
	clone int64            // bytes of its device clones not released yet
	left  bool             // it left Pending (its clones are on their way out)
}

// ID returns the task id.
func (t *Task) ID() TaskID { return t.t.ID }

// Name returns the name its TaskSpec gave the task ("" when none).
func (t *Task) Name() string { return t.t.Name }

// ReqID returns the request the write belongs to.
func (t *Task) ReqID() string { return t.t.ReqID }

// WriteN returns the how-many-th write of its request this is.
func (t *Task) WriteN() int { return t.t.WriteN }

// Mode returns the task's join mode.
func (t *Task) Mode() JoinMode { return t.t.Mode }

// State returns the task's state (it may change as soon as it is read).
func (t *Task) State() TaskState { return t.t.State() }

// WaitHostReady waits until the task's rows are in host memory (the copy
// stage finished: JOIN_NEXT_STEP waited the step's copy, JOIN_ON_FINISH
// copied its clone) or the task failed (its failure is returned). It does
// not wait for the pool write.
func (t *Task) WaitHostReady(ctx context.Context) error {
	select {
	case <-t.t.HostReady():
		if t.t.State() == Failed {
			<-t.t.Done()
			return t.t.Err()
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wait waits until the task is written to the CPU block pool (nil) or
// failed (its failure).
func (t *Task) Wait(ctx context.Context) error {
	select {
	case <-t.t.Done():
		return t.t.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Open registers a new write task, Pending, with no rows.
func (p *Pipeline) Open(ctx context.Context, spec TaskSpec) (*Task, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	if spec.Mode != JoinNextStep && spec.Mode != JoinOnFinish {
		return nil, fmt.Errorf("%w: unknown join mode %d", ErrConfig, spec.Mode)
	}
	if spec.Mode == JoinOnFinish && p.cfg.CloneBudgetBytes == 0 {
		return nil, fmt.Errorf("%w: JOIN_ON_FINISH needs CloneBudgetBytes > 0", ErrConfig)
	}
	if err := checkTaskName(spec.Name); err != nil {
		return nil, err
	}
	at, err := p.sys.NewTask(spec)
	if err != nil {
		return nil, err
	}
	t := &at.handle
	p.mu.Lock()
	p.tasks[at.ID] = t
	p.counts.opened++
	failure := p.failure // published while the task was being made
	p.mu.Unlock()
	if failure != nil {
		p.sys.Fail(at, failure)
		return nil, failure
	}
	return t, nil
}

// Chunk is what one save adds to a task.
type Chunk struct {
	// Rows are the rows of this save, each RowBytes at its Offset.
	Rows []Row
	// Step (JOIN_NEXT_STEP): the staged step whose slot holds the rows.
	// The task is bound to the step's slot until its pool write.
	Step *Step
	// Device and Freeze (JOIN_ON_FINISH): the device buffer holding the
	// rows and the event after which they are final. The whole buffer is
	// cloned on the device (pass a buffer of just these rows to keep the
	// clone small); the clone is charged to the GPU-byte budget.
	Device cuda.Buffer
	Freeze cuda.Event
	// NoWait (JOIN_ON_FINISH): try-reserve. A full budget drops the chunk
	// at once with a *DropError instead of flushing and waiting.
	NoWait bool
}

// Append adds one save's rows to the task. It refuses (an
// *AppendRefusedError, nothing changed, nothing reserved) once the task's
// copy stage is claimed, and when the task already lost one of the
// chunk's rows to a later task: open a fresh task then. A row another
// unwritten task wrote before is taken from it (that task's pool write
// will skip it).
//
// JOIN_ON_FINISH: reserves the clone's bytes first (blocking: budget
// pressure flushes the oldest deferred tasks and waits; see Chunk.NoWait),
// then clones Device on the device after Freeze, once the task has taken
// the chunk. The task stays Pending.
func (t *Task) Append(ctx context.Context, c Chunk) error {
	p := t.p
	if err := p.enter(); err != nil {
		return err
	}
	defer p.exit()
	if err := p.checkChunk(t, c); err != nil {
		return err
	}
	if t.Mode() == JoinNextStep && c.Step.released.Load() {
		return ErrStepReleased
	}
	// What the task would refuse anyway is refused before any slot, byte
	// of budget or copy is taken for it.
	if err := p.refusal(t, c.Rows); err != nil {
		return err
	}
	ch := &taskChunk{Rows: slices.Clone(c.Rows)}
	if t.Mode() == JoinNextStep {
		ch.Slot, ch.SlotBuf, ch.StepEvent, ch.Step = c.Step.slot, c.Step.buf, c.Step.ev, c.Step
	} else if err := p.cloneChunk(ctx, t, ch, c); err != nil {
		return err
	}
	// The task answers at once; a context ending here must not leave the
	// chunk in the task while this call undoes it.
	if err := p.sys.Append(context.Background(), t.t, ch); err != nil {
		if ch.Clone != nil {
			p.dropClone(ch) // its copy never started (or, eager, is done)
		}
		if failure := p.Err(); failure != nil {
			return failure // the pipeline failed meanwhile (and failed the task)
		}
		return err
	}
	if t.Mode() == JoinOnFinish {
		p.budget.poke() // a deferred task appeared: waiting reserves may flush it
	}
	return nil
}

// refusal returns the *AppendRefusedError the task would answer rows with
// now (its copy stage is claimed, or it lost one of the rows), nil if it
// may take them. The task's append decides in the end.
func (p *Pipeline) refusal(t *Task, rows []Row) error {
	switch st := t.State(); {
	case st == Failed:
		if failure := p.Err(); failure != nil {
			return failure // the pipeline failed (and failed the task)
		}
		<-t.t.Done()
		return t.t.Err() // failed by Close
	case st >= Copying:
		return &AppendRefusedError{Task: t.ID(), TaskName: t.Name(), State: st}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range rows {
		if _, lost := t.lost[p.poolRow(p.keys[r.Key], r.Slot)]; lost {
			return &AppendRefusedError{Task: t.ID(), TaskName: t.Name(), State: t.State(), Reassigned: true}
		}
	}
	return nil
}

func (p *Pipeline) checkChunk(t *Task, c Chunk) error {
	var size int64
	switch t.Mode() {
	case JoinNextStep:
		if c.Step == nil || c.Device != nil {
			return fmt.Errorf("%w: a JOIN_NEXT_STEP chunk names its Step (and no Device)", ErrConfig)
		}
		if c.Step.p != p {
			return fmt.Errorf("%w: the step belongs to another pipeline", ErrConfig)
		}
		size = c.Step.bytes
	case JoinOnFinish:
		if c.Device == nil || c.Step != nil {
			return fmt.Errorf("%w: a JOIN_ON_FINISH chunk names its Device buffer (and no Step)", ErrConfig)
		}
		if c.Device.Location() != p.cfg.Device {
			return fmt.Errorf("%w: the chunk's buffer is at %s, the pipeline's device is %s", ErrConfig, c.Device.Location(), p.cfg.Device)
		}
		size = c.Device.Size()
		if size > p.cfg.CloneBudgetBytes {
			return fmt.Errorf("%w: a device clone of %d bytes exceeds the whole GPU-byte budget (%d)", ErrConfig, size, p.cfg.CloneBudgetBytes)
		}
	}
	for _, r := range c.Rows {
		if _, ok := p.keys[r.Key]; !ok {
			return fmt.Errorf("%w: unknown key %q", ErrConfig, r.Key)
		}
		if r.Slot < 0 || r.Slot >= p.cfg.PoolSlots {
			return fmt.Errorf("%w: pool slot %d out of range [0, %d)", ErrConfig, r.Slot, p.cfg.PoolSlots)
		}
		// size ≥ 0 and RowBytes ≥ 1: size-RowBytes cannot wrap, where
		// Offset+RowBytes could.
		if r.Offset < 0 || r.Offset > size-p.cfg.RowBytes {
			return fmt.Errorf("%w: row (%s, %d) at offset %d does not fit in the save's %d bytes", ErrConfig, r.Key, r.Slot, r.Offset, size)
		}
	}
	return nil
}

// cloneChunk reserves the clone's GPU bytes and allocates the clone. In
// eager mode it copies c.Device into it here (after c.Freeze); otherwise
// the copy is started on the clone stream when the task takes the chunk
// (env.Accept), so that a refused chunk never started one.
func (p *Pipeline) cloneChunk(ctx context.Context, t *Task, ch *taskChunk, c Chunk) error {
	n := c.Device.Size()
	tk, err := p.budget.reserve(ctx, n, !c.NoWait, t.ID())
	if errors.Is(err, errSelfFlushed) {
		// Making room flushed this very task: the chunk goes to a fresh
		// task. Its state is the one the flush left it in: QUEUED (eager:
		// the flush ran its copy and pool write).
		st := Queued
		if p.cfg.Eager {
			if st = t.State(); st == Failed {
				return p.refusal(t, c.Rows)
			}
		}
		return &AppendRefusedError{Task: t.ID(), TaskName: t.Name(), State: st}
	}
	if err != nil {
		return err
	}
	// The reserve may have waited (and flushed this very task).
	if err := p.refusal(t, c.Rows); err != nil {
		_ = p.budget.release(context.Background(), tk)
		return err
	}
	clone, err := p.allocate(ctx, p.cfg.Device, n)
	if err != nil {
		_ = p.budget.release(context.Background(), tk)
		return err
	}
	ch.Clone, ch.Ticket = clone, tk
	if p.cfg.Eager {
		if err := p.syncCopy(ctx, clone, c.Device, c.Freeze); err != nil {
			ch.Clone = nil
			_ = p.free(clone)
			_ = p.budget.release(context.Background(), tk)
			return err
		}
		ch.CloneEvent = doneEvent{}
		return nil
	}
	ch.Src = c.Device
	if !p.cfg.skipFreezeWait {
		ch.Freeze = c.Freeze
	}
	return nil
}

// Submit hands tasks to the copy path: each Pending task becomes Queued on
// the low-priority copy queue (a JOIN_ON_FINISH task is submitted when its
// request finishes or is aborted). In eager mode the copy stage and the
// pool write run here, inline, and Submit returns the first failure.
func (p *Pipeline) Submit(ctx context.Context, tasks ...*Task) error {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.exit()
	return p.queue(ctx, prioLow, tasks...)
}

func (p *Pipeline) queue(ctx context.Context, prio int8, tasks ...*Task) error {
	for _, t := range tasks {
		if t.p != p {
			return fmt.Errorf("%w: %s belongs to another pipeline", ErrConfig, t.t.words())
		}
		err := p.sys.Enqueue(ctx, t.t, prio) // Pending → Queued leaves the deferred set (env.Queued)
		if err == nil && p.cfg.Eager {
			err = p.sys.RunInline(ctx, t.t)
		}
		if err != nil {
			if failure := p.Err(); failure != nil && ctx.Err() == nil {
				return failure // a failed task: the pipeline's record
			}
			return err
		}
	}
	return nil
}

// Prioritize moves tasks to the front of the copy queue: a Pending task
// becomes Queued there, a task Queued at low priority (Submit) moves up
// (its old place becomes a harmless duplicate); a task already queued high
// (a budget flush) or at the front, or whose copy stage is claimed, or
// done, is left alone. Unknown ids are ignored.
func (p *Pipeline) Prioritize(ctx context.Context, ids ...TaskID) error {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.exit()
	for _, id := range ids {
		p.mu.Lock()
		t := p.tasks[id]
		p.mu.Unlock()
		if t == nil {
			continue
		}
		if err := p.queue(ctx, prioFront, t); err != nil {
			return err
		}
	}
	return nil
}

// flushOldest escalates the deferred task with the oldest enqueue time to
// the high-priority queue (GPU-byte budget pressure) and returns it. False
// when none is left.
func (p *Pipeline) flushOldest() (TaskID, bool) {
	p.mu.Lock()
	var oldest *Task
	for _, t := range p.deferred {
		if oldest == nil || t.t.Seq < oldest.t.Seq {
			oldest = t
		}
	}
	if oldest != nil {
		delete(p.deferred, oldest.ID())
	}
	p.mu.Unlock()
	if oldest == nil {
		return 0, false
	}
	p.log.Debug().Uint64("task", uint64(oldest.ID())).Str("task_name", oldest.Name()).Msg("GPU-byte budget pressure: flushing the oldest deferred task")
	ctx := p.sys.Context()
	if err := p.sys.Enqueue(ctx, oldest.t, prioHigh); err == nil && p.cfg.Eager {
		_ = p.sys.RunInline(ctx, oldest.t)
	}
	return oldest.ID(), true
}
