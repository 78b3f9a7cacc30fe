package actors

import (
	"fmt"
	"runtime/debug"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

type pendingKind int

const (
	pendRegister pendingKind = iota
	pendDirect
	pendRun
)

type pendingOp struct {
	kind    pendingKind
	request any // the request whose caller waits (see handling)
	replyTo *actor.PID
	handle  budget.Handle
	run     *runState
	effect  budget.Effect
}

type runState struct {
	run      *budget.Run
	replyTo  *actor.PID
	scope    string
	decision *budget.Decision // Admit: the decision being entered
}

// supervisor owns the ledger. It is the only code that mutates it, one
// message at a time, so every state version is serialized and a snapshot
// is one atomic copy. It never blocks: effects go to location and value
// actors, whose outcomes come back as messages.
//
// A value has a value actor only while it has transfers in flight: the
// supervisor gives it one with the value's first transfer and takes it
// back once the last one has settled, so an idle value costs no actor (a
// million resident values are a million ledger records, not a million
// actors). An actor taken back waits idle for the next value with a
// transfer, up to idleActors of them; the others are stopped.
// A value's transfers all go to its one actor, which carries them out one
// at a time, in the order they were admitted.
//
// It is also the supervision strategy of its children (the value actors):
// a value actor that panics while carrying out a transfer has that
// transfer failed in the ledger, its buffers freed, and is restarted if
// it has more transfers queued (stopped otherwise).
type supervisor struct {
	eng        *Engine
	mailbox    *callerRunsMailbox // its mailbox: wakes parked lease callers after a burst
	ledger     *budget.Ledger
	self       actor.Context           // the supervisor's own context (spawns value actors)
	valueProps *actor.Props            // every value actor's props
	workers    map[uint64]*valueWorker // value actors of values with transfers in flight, by handle id
	idle       []*actor.PID            // value actors with no transfer, at most idleActors (see transferSettled)
	crashed    *actor.PID              // the value actor whose crash is being handled (HandleFailure)
	// stopping counts the value actors told to stop whose Terminated has
	// not come back yet; quiet waits for it to reach zero (see
	// awaitQuiet).
	stopping int
	quiet    []*actor.PID
	pending  map[budget.AdmissionID]*pendingOp
	reapers  map[budget.EventID][]*actor.PID
	closing  *actor.PID // Shutdown requester, waiting for transfers to settle
	closed   bool
	// handling is the request being answered: the message in hand, or,
	// while a transfer settles, the request that admitted it (so
	// Hooks.AfterLedger and a FatalError name the caller's request, never
	// "TransferDone"). Its kind is named only when needed (requestKind
	// formats: never on the hot path). hooked: AfterLedger already ran.
	handling any
	hooked   bool
	fatal    *FatalError // set once the supervisor stopped the runtime
	// shutting (Shutdown received) or stopped (the actor is stopping or
	// stopped): direct calls (AcquireDirect) no longer run.
	shutting, stopped bool
	// abandoning: ForceShutdown failed what was in flight; value actors
	// are no longer taken back (one may be stuck in its operation).
	abandoning bool
	// roomSeen is the ledger's RoomReleases when Config.OnRoom was last
	// called (see noteRoom).
	roomSeen uint64
}

// Receive handles one message. A panic while handling it (a ledger
// invariant broken, a bug) must not leave a half-applied change behind a
// runtime that carries on, nor a caller without a reply: the supervisor
// recovers it and stops the runtime (see stopFatal).
func (s *supervisor) Receive(ctx actor.Context) {
	s.self = ctx
	msg := ctx.Message()
	switch msg.(type) { // the actors' own bookkeeping, even after a fatal stop
	case *actor.Stopping, *actor.Stopped:
		s.stopped = true
		return
	case *actor.Terminated:
		s.stopping--
		s.answerQuiet()
		return
	case *awaitQuiet:
		s.quiet = append(s.quiet, ctx.Sender())
		s.stopIdle()
		s.answerQuiet()
		return
	}
	if s.fatal != nil {
		s.refuse(msg)
		return
	}
	defer func() {
		if r := recover(); r != nil {
			s.stopFatal(msg, r, debug.Stack())
		}
	}()
	s.handling, s.hooked = msg, false
	s.drainOffers() // the caches' pending offers first (offers.go)
	if held, ok := s.heldFor(msg); ok {
		s.ledger.WithHeld(held, func() { s.receive(ctx, msg) })
	} else {
		s.receive(ctx, msg)
	}
	s.handling = nil // keep no message (nor its data) alive past its handling
	s.noteRoom()
}

// heldFor returns the room msg must not take (budget/held.go), when msg
// is a call that may charge bytes where waiters ahead of it hold the
// room: a call that does not wait (class 0: Config.HeldRoom), a waiting
// Admit's try (its class, and its id once queued), or an owner's Admit
// (a cache's load or reservation), which orders itself against the queue
// at the locations it names and so is held only elsewhere (a demotion
// into a spill target, a temporary at a source). The write pipeline's
// clone and landing reservations are not held. Decide and Explain change
// nothing but run under the rule of a call that does not wait, so that
// each answers as the call it predicts (Admit without a wait option,
// Execute) would be answered.
func (s *supervisor) heldFor(msg any) (map[string]int, bool) {
	if s.eng.heldRoom == nil {
		return nil, false
	}
	switch m := msg.(type) {
	case *messages.Transition, *messages.Register, *messages.Reserve, *messages.Execute, *messages.EnterScope,
		*messages.Decide, *messages.Explain:
		return s.eng.heldRoom(0, 0), true
	case *messages.Admit:
		if m.Ordered {
			return s.ledger.HeldOutside(s.eng.heldRoom(0, 0), budget.RequestLocations(m.Request)), true
		}
		return s.eng.heldRoom(m.Class, m.Waiter), true
	}
	return nil, false
}

func (s *supervisor) receive(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *AcquireRequest:
		s.handling = &m.Acquire // hooks and errors name the plain request
		s.acquire(&m.Acquire, m.Reply, m.Sink)
	case *messages.Acquire:
		s.acquire(m, nil, nil)
	case *ReleaseRequest:
		s.handling = &m.Release
		s.release(&m.Release, m.Reply, m.Sink)
	case *messages.Release:
		s.release(m, nil, nil)
	case *messages.Register:
		s.register(ctx, m)
	case *messages.Transition:
		s.transition(ctx, m)
	case *messages.TransferDone:
		s.transferDone(m.Admission, m.Err)
	case *messages.RecordEvent:
		s.recordEvent(m)
	case *messages.EventDone:
		s.eventDone(m)
	case *messages.AwaitReap:
		if s.ledger.EventPending(m.Event) {
			s.reapers[m.Event] = append(s.reapers[m.Event], m.ReplyTo)
		} else {
			s.reply(m.ReplyTo, &messages.Reply{Version: s.ledger.Version()})
		}
	case *messages.Hold:
		id, err := s.ledger.Hold(m.Handle, m.Location)
		s.reply(m.ReplyTo, &messages.HoldReply{Hold: id, Err: err, Version: s.ledger.Version()})
	case *messages.Unhold:
		err := s.ledger.Unhold(m.Hold)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.Reserve:
		err := s.ledger.Reserve(m.Location, m.Name, m.Bytes)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.Unreserve:
		err := s.ledger.Unreserve(m.Name)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.Explain:
		s.reply(m.ReplyTo, &messages.ExplainReply{Explanation: s.ledger.Explain(m.Plan)})
	case *messages.Decide:
		limit := m.StateLimit
		if limit == 0 {
			limit = s.eng.stateLimit
		}
		d, err := s.ledger.Decide(m.Request, limit)
		s.reply(m.ReplyTo, &messages.DecideReply{Decision: d, Err: err})
	case *messages.Execute:
		s.startRun(m.Plan, budget.RunOptions{}, "", m.ReplyTo, nil)
	case *messages.EnterScope:
		s.startRun(m.Plan, budget.RunOptions{Scope: m.Scope, CheckVersion: m.CheckVersion, ExpectedVersion: m.ExpectedVersion}, m.Scope, m.ReplyTo, nil)
	case *messages.Admit:
		s.admit(m)
	case *messages.ExitScope:
		s.exitScope(m)
	case *messages.Snapshot:
		// Frozen here, rendered by the caller: a snapshot of a million
		// values does not hold up the requests queued behind it.
		s.reply(m.ReplyTo, &messages.SnapshotReply{Frozen: s.ledger.Freeze()})
	case *messages.StateVersion:
		s.reply(m.ReplyTo, &messages.Reply{Version: s.ledger.Version()})
	case *messages.Trace:
		s.reply(m.ReplyTo, &messages.TraceReply{Trace: s.ledger.Trace()})
	case *messages.Lookup:
		h, ok := s.ledger.Lookup(m.Name)
		var err error
		if !ok {
			err = &budget.InvalidInputError{Message: fmt.Sprintf("unknown value name %q", m.Name)}
		}
		s.reply(m.ReplyTo, &messages.HandleReply{Handle: h, Err: err, Version: s.ledger.Version()})
	case *messages.ChargeDropped:
		s.chargeDropped(m)
	case messages.OwnedRequest:
		s.ownedRequest(m)
	case *messages.ReserveCapped:
		s.reserveCapped(m)
	case *messages.Shutdown:
		s.beginShutdown(m)
	case *ForceShutdown:
		s.forceShutdown(m)
	}
}

