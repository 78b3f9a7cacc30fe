package budget

// Protections: leases, consumer events and holds, and the list of what is
// outstanding.

import "sort"

type lease struct {
	v    *value
	loc  int
	open bool
}

type event struct {
	v   *value
	loc int
}

type hold struct {
	v   *value
	loc int
}

// Acquire takes a lease on h's resident materialization at loc (1 version).
// It never places: absent → Unavailable.
func (l *Ledger) Acquire(h Handle, loc string) (LeaseID, error) {
	v, i, m, err := l.residentEndpoint(h, loc, "acquire never places; admit the endpoint first")
	if err != nil {
		return 0, err
	}
	m.uses++
	v.freq++
	m.prio = l.locs[i].inflation + v.freq
	l.nextLease++
	id := l.nextLease
	l.leases[id] = &lease{v: v, loc: i, open: true}
	m.lastUse = l.commitDetail("acquire", v, i, 0, idDetail(detailLease, uint64(id)))
	l.reindex(v)
	return id, nil
}

// LeaseEndpoint returns the handle and location of an active lease.
func (l *Ledger) LeaseEndpoint(id LeaseID) (Handle, string, bool) {
	ls, ok := l.leases[id]
	if !ok {
		return Handle{}, "", false
	}
	return l.handle(ls.v), l.locs[ls.loc].name, true
}

// Release releases a lease (1 version). A released or unknown lease:
// invalid input. Events it recorded stay pending until reaped.
func (l *Ledger) Release(id LeaseID) error {
	ls, ok := l.leases[id]
	if !ok {
		return inactive(LifetimeLease, uint64(id), "", " is not active (already released or never issued)")
	}
	delete(l.leases, id)
	m := ls.v.mat(ls.loc)
	m.uses--
	if m.uses < 0 {
		panic("budget: use count went negative")
	}
	m.lastUse = l.commitDetail("release", ls.v, ls.loc, 0, idDetail(detailLease, uint64(id)))
	l.reindex(ls.v)
	return nil
}

// RecordEvent records a pending consumer event on an active lease's
// materialization (1 version). Released lease: invalid input.
func (l *Ledger) RecordEvent(id LeaseID) (EventID, error) {
	ls, ok := l.leases[id]
	if !ok {
		return 0, inactive(LifetimeLease, uint64(id), "cannot record an event on ", ": not active (already released or never issued)")
	}
	ls.v.mat(ls.loc).pending++
	l.nextEvent++
	e := l.nextEvent
	l.events[e] = &event{v: ls.v, loc: ls.loc}
	l.reindex(ls.v)
	l.commitDetail("record_event", ls.v, ls.loc, 0, traceDetail{kind: detailEventOnLease, id: uint64(e), lease: uint64(id)})
	return e, nil
}

// ReapEvent reaps a completed event (1 version). Unknown or already reaped:
// invalid input.
func (l *Ledger) ReapEvent(id EventID) error {
	e, ok := l.events[id]
	if !ok {
		return inactive(LifetimeEvent, uint64(id), "", " is not pending (already reaped or never recorded)")
	}
	delete(l.events, id)
	m := e.v.mat(e.loc)
	m.pending--
	if m.pending < 0 {
		panic("budget: pending event count went negative")
	}
	l.reindex(e.v)
	l.commitDetail("reap_event", e.v, e.loc, 0, idDetail(detailEvent, uint64(id)))
	return nil
}

// EventPending reports whether event id is recorded and not yet reaped.
func (l *Ledger) EventPending(id EventID) bool {
	_, ok := l.events[id]
	return ok
}

// Hold takes a hold on h's resident materialization at loc (1 version).
func (l *Ledger) Hold(h Handle, loc string) (HoldID, error) {
	v, i, m, err := l.residentEndpoint(h, loc, "hold needs a resident materialization")
	if err != nil {
		return 0, err
	}
	m.holds++
	l.nextHold++
	id := l.nextHold
	l.holds[id] = &hold{v: v, loc: i}
	m.lastUse = l.commitDetail("hold", v, i, 0, idDetail(detailHold, uint64(id)))
	l.reindex(v)
	return id, nil
}

// Unhold releases a hold (1 version). Released or unknown: invalid input.
func (l *Ledger) Unhold(id HoldID) error {
	hd, ok := l.holds[id]
	if !ok {
		return inactive(LifetimeHold, uint64(id), "", " is not active (already released or never issued)")
	}
	delete(l.holds, id)
	m := hd.v.mat(hd.loc)
	m.holds--
	if m.holds < 0 {
		panic("budget: hold count went negative")
	}
	m.lastUse = l.commitDetail("unhold", hd.v, hd.loc, 0, idDetail(detailHold, uint64(id)))
	l.reindex(hd.v)
	return nil
}

// Outstanding lists what still protects materializations: active leases,
// holds and pending events, as endpoints.
type Outstanding struct {
	Leases []Endpoint
	Holds  []Endpoint
	Events []Endpoint
}

// Endpoint is a (handle, location) pair.
type Endpoint struct {
	Handle   string
	Location string
	ID       uint64 // the lease, hold or event id
}

// Empty reports whether nothing is outstanding.
func (o Outstanding) Empty() bool { return len(o.Leases)+len(o.Holds)+len(o.Events) == 0 }

// Outstanding returns the active leases, holds and pending events, by id.
func (l *Ledger) Outstanding() Outstanding {
	var o Outstanding
	for id, x := range l.leases {
		o.Leases = append(o.Leases, Endpoint{Handle: x.v.name, Location: l.locs[x.loc].name, ID: uint64(id)})
	}
	for id, x := range l.holds {
		o.Holds = append(o.Holds, Endpoint{Handle: x.v.name, Location: l.locs[x.loc].name, ID: uint64(id)})
	}
	for id, x := range l.events {
		o.Events = append(o.Events, Endpoint{Handle: x.v.name, Location: l.locs[x.loc].name, ID: uint64(id)})
	}
	for _, s := range [][]Endpoint{o.Leases, o.Holds, o.Events} {
		sort.Slice(s, func(i, j int) bool { return s[i].ID < s[j].ID })
	}
	return o
}
