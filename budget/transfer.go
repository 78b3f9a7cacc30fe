package budget

// Registration and two-phase transfers: a value's registration, the
// admission of a place, copy, move or reconstruction, and its completion
// or failure.

type transfer struct {
	id       AdmissionID
	v        *value
	dest     int
	src      int // resident source; -1 for reconstruction or initialization
	temp     int // location of the temporary reconstruction charge; -1 none
	moveSrc  bool
	kind     EffectKind
	admitted Transition // the admission's own transition, for failure reports
}

// ---- registration ----------------------------------------------------------

// Register registers a value. With At, the value is admitted there at once
// (1 version) and the returned admission must be completed (1 more) once
// its bytes are initialized; with Source, it is registered without a
// materialization (1 version). Errors (nothing changed): invalid input
// (empty or duplicate name, bytes ≤ 0, both or neither of At/Source,
// malformed location), Unavailable (unconfigured location), BudgetError.
// Names are unique among live values (a registration in flight included):
// the name of a discarded value, or of a failed registration, may be
// registered again, and gets a new handle.
func (l *Ledger) Register(spec ValueSpec) (Handle, Admission, error) {
	loc, err := l.registerFields(spec)
	if err != nil {
		return Handle{}, Admission{}, err
	}
	v := &value{id: l.vals.nextID(), name: spec.Name, bytes: spec.Bytes, mode: spec.Mode, source: -1}
	if spec.Source != "" {
		v.hasSource, v.source = true, loc
		l.addValue(v)
		l.commit("register", v, loc, spec.Bytes, "with source")
		return l.handle(v), Admission{}, nil
	}
	if err := l.admits(loc, v.bytes); err != nil {
		return Handle{}, Admission{}, err
	}
	l.addValue(v)
	adm := l.admitTransfer(v, loc, -1, -1, false, EffectInitialize, "register at")
	return l.handle(v), adm, nil
}

// CheckRegister runs every field check of [Ledger.Register], in its
// order (name, bytes, replica mode, at or source, the location), without
// the budget check and without changing anything. A caller with checks of
// its own on later fields (the runtime: a source needs a loader, data of
// the value's size) runs them after this one, so that one registration
// with several problems reports the first in field order. A read: no
// version.
func (l *Ledger) CheckRegister(spec ValueSpec) error {
	_, err := l.registerFields(spec)
	return err
}

// registerFields checks spec's fields and resolves its location (the
// source, or the first location).
func (l *Ledger) registerFields(spec ValueSpec) (int, error) {
	if spec.Name == "" {
		return -1, invalidf("value name is empty")
	}
	if _, dup := l.byName[spec.Name]; dup {
		return -1, invalidf("duplicate value name %q", spec.Name)
	}
	if spec.Bytes <= 0 {
		return -1, invalidf("value %q: bytes must be positive, got %d", spec.Name, spec.Bytes)
	}
	if spec.Mode != Exclusive && spec.Mode != Replicable {
		return -1, invalidf("value %q: unknown replica mode %d", spec.Name, int(spec.Mode))
	}
	if (spec.At == "") == (spec.Source == "") {
		return -1, invalidf("value %q: give exactly one of a first location (at) or a source", spec.Name)
	}
	if spec.Source != "" {
		return l.location(spec.Source)
	}
	return l.location(spec.At)
}

func (l *Ledger) addValue(v *value) {
	l.vals.add(v)
	l.byName[v.name] = v
	l.touch(v)
}

// ---- two-phase transfers ---------------------------------------------------

// admitTransfer commits an admission whose budget checks have passed.
func (l *Ledger) admitTransfer(v *value, dest, src, temp int, moveSrc bool, kind EffectKind, detail string) Admission {
	l.nextAdmission++
	x := &transfer{id: l.nextAdmission, v: v, dest: dest, src: src, temp: temp, moveSrc: moveSrc, kind: kind}
	l.transfers[x.id] = x
	v.mats = append(v.mats, &mat{loc: dest, state: Entering})
	v.inflight++
	l.charge(dest, v.bytes)
	if temp >= 0 {
		l.charge(temp, v.bytes)
	}
	if moveSrc {
		v.mat(src).state = Leaving
	} else if src >= 0 {
		v.mat(src).readers++
	}
	eff := Effect{Kind: kind, Handle: l.handle(v), Location: l.locs[dest].name, Bytes: v.bytes}
	if src >= 0 {
		eff.From = l.locs[src].name
	}
	if temp >= 0 {
		eff.TempAt = l.locs[temp].name
	}
	l.reindex(v)
	x.admitted = Transition{Version: l.commit("admit", v, dest, v.bytes, detail), Kind: "admit", Handle: v.name, Location: l.locs[dest].name, Bytes: v.bytes, Detail: detail}
	return Admission{ID: x.id, Pending: true, Effects: []Effect{eff}}
}