func (s *supervisor) reply(to *actor.PID, msg any) {
	s.stepDone(msg)
	if to != nil {
		s.eng.root.Send(to, msg)
	}
}

// acquire answers m, in rep when the requester brings its reply storage
// and to sink when it gave one (see AcquireRequest). The lease path
// allocates nothing here then: an allocation in the serialized section
// can be drafted into a garbage-collection assist, which would hold up
// every caller queued behind it.
func (s *supervisor) acquire(m *messages.Acquire, rep *messages.LeaseReply, sink ReplySink) {
	id, err := s.ledger.Acquire(m.Handle, m.Location)
	if rep == nil {
		rep = &messages.LeaseReply{}
	}
	*rep = messages.LeaseReply{Lease: id, Err: err, Version: s.ledger.Version()}
	s.replyDirect(sink, m.ReplyTo, rep)
}

// release answers m as acquire does.
func (s *supervisor) release(m *messages.Release, rep *messages.Reply, sink ReplySink) {
	err := s.ledger.Release(m.Lease)
	if rep == nil {
		rep = &messages.Reply{}
	}
	*rep = messages.Reply{Err: err, Version: s.ledger.Version()}
	s.replyDirect(sink, m.ReplyTo, rep)
}

// replyDirect answers through sink when the requester gave one (the
// lease path: no send through the actor system, and a parked requester
// is woken by the mailbox after the burst), else to to.
func (s *supervisor) replyDirect(sink ReplySink, to *actor.PID, msg any) {
	if sink == nil || s.mailbox == nil {
		s.reply(to, msg)
		return
	}
	s.stepDone(msg)
	if sink.Deliver(msg) {
		s.mailbox.deferWake(sink)
	}
}

