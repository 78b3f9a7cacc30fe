package staging

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Close shuts the pipeline down. New entries get ErrClosed at once and
// waits for a slot or for budget end with ErrClosed; every task that has
// not failed is written (pending tasks are submitted: a JOIN_ON_FINISH
// task's clone is flushed); then the copy streams drain, steps not yet
// released lose their hold, every slot and landing buffer and the CPU
// block pool are freed (through their locations' actors) and the
// pipeline's reservations are released, so the runtime's locations are
// back to what they were before New.
//
// If ctx ends first, the work in flight is cancelled: the unfinished tasks
// whose copy stage is not claimed fail with ctx's error, those whose copy
// stage or pool write runs stop on the cancellation and fail with it, and
// Close returns ctx's error after releasing everything all the same.
// What cannot end on the cancellation — a copy or a slot buffer waiting
// for a freeze event only the application can fire — is not waited for
// past closeGrace after ctx's end: Close then returns a
// [*CloseIncompleteError] (matching ctx's error) that names it, and the
// rest of the close (those buffers freed, the pool, the streams, the
// reservations) finishes when it ends. A later call of Close waits for
// that with its own context. The runtime's Close (package system) closes
// a pipeline opened on it first, with its context.
//
// Close is idempotent: later calls return the first result once the
// close has finished (or when their context ends first) — except that a
// *CloseIncompleteError is reported only while its work runs: once the
// rest of the close has finished, a later call returns the plain ctx
// error the first call matched. Stats keeps working after Close.
func (p *Pipeline) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		if p.unregister != nil {
			p.unregister() // closed by the application: not by the runtime's Close again
		}
		p.finished = make(chan struct{})
		p.closeErr = p.close(ctx)
	})
	if p.finished == nil {
		return p.closeErr // not reached: Do has set it
	}
	select {
	case <-p.finished:
		return p.closeFinalErr()
	case <-ctx.Done():
		return p.closeErr
	}
}

// closeFinalErr is Close's result once the close has finished: its
// context's error when the close was cut short (a close that had to leave
// work running reports it no more once that work ended), nil otherwise.
func (p *Pipeline) closeFinalErr() error {
	var inc *CloseIncompleteError
	if errors.As(p.closeErr, &inc) {
		return inc.Err
	}
	return p.closeErr
}

// closeGrace bounds how long Close waits, after its context ended, for the
// work the cancellation stops to end.
const closeGrace = time.Second

// CloseIncompleteError: Close's context ended while work that its
// cancellation cannot stop was still running — a copy stage waiting for
// a freeze event, a slot whose last copy waits for one — so Close
// returned without freeing what that work uses. The rest of the close
// runs when it ends (call Close again to wait for it). It matches Err
// (errors.Is: context.Canceled or context.DeadlineExceeded).
type CloseIncompleteError struct {
	Err error
	// Tasks is how many tasks had not finished (a copy stage waits for a
	// freeze event); Slots how many staging slots' last copy waited for
	// one.
	Tasks, Slots int
	// Waiting says the same in words.
	Waiting string
}

func (e *CloseIncompleteError) Error() string {
	return fmt.Sprintf("staging: close cut short (%v): %s; the pipeline's buffers and reservations are released when it ends", e.Err, e.Waiting)
}

// Unwrap returns Err.
func (e *CloseIncompleteError) Unwrap() error { return e.Err }

func (p *Pipeline) close(ctx context.Context) error {
	p.mu.Lock()
	p.closing = true
	idle := make(chan struct{})
	if p.active == 0 {
		close(idle)
	} else {
		p.idle = idle
	}
	p.mu.Unlock()
	p.stopDemotions()
	p.slots.close()
	p.budget.fail(ErrClosed)

	// Submit what is pending, wait for the entries in flight (one of them
	// may be waiting for a pending task), then submit what they opened.
	p.submitPending(ctx)
	select {
	case <-idle:
	case <-ctx.Done():
	}
	p.submitPending(ctx)
	var ctxErr error
	err := p.drain(ctx)
	if err == nil {
		select {
		case <-idle:
		default:
			// ctx ended while entries were in flight (a Stage allocating
			// its slot's buffer, an Append): what they add is not drained
			// yet, so close as on a cut-short drain, once they are out.
			err = ctx.Err()
		}
	}
	var wait func()
	if err != nil {
		ctxErr = err
		p.sys.Abort()
		p.failUnclaimed(err)
		wait = func() {
			<-idle
			// An entry in flight until now may have opened a task: fail it
			// too (no entry starts any more), or the drain waits for it.
			p.failUnclaimed(err)
			_ = p.drain(context.Background())
		}
	}
	go func() {
		defer close(p.finished)
		if wait != nil {
			wait()
		}
		p.finish()
	}()
	return p.awaitFinish(ctx, ctxErr)
}

