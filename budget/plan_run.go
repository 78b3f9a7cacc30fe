package budget

// Plan runs: a plan executed step by step on the ledger (scopes and
// execute).

import "errors"

// RunOptions configures [Ledger.StartRun].
type RunOptions struct {
	// Scope names the owning scope; "" runs the plan as a direct execute
	// (phase "execute", reservations stay active as ordinary ones).
	Scope string
	// CheckVersion makes StartRun refuse with a StaleStateError when the
	// state version differs from ExpectedVersion.
	CheckVersion    bool
	ExpectedVersion uint64
}

// Run executes a plan step by step. The runtime calls [Run.Next] to admit
// the next step, carries out its effects, settles a pending step with
// [Run.Complete] or [Run.Fail], and finally calls [Run.Finish]. Other
// transitions may be committed between steps; they are not part of the
// run's report.
type Run struct {
	l            *Ledger
	plan         Plan
	opts         RunOptions
	phase        planPhase
	index        int
	pending      AdmissionID
	charge       *reservation // the charge of a pending charge eviction
	demoted      *reservation // its new charge at the spill target, when it is a demotion
	report       recorder     // every transition the run commits
	reservations []string     // reservations this run admitted, in order
	failed       error
	done         bool
}

// planPhase is the part of its plan a run is in: its reclaims, then its
// reservations, then its enters; done once every step has been admitted.
type planPhase int

const (
	planReclaim planPhase = iota
	planReserve
	planEnter
	planDone
)

func (p planPhase) String() string {
	switch p {
	case planReclaim:
		return PhaseReclaim
	case planReserve:
		return PhaseReserve
	case planEnter:
		return PhaseEnter
	default:
		return "done"
	}
}

// StartRun checks a plan before any mutation: the expected version (when
// asked) → StaleStateError; handles and locations → Unavailable or invalid
// input; [Ledger.Explain] → PlanError with its reason. Nothing changes on
// error.
func (l *Ledger) StartRun(p Plan, opts RunOptions) (*Run, error) {
	if opts.CheckVersion && opts.ExpectedVersion != l.version {
		return nil, &StaleStateError{ExpectedVersion: opts.ExpectedVersion, ActualVersion: l.version}
	}
	if _, err := l.planValues(p); err != nil {
		return nil, err
	}
	if ex, err := l.explain(p); !ex.Feasible {
		var wa *WaitersAheadError
		if errors.As(err, &wa) {
			// Blocked by room earlier waiters hold (WithHeld): busy,
			// not infeasible.
			// The detail names the step; the refusal's own words are
			// Error's already.
			detail := ex.Reason
			var se *stepError
			if errors.As(err, &se) {
				detail = se.Step
			}
			return nil, &WaitersAheadError{Location: wa.Location, Waiters: wa.Waiters, Detail: detail}
		}
		return nil, &PlanError{Reason: ex.Reason}
	}
	return &Run{l: l, plan: p, opts: opts}, nil
}

// Step is one admitted step of a run.
type Step struct {
	Phase     string // reclaim, reserve or enter
	Index     int    // within its list
	Admission Admission
}

func (r *Run) phaseName() string {
	if r.opts.Scope == "" {
		return PhaseExecute
	}
	if r.phase == planDone {
		// Every step was admitted: a failure now is the scope's leases
		// in Finish, part of entering.
		return PhaseEnter
	}
	return r.phase.String()
}

// releaseReservations releases, newest first, the reservations a failed
// scope entry admitted, recording each release in the report. A plain
// execute admits ordinary reservations that stay active (released by
// name), failed or not: nothing to do.
func (r *Run) releaseReservations() {
	if r.opts.Scope == "" {
		return
	}
	r.l.recordInto(&r.report, func() {
		for j := len(r.reservations) - 1; j >= 0; j-- {
			_ = r.l.unreserve(r.reservations[j], r.opts.Scope)
		}
	})
	r.reservations = nil
}