// replyRun answers a run's caller; an Admit's reply carries its decision.
func (s *supervisor) replyRun(rs *runState, rep *messages.RunReply) {
	rep.Decision = rs.decision
	if rep.Version == 0 {
		rep.Version = s.ledger.Version()
	}
	s.reply(rs.replyTo, rep)
}

// stopFatal stops the runtime after a panic while handling msg. The
// ledger may hold a half-applied change, so from now on nothing is
// admitted: the caller of msg, every caller waiting on a transfer, a run, a
// reap or the shutdown, and every later caller receive the same
// [*FatalError]. Close still frees every physical buffer (Engine.Stop).
func (s *supervisor) stopFatal(msg, reason any, stack []byte) {
	req := s.handling
	if req == nil {
		req = actor.UnwrapEnvelopeMessage(msg)
	}
	kind := requestKind(req)
	s.fatal = &FatalError{Reason: fmt.Sprint(reason), Message: kind, Version: s.ledger.Version(), Stack: string(stack)}
	s.eng.log.Error().Str("reason", s.fatal.Reason).Str("message", s.fatal.Message).Uint64("state_version", s.fatal.Version).Str("stack", s.fatal.Stack).Msg("supervisor panicked; runtime stopped (every caller receives the fatal error)")
	s.refuse(msg)
	for id, op := range s.pending {
		to := op.replyTo
		if op.run != nil {
			to = op.run.replyTo
		}
		s.send(to, &messages.FatalReply{Err: s.fatal})
		delete(s.pending, id)
	}
	for ev, tos := range s.reapers {
		for _, to := range tos {
			s.send(to, &messages.FatalReply{Err: s.fatal})
		}
		delete(s.reapers, ev)
	}
	if s.closing != nil {
		s.send(s.closing, &messages.FatalReply{Err: s.fatal})
		s.closing = nil
	}
}

