package replay

import (
	"context"
	"errors"
	"fmt"
	"github.com/residency-go/residency/system/wire"

	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system"
)

// The ops on plans, decisions and scopes: one parse and one exec function
// per op (the table is in ops.go).

func parsePlanOp(o *Op, f *jsonline.Fields) { o.plan = readPlan(f, "plan") }

func parseDecide(o *Op, f *jsonline.Fields) {
	o.request = readRequest(f, "request")
	o.as = f.Str("as")
}

func parseEnter(o *Op, f *jsonline.Fields) {
	o.as = f.Str("as")
	d, hasD := f.OptStr("decision")
	hasP := f.Obj.Has("plan")
	switch {
	case hasD && hasP:
		f.Fail(fmt.Errorf("give either \"decision\" or \"plan\", not both"))
	case !hasD && !hasP:
		f.Fail(fmt.Errorf("needs \"decision\" (a decision's name) or \"plan\""))
	case hasP:
		o.plan = readPlan(f, "plan")
	}
	o.decision = d
	if v := f.OptInt("expected_version"); v != nil {
		switch {
		case hasD:
			f.Fail(fmt.Errorf("\"expected_version\" goes with \"plan\"; a decision carries its own"))
		case *v < 0:
			f.Fail(fmt.Errorf("field \"expected_version\": must be ≥ 0"))
		default:
			u := uint64(*v)
			o.expectedVersion = &u
		}
	}
}

func parseScope(o *Op, f *jsonline.Fields) { o.scope = f.Str("scope") }

func parseReleaseScopeLease(o *Op, f *jsonline.Fields) {
	o.scope = f.Str("scope")
	if n := f.OptInt("enter"); n != nil {
		if *n < 0 {
			f.Fail(fmt.Errorf("field \"enter\": an index into the plan's enter actions, ≥ 0"))
		}
		o.index = *n
	}
}

// execExplain: Explain never fails on a plan's content: a plan that fails
// validation (an unknown handle included) is infeasible, with the
// validation error as its reason.
func (r *Runner) execExplain(ctx context.Context, o Op, res *Result) (bool, error) {
	ex, err := r.sys.Explain(ctx, r.plan(o.plan))
	if err != nil {
		return true, err
	}
	e := wire.ExplanationOf(ex)
	res.Explanation = &e
	return true, nil
}

func (r *Runner) execExecute(ctx context.Context, o Op, res *Result) (bool, error) {
	p := r.plan(o.plan)
	r.explain(ctx, o, p)
	rep, err := r.sys.Execute(ctx, p)
	if err != nil {
		return true, err
	}
	res.Report = r.toReport(rep)
	return true, nil
}

// execDecide: fields request, then as.
func (r *Runner) execDecide(ctx context.Context, o Op, res *Result) (bool, error) {
	req := r.request(o.request)
	if _, dup := r.decisions[o.as]; dup || o.as == "" {
		if _, err := r.sys.Decide(ctx, req); err != nil && isFieldError(err) {
			return true, err
		}
		if o.as == "" {
			return true, invalid("a decision name must not be empty")
		}
		return true, invalid("duplicate decision name %q", o.as)
	}
	d, err := r.sys.Decide(ctx, req)
	if err != nil {
		return true, err
	}
	r.decisions[o.as] = d
	r.fresh = append(r.fresh, o.as)
	res.Decision = r.toDecision(d)
	return true, nil
}

// execEnter: `enter … as S` binds S whatever the outcome: a failed scope
// is still a scope (exiting it is invalid input), and scopes are
// single-use.
func (r *Runner) execEnter(ctx context.Context, o Op, res *Result) (bool, error) {
	if o.as == "" {
		return false, invalid("a scope name must not be empty")
	}
	if _, dup := r.scopes[o.as]; dup {
		return false, invalid("scope %q already exists: a scope is single-use, enter a new one under another name", o.as)
	}
	entry := &scopeEntry{state: scopeFailed}
	r.scopes[o.as] = entry
	defer func() {
		if entry.state == scopeFailed {
			r.finishScope(o.as, entry) // a failed scope only answers for its name
		}
	}()
	var sc *system.Scope
	var plan system.Plan
	if o.decision != "" {
		d, ok := r.decisions[o.decision]
		if !ok {
			return false, invalid("unknown decision %q", o.decision)
		}
		sc, plan = r.sys.ScopeFor(d), d.Plan
	} else if o.expectedVersion != nil {
		plan = r.plan(o.plan)
		r.explain(ctx, o, plan)
		sc = r.sys.NewScopeExpecting(plan, *o.expectedVersion)
	} else {
		plan = r.plan(o.plan)
		r.explain(ctx, o, plan)
		sc = r.sys.NewScope(plan)
	}
	entry.scope = sc
	r.scopeNames[sc.Name()] = o.as
	if err := sc.Enter(ctx); err != nil {
		return true, err
	}
	entry.state = scopeEntered
	for _, rs := range plan.Reservations {
		entry.resv = append(entry.resv, rs.Name)
		r.resvScopes[rs.Name] = o.as
	}
	for _, id := range sc.Leases() {
		r.leaseNames[uint64(id)] = scriptName{kind: "lease", name: o.as, scope: true}
	}
	res.Report = r.toReport(sc.Report())
	return true, nil
}

func (r *Runner) execExit(ctx context.Context, o Op, _ *Result) (bool, error) {
	e, ok := r.scopes[o.scope]
	switch {
	case !ok:
		return false, invalid("unknown scope %q", o.scope)
	case e.state == scopeFailed:
		return false, invalid("scope %q cannot exit: its entry failed, so it holds nothing", o.scope)
	case e.state == scopeExited:
		return false, invalid("scope %q cannot exit: it already exited", o.scope)
	}
	err := e.scope.Exit(ctx)
	var pe *system.PlanExecutionError
	if err == nil || errors.As(err, &pe) {
		e.state = scopeExited // an exit failure is kept; the scope is done
		for _, name := range e.resv {
			delete(r.resvScopes, name)
		}
		r.finishScope(o.scope, e)
	}
	return true, err
}

// execReleaseScopeLease releases the lease a scope took for one enter
// action, by id behind the scope's back (as a tool that keeps lease ids
// would): the scope's exit then fails in phase exit.
func (r *Runner) execReleaseScopeLease(ctx context.Context, o Op, _ *Result) (bool, error) {
	e, ok := r.scopes[o.scope]
	switch {
	case !ok:
		return false, invalid("unknown scope %q", o.scope)
	case e.state != scopeEntered:
		return false, invalid("scope %q holds no leases: it is not entered", o.scope)
	}
	ids := e.scope.Leases()
	if o.index >= int64(len(ids)) {
		return false, invalid("scope %q has %d enter action(s): no enter %d", o.scope, len(ids), o.index)
	}
	return true, r.sys.ReleaseByID(ctx, ids[o.index])
}
