package staging

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// env is the pipeline seen by its actors (actors.StagingEnv): the effects
// on the memory the pipeline owns.
type env Pipeline

var _ actors.StagingEnv = (*env)(nil)

// CopyStage: JOIN_NEXT_STEP waits for each chunk's whole-step device→host
// copy; JOIN_ON_FINISH first takes a pinned landing buffer (charged to the
// pinned location) for each chunk and enqueues every clone → landing copy
// on the landing stream, then waits for them. Config.OnCopyStarted is told
// once everything the stage waits for is enqueued. The stage waits for all
// of its copies, even after one failed, and then reports the first failure
// in chunk order: when it ends, none of its copies is still in flight, and
// whether it fails does not depend on which copy finished first.
func (e *env) CopyStage(ctx context.Context, t *actors.StagingTask, chunks []*actors.StagingChunk) error {
	p := (*Pipeline)(e)
	if t.Mode == messages.JoinNextStep {
		p.copyStarted(t)
		var first error
		for _, c := range chunks {
			if c.StepEvent == nil {
				continue
			}
			if err := c.StepEvent.Wait(ctx); err != nil {
				if ctx.Err() != nil {
					return err
				}
				if first == nil {
					first = fmt.Errorf("step device→host copy into slot %d: %w", c.Slot, err)
				}
			}
		}
		return first
	}
	lands := make([]*landing, 0, len(chunks))
	var own int64 // landing bytes this task already holds
	for _, c := range chunks {
		l, err := p.startLanding(ctx, c, own)
		if err != nil {
			p.abandonLandings(lands)
			return err
		}
		lands = append(lands, l)
		own += l.tk.bytes
	}
	p.copyStarted(t)
	var first error
	for i, l := range lands {
		err := p.waitLanding(ctx, l)
		if err != nil && ctx.Err() != nil {
			p.abandonLandings(lands[i:]) // ctx ended: free each once it lands
			for _, done := range lands[:i] {
				p.freeHost(done.host, done.tk)
			}
			return err
		}
		if err != nil && first == nil {
			first = err
		}
	}
	for _, l := range lands {
		if first != nil {
			p.freeHost(l.host, l.tk)
			continue
		}
		l.c.Host, l.c.HostTicket = l.host, l.tk
	}
	return first
}

func (p *Pipeline) copyStarted(t *actors.StagingTask) {
	if p.cfg.OnCopyStarted != nil {
		p.cfg.OnCopyStarted(t.ID)
	}
}

// landing is one clone → landing-buffer copy of a copy stage.
type landing struct {
	c    *actors.StagingChunk
	host cuda.Buffer
	tk   *ticket
	ev   cuda.Event // nil when eager (copied already)
}

// startLanding takes a landing buffer for c's clone (own: the landing
// bytes c's task already holds) and enqueues the copy into it, after the
// clone's own copy (eager: copies it now).
func (p *Pipeline) startLanding(ctx context.Context, c *actors.StagingChunk, own int64) (*landing, error) {
	n := c.Clone.Size()
	tk := &ticket{name: fmt.Sprintf("%s/host/%d", p.cfg.Name, p.hostSeq.Add(1)), bytes: n}
	if err := p.reserveLanding(ctx, tk.name, n, own); err != nil {
		return nil, fmt.Errorf("landing buffer for a %d-byte clone: %w", n, err)
	}
	host, err := p.be.Allocate(ctx, p.cfg.Pinned, n)
	if err != nil {
		_ = p.budget.release(context.Background(), tk)
		p.landingReleased(n)
		return nil, fmt.Errorf("landing buffer for a %d-byte clone: %w", n, err)
	}
	l := &landing{c: c, host: host, tk: tk}
	if p.cfg.Eager {
		err = p.syncCopy(ctx, host, c.Clone, c.CloneEvent)
	} else {
		l.ev, err = p.land.copyAfter(host, c.Clone, c.CloneEvent)
	}
	if err != nil {
		p.freeHost(host, tk)
		return nil, fmt.Errorf("device clone → host copy: %w", err)
	}
	return l, nil
}