// refuse answers a request after a fatal stop.
func (s *supervisor) refuse(msg any) {
	msg = actor.UnwrapEnvelopeMessage(msg)
	switch m := msg.(type) { // what the sender parked for this request is ours to drop
	case *messages.Register:
		s.eng.newLoaders.take(m.LoaderKey)
	case *messages.RecordEvent:
		s.eng.events.take(m.EventKey)
	}
	if r, ok := msg.(messages.Request); ok {
		s.send(r.Replier(), &messages.FatalReply{Err: s.fatal})
	}
}

// send sends without the AfterLedger hook.
func (s *supervisor) send(to *actor.PID, msg any) {
	if to != nil {
		s.eng.root.Send(to, msg)
	}
}

// dispatch sends effects to the actors that carry them out: frees to the
// location actors, transfers to the value's actor.
func (s *supervisor) dispatch(effects []budget.Effect, adm budget.AdmissionID, data []byte) {
	for _, e := range effects {
		if e.Kind == budget.EffectFree {
			s.eng.root.Send(s.eng.locations[e.Location], &messages.Free{Key: messages.BufferKey{Value: e.Handle.ID, Location: e.Location}})
			continue
		}
		s.sendTransfer(&messages.DoTransfer{Admission: adm, Effect: e, Data: data}, false)
	}
}

// valueWorker is the value actor of a value with transfers in flight.
type valueWorker struct {
	pid      *actor.PID
	inflight int // transfers sent to it and not yet settled
}

// sendTransfer sends a transfer to its value's actor, giving the value
// one if it has none (no transfer in flight): an idle one, else a new
// one; a demotion's copy goes as a demoteTransfer.
func (s *supervisor) sendTransfer(t *messages.DoTransfer, demotion bool) {
	id := t.Effect.Handle.ID
	w := s.workers[id]
	if w == nil {
		w = &valueWorker{}
		if n := len(s.idle); n > 0 {
			w.pid, s.idle = s.idle[n-1], s.idle[:n-1]
		} else {
			w.pid = s.self.Spawn(s.valueProps)
		}
		s.workers[id] = w
	}
	w.inflight++
	if demotion {
		s.eng.root.Send(w.pid, &demoteTransfer{t})
		return
	}
	s.eng.root.Send(w.pid, t)
}