// Next admits the next step and returns it; ok is false when every step
// has been admitted and settled. A step with a pending admission (an
// enter, or a demotion in the reclaim phase) must be settled before Next
// is called again. On failure it returns a *PlanExecutionError and the
// run is over; a scope's reservations admitted so far are released, an
// execute's stay active.
func (r *Run) Next() (step Step, ok bool, err error) {
	if r.failed != nil {
		return Step{}, false, r.failed
	}
	if r.pending != 0 {
		return Step{}, false, invalidf("run step is still pending")
	}
	for r.phase != planDone {
		switch r.phase {
		case planReclaim:
			if r.index >= len(r.plan.Reclaim) {
				r.phase, r.index = planReserve, 0
				continue
			}
			i, a := r.index, r.plan.Reclaim[r.index]
			r.index++
			if a.Charge != "" {
				return r.nextChargeEviction(i, a)
			}
			if a.To != "" {
				return r.nextDemotion(i, a)
			}
			return r.nextReclaim(i, a)
		case planReserve:
			if r.index >= len(r.plan.Reservations) {
				r.phase, r.index = planEnter, 0
				continue
			}
			i, s := r.index, r.plan.Reservations[r.index]
			r.index++
			var e error
			owner := r.opts.Scope
			if s.Owner != "" {
				owner = s.Owner
			}
			r.l.recordInto(&r.report, func() { e = r.l.reserve(s.Location, s.Name, s.Bytes, owner) })
			if e != nil {
				return Step{}, false, r.fail(e, nil, -1, &s, i)
			}
			if s.Owner == "" {
				r.reservations = append(r.reservations, s.Name)
			}
			return Step{Phase: PhaseReserve, Index: i}, true, nil
		case planEnter:
			if r.index >= len(r.plan.Enter) {
				r.phase = planDone
				continue
			}
			i, a := r.index, r.plan.Enter[r.index]
			r.index++
			return r.nextEnter(i, a)
		}
	}
	return Step{}, false, nil
}

// nextReclaim commits reclaim step i, a plain removal.
func (r *Run) nextReclaim(i int, a Action) (Step, bool, error) {
	var effects []Effect
	var e error
	r.l.recordInto(&r.report, func() {
		var v *value
		if v, e = r.l.value(a.Handle); e != nil {
			return
		}
		loc, locErr := r.l.location(a.Location)
		if locErr != nil {
			e = locErr
			return
		}
		var m *mat
		if m, e = r.l.checkEvict(v, loc); e != nil {
			return
		}
		r.l.removeMat(v, m, RemovalReclaim)
		effects = []Effect{r.l.freeEffect(v, loc)}
	})
	if e != nil {
		return Step{}, false, r.fail(e, &a, i, nil, -1)
	}
	return Step{Phase: PhaseReclaim, Index: i, Admission: Admission{Effects: effects}}, true, nil
}

// nextEnter admits enter step i.
func (r *Run) nextEnter(i int, a Action) (Step, bool, error) {
	var adm Admission
	var e error
	r.l.recordInto(&r.report, func() {
		var v *value
		if v, e = r.l.value(a.Handle); e != nil {
			return
		}
		if _, e = r.l.location(a.Location); e != nil {
			return
		}
		if a.From != "" {
			if _, e = r.l.location(a.From); e != nil {
				return
			}
		}
		adm, e = r.l.enter(v, a)
	})
	if e != nil {
		return Step{}, false, r.fail(e, &a, i, nil, -1)
	}
	if adm.Pending {
		r.pending = adm.ID
	}
	return Step{Phase: PhaseEnter, Index: i, Admission: adm}, true, nil
}

