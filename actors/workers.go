package actors

import (
	"context"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// workerPool is the dispatcher of the value actors (and, one pool of
// their own, of the location actors): it runs their
// mailboxes on goroutines that wait, once done, for the next mailbox to
// run, instead of protoactor's default of a new goroutine per run. A new
// goroutine starts with a small stack and grows it (a copy of the stack
// per doubling) down the path of a transfer; a kept goroutine has its
// stack grown already. At most maxIdle goroutines wait; close ends them
// (Engine.Stop), and a mailbox scheduled after close runs on a goroutine
// of its own, as by default.
type workerPool struct {
	maxIdle int
	mu      sync.Mutex
	idle    []chan func() // waiting goroutines, each on its own channel
	closed  bool
	running goCount
}

func newWorkerPool(maxIdle int) *workerPool { return &workerPool{maxIdle: maxIdle} }

// Schedule runs fn on a waiting goroutine, or a new one.
func (p *workerPool) Schedule(fn func()) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		go fn()
		return
	}
	if n := len(p.idle); n > 0 {
		ch := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		ch <- fn // buffered: never blocks
		return
	}
	p.running.add()
	p.mu.Unlock()
	go p.work(fn)
}

// Throughput is the number of messages a mailbox processes before it
// yields (protoactor's default).
func (p *workerPool) Throughput() int { return 300 }

func (p *workerPool) work(fn func()) {
	defer p.running.done()
	ch := make(chan func(), 1)
	for fn != nil {
		fn()
		p.mu.Lock()
		if p.closed || len(p.idle) >= p.maxIdle {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, ch)
		p.mu.Unlock()
		fn = <-ch // nil: closed
	}
}

// close ends the waiting goroutines and waits for every goroutine of the
// pool to return but the stuck() ones (nil: none), or until ctx ends (its
// error). The mailboxes must be done (their actors stopped or idle), or
// stuck in an operation abandoned at close. A nil pool has nothing to
// close.
func (p *workerPool) close(ctx context.Context, stuck func() int) error {
	if p == nil {
		return nil
	}
	if stuck == nil {
		stuck = func() int { return 0 }
	}
	p.mu.Lock()
	p.closed = true
	for _, ch := range p.idle {
		close(ch)
	}
	p.idle = nil
	p.mu.Unlock()
	return p.running.wait(ctx, stuck)
}

// idleActors is the most value actors kept idle for the next value with a
// transfer (see supervisor.transferSettled), and the most goroutines kept
// waiting for the value actors' mailboxes.
const idleActors = 8

// stopActor stops a value actor; its Terminated comes back to the
// supervisor (see awaitQuiet).
func (s *supervisor) stopActor(pid *actor.PID) {
	s.stopping++
	s.eng.root.Stop(pid)
}

// stopIdle stops the idle value actors.
func (s *supervisor) stopIdle() {
	for _, pid := range s.idle {
		s.stopActor(pid)
	}
	s.idle = s.idle[:0]
}