// transferSettled counts one of value id's transfers settled (completed
// or failed in the ledger) and, once none is left, takes its actor from
// the value: the actor has sent its outcome, its last act for that
// transfer, and nothing else is queued to it. The actor waits idle for
// the next value with a transfer (sparing a spawn and a stop per
// transfer) while fewer than idleActors wait; otherwise, or if it crashed
// (s.crashed), it is stopped.
func (s *supervisor) transferSettled(id uint64) {
	w := s.workers[id]
	if w == nil {
		return
	}
	if w.inflight--; w.inflight > 0 {
		return
	}
	delete(s.workers, id)
	if s.abandoning {
		return // stopped with the supervisor (a stuck one when it returns)
	}
	if len(s.idle) < idleActors && !w.pid.Equal(s.crashed) {
		s.idle = append(s.idle, w.pid)
		return
	}
	s.stopActor(w.pid)
}

// awaitQuiet asks the supervisor to stop its idle value actors and to
// answer once every value actor it stopped is gone (Engine.Stop: stopping
// the supervisor then sends no Stop to a child that is already
// terminating, which protoactor would report as a dead letter). Value
// actors of transfers in flight keep running.
type awaitQuiet struct{}

type quietReply struct{}

func (s *supervisor) answerQuiet() {
	if s.stopping > 0 {
		return
	}
	for _, to := range s.quiet {
		s.send(to, &quietReply{})
	}
	s.quiet = nil
}

func (s *supervisor) register(ctx actor.Context, m *messages.Register) {
	// The parked loader is this call's own (keyed per call): take it out
	// whatever the outcome, so a refused registration leaves nothing behind.
	var ld cuda.Loader
	if m.LoaderKey != 0 {
		ld, _ = s.eng.newLoaders.take(m.LoaderKey)
	}
	// The ledger's field checks first, then the runtime's own (they are
	// about later fields: the source's loader, the initial data), then
	// admission: one registration with several problems reports the first
	// in field order.
	err := s.ledger.CheckRegister(m.Spec)
	if err == nil {
		err = m.CheckRuntime()
	}
	if err != nil {
		s.reply(m.ReplyTo, &messages.HandleReply{Err: err, Version: s.ledger.Version()})
		return
	}
	h, adm, err := s.ledger.Register(m.Spec)
	if err != nil {
		s.reply(m.ReplyTo, &messages.HandleReply{Err: err, Version: s.ledger.Version()})
		return
	}
	if ld != nil {
		s.eng.loaders.put(h.ID, ld)
	}
	if !adm.Pending {
		s.reply(m.ReplyTo, &messages.HandleReply{Handle: h, Version: s.ledger.Version()})
		return
	}
	s.pending[adm.ID] = &pendingOp{kind: pendRegister, request: s.handling, replyTo: m.ReplyTo, handle: h, effect: adm.Effects[0]}
	s.dispatch(adm.Effects, adm.ID, m.Data)
}

func (s *supervisor) transition(_ actor.Context, m *messages.Transition) {
	var adm budget.Admission
	var effects []budget.Effect
	var err error
	switch m.Kind {
	case messages.Place:
		adm, err = s.ledger.Place(m.Handle, m.To)
	case messages.Copy:
		adm, err = s.ledger.Copy(m.Handle, m.From, m.To)
	case messages.Move:
		adm, err = s.ledger.Move(m.Handle, m.From, m.To)
	case messages.Evict:
		effects, err = s.ledger.Evict(m.Handle, m.From)
	case messages.Discard:
		effects, err = s.ledger.Discard(m.Handle)
	}
	if err != nil {
		s.reply(m.ReplyTo, &messages.RunReply{Err: err, Version: s.ledger.Version()})
		return
	}
	if m.Kind == messages.Discard {
		s.retire(m.Handle.ID)
	}
	if adm.Pending {
		s.pending[adm.ID] = &pendingOp{kind: pendDirect, request: s.handling, replyTo: m.ReplyTo, handle: m.Handle, effect: adm.Effects[0]}
		s.dispatch(adm.Effects, adm.ID, nil)
		return
	}
	if m.Kind == messages.Evict {
		s.observeEvict(m, effects)
	}
	s.dispatch(append(effects, adm.Effects...), 0, nil)
	s.reply(m.ReplyTo, &messages.RunReply{Version: s.ledger.Version()})
}

