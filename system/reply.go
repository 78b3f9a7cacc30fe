package system

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/messages"
)

// replySlot is a reusable reply address: a protoactor Process registered
// once in the process registry. A request carries the slot's PID as
// ReplyTo; the reply is stored in the slot and published by its state, so
// a caller whose reply is already there when its send returns (the
// supervisor runs on its senders' goroutines: often its own) takes it
// without any channel operation or lock. A caller that must wait parks on
// the slot's wake channel, which the reply then signals. This costs no
// future (timer, allocations) per call.
//
// A caller that gives up (context done) abandons the slot: the late reply
// is then passed to onLate (to release a lease or hold nobody will use)
// and the slot is removed from the registry instead of being reused. The
// slot's state decides, by compare-and-swap, whether the reply or the
// abandonment came first, so the reply is handed over exactly once.
type replySlot struct {
	pid  *actor.PID
	reg  *actor.ProcessRegistryValue
	wake chan struct{} // one element: wakes a parked caller

	state  atomic.Int32 // slotWaiting, slotReplied, slotParked, slotAbandoned
	msg    any          // the reply, published by state slotReplied
	onLate func(any)    // set before state slotAbandoned

	// The lease hot path's requests and their reply storage, reused with
	// the slot: the supervisor reads a request and writes its reply before
	// it sends it and keeps nothing of either; a slot is reused only once
	// its reply has arrived and been read (an abandoned slot never is).
	acquire    actors.AcquireRequest
	release    actors.ReleaseRequest
	leaseReply messages.LeaseReply
	reply      messages.Reply
}

var _ actors.ReplySink = (*replySlot)(nil)

// States of a replySlot.
const (
	slotWaiting   int32 = iota // no reply yet, the caller not parked
	slotReplied                // the reply is in msg
	slotParked                 // no reply yet, the caller parked on wake
	slotAbandoned              // the caller left: the reply goes to onLate
)

func (s *replySlot) SendUserMessage(_ *actor.PID, m any) {
	if s.Deliver(actor.UnwrapEnvelopeMessage(m)) {
		s.Wake()
	}
}

// Deliver stores the reply to the slot's request (actors.ReplySink); true
// when the caller is parked and Wake must follow. A slot whose caller left
// hands the reply to onLate.
func (s *replySlot) Deliver(m any) bool {
	for {
		switch st := s.state.Load(); st {
		case slotWaiting, slotParked:
			s.msg = m
			if s.state.CompareAndSwap(st, slotReplied) {
				return st == slotParked
			}
		case slotAbandoned:
			s.reg.Remove(s.pid)
			if s.onLate != nil {
				s.onLate(m)
			}
			return false
		default:
			// Exactly one reply per request: a second one would be a
			// runtime bug. Never block (or crash) the supervisor on it;
			// drop it.
			return false
		}
	}
}

// Wake wakes the caller parked on the slot (after a Deliver that said so).
func (s *replySlot) Wake() { s.wake <- struct{}{} }

func (s *replySlot) SendSystemMessage(*actor.PID, any) {}
func (s *replySlot) Stop(*actor.PID)                   {}

// take returns the reply and readies the slot for its next request.
func (s *replySlot) take() any {
	m := s.msg
	s.msg, s.onLate = nil, nil
	s.state.Store(slotWaiting)
	return m
}

// slotPool keeps idle reply slots. It is a plain stack (not a sync.Pool)
// so that slots are never dropped while still registered.
type slotPool struct {
	mu   sync.Mutex
	free []*replySlot
	reg  *actor.ProcessRegistryValue
	// stopped is closed once the actors are stopped (stop): a caller
	// still waiting then, whose reply can never come, gets ErrClosed.
	stopped  chan struct{}
	stopOnce sync.Once
}

// stop releases every caller still waiting for a reply (the actors are
// stopped: none will come). Idempotent.
func (p *slotPool) stop() { p.stopOnce.Do(func() { close(p.stopped) }) }

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
	s := &replySlot{wake: make(chan struct{}, 1), reg: p.reg}
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
// A context already done wins over a reply already there: the caller
// gets ctx.Err() and the reply is handed back as a late one. (A sender
// that served other callers on its goroutine has already yielded to them
// in the supervisor's mailbox: see actors.callerRunsMailbox.)
//
// With keep, a reply that arrived leaves the slot with the caller, who
// puts it back once it has read the reply (a reply in the slot's own
// storage must not be overwritten by the slot's next user first).
func (p *slotPool) await(ctx context.Context, s *replySlot, onLate func(any), keep bool) (any, error) {
	done := ctx.Done() // nil, never ready, for a context that never ends
	if done != nil {
		select {
		case <-done:
			return nil, p.giveUp(ctx, s, onLate, slotWaiting)
		default:
		}
	}
	if s.state.CompareAndSwap(slotWaiting, slotParked) {
		select {
		case <-s.wake:
		case <-done:
			return nil, p.giveUp(ctx, s, onLate, slotParked)
		case <-p.stopped:
			// The runtime stopped its actors without answering (a Close
			// whose own wait was cut short): no reply will come.
			if err := p.abandon(s, onLate, slotParked, ErrClosed); err != nil {
				return nil, err
			}
			m := s.take() // it came after all
			if !keep {
				p.put(s)
			}
			return m, nil
		}
	}
	m := s.take()
	if !keep {
		p.put(s)
	}
	return m, nil
}

// giveUp abandons s, which is in state from unless its reply came: the
// reply, now or later, goes to onLate.
func (p *slotPool) giveUp(ctx context.Context, s *replySlot, onLate func(any), from int32) error {
	s.onLate = onLate // read by the late reply once the slot is abandoned
	if s.state.CompareAndSwap(from, slotAbandoned) {
		return ctx.Err()
	}
	// The reply is there (a parked caller's wake signal is on the way).
	if from == slotParked {
		<-s.wake
	}
	m := s.take()
	if onLate != nil {
		onLate(m) // before the slot (and the reply storage) is reused
	}
	p.put(s)
	return ctx.Err()
}

// abandon is giveUp for a caller released by stop: err when s is
// abandoned; nil when its reply is there after all (the caller takes it).
func (p *slotPool) abandon(s *replySlot, onLate func(any), from int32, err error) error {
	s.onLate = onLate
	if s.state.CompareAndSwap(from, slotAbandoned) {
		return err
	}
	if from == slotParked {
		<-s.wake
	}
	return nil
}
