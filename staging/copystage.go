package staging

import (
	"context"
	"errors"
	"fmt"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
)

// The copy stage of a task, run by the copy queue (or inline when eager):
// it brings the task's rows to host memory. JOIN_ON_FINISH lands each
// device clone in a pinned landing buffer, bounded by the pinned budget.

// copyStage: JOIN_NEXT_STEP waits for each chunk's whole-step device→host
// copy; JOIN_ON_FINISH first takes a pinned landing buffer (charged to the
// pinned location) for each chunk and enqueues every clone → landing copy
// on the landing stream, then waits for them. Config.OnCopyStarted is told
// once everything the stage waits for is enqueued. The stage waits for all
// of its copies, even after one failed, and then reports the first failure
// in chunk order: when it ends, none of its copies is still in flight, and
// whether it fails does not depend on which copy finished first.
func (p *Pipeline) copyStage(ctx context.Context, t *taskRef, chunks []*taskChunk) error {
	if t.Mode == JoinNextStep {
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
	// Every landing buffer first, then every copy: a stage that cannot
	// take all of its landing buffers enqueues no copy, and its failure
	// leaves nothing in flight.
	lands := make([]*landing, 0, len(chunks))
	var own int64 // landing bytes this task already holds
	for _, c := range chunks {
		l, err := p.takeLanding(ctx, c, own)
		if err != nil {
			p.abandonLandings(lands)
			return err
		}
		lands = append(lands, l)
		own += l.tk.bytes
	}
	for i, l := range lands {
		if err := p.startLanding(ctx, l); err != nil {
			p.abandonLandings(lands[:i])        // copies enqueued: freed once done
			for _, later := range lands[i+1:] { // no copy: freed now
				p.freeHost(later.host, later.tk)
			}
			return err
		}
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

func (p *Pipeline) copyStarted(t *taskRef) {
	if p.cfg.OnCopyStarted != nil {
		p.cfg.OnCopyStarted(t.ID)
	}
}

// landing is one clone → landing-buffer copy of a copy stage.
type landing struct {
	c    *taskChunk
	host cuda.Buffer
	tk   *ticket
	ev   cuda.Event // nil when eager (copied already)
}

// takeLanding reserves and allocates a landing buffer for c's clone (own:
// the landing bytes c's task already holds).
func (p *Pipeline) takeLanding(ctx context.Context, c *taskChunk, own int64) (*landing, error) {
	n := c.Clone.Size()
	seq := p.hostSeq.Add(1)
	tk := &ticket{name: fmt.Sprintf("%s/host/%d", p.cfg.Name, seq), seq: seq, bytes: n}
	if err := p.reserveLanding(ctx, tk.name, n, own); err != nil {
		return nil, fmt.Errorf("landing buffer for a %d-byte clone: %w", n, err)
	}
	host, err := p.allocate(ctx, p.cfg.Pinned, n)
	if err != nil {
		_ = p.budget.release(context.Background(), tk)
		p.landingReleased(n)
		return nil, fmt.Errorf("landing buffer for a %d-byte clone: %w", n, err)
	}
	return &landing{c: c, host: host, tk: tk}, nil
}

// startLanding enqueues the copy of l's clone into its landing buffer,
// after the clone's own copy (eager: copies it now). On error l's buffer
// is freed.
func (p *Pipeline) startLanding(ctx context.Context, l *landing) error {
	var err error
	if p.cfg.Eager {
		err = p.syncCopy(ctx, l.host, l.c.Clone, l.c.CloneEvent)
	} else {
		l.ev, err = p.land.copyAfter(l.host, l.c.Clone, l.c.CloneEvent)
	}
	if err != nil {
		p.freeHost(l.host, l.tk)
		return fmt.Errorf("device clone → host copy: %w", err)
	}
	return nil
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
		p.afterCopy(l.ev, l.tk, func() { p.freeHost(l.host, l.tk) })
	}
}

// reserveLanding reserves a landing buffer of n bytes at the pinned
// location, in the group of the cap "<Name>/landings" of
// Config.CloneBudgetBytes (the landing buffers of a task are the size of
// its clones, which that figure bounds). When the budget or the cap is
// short it waits for landing buffers of other tasks to be released (their
// pool writes free them), then tries again; with none held but its own
// task's (own bytes), waiting could never end, so the refusal is
// returned. Landing bytes in use are thus bounded by the cap and the
// pinned budget, and a burst of deferred tasks is slowed down, not
// failed. Like the clones, landing buffers order themselves: they are not
// refused for room that callers waiting at the pinned location hold
// (they would fail or stall the pipeline for an unrelated caller), and
// such a caller waits for at most the cap's bytes of them in flight.
func (p *Pipeline) reserveLanding(ctx context.Context, name string, n, own int64) error {
	for {
		p.landMu.Lock()
		freed := p.landFreed
		p.landMu.Unlock()
		err := p.rt.ReserveCapped(ctx, p.cfg.Pinned, name, p.cfg.Name+"/landings", p.cfg.CloneBudgetBytes, n)
		if err == nil {
			p.landMu.Lock()
			p.landHeld += n
			p.landMu.Unlock()
			return nil
		}
		var be *budget.BudgetError
		var ce *budget.CapError
		if !errors.As(err, &be) && !errors.As(err, &ce) {
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
	_ = p.free(buf)
	_ = p.budget.release(context.Background(), tk)
	p.landingReleased(tk.bytes)
}
