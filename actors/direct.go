package actors

import (
	"context"
	"runtime/debug"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Direct calls: the lease hot path without messages.
//
// A lease acquire or release is a short supervisor step that never
// blocks. Sent as a message it costs several times the step itself: the
// actor system's send, the mailbox queue, protoactor's invoker, and, when
// the caller had to park, a wake-up from the goroutine that ran it. A
// direct call is the same step under the same serialization, without the
// envelope: the caller takes the supervisor mailbox's run right on its
// own goroutine (callerRunsMailbox.lock), runs the messages queued before
// it, runs the step, and gives the run right back, running whatever was
// queued meanwhile (callerRunsMailbox.release). That is what a sender
// that finds the mailbox idle does with its message; a direct caller that
// finds the run right taken waits for it, on its context, instead of
// queueing.
//
// So every step still runs one at a time, in one total order with the
// messages, with the same AfterLedger hook and the same fatal stop on a
// panic as the message would. A step is refused without running (ran
// false) once the supervisor is shutting down or stopped, or while its
// mailbox is suspended; the caller then sends its request as a message,
// and the message path answers as it does for any request (ErrClosed,
// say).

// ReplySink takes a reply straight from the supervisor, on the goroutine
// running it, instead of a send through the actor system: the lease
// path's reusable reply slots (package system) are sinks.
type ReplySink interface {
	// Deliver stores the reply. True: the requester is parked and Wake
	// must be called; the supervisor's mailbox calls it once the burst of
	// messages it is processing is over, outside the serialized section,
	// so that waking a goroutine does not hold up the callers queued
	// behind it.
	Deliver(reply any) (wake bool)
	Wake()
}

// AcquireRequest is a [messages.Acquire] sent with the lease path's reply
// plumbing, for when a direct call was refused and the request goes as a
// message. The supervisor writes its answer into Reply (storage the
// requester reuses, so that the serialized section allocates nothing for
// it; nil: a new LeaseReply) and hands it to Sink in place of a send to
// ReplyTo. ReplyTo stays set: the answer to a request refused after a
// fatal stop goes there. The requester owns Reply and reads it once the
// answer has arrived. Hooks and errors name the request "Acquire".
type AcquireRequest struct {
	messages.Acquire
	Reply *messages.LeaseReply
	Sink  ReplySink
}

// ReleaseRequest is a [messages.Release] sent with the lease path's reply
// plumbing (see [AcquireRequest]).
type ReleaseRequest struct {
	messages.Release
	Reply *messages.Reply
	Sink  ReplySink
}

type callKind uint8

const (
	callAcquire callKind = iota + 1
	callRelease
)

// leaseStep is one lease step and its answer. It stays on its caller's
// stack: nothing keeps it after the step.
type leaseStep struct {
	kind   callKind
	handle budget.Handle
	loc    string
	lease  budget.LeaseID // release: the lease; acquire: the answer

	ran     bool // false: refused without running; send a message instead
	err     error
	version uint64
}

// Stand-ins for the request being handled in a direct step: they name it
// for Hooks.AfterLedger and a FatalError ("Acquire", "Release") without
// a message per call.
var (
	directAcquire = &messages.Acquire{}
	directRelease = &messages.Release{}
)

// AcquireDirect takes a lease on (h, loc) as a direct call (see above).
// ran false: nothing ran; send the request as a message. err: ctx ended
// while the call waited for the run right (nothing ran). Otherwise rep is
// the answer; its Err is the runtime's *FatalError once it has stopped.
func (e *Engine) AcquireDirect(ctx context.Context, h budget.Handle, loc string) (rep messages.LeaseReply, ran bool, err error) {
	st := leaseStep{kind: callAcquire, handle: h, loc: loc}
	if err := e.sup.call(ctx, &st); err != nil {
		return rep, false, err
	}
	return messages.LeaseReply{Lease: st.lease, Err: st.err, Version: st.version}, st.ran, nil
}

// ReleaseDirect releases lease id as a direct call (see AcquireDirect).
func (e *Engine) ReleaseDirect(ctx context.Context, id budget.LeaseID) (rep messages.Reply, ran bool, err error) {
	st := leaseStep{kind: callRelease, lease: id}
	if err := e.sup.call(ctx, &st); err != nil {
		return rep, false, err
	}
	return messages.Reply{Err: st.err, Version: st.version}, st.ran, nil
}

// call runs st once this goroutine holds the run right, or returns ctx's
// error if ctx ends while it waits for it (st did not run).
func (s *supervisor) call(ctx context.Context, st *leaseStep) error {
	m := s.mailbox
	if err := m.lock(ctx); err != nil {
		return err
	}
	served := 0
	defer func() { m.release(served + 1) }()
	served = m.runBefore()
	s.runStep(st)
	return nil
}

// runStep is the supervisor's step for st, as receive runs it for the
// matching message. On the goroutine holding the run right.
func (s *supervisor) runStep(st *leaseStep) {
	if s.shutting || s.stopped || s.mailbox.suspended.Load() {
		return // st.ran stays false
	}
	st.ran = true
	if s.fatal != nil {
		st.err = s.fatal
		return
	}
	defer s.recoverStep(st)
	s.drainOffers() // the caches' pending offers first (offers.go)
	switch st.kind {
	case callAcquire:
		s.handling, s.hooked = directAcquire, false
		st.lease, st.err = s.ledger.Acquire(st.handle, st.loc)
	case callRelease:
		s.handling, s.hooked = directRelease, false
		st.err = s.ledger.Release(st.lease)
	}
	st.version = s.ledger.Version()
	if st.err != nil && s.eng.obs != nil {
		s.eng.obs.Refused(s.handling, st.err, st.version)
	}
	s.afterLedger()
	s.handling = nil
	s.noteRoom()
}

// recoverStep stops the runtime after a panic in a direct step, as
// Receive does for a message; the step's caller gets the FatalError.
func (s *supervisor) recoverStep(st *leaseStep) {
	if r := recover(); r != nil {
		s.stopFatal(nil, r, debug.Stack())
		st.err = s.fatal
		s.handling = nil
	}
}
