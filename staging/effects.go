package staging

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/residency-go/residency/cuda"
)

// The effects of a task's moves on the memory the pipeline owns. The
// task's actor (task_actor.go) decides when each runs, one at a
// time per task; accept, onQueued, onHostReady, onWritten and onFailed run
// in the task actor's Receive and never block on another task. The pool write
// (poolwrite.go) runs on the committer (or inline when eager).

// accept takes chunk c into task at (called by the task's actor, in
// its append, which has checked that the copy stage is not claimed). In this order, each step
// able to refuse before anything is taken: a row the task lost to a later
// task refuses the chunk; a JOIN_NEXT_STEP chunk adds the task to its
// slot's holders, which needs the chunk's step still holding the slot; a
// JOIN_ON_FINISH chunk starts its clone copy (unless eager: copied
// already) and counts its bytes; then the task owns the chunk's rows, and
// the older tasks that wrote them lose them.
func (p *Pipeline) accept(at *taskRef, state TaskState, c *taskChunk) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tasks[at.ID]
	if t == nil {
		return ErrClosed // not reached: a task is known until it is done
	}
	rows := make([]int, len(c.Rows))
	for i, r := range c.Rows {
		rows[i] = p.poolRow(p.keys[r.Key], r.Slot) // checked by checkChunk
		if _, lost := t.lost[rows[i]]; lost {
			return &AppendRefusedError{Task: at.ID, TaskName: at.Name, State: state, Reassigned: true}
		}
	}
	switch at.Mode {
	case JoinNextStep:
		if err := p.slots.holdWith(c.Slot, holder{step: c.Step}, holder{task: at.ID}); err != nil {
			return err
		}
	case JoinOnFinish:
		if c.CloneEvent == nil {
			ev, err := p.cloner.copyAfter(c.Clone, c.Src, c.Freeze)
			if err != nil {
				return err
			}
			c.CloneEvent = ev
			p.cloning = append(pruneDone(p.cloning), ev)
		}
		c.Src, c.Freeze = nil, nil
		n := c.Clone.Size()
		t.clone += n
		if state == Pending {
			p.deferred[at.ID] = t
		} else {
			p.budget.addInflight(n) // queued already: on its way out
		}
	}
	for _, k := range rows {
		if prev := p.owners[k]; prev != nil && prev != t {
			if prev.lost == nil {
				prev.lost = map[int]struct{}{}
			}
			prev.lost[k] = struct{}{}
		}
		p.owners[k] = t
	}
	t.has = addRows(t.has, rows)
	return nil
}

// addRows adds rows to has (increasing, each once) and returns it; rows
// may become has's array.
func addRows(has, rows []int) []int {
	if len(has) == 0 && increasing(rows) {
		return rows // the common case: one chunk, rows in order
	}
	has = append(has, rows...)
	slices.Sort(has)
	return slices.Compact(has)
}

func increasing(rows []int) bool {
	for i := 1; i < len(rows); i++ {
		if rows[i] <= rows[i-1] {
			return false
		}
	}
	return true
}

// pruneDone drops the completed events at the front of evs (the clone
// stream runs its copies in order, so they complete in order).
func pruneDone(evs []cuda.Event) []cuda.Event {
	i := 0
	for i < len(evs) && evs[i].Query() {
		evs[i] = nil
		i++
	}
	if i == len(evs) {
		return evs[:0]
	}
	return evs[i:]
}

// onQueued: the task left Pending (submitted, prioritized or flushed): it is
// no longer deferred, and its clone bytes are on their way out.
func (p *Pipeline) onQueued(at *taskRef) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.deferred, at.ID)
	if t := p.tasks[at.ID]; t != nil && !t.left {
		t.left = true
		p.budget.addInflight(t.clone)
	}
}

// onHostReady drops the device clones and releases their budget tickets,
// all at once: waiting reserves see the task's bytes come back together.
// (The copy stage waited for each clone's copy before landing it.)
func (p *Pipeline) onHostReady(at *taskRef, chunks []*taskChunk) {
	p.mu.Lock()
	var leaving int64
	if t := p.tasks[at.ID]; t != nil {
		if t.left {
			leaving = t.clone
		}
		t.clone = 0
	}
	p.mu.Unlock()
	var tickets []*ticket
	for _, c := range chunks {
		if c.Clone == nil {
			continue
		}
		if c.CloneEvent != nil && !c.CloneEvent.Query() {
			p.dropClone(c) // not reached: the landing copy waited for it
			continue
		}
		_ = p.free(c.Clone)
		c.Clone = nil
		tickets = append(tickets, c.Ticket)
	}
	_ = p.budget.releaseAll(context.Background(), tickets, leaving)
}