// Place ensures a resident materialization of h at dest. Already resident:
// a no-op admission (nothing committed). An exclusive value resident
// elsewhere is moved; otherwise the bytes are copied from a resident
// materialization (pinned-host, pageable-host, cuda:0, … first) or
// reconstructed from the source. Errors (nothing changed): invalid input,
// Unavailable (no resident copy and no source, in-flight endpoint,
// unconfigured location), InUse (an exclusive value's protected source),
// BudgetError (dest first, then the source location).
func (l *Ledger) Place(h Handle, dest string) (Admission, error) {
	v, err := l.value(h)
	if err != nil {
		return Admission{}, err
	}
	d, err := l.location(dest)
	if err != nil {
		return Admission{}, err
	}
	return l.place(v, d)
}

func (l *Ledger) place(v *value, d int) (Admission, error) {
	if m := v.mat(d); m != nil {
		if m.state == Resident {
			return Admission{}, nil
		}
		return Admission{}, &UnavailableError{Handle: v.name, Location: l.locs[d].name, Detail: "a transition into this endpoint is in flight", Reason: UnavailableInFlight}
	}
	if v.mode == Exclusive && len(v.mats) > 0 {
		m := v.mats[0]
		if m.state != Resident || len(v.mats) > 1 {
			return Admission{}, &UnavailableError{Handle: v.name, Location: l.locs[m.loc].name, Detail: "exclusive value has a transition in flight", Reason: UnavailableInFlight}
		}
		return l.move(v, m.loc, d)
	}
	src := l.preferredSource(v)
	if src >= 0 {
		return l.copyFrom(v, src, d, false)
	}
	return l.reconstruct(v, d)
}

func (l *Ledger) preferredSource(v *value) int {
	best := -1
	for _, m := range v.mats {
		if m.state != Resident {
			continue
		}
		if best < 0 || sourceLess(l.locs[m.loc].parsed, l.locs[best].parsed) {
			best = m.loc
		}
	}
	return best
}

func (l *Ledger) reconstruct(v *value, d int) (Admission, error) {
	if !v.hasSource {
		return Admission{}, &UnavailableError{Handle: v.name, Location: l.locs[d].name, Detail: "no resident materialization and no source to reconstruct from", Reason: UnavailableSource}
	}
	if err := l.admitsLocation(d, v.bytes); err != nil {
		return Admission{}, err
	}
	if err := l.admitsShared(d, v.bytes, 0); err != nil {
		return Admission{}, err
	}
	temp := -1
	if v.source != d {
		temp = v.source
		if err := l.admitsLocation(temp, v.bytes); err != nil {
			return Admission{}, err
		}
		also := int64(0)
		if g := l.locs[d].shared; g > 0 && g == l.locs[temp].shared {
			also = v.bytes // the destination's charge counts at the same group
		}
		if err := l.admitsShared(temp, v.bytes, also); err != nil {
			return Admission{}, err
		}
	}
	// Room held for earlier waiters last: it refuses only what would fit.
	if err := l.heldErr(d); err != nil {
		return Admission{}, err
	}
	if temp >= 0 {
		if err := l.heldErr(temp); err != nil {
			return Admission{}, err
		}
	}
	return l.admitTransfer(v, d, -1, temp, false, EffectReconstruct, "reconstruct from source "+l.locs[v.source].name), nil
}

func (l *Ledger) copyFrom(v *value, src, d int, move bool) (Admission, error) {
	if err := l.admits(d, v.bytes); err != nil {
		return Admission{}, err
	}
	detail := "copy from " + l.locs[src].name
	if move {
		detail = "move from " + l.locs[src].name
	}
	return l.admitTransfer(v, d, src, -1, move, EffectCopy, detail), nil
}

// Copy copies a replicable value's resident materialization at from to to.
// to already resident: no-op. Errors (nothing changed): PlanError for an
// exclusive value, Unavailable (from not resident, to in flight), invalid
// input, BudgetError at to.
func (l *Ledger) Copy(h Handle, from, to string) (Admission, error) {
	v, f, t, err := l.endpoints(h, from, to)
	if err != nil {
		return Admission{}, err
	}
	if v.mode != Replicable {
		return Admission{}, planf("copy of %q: value is exclusive; only replicable values may be copied (use move)", v.name)
	}
	if _, err := l.residentMat(v, f, "copy source"); err != nil {
		return Admission{}, err
	}
	if m := v.mat(t); m != nil {
		if m.state == Resident {
			return Admission{}, nil
		}
		return Admission{}, &UnavailableError{Handle: v.name, Location: l.locs[t].name, Detail: "a transition into this endpoint is in flight", Reason: UnavailableInFlight}
	}
	return l.copyFrom(v, f, t, false)
}

// Move moves the resident materialization at from to to: copy, then remove
// from (admission, completion and removal: 3 versions). from must be
// resident and unprotected before anything starts. from == to, or to
// already resident (replicable), needs no transfer: the former is a no-op,
// the latter removes from (1 version). Errors (nothing changed): invalid
// input, Unavailable, InUse, BudgetError at to.
func (l *Ledger) Move(h Handle, from, to string) (Admission, error) {
	v, f, t, err := l.endpoints(h, from, to)
	if err != nil {
		return Admission{}, err
	}
	m, err := l.residentMat(v, f, "move source")
	if err != nil {
		return Admission{}, err
	}
	if f == t {
		return Admission{}, nil
	}
	if m.protected() {
		return Admission{}, l.inUse(v, m)
	}
	return l.move(v, f, t)
}

