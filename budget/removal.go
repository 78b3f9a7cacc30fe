package budget

// Removal: evicting a materialization, discarding a value and retiring
// its handle.

import "sort"

func (l *Ledger) freeEffect(v *value, loc int) Effect {
	return Effect{Kind: EffectFree, Handle: l.handle(v), Location: l.locs[loc].name, Bytes: v.bytes}
}

// removeMat removes a materialization, releases its charge, raises the
// location's inflation to its priority and commits one version.
func (l *Ledger) removeMat(v *value, m *mat, kind RemovalKind) {
	l.removeMatDetail(v, m, kind, kind.detail())
}

// removeMatDetail is removeMat with a detail that says more than the
// kind's own.
func (l *Ledger) removeMatDetail(v *value, m *mat, kind RemovalKind, detail string) {
	lc := &l.locs[m.loc]
	if m.prio > lc.inflation {
		lc.inflation = m.prio
	}
	l.unindex(v, m)
	v.removeMat(m.loc)
	l.reindex(v)
	l.uncharge(m.loc, v.bytes)
	l.commitEntry("remove", v, m.loc, v.bytes, textDetail(detail), kind)
}

// checkEvict validates the removal of h's materialization at loc.
func (l *Ledger) checkEvict(v *value, loc int) (*mat, error) {
	m := v.mat(loc)
	if m == nil {
		return nil, &UnavailableError{Handle: v.name, Location: l.locs[loc].name, Detail: "no materialization to evict", Reason: UnavailableEndpoint}
	}
	if m.state != Resident {
		return nil, &UnavailableError{Handle: v.name, Location: l.locs[loc].name, Detail: "materialization is " + m.state.String() + "; a transition is in flight", Reason: UnavailableInFlight}
	}
	if m.protected() {
		return nil, l.inUse(v, m)
	}
	if m.busy() {
		return nil, &UnavailableError{Handle: v.name, Location: l.locs[loc].name, Detail: "materialization is the source of a copy in flight", Reason: UnavailableInFlight}
	}
	if !v.hasSource && v.keptCount() == 1 {
		return nil, planf("evicting %q at %s would lose its data: it is the last materialization and the value has no source (use discard)", v.name, l.locs[loc].name)
	}
	return m, nil
}

// Evict removes h's materialization at loc (1 version) and returns the free
// effect. Errors (nothing changed): Unavailable (absent or in flight),
// InUse (protected; checked before data loss), PlanError (the last
// materialization of a value without a source).
func (l *Ledger) Evict(h Handle, loc string) ([]Effect, error) {
	v, err := l.value(h)
	if err != nil {
		return nil, err
	}
	i, err := l.location(loc)
	if err != nil {
		return nil, err
	}
	m, err := l.checkEvict(v, i)
	if err != nil {
		return nil, err
	}
	l.removeMat(v, m, RemovalEvict)
	return []Effect{l.freeEffect(v, i)}, nil
}

// Discard removes every materialization of h (1 version each, location
// order) and retires the handle (1 version); its name is free for a new
// registration, which gets a new handle. Every materialization must be
// unprotected and settled. Protection is checked first, over every
// materialization: the first protected one in location order is reported
// as InUse, even when a materialization earlier in location order is in
// flight. Only when none is protected, the first one in location order
// that is entering, leaving or the source of a copy in flight is
// Unavailable (in flight). Later use of h is Unavailable (discarded).
func (l *Ledger) Discard(h Handle) ([]Effect, error) {
	v, err := l.value(h)
	if err != nil {
		return nil, err
	}
	ms := l.matsInOrder(v)
	for _, m := range ms {
		if m.protected() {
			return nil, l.inUse(v, m)
		}
	}
	for _, m := range ms {
		if m.state != Resident {
			return nil, &UnavailableError{Handle: v.name, Location: l.locs[m.loc].name, Detail: "materialization is " + m.state.String() + "; a transition is in flight", Reason: UnavailableInFlight}
		}
		if m.busy() {
			return nil, &UnavailableError{Handle: v.name, Location: l.locs[m.loc].name, Detail: "materialization is the source of a copy in flight", Reason: UnavailableInFlight}
		}
	}
	effects := make([]Effect, 0, len(ms))
	for _, m := range ms {
		effects = append(effects, l.freeEffect(v, m.loc))
		l.removeMat(v, m, RemovalDiscard)
	}
	// The name is free for a new registration; the retired handle keeps
	// its id, which still answers Unavailable (discarded).
	l.retire(v)
	l.commit("discard", v, -1, 0, "handle retired")
	return effects, nil
}

func (l *Ledger) matsInOrder(v *value) []*mat {
	ms := append([]*mat(nil), v.mats...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].loc < ms[j].loc })
	return ms
}

// retire forgets a value whose handle is retired: its name is free and its
// id answers Unavailable (discarded) from now on.
func (l *Ledger) retire(v *value) {
	v.discarded = true
	delete(l.byName, v.name)
	l.vals.retire(v)
	l.forgetDirty(v)
}
