package system

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Scope is a single-use plan execution that protects what it entered:
// after a successful Enter it holds a lease on every entered endpoint
// until Exit. A scope's reservations belong to it (Unreserve refuses
// them) and are released at Exit.
type Scope struct {
	sys      *System
	name     string
	plan     Plan
	check    bool
	expected uint64

	mu      sync.Mutex
	state   scopeState
	leases  []LeaseID
	resv    []string
	report  Report
	exitErr error
}

type scopeState int

const (
	scopeNew scopeState = iota
	scopeEntered
	scopeFailed
	scopeExited
)

// NewScope prepares a scope for plan. Nothing is checked or changed until
// Enter.
func (s *System) NewScope(plan Plan) *Scope {
	return &Scope{sys: s, plan: plan, name: "scope-" + strconv.FormatUint(s.scopeSeq.Add(1), 10)}
}

// NewScopeExpecting prepares a scope whose Enter first checks that the
// state version is still expected ([*StaleStateError] otherwise).
func (s *System) NewScopeExpecting(plan Plan, expected uint64) *Scope {
	sc := s.NewScope(plan)
	sc.check, sc.expected = true, expected
	return sc
}

// ScopeFor prepares a scope for a controller decision: its plan, with the
// decision's expected state version.
func (s *System) ScopeFor(d Decision) *Scope {
	return s.NewScopeExpecting(d.Plan, d.ExpectedStateVersion)
}

// Name returns the scope's name (it owns the scope's reservations).
func (sc *Scope) Name() string { return sc.name }

// Enter enters the scope: the stale-state check before any mutation, the
// preflight (PlanError, nothing changed), then reclaim → reserve → enter,
// then one lease per entered endpoint. A failure after preflight is a
// [*PlanExecutionError] with phase reclaim, reserve or enter; committed
// steps stay, the scope's reservations are released, no lease is held, and
// the scope cannot be entered again. Entering twice: [*InvalidInputError].
func (sc *Scope) Enter(ctx context.Context) (err error) {
	defer func() { sc.sys.stats.entered(ctx, err) }()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.state != scopeNew {
		return &budget.InvalidInputError{Message: fmt.Sprintf("%s is single-use: it was already entered", sc.name)}
	}
	r, err := sc.sys.call(ctx, func(p *actor.PID) any {
		return &messages.EnterScope{Scope: sc.name, Plan: sc.plan, CheckVersion: sc.check, ExpectedVersion: sc.expected, ReplyTo: p}
	}, sc.exitLate)
	if err != nil {
		sc.state = scopeFailed
		return err
	}
	rep := r.(*messages.RunReply)
	if rep.Err != nil {
		sc.state = scopeFailed
		return rep.Err
	}
	sc.state, sc.leases, sc.resv, sc.report = scopeEntered, rep.Leases, rep.Reservations, rep.Report
	return nil
}

// exitLate hands back what an entry took for a caller who stopped waiting
// for it (the scope is failed for that caller and can never exit): its
// leases and reservations are released as an exit would.
func (sc *Scope) exitLate(m any) {
	if rep, ok := m.(*messages.RunReply); ok && rep.Err == nil {
		sc.sys.root.Send(sc.sys.sup, &messages.ExitScope{Scope: sc.name, Leases: rep.Leases, Reservations: rep.Reservations})
	}
}

// Report returns the transitions the scope's entry committed.
func (sc *Scope) Report() Report {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.report
}

// Leases returns the ids of the scope's leases (one per enter action).
func (sc *Scope) Leases() []LeaseID {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return append([]LeaseID(nil), sc.leases...)
}

// Exit releases the scope's leases and reservations. A failure is a
// [*PlanExecutionError] with phase "exit", also kept as ExitError. Exit of
// a scope that was not entered, failed, or already exited:
// [*InvalidInputError]. If ctx is already done, Exit returns ctx.Err()
// and the scope stays entered (call Exit again); if ctx ends after the
// request was sent, the release still happens.
func (sc *Scope) Exit(ctx context.Context) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.state != scopeEntered {
		return &budget.InvalidInputError{Message: fmt.Sprintf("%s cannot exit: it is not entered (never entered, failed, or already exited)", sc.name)}
	}
	sent := true
	r, err := sc.sys.callOwned(ctx, func(p *actor.PID) any {
		return &messages.ExitScope{Scope: sc.name, Leases: sc.leases, Reservations: sc.resv, ReplyTo: p}
	}, nil, func() { sent = false })
	if !sent && !errors.Is(err, ErrClosed) {
		var fe *FatalError
		if !errors.As(err, &fe) {
			// ctx ended before the exit was sent: nothing was released and
			// the scope is still entered; Exit again with a live context.
			return err
		}
	}
	// Sent (the runtime releases the scope's leases and reservations even
	// if ctx ends before the reply), or the runtime is closed or stopped
	// (Close released them).
	sc.state = scopeExited
	if err != nil {
		sc.exitErr = err
		return err
	}
	sc.exitErr = r.(*messages.RunReply).Err
	return sc.exitErr
}

// ExitError returns the error of Exit (nil if it succeeded or has not run).
func (sc *Scope) ExitError() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.exitErr
}

// WithScope enters a scope for plan, runs body, and exits. If body fails,
// its error is returned (primary) and an exit failure is kept on the
// scope's ExitError; otherwise the exit error is returned.
func (s *System) WithScope(ctx context.Context, plan Plan, body func(*Scope) error) error {
	sc := s.NewScope(plan)
	if err := sc.Enter(ctx); err != nil {
		return err
	}
	berr := body(sc)
	xerr := sc.Exit(context.WithoutCancel(ctx))
	if berr != nil {
		return berr
	}
	return xerr
}
