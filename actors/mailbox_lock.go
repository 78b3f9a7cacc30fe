package actors

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// The run right for direct calls (see direct.go).
//
// A direct caller takes the supervisor mailbox's run right on its own
// goroutine (lock), runs the messages queued before it, then its step,
// and gives the run right back (release), exactly as a sender that finds
// the mailbox idle runs its message. A caller that finds the run right
// taken waits for it like a caller of sync.Mutex, but on its context:
//
//   - With several processors it first spins for a moment: the holder is
//     running on another processor and its step is short.
//   - Then it parks, listed as a waiter, until a release wakes it or its
//     context ends. A release wakes one waiter, and no other until that
//     one has tried (woken): waking costs more than the step.
//   - A woken waiter competes with newly arrived callers, which keeps the
//     run right on the processor that has the ledger in its cache. A
//     waiter that has waited starveAfter in all goes to the front of the
//     list and turns on starvation: releases then hand the run right
//     straight to the first waiter (running stays set, so nobody can
//     barge in) until a waiter that waited less, or the last one, gets
//     it.
//   - A caller whose context ends while it waits leaves without running
//     anything; a wake (or a handed-over run right) that reached it
//     meanwhile is passed on.
//   - While a direct caller waits, whoever runs queued messages stops at
//     the end of a burst and lets it go next (see run): a stream of later
//     messages cannot keep it waiting. It runs what is still queued before
//     its own step, so the order of the queue is kept.
//
// Senders of messages never wait for the run right: they queue their
// message, and whoever holds the run right runs it before giving it back.

// How long a direct caller spins for the run right before it parks:
// lockSpins rounds of up to lockSpinLoads loads (several processors
// only); and how long in all it may wait before releases hand the run
// right over to the waiters in turn.
const (
	lockSpins     = 4
	lockSpinLoads = 30
)

var starveAfter = time.Millisecond // a variable for tests

// multiProcessor reports whether goroutines run on several processors
// (read on slow paths only: it takes the scheduler's lock).
func multiProcessor() bool { return runtime.GOMAXPROCS(0) > 1 }

// A waiter's channel carries true when the run right was handed to it.
var waiterPool = sync.Pool{New: func() any { return make(chan bool, 1) }}

// lock takes the run right for a direct call, or returns ctx's error
// (having taken nothing).
func (m *callerRunsMailbox) lock(ctx context.Context) error {
	var since time.Time // when this caller first parked
	starving := false
	for {
		if m.spinForRun() {
			return nil
		}
		if since.IsZero() {
			since = time.Now()
		}
		w := waiterPool.Get().(chan bool)
		m.list(w, starving)
		// Given back after this caller looked, but before it was listed?
		if m.running.CompareAndSwap(false, true) {
			if !m.unlist(w) {
				<-w // a plain wake (nobody can hand over what this caller holds)
				m.woken.Store(false)
			}
			waiterPool.Put(w)
			return nil
		}
		var handed bool
		if done := ctx.Done(); done == nil {
			handed = <-w
		} else {
			select {
			case handed = <-w:
			case <-done:
				m.leave(w)
				return ctx.Err()
			}
		}
		waiterPool.Put(w)
		waited := time.Since(since)
		if handed {
			if waited < starveAfter || m.nwait.Load() == 0 {
				m.starving.Store(false)
			}
			return nil
		}
		m.woken.Store(false)
		starving = waited >= starveAfter
	}
}

// leave takes a waiter whose context ended off the list. A wake or a
// handed-over run right that reached it meanwhile is passed on, so that
// the next waiter, or the queued messages, are not left behind.
func (m *callerRunsMailbox) leave(w chan bool) {
	if m.unlist(w) {
		waiterPool.Put(w)
		return
	}
	handed := <-w
	waiterPool.Put(w)
	if handed {
		m.release(0)
		return
	}
	m.woken.Store(false)
	if !m.wakeWaiter() && !m.idle() && m.running.CompareAndSwap(false, true) {
		m.process()
	}
}

// runBefore runs what was queued before a direct call's step (the run
// right just taken): the system messages and the burst of user messages
// queued now, not those posted later. A message of that burst that
// panicked past the invoker leaves the rest queued behind a suspension
// (protoactor's escalation posts one): that suspension is processed too,
// so that the step sees the mailbox suspended rather than overtaking
// them.
func (m *callerRunsMailbox) runBefore() int {
	if m.idle() {
		return 0
	}
	served := m.run(runOneBurst)
	for m.systemN.Load() > 0 {
		served += m.run(runOneBurst)
	}
	return served
}

// spinForRun tries for the run right, spinning for a moment with several
// processors; never while a waiter starves (the run right is handed
// over then).
func (m *callerRunsMailbox) spinForRun() bool {
	if m.tryRun() {
		return true
	}
	if !multiProcessor() {
		return false
	}
	for range lockSpins {
		for i := 0; i < lockSpinLoads && m.running.Load(); i++ {
		}
		if m.tryRun() {
			return true
		}
	}
	return false
}

// tryRun takes the run right if it is free and no waiter starves.
func (m *callerRunsMailbox) tryRun() bool {
	return !m.starving.Load() && !m.running.Load() && m.running.CompareAndSwap(false, true)
}

// list adds w to the waiters; a starving caller goes to the front and
// turns starvation on.
func (m *callerRunsMailbox) list(w chan bool, starving bool) {
	m.waitMu.Lock()
	if starving {
		m.starving.Store(true)
		m.waiters = append(m.waiters, nil)
		copy(m.waiters[1:], m.waiters)
		m.waiters[0] = w
	} else {
		m.waiters = append(m.waiters, w)
	}
	m.nwait.Add(1)
	m.waitMu.Unlock()
}

// unlist removes w from the waiters; false: a release took it off (and
// signalled it) already. With nobody left waiting, starvation is over.
func (m *callerRunsMailbox) unlist(w chan bool) bool {
	m.waitMu.Lock()
	defer m.waitMu.Unlock()
	for i, x := range m.waiters {
		if x == w {
			m.waiters = append(m.waiters[:i], m.waiters[i+1:]...)
			m.nwait.Add(-1)
			if len(m.waiters) == 0 {
				m.starving.Store(false)
			}
			return true
		}
	}
	return false
}

// pop takes the first waiter off the list (nil when there is none).
// Called with waitMu held.
func (m *callerRunsMailbox) pop() chan bool {
	if len(m.waiters) == 0 {
		return nil
	}
	w := m.waiters[0]
	m.waiters[0] = nil
	m.waiters = m.waiters[1:]
	if len(m.waiters) == 0 {
		m.waiters = m.waiters[:0:0]
	}
	m.nwait.Add(-1)
	return w
}

// wakeWaiter wakes the first waiter to try for the run right again,
// unless a woken one has yet to try (false: it woke nobody). After the
// run right was given back.
func (m *callerRunsMailbox) wakeWaiter() bool {
	if m.nwait.Load() == 0 || m.woken.Load() {
		return false
	}
	m.waitMu.Lock()
	defer m.waitMu.Unlock()
	if m.woken.Load() {
		return false
	}
	w := m.pop()
	if w == nil {
		return false
	}
	m.woken.Store(true)
	w <- false
	return true
}

// handOff hands the run right straight to the first waiter while one
// starves (true). Called by the holder, instead of giving it back. With
// nobody left waiting, starvation is over.
func (m *callerRunsMailbox) handOff() bool {
	if !m.starving.Load() {
		return false
	}
	m.waitMu.Lock()
	w := m.pop()
	if w != nil {
		w <- true
	} else {
		m.starving.Store(false)
	}
	m.waitMu.Unlock()
	return w != nil
}