// dropClone frees c's clone and releases its ticket, once the clone copy
// has completed (at once if it has).
func (p *Pipeline) dropClone(c *taskChunk) {
	clone, ev, tk := c.Clone, c.CloneEvent, c.Ticket
	c.Clone = nil
	release := func() {
		_ = p.free(clone)
		_ = p.budget.release(context.Background(), tk)
	}
	p.afterCopy(ev, tk, release)
}

// afterCopy runs f, the free of tk's buffer, once ev (the copy that uses
// the buffer) completes: at once if it has, else on a goroutine Close
// waits for. With Config.Serial f is held instead (see FreeHeld) unless ev
// is nil or eager (complete from the start).
func (p *Pipeline) afterCopy(ev cuda.Event, tk *ticket, f func()) {
	if p.serial() && ev != nil {
		if _, done := ev.(doneEvent); !done {
			p.heldMu.Lock()
			p.held = append(p.held, heldFree{ev: ev, tk: tk, free: f})
			p.pendingFrees.Add(1)
			p.heldMu.Unlock()
			return
		}
	}
	if ev == nil || ev.Query() {
		f()
		return
	}
	p.cleanup.Add(1)
	p.pendingFrees.Add(1)
	go func() {
		defer p.cleanup.Done()
		<-ev.Done()
		f()
		p.pendingFrees.Add(-1)
	}()
}

// heldFree is a free that waits for a copy, held for FreeHeld (Serial).
type heldFree struct {
	ev   cuda.Event
	tk   *ticket
	free func()
}

// serial: the pipeline runs with Config.Serial (and copies on streams).
func (p *Pipeline) serial() bool { return p.cfg.Serial && !p.cfg.Eager }

