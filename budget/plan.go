package budget

import "fmt"

// simClone returns a simulation copy of the ledger for a plan touching
// vals: the locations' figures and the listed values are copied (copy on
// write: nothing else is), so transitions on the clone change only the
// clone. The clone sees no other value; the simulation must touch only
// the values it listed (it looks them up with simValue). Reservations:
// the clone starts with none of its own but refuses the names active in
// l (its reserve checks them), which is all a simulation needs of them.
func (l *Ledger) simClone(vals []*value) *Ledger {
	c := &Ledger{
		id:         l.id,
		version:    l.version,
		locs:       make([]location, len(l.locs)),
		locIdx:     l.locIdx,
		vals:       valueTable{byID: make(map[uint64]*value, len(vals)), maxID: l.vals.maxID},
		byName:     l.byName,
		resv:       map[string]*reservation{},
		parentResv: l.resv,
		xfers:      map[AdmissionID]*transfer{},
		sim:        true,
	}
	copy(c.locs, l.locs)
	for i := range c.locs {
		c.locs[i].peak = c.locs[i].used + c.locs[i].reserved
		c.locs[i].reservations = nil
	}
	for _, v := range vals {
		if c.vals.byID[v.id] != nil {
			continue // already copied
		}
		cv := *v
		cv.mats = make([]*mat, len(v.mats))
		for i, m := range v.mats {
			cm := *m
			cv.mats[i] = &cm
		}
		c.vals.byID[v.id] = &cv
	}
	return c
}

// simValue returns the simulation's copy of the value with id.
func (l *Ledger) simValue(id uint64) *value { return l.vals.byID[id] }

// planValues resolves and validates every handle and location of a plan.
// Errors: Unavailable (foreign, discarded, unconfigured location), invalid
// input (unknown handle, malformed location, bad reservation: empty,
// repeated or already active name, bytes ≤ 0).
func (l *Ledger) planValues(p Plan) ([]*value, error) {
	var vals []*value
	check := func(a Action, what string, i int) error {
		v, err := l.value(a.Handle)
		if err != nil {
			return err
		}
		if _, err := l.location(a.Location); err != nil {
			return err
		}
		if a.From != "" {
			if what == "reclaim" {
				return invalidf("reclaim %d (%s): from is only meaningful for enter actions", i, a)
			}
			if _, err := l.location(a.From); err != nil {
				return err
			}
		}
		vals = append(vals, v)
		return nil
	}
	for i, a := range p.Reclaim {
		if err := check(a, "reclaim", i); err != nil {
			return nil, err
		}
	}
	names := map[string]bool{}
	for i, r := range p.Reservations {
		if r.Name == "" {
			return nil, invalidf("reservation %d has an empty name", i)
		}
		if names[r.Name] {
			return nil, invalidf("reservation name %q appears twice in the plan", r.Name)
		}
		if _, active := l.resv[r.Name]; active {
			return nil, invalidf("duplicate reservation name %q (already active)", r.Name)
		}
		names[r.Name] = true
		if r.Bytes <= 0 {
			return nil, invalidf("reservation %q: bytes must be positive, got %d", r.Name, r.Bytes)
		}
		if _, err := l.location(r.Location); err != nil {
			return nil, err
		}
	}
	for i, a := range p.Enter {
		if err := check(a, "enter", i); err != nil {
			return nil, err
		}
	}
	return vals, nil
}

// Explain simulates plan p on the current state without changing it: every
// reclaim, then every reservation, then every enter one after another (each
// admitted and completed before the next). It reports whether the plan is
// feasible, the first failure in words, and the predicted peak of
// used+reserved at every location, overlap and temporary reconstruction
// charges included. A plan whose entered endpoint is not resident at the
// end is infeasible. A read: no version. Invalid handles or locations make
// it infeasible with the validation error as the reason.
func (l *Ledger) Explain(p Plan) Explanation {
	ex, _ := l.explain(p)
	return ex
}