// Complete settles the pending step (an enter, or a demotion) as done and
// returns the effects its completion produced (a move's source free). For
// a charge's eviction (EffectDropCharge) it is the owner's confirmation:
// the charge is released; no effects.
func (r *Run) Complete() ([]Effect, error) {
	if r.pending == 0 {
		return nil, invalidf("no run step is pending")
	}
	if r.charge != nil {
		r.pending = 0
		r.completeCharge()
		return nil, nil
	}
	var effects []Effect
	var err error
	r.l.recordInto(&r.report, func() { effects, err = r.l.Complete(r.pending) })
	r.pending = 0
	return effects, err
}

// FailStep settles the pending step as failed with cause. A failed enter
// ends the run: it returns the run's *PlanExecutionError. A failed
// demotion (a reclaim with To) drops the value's materialization at its
// location instead, as a plain reclaim would have, and the run goes on:
// it returns the free effect to carry out and no error; only when that
// removal would lose data does the run fail (phase reclaim, cause the
// copy's failure). For a charge's eviction it is the owner's refusal: the
// charge is not offered again and the run fails (phase reclaim) with a
// [*ChargeBusyError] (Refused, Cause cause) as its cause.
func (r *Run) FailStep(cause error) ([]Effect, error) {
	if r.pending == 0 {
		return nil, invalidf("no run step is pending")
	}
	id := r.pending
	r.pending = 0
	if r.charge != nil {
		return nil, r.failCharge(cause)
	}
	if r.phase == planReclaim {
		return r.failDemotion(id, cause)
	}
	r.l.recordInto(&r.report, func() { _ = r.l.Fail(id, cause) })
	i := r.index - 1
	a := r.plan.Enter[i]
	return nil, r.fail(cause, &a, i, nil, -1)
}

// Fail is [Run.FailStep] for a caller that carries out no effects (a
// dropped demotion's free effect is discarded): it returns the run's
// *PlanExecutionError, or nil when the run goes on.
func (r *Run) Fail(cause error) error {
	_, err := r.FailStep(cause)
	return err
}

// fail ends the run with a *PlanExecutionError. A failed scope entry first
// releases the reservations it admitted; the partial report is taken after
// that cleanup, so it lists every transition the run committed, the
// releases included.
func (r *Run) fail(cause error, a *Action, actionIndex int, s *ReservationSpec, reservationIndex int) error {
	r.releaseReservations()
	e := &PlanExecutionError{
		Phase:                  r.phaseName(),
		FailedAction:           a,
		FailedActionIndex:      actionIndex,
		FailedReservation:      s,
		FailedReservationIndex: reservationIndex,
		PartialReport:          Report{Transitions: r.report.transitions()},
		Cause:                  cause,
	}
	r.failed = e
	r.done = true
	return e
}

// Finish ends a run whose steps all succeeded. For a scope it takes one
// lease on every entered endpoint (1 version each), in enter order, and
// returns them. The report lists every transition the run committed.
func (r *Run) Finish() (Report, []LeaseID, error) {
	if r.failed != nil {
		return Report{}, nil, r.failed
	}
	if r.phase != planDone || r.pending != 0 {
		return Report{}, nil, invalidf("run is not finished")
	}
	if r.done {
		return Report{}, nil, invalidf("run already finished")
	}
	r.done = true
	var leases []LeaseID
	if r.opts.Scope != "" {
		for i, a := range r.plan.Enter {
			var id LeaseID
			var err error
			r.l.recordInto(&r.report, func() { id, err = r.l.Acquire(a.Handle, a.Location) })
			if err != nil {
				// The entry failed: release the leases taken so far and
				// the reservations (both recorded in the report).
				r.l.recordInto(&r.report, func() {
					for _, x := range leases {
						_ = r.l.Release(x)
					}
				})
				return Report{}, nil, r.fail(err, &a, i, nil, -1)
			}
			leases = append(leases, id)
		}
	}
	return Report{Transitions: r.report.transitions()}, leases, nil
}

// Reservations returns the names of the reservations the run admitted.
func (r *Run) Reservations() []string { return append([]string(nil), r.reservations...) }