// waitLanding waits for l's copy and returns its failure (or the clone's).
func (p *Pipeline) waitLanding(ctx context.Context, l *landing) error {
	if l.ev != nil {
		if err := l.ev.Wait(ctx); err != nil {
			if ctx.Err() != nil && !l.ev.Query() {
				return err
			}
			return fmt.Errorf("device clone → host copy: %w", err)
		}
	}
	if err := l.c.CloneEvent.Err(); err != nil { // the clone's own copy (complete by now)
		return fmt.Errorf("device clone → host copy: %w", err)
	}
	return nil
}

// abandonLandings frees landing buffers a failed copy stage will not hand
// to their chunks, each once its copy is done with it.
func (p *Pipeline) abandonLandings(ls []*landing) {
	for _, l := range ls {
		if l.ev == nil || l.ev.Query() {
			p.freeHost(l.host, l.tk)
			continue
		}
		p.afterEvent(l.ev, func() { p.freeHost(l.host, l.tk) })
	}
}

// reserveLanding reserves a landing buffer of n bytes at the pinned
// location. When the budget is short it waits for landing buffers of other
// tasks to be released (their pool writes free them), then tries again;
// with none held but its own task's (own bytes), waiting could never end,
// so the budget refusal is returned. Landing bytes in use are thus bounded
// by the pinned budget, and a burst of deferred tasks is slowed down, not
// failed.
func (p *Pipeline) reserveLanding(ctx context.Context, name string, n, own int64) error {
	for {
		p.landMu.Lock()
		freed := p.landFreed
		p.landMu.Unlock()
		err := p.rt.Reserve(ctx, p.cfg.Pinned, name, n)
		if err == nil {
			p.landMu.Lock()
			p.landHeld += n
			p.landMu.Unlock()
			return nil
		}
		var be *budget.BudgetError
		if !errors.As(err, &be) {
			return err
		}
		p.landMu.Lock()
		others := p.landHeld - own
		p.landMu.Unlock()
		select {
		case <-freed: // a landing buffer was released since: try again
			continue
		default:
		}
		if others <= 0 {
			return err
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// landingReleased accounts for a released landing buffer of n bytes and
// wakes the copy stages waiting for room.
func (p *Pipeline) landingReleased(n int64) {
	p.landMu.Lock()
	p.landHeld -= n
	close(p.landFreed)
	p.landFreed = make(chan struct{})
	p.landMu.Unlock()
}

func (p *Pipeline) freeHost(buf cuda.Buffer, tk *ticket) {
	_ = p.be.Free(buf)
	_ = p.budget.release(context.Background(), tk)
	p.landingReleased(tk.bytes)
}

// Accept takes chunk c into task at (called by its actor, which has
// checked that the copy stage is not claimed). In this order, each step
// able to refuse before anything is taken: a row the task lost to a later
// task refuses the chunk; a JOIN_NEXT_STEP chunk adds the task to its
// slot's holders, which needs the chunk's step still holding the slot; a
// JOIN_ON_FINISH chunk starts its clone copy (unless eager: copied
// already) and counts its bytes; then the task owns the chunk's rows, and
// the older tasks that wrote them lose them.
func (e *env) Accept(at *actors.StagingTask, state messages.TaskState, c *actors.StagingChunk) error {
	p := (*Pipeline)(e)
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
			return &AppendRefusedError{Task: at.ID, State: state, Reassigned: true}
		}
	}
	switch at.Mode {
	case messages.JoinNextStep:
		if err := p.slots.holdWith(c.Slot, holder{step: c.Step.(*Step)}, holder{task: at.ID}); err != nil {
			return err
		}
	case messages.JoinOnFinish:
		if c.CloneEvent == nil {
			ev, err := p.cloner.copyAfter(c.Clone, c.Src, c.Freeze)
			if err != nil {
				return err
			}
			c.CloneEvent = ev
		}
		c.Src, c.Freeze = nil, nil
		n := c.Clone.Size()
		t.clone += n
		if state == messages.TaskPending {
			p.deferred[at.ID] = t
		} else {
			p.budget.addInflight(n) // queued already: on its way out
		}
	}
	for _, k := range rows {
		if prev := p.owners[k]; prev != nil && prev != t {
			prev.lost[k] = struct{}{}
		}
		p.owners[k] = t
		t.has[k] = struct{}{}
	}
	return nil
}

// Queued: the task left Pending (submitted, prioritized or flushed): it is
// no longer deferred, and its clone bytes are on their way out.
func (e *env) Queued(at *actors.StagingTask, _ []*actors.StagingChunk) {
	p := (*Pipeline)(e)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.deferred, at.ID)
	if t := p.tasks[at.ID]; t != nil && !t.left {
		t.left = true
		p.budget.addInflight(t.clone)
	}
}