// awaitFinish waits for the close's finish until ctx ends and closeGrace
// more: its result is ctxErr once finished, else a *CloseIncompleteError
// naming what still runs.
func (p *Pipeline) awaitFinish(ctx context.Context, ctxErr error) error {
	select {
	case <-p.finished:
		return ctxErr
	case <-ctx.Done():
	}
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-p.finished:
		return cmp.Or(ctxErr, ctx.Err())
	case <-grace.C:
	}
	tasks, slots := p.stillRunning()
	waiting := fmt.Sprintf("%d tasks not finished (a copy stage waits for a freeze event), %d staging slots whose last copy waits for a freeze event", tasks, slots)
	p.log.Warn().Int("tasks", tasks).Int("slots", slots).Msg("close cut short; the rest of the close finishes when that work ends")
	return &CloseIncompleteError{Err: cmp.Or(ctxErr, ctx.Err()), Tasks: tasks, Slots: slots, Waiting: waiting}
}

// stillRunning counts what an unfinished close waits for: tasks not
// terminal, and slots whose last copy has not ended.
func (p *Pipeline) stillRunning() (tasks, slots int) {
	p.mu.Lock()
	for _, t := range p.tasks {
		if !t.State().Terminal() {
			tasks++
		}
	}
	p.mu.Unlock()
	for _, sl := range p.slots.slots {
		if sl.buf != nil && sl.last != nil {
			select {
			case <-sl.last.Done():
			default:
				slots++
			}
		}
	}
	return tasks, slots
}

// finish is the end of the close, once no entry is in flight and every
// task is terminal: held chunks and steps released, slot buffers freed
// once their last copy ended, the pool, the streams, the reservations.
func (p *Pipeline) finish() {
	p.freeAllHeld()
	p.cleanup.Wait()

	p.mu.Lock()
	steps := make([]*Step, 0, len(p.steps))
	for s := range p.steps {
		steps = append(steps, s)
	}
	p.mu.Unlock()
	if len(steps) > 0 {
		p.log.Warn().Int("steps", len(steps)).Msg("closing with steps never released; releasing their slots")
	}
	for _, s := range steps {
		_ = s.Release()
	}
	for _, sl := range p.slots.slots {
		if sl.buf == nil {
			continue
		}
		if sl.last != nil {
			<-sl.last.Done()
		}
		_ = p.free(sl.buf)
		sl.buf, sl.last = nil, nil
	}
	p.freePool()     // every task is terminal and no entry is in flight: nothing writes or reads it
	p.demo.wg.Wait() // a demotion copy running on the landing stream
	for _, s := range []*lockedStream{p.d2h, p.cloner, p.land} {
		if s != nil {
			_ = s.Close()
		}
	}
	bg := context.Background()
	_ = p.rt.Unreserve(bg, p.cfg.Name+"/slots")
	_ = p.rt.Unreserve(bg, p.cfg.Name+"/pool")
	p.sys.Stop()
	p.log.Debug().Msg("pipeline closed")
}

// failUnclaimed fails every task of the pipeline whose copy stage is not
// claimed. A claimed task ends on its own: its copy stage or pool write
// stops on the aborted context (and owns its chunks until then).
func (p *Pipeline) failUnclaimed(err error) {
	p.mu.Lock()
	left := make([]*Task, 0, len(p.tasks))
	for _, t := range p.tasks {
		left = append(left, t)
	}
	p.mu.Unlock()
	for _, t := range left {
		p.sys.FailUnclaimed(t.t, err)
	}
}

// drain waits until every task of the pipeline is terminal, or ctx ends.
func (p *Pipeline) drain(ctx context.Context) error {
	p.mu.Lock()
	left := make([]*Task, 0, len(p.tasks))
	for _, t := range p.tasks {
		left = append(left, t)
	}
	p.mu.Unlock()
	for _, t := range left {
		select {
		case <-t.t.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// submitPending queues every pending task, oldest first (Close writes
// them).
func (p *Pipeline) submitPending(ctx context.Context) {
	p.mu.Lock()
	var pending []*Task
	for _, t := range p.tasks {
		if t.State() == Pending {
			pending = append(pending, t)
		}
	}
	p.mu.Unlock()
	slices.SortFunc(pending, func(a, b *Task) int { return cmp.Compare(a.t.Seq, b.t.Seq) })
	for _, t := range pending {
		if err := p.queue(ctx, prioLow, t); err != nil && ctx.Err() != nil {
			return
		}
	}
}