func (s *supervisor) transferDone(id budget.AdmissionID, cause error) {
	op, ok := s.pending[id]
	if !ok {
		return
	}
	// The op stays pending until its caller is answered: a panic while it
	// settles (a ledger invariant in Complete or Fail) reaches stopFatal
	// with the op still listed, so its caller receives the FatalError.
	s.handling, s.hooked = op.request, false
	s.observeTransfer(op.effect, cause)
	switch op.kind {
	case pendRegister:
		if cause == nil {
			_, err := s.ledger.Complete(id)
			s.reply(op.replyTo, &messages.HandleReply{Handle: op.handle, Err: err, Version: s.ledger.Version()})
			break
		}
		err := s.ledger.FailDirect(id, cause)
		s.retire(op.handle.ID)
		s.eng.log.Warn().Err(cause).Str("value", op.handle.Name).Msg("registration failed; handle retired, name free again")
		s.reply(op.replyTo, &messages.HandleReply{Err: err, Version: s.ledger.Version()})
	case pendDirect:
		if cause == nil {
			effects, err := s.ledger.Complete(id)
			s.dispatch(effects, 0, nil)
			s.reply(op.replyTo, &messages.RunReply{Err: err, Version: s.ledger.Version()})
			break
		}
		err := s.ledger.FailDirect(id, cause)
		s.eng.log.Warn().Err(cause).Str("value", op.handle.Name).Str("effect", op.effect.String()).Msg("transfer failed")
		s.reply(op.replyTo, &messages.RunReply{Err: err, Version: s.ledger.Version()})
	case pendRun:
		if cause == nil {
			effects, err := op.run.run.Complete()
			if err != nil {
				s.replyRun(op.run, &messages.RunReply{Err: err})
				break
			}
			s.dispatch(effects, 0, nil)
			s.advance(op.run)
			break
		}
		// A failed demotion drops the value instead and the run goes on
		// (budget.Run.FailStep); any other failed step ends the run.
		effects, err := op.run.run.FailStep(cause)
		if err == nil {
			s.eng.log.Warn().Err(cause).Str("effect", op.effect.String()).Msg("demotion failed; value dropped instead")
			s.dispatch(effects, 0, nil)
			s.advance(op.run)
			break
		}
		s.eng.log.Warn().Err(cause).Str("effect", op.effect.String()).Msg("plan step failed")
		s.replyRun(op.run, &messages.RunReply{Err: err})
	}
	delete(s.pending, id)
	// Settled after the reply and any next step of a run: a next transfer
	// of the same value goes to the same actor instead of a new one.
	s.transferSettled(op.effect.Handle.ID)
	s.maybeFinishShutdown()
}

func (s *supervisor) startRun(p budget.Plan, opts budget.RunOptions, scope string, replyTo *actor.PID, d *budget.Decision) {
	rs := &runState{replyTo: replyTo, scope: scope, decision: d}
	run, err := s.ledger.StartRun(p, opts)
	if err != nil {
		s.replyRun(rs, &messages.RunReply{Err: err})
		return
	}
	rs.run = run
	s.advance(rs)
}

// admit decides and enters in one message: no other mutation can come
// between the decision and the scope entry, so the decision's expected
// version is current by construction (the stale check still runs and
// cannot fail), and the run does not simulate the plan Decide just
// explained (budget.Ledger.StartDecided).
func (s *supervisor) admit(m *messages.Admit) {
	limit := m.StateLimit
	if limit == 0 {
		limit = s.eng.stateLimit
	}
	d, err := s.ledger.Decide(m.Request, limit)
	if err != nil {
		s.reply(m.ReplyTo, &messages.RunReply{Err: err, Version: s.ledger.Version()})
		return
	}
	rs := &runState{replyTo: m.ReplyTo, scope: m.Scope, decision: &d}
	run, err := s.ledger.StartDecided(&d, m.Scope)
	if err != nil {
		s.replyRun(rs, &messages.RunReply{Err: err})
		return
	}
	rs.run = run
	s.advance(rs)
}