// explain returns the explanation and, when infeasible, the error that
// stopped the simulation.
func (l *Ledger) explain(p Plan) (Explanation, error) {
	vals, err := l.planValues(p)
	if err != nil {
		return Explanation{Reason: err.Error(), PredictedPeakBytes: l.currentPeaks()}, err
	}
	c := l.simClone(vals)
	fail := func(err error) (Explanation, error) {
		return Explanation{Reason: err.Error(), PredictedPeakBytes: c.simPeaks()}, err
	}
	for i, a := range p.Reclaim {
		v := c.simValue(a.Handle.ID)
		loc := c.locIdx[a.Location]
		m, err := c.checkEvict(v, loc)
		if err != nil {
			return fail(fmt.Errorf("reclaim %d (%s): %w", i, a, err))
		}
		c.removeMat(v, m, "reclaim")
	}
	for i, r := range p.Reservations {
		if err := c.reserve(r.Location, r.Name, r.Bytes, "plan"); err != nil {
			return fail(fmt.Errorf("reservation %d (%s): %w", i, r, err))
		}
	}
	for i, a := range p.Enter {
		v := c.simValue(a.Handle.ID)
		adm, err := c.enter(v, a)
		if err != nil {
			return fail(fmt.Errorf("enter %d (%s): %w", i, a, err))
		}
		if adm.Pending {
			if _, err := c.Complete(adm.ID); err != nil {
				return fail(err)
			}
		}
	}
	for i, a := range p.Enter {
		v := c.simValue(a.Handle.ID)
		if m := v.mat(c.locIdx[a.Location]); m == nil || m.state != Resident {
			err := planf("enter %d (%s): endpoint is not resident at the end of the plan (a later step moved or removed it)", i, a)
			return fail(err)
		}
	}
	return Explanation{Feasible: true, PredictedPeakBytes: c.simPeaks()}, nil
}

func (l *Ledger) currentPeaks() map[string]int64 {
	out := make(map[string]int64, len(l.locs))
	for i := range l.locs {
		out[l.locs[i].name] = l.locs[i].used + l.locs[i].reserved
	}
	return out
}

func (l *Ledger) simPeaks() map[string]int64 {
	out := make(map[string]int64, len(l.locs))
	for i := range l.locs {
		out[l.locs[i].name] = l.locs[i].peak
	}
	return out
}

// enter admits one enter action: with From, a copy (replicable) or a move
// (exclusive) from that materialization; without, a place.
func (l *Ledger) enter(v *value, a Action) (Admission, error) {
	d := l.locIdx[a.Location]
	if a.From == "" {
		return l.place(v, d)
	}
	f := l.locIdx[a.From]
	if _, err := l.residentMat(v, f, "enter source"); err != nil {
		return Admission{}, err
	}
	if m := v.mat(d); m != nil {
		if m.state == Resident && v.mode == Replicable {
			return Admission{}, nil
		}
		if m.state != Resident {
			return Admission{}, &UnavailableError{Handle: v.name, Location: a.Location, Detail: "a transition into this endpoint is in flight", Reason: UnavailableInFlight}
		}
	}
	if f == d {
		return Admission{}, nil
	}
	if v.mode == Replicable {
		return l.copyFrom(v, f, d, false)
	}
	return l.move(v, f, d)
}

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
	l       *Ledger
	plan    Plan
	opts    RunOptions
	phase   int // 0 reclaim, 1 reserve, 2 enter, 3 done
	index   int
	pending AdmissionID
	report  []Transition
	resv    []string // reservations this run admitted, in order
	failed  error
	done    bool
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
	if ex, _ := l.explain(p); !ex.Feasible {
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
	switch r.phase {
	case 0:
		return PhaseReclaim
	case 1:
		return PhaseReserve
	default:
		return PhaseEnter
	}
}

// record runs f with the ledger's transitions appended to the run's
// report.
func (r *Run) record(f func()) {
	prev := r.l.sink
	r.l.sink = &r.report
	defer func() { r.l.sink = prev }()
	f()
}

// releaseReservations releases, newest first, the reservations a failed
// scope entry admitted, recording each release in the report. A plain
// execute admits ordinary reservations that stay active (released by
// name), failed or not: nothing to do.
func (r *Run) releaseReservations() {
	if r.opts.Scope == "" {
		return
	}
	r.record(func() {
		for j := len(r.resv) - 1; j >= 0; j-- {
			_ = r.l.unreserve(r.resv[j], r.opts.Scope)
		}
	})
	r.resv = nil
}