func (l *Ledger) move(v *value, f, t int) (Admission, error) {
	src := v.mat(f)
	if src.protected() {
		return Admission{}, l.inUse(v, src)
	}
	if src.busy() {
		return Admission{}, &UnavailableError{Handle: v.name, Location: l.locs[f].name, Detail: "materialization is the source of a copy in flight", Reason: UnavailableInFlight}
	}
	if destMat := v.mat(t); destMat != nil {
		if destMat.state != Resident {
			return Admission{}, &UnavailableError{Handle: v.name, Location: l.locs[t].name, Detail: "a transition into this endpoint is in flight", Reason: UnavailableInFlight}
		}
		l.removeMatDetail(v, src, RemovalMoveSource, "move source (destination already resident)")
		return Admission{Effects: []Effect{l.freeEffect(v, f)}}, nil
	}
	return l.copyFrom(v, f, t, true)
}

func (l *Ledger) endpoints(h Handle, from, to string) (*value, int, int, error) {
	v, err := l.value(h)
	if err != nil {
		return nil, 0, 0, err
	}
	f, err := l.location(from)
	if err != nil {
		return nil, 0, 0, err
	}
	t, err := l.location(to)
	if err != nil {
		return nil, 0, 0, err
	}
	return v, f, t, nil
}

// Complete commits the completion of an admitted transfer: the destination
// becomes resident, a temporary charge is released (1 version), and a
// move's source is removed (1 more version; its free effect is returned).
// Unknown or already settled id: invalid input.
func (l *Ledger) Complete(id AdmissionID) ([]Effect, error) {
	x, ok := l.transfers[id]
	if !ok {
		return nil, invalidf("admission %d is not pending", id)
	}
	delete(l.transfers, id)
	v := x.v
	v.inflight--
	if x.temp >= 0 {
		l.uncharge(x.temp, v.bytes)
	}
	if x.src >= 0 && !x.moveSrc {
		v.mat(x.src).readers--
	}
	m := v.mat(x.dest)
	m.state = Resident
	v.freq++
	m.prio = l.locs[x.dest].inflation + v.freq
	m.lastUse = l.commit("complete", v, x.dest, v.bytes, "")
	l.reindex(v)
	if x.moveSrc {
		sourceMat := v.mat(x.src)
		l.removeMat(v, sourceMat, RemovalMoveSource)
		return []Effect{l.freeEffect(v, x.src)}, nil
	}
	return nil, nil
}

// Fail commits the failure of an admitted transfer: the destination charge
// and any temporary charge are released, a move's source is resident again
// (1 version). Unknown or already settled id: invalid input.
func (l *Ledger) Fail(id AdmissionID, cause error) error {
	x, ok := l.transfers[id]
	if !ok {
		return invalidf("admission %d is not pending", id)
	}
	delete(l.transfers, id)
	v := x.v
	v.inflight--
	if x.temp >= 0 {
		l.uncharge(x.temp, v.bytes)
	}
	if x.src >= 0 && !x.moveSrc {
		v.mat(x.src).readers--
	}
	l.unindex(v, v.mat(x.dest))
	v.removeMat(x.dest)
	l.uncharge(x.dest, v.bytes)
	if x.moveSrc {
		v.mat(x.src).state = Resident
	}
	l.reindex(v)
	detail, failure := "transfer failed", FailureTransfer
	if x.kind == EffectInitialize {
		// A registration whose first materialization failed: the value
		// never existed for anyone else. Retire the handle and free its
		// name so the caller can register again.
		l.retire(v)
		detail, failure = "registration failed; handle retired", FailureRegistration
	}
	if cause != nil {
		detail += ": " + cause.Error()
	}
	l.commitDetail("fail", v, x.dest, v.bytes, traceDetail{text: detail, failure: failure})
	return nil
}

// FailDirect is [Ledger.Fail] for a direct place, copy or move (not part of
// a plan): it commits the failure and returns the *PlanExecutionError the
// caller reports — phase execute, the failed action (index 0), the partial
// report (the admission and the failure), and the cause.
func (l *Ledger) FailDirect(id AdmissionID, cause error) error {
	x, ok := l.transfers[id]
	if !ok {
		return invalidf("admission %d is not pending", id)
	}
	a := Action{Handle: l.handle(x.v), Location: l.locs[x.dest].name}
	if x.src >= 0 {
		a.From = l.locs[x.src].name
	}
	var failure recorder
	l.recordInto(&failure, func() { _ = l.Fail(id, cause) })
	report := append([]Transition{x.admitted}, failure.transitions()...)
	return &PlanExecutionError{Phase: PhaseExecute, FailedAction: &a, FailedActionIndex: 0, FailedReservationIndex: -1, PartialReport: Report{Transitions: report}, Cause: cause}
}

// Pending reports the number of admitted transfers not yet settled.
func (l *Ledger) Pending() int { return len(l.transfers) }