// HostReady drops the device clones and releases their budget tickets,
// all at once: waiting reserves see the task's bytes come back together.
// (The copy stage waited for each clone's copy before landing it.)
func (e *env) HostReady(at *actors.StagingTask, chunks []*actors.StagingChunk) {
	p := (*Pipeline)(e)
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
		_ = p.be.Free(c.Clone)
		c.Clone = nil
		tickets = append(tickets, c.Ticket.(*ticket))
	}
	_ = p.budget.releaseAll(context.Background(), tickets, leaving)
}

// dropClone frees c's clone and releases its ticket, once the clone copy
// has completed (at once if it has).
func (p *Pipeline) dropClone(c *actors.StagingChunk) {
	clone, ev, tk := c.Clone, c.CloneEvent, c.Ticket.(*ticket)
	c.Clone = nil
	release := func() {
		_ = p.be.Free(clone)
		_ = p.budget.release(context.Background(), tk)
	}
	if ev == nil || ev.Query() {
		release()
		return
	}
	p.afterEvent(ev, release)
}

// afterEvent runs f once ev completes, on a goroutine Close waits for.
func (p *Pipeline) afterEvent(ev cuda.Event, f func()) {
	p.cleanup.Add(1)
	p.pendingFrees.Add(1)
	go func() {
		defer p.cleanup.Done()
		<-ev.Done()
		f()
		p.pendingFrees.Add(-1)
	}()
}

// PoolWrite scatters the plan's rows into the CPU block pool, reading each
// chunk's host bytes (the staging slot, or the landed clone) in place: one
// copy per byte, slot → pool. Rows that follow each other both in the
// chunk and in the pool are written as one run (one copy() of the whole
// run: a step whose rows land on consecutive pool rows is written with a
// single large copy, which the Go runtime does with non-temporal stores
// beyond 1 MiB).
//
// A row that a later task took (its newest append is another task's) is
// skipped: ownership is read under the pool's lock, row by row, so the
// newest append wins whatever order the two tasks are written in.
func (e *env) PoolWrite(ctx context.Context, t *actors.StagingTask, chunks []*actors.StagingChunk, plan []actors.ScatterRow) error {
	p := (*Pipeline)(e)
	n := p.cfg.RowBytes
	p.mu.Lock()
	task := p.tasks[t.ID]
	p.mu.Unlock()
	// Pool offsets, checked before anything is written.
	offs := make([]int64, len(plan))
	sorted := true // plan rows in chunk order (always, for one chunk)
	for i, r := range plan {
		off, err := p.poolOffset(r.Key, r.Slot)
		if err != nil {
			return err
		}
		offs[i] = off
		if i > 0 && r.Chunk < plan[i-1].Chunk {
			sorted = false
		}
	}
	order := make([]int, len(plan))
	for i := range order {
		order[i] = i
	}
	if !sorted {
		slices.SortStableFunc(order, func(a, b int) int { return plan[a].Chunk - plan[b].Chunk })
	}
	var written int64
	for lo := 0; lo < len(order); {
		ci := plan[order[lo]].Chunk
		hi := lo
		for hi < len(order) && plan[order[hi]].Chunk == ci {
			hi++
		}
		c := chunks[ci]
		src := c.Host
		if t.Mode == messages.JoinNextStep {
			src = c.SlotBuf
		}
		chunkRows := order[lo:hi]
		var rows []int
		err := p.hostView(ctx, src, func(b []byte) {
			p.poolMu.Lock()
			taken := func(r int) bool { return p.owners[offs[r]/n] != task }
			rows = chunkRows
			p.mu.Lock()
			if slices.ContainsFunc(chunkRows, taken) {
				rows = slices.DeleteFunc(slices.Clone(chunkRows), taken)
			}
			p.mu.Unlock()
			for i := 0; i < len(rows); {
				// The run of rows contiguous in both the chunk and the pool.
				first := rows[i]
				j := i + 1
				for j < len(rows) {
					prev, next := rows[j-1], rows[j]
					if plan[next].Offset != plan[prev].Offset+n || offs[next] != offs[prev]+n {
						break
					}
					j++
				}
				run := int64(j-i) * n
				so, do := plan[first].Offset, offs[first]
				copy(p.pool[do:do+run], b[so:so+run])
				i = j
			}
			p.poolMu.Unlock()
		})
		if err != nil {
			return fmt.Errorf("pool write: %w", err)
		}
		written += int64(len(rows)) * n
		lo = hi
	}
	p.mu.Lock()
	p.counts.committedBytes += written
	p.mu.Unlock()
	return nil
}

