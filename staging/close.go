package staging

import (
	"cmp"
	"context"
	"slices"
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
// Close returns ctx's error after releasing everything all the same. Close is idempotent: later calls return the
// first result. Stats keeps working after Close.
func (p *Pipeline) Close(ctx context.Context) error {
	p.closeOnce.Do(func() { p.closeErr = p.close(ctx) })
	return p.closeErr
}

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
	if err != nil {
		ctxErr = err
		p.sys.Abort()
		p.failUnclaimed(err)
		<-idle
		// An entry in flight until now may have opened a task: fail it
		// too (no entry starts any more), or the drain waits for it.
		p.failUnclaimed(err)
		_ = p.drain(context.Background())
	}
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
	return ctxErr
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