// advance admits the run's steps until one is pending (a transfer in
// flight) or the run ends.
func (s *supervisor) advance(rs *runState) {
	for {
		step, ok, err := rs.run.Next()
		if err != nil {
			s.replyRun(rs, &messages.RunReply{Err: err})
			return
		}
		if !ok {
			report, leases, err := rs.run.Finish()
			s.replyRun(rs, &messages.RunReply{Report: report, Leases: leases, Reservations: rs.run.Reservations(), Err: err})
			return
		}
		adm := step.Admission
		if adm.Pending {
			s.pending[adm.ID] = &pendingOp{kind: pendRun, request: s.handling, run: rs, effect: adm.Effects[0]}
			if adm.Effects[0].Kind == budget.EffectDropCharge {
				s.dropCharge(adm.ID, adm.Effects[0])
				return
			}
			if step.Phase == budget.PhaseReclaim {
				s.dispatchDemotion(adm)
				return
			}
			s.dispatch(adm.Effects, adm.ID, nil)
			return
		}
		s.dispatch(adm.Effects, 0, nil)
	}
}

func (s *supervisor) exitScope(m *messages.ExitScope) {
	var first error
	report := s.ledger.Recording(func() {
		for _, id := range m.Leases {
			if err := s.ledger.Release(id); err != nil && first == nil {
				first = err
			}
		}
		for _, name := range m.Reservations {
			if err := s.ledger.UnreserveOwned(name, m.Scope); err != nil && first == nil {
				first = err
			}
		}
	})
	var err error
	if first != nil {
		err = &budget.PlanExecutionError{Phase: budget.PhaseExit, FailedActionIndex: -1, FailedReservationIndex: -1, PartialReport: report, Cause: first}
	}
	s.reply(m.ReplyTo, &messages.RunReply{Report: report, Err: err, Version: s.ledger.Version()})
}

func (s *supervisor) recordEvent(m *messages.RecordEvent) {
	id, err := s.ledger.RecordEvent(m.Lease)
	if err == nil {
		s.watch(id, m.EventKey)
	} else {
		s.eng.events.take(m.EventKey)
	}
	s.reply(m.ReplyTo, &messages.EventReply{Event: id, Err: err, Version: s.ledger.Version()})
}

// watch waits, on a goroutine of its own, for the device event parked
// under key (recorded as event id) and reports its completion to the
// supervisor, which reaps it. Engine.Stop cancels the wait.
func (s *supervisor) watch(id budget.EventID, key uint64) {
	ev, ok := s.eng.events.take(key)
	if !ok {
		return
	}
	eng := s.eng
	eng.watchers.add()
	go func() {
		defer eng.watchers.done()
		select {
		case <-ev.Done():
			eng.root.Send(eng.Supervisor, &messages.EventDone{Event: id})
		case <-eng.ctx.Done():
		}
	}()
}

func (s *supervisor) eventDone(m *messages.EventDone) {
	err := s.ledger.ReapEvent(m.Event)
	if err != nil && !s.closed {
		s.eng.log.Error().Err(err).Uint64("event", uint64(m.Event)).Msg("reap failed")
	}
	for _, to := range s.reapers[m.Event] {
		s.reply(to, &messages.Reply{Version: s.ledger.Version()})
	}
	delete(s.reapers, m.Event)
	s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
}

