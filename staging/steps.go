package staging

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/residency-go/residency/cuda"
)

// Steps: a whole step staged in a slot by one device→host copy.

// Step is one whole step staged in a slot by [Pipeline.Stage]. The step
// holds its slot until Release; each JOIN_NEXT_STEP task whose chunk names
// the step holds it too, until its pool write.
type Step struct {
	p        *Pipeline
	slot     int
	buf      cuda.Buffer
	ev       cuda.Event
	bytes    int64
	released atomic.Bool
}

// Slot returns the index of the step's staging slot.
func (s *Step) Slot() int { return s.slot }

// Bytes returns the size of the step's device→host copy (0 for a
// leftover-only step).
func (s *Step) Bytes() int64 { return s.bytes }

// Event returns the event of the step's device→host copy (nil for a
// leftover-only step). Reuse the step's device buffer only after it.
func (s *Step) Event() cuda.Event { return s.ev }

// Release drops the step's hold on its slot (call it when the step is
// materialized or discarded). The slot is free again once every task bound
// to it has been written too. A second Release returns an error.
func (s *Step) Release() error {
	if s.released.Swap(true) {
		return fmt.Errorf("staging: step in slot %d released twice", s.slot)
	}
	s.p.mu.Lock()
	delete(s.p.steps, s)
	s.p.mu.Unlock()
	return s.p.slots.release(s.slot, holder{step: s})
}

// Stage claims a staging slot for one step and launches ONE device→host
// copy of the whole of dev into it, on the pipeline's copy stream, ordered
// after freeze (the event after which the step's rows are final; nil: no
// wait). A nil dev is a leftover-only save: it still takes a slot, and
// copies nothing. Stage returns once the copy is enqueued, not landed.
//
// A full pool waits for a slot to be released (see Step.Release) up to
// Config.ClaimTimeout (0 or less: not at all) or ctx: *SlotTimeoutError.
// A free slot whose buffer has another size than dev, and whose last copy
// has not landed, is not ready (its buffer cannot be reallocated yet): the
// lowest ready free slot is taken; when free slots exist but none is
// ready, the claim waits for one to become ready, up to ClaimTimeout when
// it is positive, else under ctx only (that copy may wait for its step's
// freeze event).
// A dev larger than a slot is a configuration error: *SlotOverflowError.
// In eager mode the copy runs here, synchronously, after waiting freeze.
func (p *Pipeline) Stage(ctx context.Context, dev cuda.Buffer, freeze cuda.Event) (*Step, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	s := &Step{p: p}
	if dev != nil {
		s.bytes = dev.Size()
		if s.bytes > p.cfg.SlotBytes {
			return nil, &SlotOverflowError{StepBytes: s.bytes, SlotBytes: p.cfg.SlotBytes}
		}
	}
	// A slot whose buffer has another size is reallocated, which waits for
	// its last copy to land: prefer a slot ready for this step.
	var ready func(*slot) bool
	if dev != nil {
		ready = func(sl *slot) bool {
			return sl.buf == nil || sl.buf.Size() == s.bytes || sl.last == nil || sl.last.Query()
		}
	}
	i, err := p.slots.claim(ctx, holder{step: s}, p.cfg.ClaimTimeout, ready)
	if err != nil {
		return nil, err
	}
	s.slot = i
	if dev != nil {
		if err := p.launchStep(ctx, s, dev, freeze); err != nil {
			_ = p.slots.release(i, holder{step: s})
			return nil, err
		}
	}
	p.mu.Lock()
	p.steps[s] = struct{}{}
	p.counts.stepsStaged++
	p.mu.Unlock()
	return s, nil
}

// launchStep sizes the slot's pinned buffer to the step (the backend copies
// whole buffers) and enqueues the step's device→host copy.
func (p *Pipeline) launchStep(ctx context.Context, s *Step, dev cuda.Buffer, freeze cuda.Event) error {
	sl := p.slots.slots[s.slot] // ours alone: we just claimed it free
	if sl.buf == nil || sl.buf.Size() != s.bytes {
		if sl.buf != nil {
			if sl.last != nil {
				_ = sl.last.Wait(ctx)
			}
			_ = p.free(sl.buf)
			sl.buf, sl.last = nil, nil
		}
		buf, err := p.allocate(ctx, p.cfg.Pinned, s.bytes)
		if err != nil {
			return err
		}
		sl.buf = buf
	}
	s.buf = sl.buf
	if p.cfg.Eager {
		if err := p.syncCopy(ctx, sl.buf, dev, freeze); err != nil {
			return err
		}
		s.ev = doneEvent{}
	} else {
		var wait cuda.Event
		if !p.cfg.skipFreezeWait {
			wait = freeze
		}
		ev, err := p.d2h.copyAfter(sl.buf, dev, wait)
		if err != nil {
			return err
		}
		s.ev = ev
	}
	sl.last = s.ev
	return nil
}

// syncCopy is the eager device→host (or device→device) copy: wait for
// after, then move the bytes through the backend synchronously.
func (p *Pipeline) syncCopy(ctx context.Context, dst, src cuda.Buffer, after cuda.Event) error {
	if after != nil && !p.cfg.skipFreezeWait {
		if err := after.Wait(ctx); err != nil {
			return err
		}
	}
	b, err := p.be.Read(ctx, src)
	if err != nil {
		return err
	}
	return p.be.Write(ctx, dst, b)
}