// Written releases the task's slot holds and landing buffers, and wakes
// the reserves waiting for the clone bytes it released at HOST_READY.
func (e *env) Written(t *actors.StagingTask, chunks []*actors.StagingChunk) {
	p := (*Pipeline)(e)
	p.releaseChunks(t, chunks)
	p.forget(t, false)
	if t.Mode == messages.JoinOnFinish {
		p.budget.wakeAll()
	}
}

// Failed publishes the pipeline's failure record, then releases every
// budget ticket, slot hold and buffer of the task. The task's actor wakes
// its waiters only after this returns.
func (e *env) Failed(t *actors.StagingTask, chunks []*actors.StagingChunk, err error) {
	p := (*Pipeline)(e)
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
	if t.Mode == messages.JoinOnFinish {
		p.budget.wakeAll() // its clones may have come back at HOST_READY
	}
}

func (p *Pipeline) releaseChunks(t *actors.StagingTask, chunks []*actors.StagingChunk) {
	for _, c := range chunks {
		if t.Mode == messages.JoinNextStep {
			if err := p.slots.release(c.Slot, holder{task: t.ID}); err != nil {
				p.log.Error().Err(err).Uint64("task", uint64(t.ID)).Msg("slot release")
			}
		}
		if c.Host != nil {
			p.freeHost(c.Host, c.HostTicket.(*ticket))
			c.Host = nil
		}
	}
}

// forget drops a terminal task from the pipeline's tables.
func (p *Pipeline) forget(t *actors.StagingTask, failed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if task := p.tasks[t.ID]; task != nil {
		for k := range task.has {
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
// more. Those failures are sent, not awaited (the caller is a task actor),
// and leave alone a task whose copy stage was claimed meanwhile (its copy
// stage owns its chunks, and ends it).
func (p *Pipeline) publishFailure(t *actors.StagingTask, err error) {
	p.mu.Lock()
	if p.failure != nil || p.closing {
		p.mu.Unlock()
		return
	}
	p.failure = &FailedError{Task: t.ID, Err: err}
	rec := p.failure
	var pending []*Task
	for _, other := range p.tasks {
		if other.t != t && other.State() == messages.TaskPending {
			pending = append(pending, other)
		}
	}
	p.mu.Unlock()
	p.log.Warn().Err(err).Uint64("task", uint64(t.ID)).Msg("pipeline failed; later entries return this failure")
	p.budget.fail(rec)
	for _, o := range pending {
		p.st.FailAsync(o.t, rec)
	}
}

// hostView runs f on the bytes of a host buffer in place. The backend
// interface has no call that maps a buffer; Backend.Load runs a function on
// a buffer's own bytes, which for host memory (pinned memory is host
// addressable on real devices too) is exactly a view. f must not keep b.
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
