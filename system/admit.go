package system

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Admit asks the controller for a decision on req and enters it as a scope
// in one step of the runtime: nothing can change the state between the
// decision and the start of the entry, so under load it never fails with
// a [*StaleStateError] (the two-step path, [System.Decide] then
// [System.ScopeFor] and [Scope.Enter], does as soon as other callers commit
// in between; keep it for what-if questions). One exception: while a
// demotion the plan needs copies its victim to the spill target, other
// calls run, and may take the room the plan's drops freed; the entry
// then fails with a [*PlanExecutionError] (its victims stay evicted), and
// a waiting Admit is tried again.
//
// On success the scope is entered (a lease on every entered endpoint, the
// decision's reservations owned by the scope) and the decision is returned
// as evidence: explored states, evictions with their reasons, the plan and
// its explanation. Exit the scope when done.
//
// Errors: the controller's ([*PlanError], [*SearchLimitError],
// [*UnavailableError], [*InvalidInputError]; no decision, nothing changed;
// without a wait option also [*WaitersAheadError], errors.Is [ErrBusy],
// when the room it needs is held by earlier waiters: see [System.Place])
// or the entry's ([*PlanExecutionError] with the committed prefix; the
// decision is returned alongside). If ctx ends before the reply, the call
// returns ctx.Err() and whatever the entry took is handed back.
//
// Waiting for room: with a [WaitOption] ([WaitForRoom], [WaitClass],
// [WaitAllowBypass]) a refusal that room could lift — a [*PlanError], a
// [*BudgetError], or anything matching [ErrBusy] — does not return:
// the caller joins the runtime's wait queue and is tried again, whole,
// each time room may have been made (an exit, a lease release, an
// eviction, a discard, an unreserve, a cache lease released), in queue
// order (docs/semantics.md, "Waiting for room"). It returns once admitted,
// on a refusal waiting cannot change (also a [*PlanError] for a request
// that can never fit: see budget.CannotFit), when ctx ends (ctx.Err(); nothing
// is left behind) or when the runtime closes ([ErrClosed]). A full queue
// refuses at once with a [*QueueFullError] (errors.Is [ErrBusy];
// Options.MaxWaiters). A waiter holds nothing while it waits: each try is
// one Admit, admitted whole or not at all.
func (s *System) Admit(ctx context.Context, req Request, opts ...WaitOption) (*Scope, Decision, error) {
	return s.AdmitWithLimit(ctx, req, 0, opts...)
}

// AdmitWithLimit is Admit with an explicit state limit (0 = default).
func (s *System) AdmitWithLimit(ctx context.Context, req Request, limit int, opts ...WaitOption) (sc *Scope, dec Decision, rerr error) {
	defer s.stats.admitted(ctx, time.Now(), &dec, &rerr)
	wc := waitConfigOf(opts)
	if !wc.Wait {
		return s.admitOnce(ctx, req, limit, 0, 0)
	}
	if err := s.refusal(ctx); err != nil {
		return nil, Decision{}, err
	}
	spec := budget.WaitSpec{Name: req.Name, Class: wc.Class, Locations: budget.RequestLocations(req), AllowBypass: wc.Bypass}
	checked := false
	rerr = s.room.wait(ctx, spec, wc.Notify, true, func(id budget.WaitID) (bool, error) {
		sc, dec, rerr = s.admitOnce(ctx, req, limit, wc.Class, id)
		if !roomWaitable(rerr) {
			return true, rerr
		}
		if !checked { // after the first refusal: can it ever fit?
			checked = true
			if err := s.cannotFit(ctx, req); err != nil {
				return true, err
			}
		}
		return false, rerr
	})
	if rerr != nil {
		return nil, dec, rerr
	}
	return sc, dec, nil
}

// admitOnce is one Admit: one request to the runtime, made under the
// room held by the waiters ahead of it — for a call of class that is not
// queued (waiter 0: a call that does not wait is class 0), every waiter
// of its class or higher; for a queued waiter's turn, those ahead of it
// in the queue (budget.WaitQueue.HeldAhead).
func (s *System) admitOnce(ctx context.Context, req Request, limit int, class int, waiter budget.WaitID) (*Scope, Decision, error) {
	sc := s.NewScope(Plan{})
	sc.mu.Lock()
	defer sc.mu.Unlock()
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.Admit{Request: req, StateLimit: limit, Scope: sc.name, Class: class, Waiter: uint64(waiter), ReplyTo: p}
	}, sc.exitLate)
	if err != nil {
		return nil, Decision{}, err
	}
	rep := r.(*messages.RunReply)
	var d Decision
	if rep.Decision != nil {
		d = *rep.Decision
		sc.plan, sc.check, sc.expected = d.Plan, true, d.ExpectedStateVersion
	}
	if rep.Err != nil {
		return nil, d, rep.Err
	}
	sc.state, sc.leases, sc.resv, sc.report = scopeEntered, rep.Leases, rep.Reservations, rep.Report
	return sc, d, nil
}
