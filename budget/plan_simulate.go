package budget

// Plan simulation: validating a plan and simulating it on a
// copy-on-write clone of the ledger (Explain, and StartRun's check).

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
		id:                 l.id,
		version:            l.version,
		locs:               make([]location, len(l.locs)),
		locIndex:           l.locIndex,
		vals:               valueTable{byID: make(map[uint64]*value, len(vals)), maxID: l.vals.maxID},
		byName:             l.byName,
		reservations:       map[string]*reservation{},
		parentReservations: l.reservations,
		transfers:          map[AdmissionID]*transfer{},
		sim:                true,
		held:               l.held, // a plan checked under WithHeld is simulated under it
	}
	copy(c.locs, l.locs)
	c.shared = cloneShared(l.shared)
	for i := range c.locs {
		c.locs[i].peak = c.locs[i].used + c.locs[i].reserved
		c.locs[i].reservations = nil
	}
	// The copies live in three allocations (values, materializations,
	// their pointers) instead of one per value and per materialization.
	n := 0
	for _, v := range vals {
		n += len(v.mats)
	}
	values := make([]value, 0, len(vals))
	mats := make([]mat, 0, n)
	ptrs := make([]*mat, 0, n)
	for _, v := range vals {
		if c.vals.byID[v.id] != nil {
			continue // already copied
		}
		values = append(values, *v)
		copied := &values[len(values)-1]
		start := len(ptrs)
		for _, m := range v.mats {
			mats = append(mats, *m)
			ptrs = append(ptrs, &mats[len(mats)-1])
		}
		// Capacity = length: a simulated append reallocates instead of
		// writing into the next value's materializations.
		copied.mats = ptrs[start:len(ptrs):len(ptrs)]
		c.vals.byID[v.id] = copied
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
		if a.Charge != "" || a.Owner != "" {
			return l.checkChargeAction(a, what, i)
		}
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
		if a.To != "" {
			if what == "enter" {
				return invalidf("enter %d (%s): to is only meaningful for reclaim actions (a demotion)", i, a)
			}
			if err := l.checkDemotionField(a, i); err != nil {
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
		if _, active := l.reservations[r.Name]; active {
			return nil, invalidf("duplicate reservation name %s (already active)", l.shownName(r.Name))
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
// reclaim (a demotion, a reclaim with To, as a move admitted and
// completed; a charge's, as its owner's confirmation: the charge must be
// offered), then every reservation, then every enter one after another (each
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

// stepError is a simulated step's refusal: which step (its Step words,
// "reservation 0 (name: bytes at loc)"), and why (Err).
type stepError struct {
	Step string
	Err  error
}

func (e *stepError) Error() string { return e.Step + ": " + e.Err.Error() }

func (e *stepError) Unwrap() error { return e.Err }

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
		if a.Charge != "" {
			if err := c.simEvictCharge(a); err != nil {
				return fail(&stepError{Step: fmt.Sprintf("reclaim %d (%s)", i, a), Err: err})
			}
			continue
		}
		v := c.simValue(a.Handle.ID)
		loc := c.locIndex[a.Location]
		if a.To != "" {
			adm, err := c.demote(v, loc, c.locIndex[a.To])
			if err != nil {
				return fail(&stepError{Step: fmt.Sprintf("reclaim %d (%s)", i, a), Err: err})
			}
			if adm.Pending {
				if _, err := c.Complete(adm.ID); err != nil {
					return fail(err)
				}
			}
			continue
		}
		m, err := c.checkEvict(v, loc)
		if err != nil {
			return fail(&stepError{Step: fmt.Sprintf("reclaim %d (%s)", i, a), Err: err})
		}
		c.removeMat(v, m, RemovalReclaim)
	}
	for i, r := range p.Reservations {
		if err := c.reserve(r.Location, r.Name, r.Bytes, "plan"); err != nil {
			return fail(&stepError{Step: fmt.Sprintf("reservation %d (%s)", i, r), Err: err})
		}
	}
	for i, a := range p.Enter {
		v := c.simValue(a.Handle.ID)
		adm, err := c.enter(v, a)
		if err != nil {
			return fail(&stepError{Step: fmt.Sprintf("enter %d (%s)", i, a), Err: err})
		}
		if adm.Pending {
			if _, err := c.Complete(adm.ID); err != nil {
				return fail(err)
			}
		}
	}
	for i, a := range p.Enter {
		v := c.simValue(a.Handle.ID)
		if m := v.mat(c.locIndex[a.Location]); m == nil || m.state != Resident {
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
	d := l.locIndex[a.Location]
	if a.From == "" {
		return l.place(v, d)
	}
	f := l.locIndex[a.From]
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
