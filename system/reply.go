package system

import (
	"context"
	"runtime"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// replySlot is a reusable reply address: a protoactor Process registered
// once in the process registry whose messages land in a one-element
// channel. A request carries the slot's PID as ReplyTo; the caller waits
// on the channel with its context. This costs one channel hand-off instead
// of a future (timer, allocations) per call.
//
// A caller that gives up (context done) abandons the slot: the late reply
// is then passed to onLate (to release a lease or hold nobody will use)
// and the slot is removed from the registry instead of being reused.
type replySlot struct {
	pid *actor.PID
	ch  chan any
	reg *actor.ProcessRegistryValue

	mu        sync.Mutex
	abandoned bool
	onLate    func(any)
}

func (s *replySlot) SendUserMessage(_ *actor.PID, m any) {
	m = actor.UnwrapEnvelopeMessage(m)
	s.mu.Lock()
	if s.abandoned {
		f := s.onLate
		s.mu.Unlock()
		s.reg.Remove(s.pid)
		if f != nil {
			f(m)
		}
		return
	}
	select {
	case s.ch <- m:
	default:
		// Exactly one reply per request: a second one would be a runtime
		// bug. Never block (or crash) the supervisor on it; drop it.
	}
	s.mu.Unlock()
}

func (s *replySlot) SendSystemMessage(*actor.PID, any) {}
func (s *replySlot) Stop(*actor.PID)                   {}

func (s *replySlot) abandon(onLate func(any)) {
	s.mu.Lock()
	s.abandoned = true
	s.onLate = onLate
	select {
	case m := <-s.ch:
		s.mu.Unlock()
		s.reg.Remove(s.pid)
		if onLate != nil {
			onLate(m)
		}
	default:
		s.mu.Unlock()
	}
}

// slotPool keeps idle reply slots. It is a plain stack (not a sync.Pool)
// so that slots are never dropped while still registered.
type slotPool struct {
	mu   sync.Mutex
	free []*replySlot
	reg  *actor.ProcessRegistryValue
}

const maxIdleSlots = 1024

func (p *slotPool) get() *replySlot {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		s := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return s
	}
	p.mu.Unlock()
	s := &replySlot{ch: make(chan any, 1), reg: p.reg}
	s.pid, _ = p.reg.Add(s, "reply$"+p.reg.NextId())
	return s
}

func (p *slotPool) put(s *replySlot) {
	p.mu.Lock()
	if len(p.free) < maxIdleSlots {
		p.free = append(p.free, s)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.reg.Remove(s.pid)
}

func (p *slotPool) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.free {
		p.reg.Remove(s.pid)
	}
	p.free = nil
}

// await waits for the reply to a request already sent with s as ReplyTo.
func (p *slotPool) await(ctx context.Context, s *replySlot, onLate func(any)) (any, error) {
	select {
	case m := <-s.ch:
		p.put(s)
		// The supervisor runs on its senders' goroutines (caller-runs
		// dispatch), so this goroutine may just have served other callers
		// whose replies made them runnable behind it. Yield once so they
		// run now rather than when the scheduler preempts us: it bounds
		// the tail latency of every caller (see BENCHMARKS.md).
		runtime.Gosched()
		return m, nil
	case <-ctx.Done():
		s.abandon(onLate)
		return nil, ctx.Err()
	}
}
