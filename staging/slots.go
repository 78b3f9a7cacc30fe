package staging

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/residency-go/residency/cuda"
)

// holder is one owner of a staging slot: a step (from its save until the
// step is released, i.e. materialized or discarded) or a task bound to the
// slot (until its pool write, or its failure). Exactly one field is set.
type holder struct {
	step *Step
	task TaskID
}

// slot is one fixed pinned landing zone. buf and last are touched only by
// the claimer of a free slot (the handover goes through slotPool.mu).
type slot struct {
	buf     cuda.Buffer // pinned buffer sized to the last step that landed here
	last    cuda.Event  // the last device→host copy into buf
	holders map[holder]struct{}
}

// slotPool is the fixed set of staging slots. A slot is free when nobody
// holds it; several holders share a slot. Safe for concurrent use.
type slotPool struct {
	mu      sync.Mutex
	slots   []*slot
	changed chan struct{} // closed (and replaced) whenever a slot is freed or the pool closes, if watched
	watched bool          // someone took changed to wait on it since it was made
	closed  bool
	claims  int64
	waits   int64
	asleep  map[*claimWait]struct{} // claims waiting for a slot
}

// claimWait is what a waiting claim waits for: a slot to be freed, or a
// free slot's last copy to land.
type claimWait struct{ changed, landed <-chan struct{} }

// pending reports whether nothing it waits for has happened yet.
func (w *claimWait) pending() bool {
	for _, ch := range []<-chan struct{}{w.changed, w.landed} {
		if ch == nil {
			continue
		}
		select {
		case <-ch:
			return false
		default:
		}
	}
	return true
}

func newSlotPool(n int) *slotPool {
	p := &slotPool{slots: make([]*slot, n), changed: make(chan struct{}), asleep: map[*claimWait]struct{}{}}
	for i := range p.slots {
		p.slots[i] = &slot{holders: map[holder]struct{}{}}
	}
	return p
}

// claim gives a free slot to h, waiting for one until timeout (timeout <=
// 0: fail at once when none is free), ctx or the pool's close. With ready
// set, a free slot must also be ready for the claimer: the lowest ready free
// slot is taken; when the free slots are all not ready, the claim waits for
// one to become ready (its last copy to land) or another to be freed —
// up to timeout when it is positive, else until ctx ends.
func (p *slotPool) claim(ctx context.Context, h holder, timeout time.Duration, ready func(*slot) bool) (int, error) {
	var deadline <-chan time.Time
	waited := false
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return -1, ErrClosed
		}
		var landed <-chan struct{} // the first free slot that is not ready: its last copy
		for i, s := range p.slots {
			if len(s.holders) != 0 {
				continue
			}
			if ready == nil || ready(s) {
				s.holders[h] = struct{}{}
				p.claims++
				if waited {
					p.waits++
				}
				p.mu.Unlock()
				return i, nil
			}
			if landed == nil {
				landed = s.last.Done()
			}
		}
		ch := p.changed
		p.watched = true
		p.mu.Unlock()
		if timeout <= 0 && landed == nil {
			return -1, &SlotTimeoutError{Slots: len(p.slots), Timeout: timeout}
		}
		if deadline == nil && timeout > 0 {
			t := getTimer(timeout)
			defer putTimer(t)
			deadline = t.C
		}
		waited = true
		w := &claimWait{changed: ch, landed: landed}
		p.mu.Lock()
		p.asleep[w] = struct{}{}
		p.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-landed:
		case <-deadline:
			err = &SlotTimeoutError{Slots: len(p.slots), Timeout: timeout, NotLanded: landed != nil}
		case <-ctx.Done():
			err = ctx.Err()
		}
		p.mu.Lock()
		delete(p.asleep, w)
		p.mu.Unlock()
		if err != nil {
			return -1, err
		}
	}
}

// Claim timers are reused: a claim that waits for a slot (the common case
// of a producer ahead of its pool writes) needs one per claim. Stop (Go
// 1.23 timers) leaves no stale tick in a reused timer's channel.
var timers sync.Pool

func getTimer(d time.Duration) *time.Timer {
	if t, ok := timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func putTimer(t *time.Timer) {
	t.Stop()
	timers.Put(t)
}

// holdWith adds h to the holders of slot i, which by must hold (else
// ErrStepReleased): a task
// binds to a slot only through the step whose copy the slot carries (once
// that step let go, the slot may carry another step). Holders are a set:
// a task that holds the slot already (an earlier chunk of the same step)
// stays one holder, released once at its pool write.
func (p *slotPool) holdWith(i int, by, h holder) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.slots[i]
	if _, ok := s.holders[by]; !ok {
		return ErrStepReleased
	}
	s.holders[h] = struct{}{}
	return nil
}

// release removes h from slot i. Releasing a holder that does not hold the
// slot is a bug: it returns an error and changes nothing.
func (p *slotPool) release(i int, h holder) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.slots[i]
	if _, ok := s.holders[h]; !ok {
		return fmt.Errorf("staging: slot %d: release by a holder that does not hold it", i)
	}
	delete(s.holders, h)
	if len(s.holders) == 0 && p.watched {
		// Nobody waits on a channel nobody took: it is replaced only once
		// a claim has taken it (and may be waiting on it).
		close(p.changed)
		p.changed = make(chan struct{})
		p.watched = false
	}
	return nil
}

// slotState is what Stats reports of the pool.
type slotState struct {
	free, holders int
	claims, waits int64
	asleep        int
}

func (p *slotPool) state() slotState {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := slotState{claims: p.claims, waits: p.waits}
	for w := range p.asleep {
		if w.pending() {
			st.asleep++
		}
	}
	for _, s := range p.slots {
		if len(s.holders) == 0 {
			st.free++
		}
		st.holders += len(s.holders)
	}
	return st
}

// close fails every waiting and later claim with ErrClosed.
func (p *slotPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.changed)
		p.changed = make(chan struct{})
	}
}