// maybeFinishShutdown completes a requested shutdown once no transfer is
// in flight: it reports what was still outstanding, force-releases it,
// removes every materialization (sending the frees) and replies with the
// final snapshot.
func (s *supervisor) maybeFinishShutdown() {
	if s.closing == nil || len(s.pending) > 0 {
		return
	}
	out := s.ledger.Outstanding()
	effects, err := s.ledger.Shutdown()
	s.dispatch(effects, 0, nil)
	for ev, tos := range s.reapers {
		for _, to := range tos {
			s.reply(to, &messages.Reply{Version: s.ledger.Version()})
		}
		delete(s.reapers, ev)
	}
	s.closed = true
	s.reply(s.closing, &messages.ShutdownReply{Outstanding: out, Final: s.ledger.Snapshot(), Err: err})
	s.closing = nil
}

// HandleFailure makes the supervisor the supervision strategy of its
// children. It runs on the supervisor's own mailbox goroutine (as a system
// message), so it may touch the ledger. A value actor that crashed in the
// middle of a transfer has that transfer failed (never completed), the
// buffers it may have allocated freed, and is restarted for the value's
// next transfers queued to it, or stopped when there are none.
func (s *supervisor) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason any, message any) {
	msg := actor.UnwrapEnvelopeMessage(message)
	if d, ok := msg.(*demoteTransfer); ok {
		msg = d.DoTransfer
	}
	s.eng.log.Error().Str("actor", child.String()).Interface("reason", reason).Msg("actor crashed; restarting it")
	defer func() {
		if r := recover(); r != nil {
			s.stopFatal(nil, r, debug.Stack())
		}
	}()
	if t, ok := msg.(*messages.DoTransfer); ok && s.fatal == nil {
		e := t.Effect
		s.eng.root.Send(s.eng.locations[e.Location], &messages.Free{Key: messages.BufferKey{Value: e.Handle.ID, Location: e.Location}})
		if e.TempAt != "" {
			s.eng.root.Send(s.eng.locations[e.TempAt], &messages.Free{Key: messages.BufferKey{Value: e.Handle.ID, Location: e.TempAt, Temporary: t.Admission}})
		}
		s.crashed = child // stopped, never kept idle, if nothing else is queued to it
		s.transferDone(t.Admission, &ActorCrashError{Actor: child.String(), Reason: fmt.Sprint(reason)})
		s.crashed = nil
		if w := s.workers[e.Handle.ID]; w == nil || !w.pid.Equal(child) {
			return // no transfer of the value left: its actor is stopping
		}
	}
	sup.RestartChildren(child)
}

// retire forgets a retired value (discarded, or whose registration
// failed): its loader is dropped, so nothing of it stays in the runtime;
// its handle keeps answering Unavailable (discarded) from the ledger
// alone. It has no value actor left once its last transfer settles (the
// ledger retires a value only once it has no transfer in flight and no
// pending event, so no watcher, left; a failed registration's actor stops
// as that failure settles).
func (s *supervisor) retire(id uint64) {
	s.eng.loaders.take(id)
}

// FatalError: the supervisor panicked while handling a message (a ledger
// invariant broke, or a bug) and stopped the runtime. The ledger may hold
// a half-applied change, so nothing more is admitted: the caller whose
// request was being handled, every caller waiting on the runtime and every
// later caller receive this error. Close still frees every device buffer.
type FatalError struct {
	// Reason is the panic value, in words.
	Reason string
	// Message is the type of the message being handled.
	Message string
	// Version is the state version when it happened.
	Version uint64
	// Stack is the supervisor's stack at the panic.
	Stack string
}

func (e *FatalError) Error() string {
	return fmt.Sprintf("residency runtime stopped on a fatal error while handling %s at state version %d: %s (nothing more is admitted; Close frees every buffer)", e.Message, e.Version, e.Reason)
}

// ActorCrashError is the cause of a transfer whose actor panicked.
type ActorCrashError struct {
	Actor  string
	Reason string
}

func (e *ActorCrashError) Error() string {
	return fmt.Sprintf("actor %s crashed: %s", e.Actor, e.Reason)
}