// FreeHeld frees the buffers whose free waits for a copy (counted in
// Stats.PendingFrees: after a failure, device clones and landing buffers
// that a copy still used) and whose copy has completed since, and returns
// how many it freed. Only a pipeline with Config.Serial holds them: it
// frees such a buffer here or in Close, never on its own, so that the
// moment its reservation is released is the caller's. They are freed
// device clones first, then landing buffers, each in the order their
// reservations were made. Without Serial they are freed as soon as their
// copies complete, and FreeHeld returns 0.
func (p *Pipeline) FreeHeld() int {
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	var ready []heldFree
	kept := p.held[:0]
	for _, h := range p.held {
		if h.ev.Query() {
			ready = append(ready, h)
		} else {
			kept = append(kept, h)
		}
	}
	clear(p.held[len(kept):])
	p.held = kept
	slices.SortFunc(ready, func(a, b heldFree) int {
		if a.tk.gpu != b.tk.gpu {
			if a.tk.gpu {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.tk.seq, b.tk.seq)
	})
	for _, h := range ready {
		h.free()
		p.pendingFrees.Add(-1)
	}
	return len(ready)
}

// freeAllHeld waits for the copies of the held frees and runs them (Close).
func (p *Pipeline) freeAllHeld() {
	p.heldMu.Lock()
	evs := make([]cuda.Event, 0, len(p.held))
	for _, h := range p.held {
		evs = append(evs, h.ev)
	}
	p.heldMu.Unlock()
	for _, ev := range evs {
		<-ev.Done()
	}
	p.FreeHeld()
}

// onWritten releases the task's slot holds and landing buffers, and wakes
// the reserves waiting for the clone bytes it released at HOST_READY.
func (p *Pipeline) onWritten(t *taskRef, chunks []*taskChunk) {
	p.releaseChunks(t, chunks)
	p.forget(t, false)
	if t.Mode == JoinOnFinish {
		p.budget.wakeAll()
	}
}

// onFailed publishes the pipeline's failure record, then releases every
// budget ticket, slot hold and buffer of the task. The task's waiters are
// woken only after this returns.
func (p *Pipeline) onFailed(t *taskRef, chunks []*taskChunk, err error) {
	p.publishFailure(t, err)
	p.mu.Lock()
	if task := p.tasks[t.ID]; task != nil {
		if task.left {
			p.budget.addInflight(-task.clone)
		}
		task.clone = 0
	}
	p.mu.Unlock()
	for _, c := range chunks {
		if c.Clone != nil {
			p.dropClone(c)
		}
	}
	p.releaseChunks(t, chunks)
	p.forget(t, true)
	if t.Mode == JoinOnFinish {
		p.budget.wakeAll() // its clones may have come back at HOST_READY
	}
}

func (p *Pipeline) releaseChunks(t *taskRef, chunks []*taskChunk) {
	for _, c := range chunks {
		if t.Mode == JoinNextStep {
			if err := p.slots.release(c.Slot, holder{task: t.ID}); err != nil {
				p.log.Error().Err(err).Uint64("task", uint64(t.ID)).Str("task_name", t.Name).Msg("slot release")
			}
		}
		if c.Host != nil {
			p.freeHost(c.Host, c.HostTicket)
			c.Host = nil
		}
	}
}

// forget drops a terminal task from the pipeline's tables.
func (p *Pipeline) forget(t *taskRef, failed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if task := p.tasks[t.ID]; task != nil {
		for _, k := range task.has {
			if p.owners[k] == task {
				p.owners[k] = nil
			}
		}
	}
	delete(p.tasks, t.ID)
	delete(p.deferred, t.ID)
	if failed {
		p.counts.failed++
	} else {
		p.counts.written++
	}
}

// publishFailure records the pipeline's first failure (unless it is
// closing: a task failed by Close is no pipeline failure) and fails every
// task that is still Pending: no entry of the pipeline will submit it any
// more. Those failures are messages to the pending tasks' actors, sent
// from the failing task's actor without waiting for an answer (no task
// actor waits for another), and each leaves alone a task whose copy stage
// was claimed meanwhile (its copy stage owns its chunks, and ends it).
func (p *Pipeline) publishFailure(t *taskRef, err error) {
	p.mu.Lock()
	if p.failure != nil || p.closing {
		p.mu.Unlock()
		return
	}
	p.failure = &FailedError{Task: t.ID, TaskName: t.Name, Err: err}
	rec := p.failure
	var pending []*Task
	for _, other := range p.tasks {
		if other.t != t && other.State() == Pending {
			pending = append(pending, other)
		}
	}
	p.mu.Unlock()
	// Oldest first, like Close: the order of their releases does not
	// depend on the map's.
	slices.SortFunc(pending, func(a, b *Task) int { return cmp.Compare(a.t.Seq, b.t.Seq) })
	p.log.Warn().Err(err).Uint64("task", uint64(t.ID)).Str("task_name", t.Name).Msg("pipeline failed; later entries return this failure")
	p.reportFailure(t.ID, err)
	p.budget.fail(rec)
	for _, o := range pending {
		p.sys.FailAsync(o.t, rec)
	}
}

// hostView runs f on the bytes of a host buffer in place, through
// Backend.Load: a function run on the buffer's own bytes, a
// reconstruction at the buffer's location (which a fault injector may
// fail). f must not keep b. (The CPU block pool is read and written
// through its host view instead: pool.go.)
func (p *Pipeline) hostView(ctx context.Context, buf cuda.Buffer, f func(b []byte)) error {
	return p.be.Load(ctx, buf, buf.Location(), func(_ context.Context, b []byte) error {
		f(b)
		return nil
	})
}

// lockedStream is one of the pipeline's copy streams. A stream reports a
// failed copy to the first event recorded after it, so each wait, copy and
// record triple is enqueued under mu: every event speaks for its own copy.
type lockedStream struct {
	cuda.Stream
	mu sync.Mutex
}

// copyAfter enqueues dst←src after wait (nil: no wait) and records the
// event of that copy.
func (s *lockedStream) copyAfter(dst, src cuda.Buffer, wait cuda.Event) (cuda.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if wait != nil {
		if err := s.WaitEvent(wait); err != nil {
			return nil, err
		}
	}
	if err := s.CopyAsync(dst, src); err != nil {
		return nil, err
	}
	return s.Record()
}

// doneEvent is an event that has already completed without error (eager
// mode's copies are synchronous).
type doneEvent struct{}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (doneEvent) Done() <-chan struct{}      { return closedCh }
func (doneEvent) Err() error                 { return nil }
func (doneEvent) Query() bool                { return true }
func (doneEvent) Wait(context.Context) error { return nil }