// Next admits the next step and returns it; ok is false when every step
// has been admitted and settled. A step with a pending admission must be
// settled before Next is called again. On failure it returns a
// *PlanExecutionError and the run is over; a scope's reservations admitted
// so far are released, an execute's stay active.
func (r *Run) Next() (step Step, ok bool, err error) {
	if r.failed != nil {
		return Step{}, false, r.failed
	}
	if r.pending != 0 {
		return Step{}, false, invalidf("run step is still pending")
	}
	for r.phase < 3 {
		switch r.phase {
		case 0:
			if r.index >= len(r.plan.Reclaim) {
				r.phase, r.index = 1, 0
				continue
			}
			i, a := r.index, r.plan.Reclaim[r.index]
			r.index++
			var effs []Effect
			var e error
			r.record(func() {
				var v *value
				if v, e = r.l.value(a.Handle); e != nil {
					return
				}
				loc, le := r.l.location(a.Location)
				if le != nil {
					e = le
					return
				}
				var m *mat
				if m, e = r.l.checkEvict(v, loc); e != nil {
					return
				}
				r.l.removeMat(v, m, "reclaim")
				effs = []Effect{r.l.freeEffect(v, loc)}
			})
			if e != nil {
				return Step{}, false, r.fail(e, &a, i, nil, -1)
			}
			return Step{Phase: PhaseReclaim, Index: i, Admission: Admission{Effects: effs}}, true, nil
		case 1:
			if r.index >= len(r.plan.Reservations) {
				r.phase, r.index = 2, 0
				continue
			}
			i, s := r.index, r.plan.Reservations[r.index]
			r.index++
			var e error
			r.record(func() { e = r.l.reserve(s.Location, s.Name, s.Bytes, r.opts.Scope) })
			if e != nil {
				return Step{}, false, r.fail(e, nil, -1, &s, i)
			}
			r.resv = append(r.resv, s.Name)
			return Step{Phase: PhaseReserve, Index: i}, true, nil
		case 2:
			if r.index >= len(r.plan.Enter) {
				r.phase = 3
				continue
			}
			i, a := r.index, r.plan.Enter[r.index]
			r.index++
			var adm Admission
			var e error
			r.record(func() {
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
	}
	return Step{}, false, nil
}

// Complete settles the pending enter step as done and returns the effects
// its completion produced (a move's source free).
func (r *Run) Complete() ([]Effect, error) {
	if r.pending == 0 {
		return nil, invalidf("no run step is pending")
	}
	var effs []Effect
	var err error
	r.record(func() { effs, err = r.l.Complete(r.pending) })
	r.pending = 0
	return effs, err
}

// Fail settles the pending enter step as failed with cause and returns the
// run's *PlanExecutionError.
func (r *Run) Fail(cause error) error {
	if r.pending == 0 {
		return invalidf("no run step is pending")
	}
	id := r.pending
	r.pending = 0
	r.record(func() { _ = r.l.Fail(id, cause) })
	i := r.index - 1
	a := r.plan.Enter[i]
	return r.fail(cause, &a, i, nil, -1)
}

// fail ends the run with a *PlanExecutionError. A failed scope entry first
// releases the reservations it admitted; the partial report is taken after
// that cleanup, so it lists every transition the run committed, the
// releases included.
func (r *Run) fail(cause error, a *Action, ai int, s *ReservationSpec, si int) error {
	r.releaseReservations()
	e := &PlanExecutionError{
		Phase:                  r.phaseName(),
		FailedAction:           a,
		FailedActionIndex:      ai,
		FailedReservation:      s,
		FailedReservationIndex: si,
		PartialReport:          Report{Transitions: append([]Transition(nil), r.report...)},
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
	if r.phase != 3 || r.pending != 0 {
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
			r.record(func() { id, err = r.l.Acquire(a.Handle, a.Location) })
			if err != nil {
				// The entry failed: release the leases taken so far and
				// the reservations (both recorded in the report).
				r.record(func() {
					for _, x := range leases {
						_ = r.l.Release(x)
					}
				})
				return Report{}, nil, r.fail(err, &a, i, nil, -1)
			}
			leases = append(leases, id)
		}
	}
	return Report{Transitions: append([]Transition(nil), r.report...)}, leases, nil
}

// Reservations returns the names of the reservations the run admitted.
func (r *Run) Reservations() []string { return append([]string(nil), r.resv...) }
