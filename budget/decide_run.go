package budget

// StartDecided starts the run of d's plan in scope, as
// StartRun(d.Plan, RunOptions{Scope: scope, CheckVersion: true,
// ExpectedVersion: d.ExpectedStateVersion}) does. d must be a decision as
// [Ledger.Decide] of this ledger returned it, plan unchanged. While the
// ledger is still at d.ExpectedStateVersion, d.Explanation is the
// explanation StartRun would compute (the state is the one Decide
// simulated the plan on), so StartDecided does not simulate the plan
// again; at any other version it refuses with a [*StaleStateError], as
// StartRun does. Nothing changes on error.
func (l *Ledger) StartDecided(d *Decision, scope string) (*Run, error) {
	opts := RunOptions{Scope: scope, CheckVersion: true, ExpectedVersion: d.ExpectedStateVersion}
	if l.version != d.ExpectedStateVersion || !d.Explanation.Feasible {
		return l.StartRun(d.Plan, opts)
	}
	r := &Run{l: l, plan: d.Plan, opts: opts}
	// A step commits about two transitions (admit, complete): size the
	// report once instead of growing it step by step.
	r.report.entries = make([]traceEntry, 0, 2*(len(d.Plan.Reclaim)+len(d.Plan.Enter))+len(d.Plan.Reservations))
	return r, nil
}
