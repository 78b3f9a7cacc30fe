package budget

import "sort"

// Shutdown is the ledger side of closing a runtime: it force-releases every
// lease, hold and pending event (reported by [Ledger.Outstanding] first),
// every reservation, and removes every materialization, committing each as
// a transition, and returns the free effects. It refuses while transfers
// are pending (settle them first). Afterwards every location's used and
// reserved bytes are zero.
func (l *Ledger) Shutdown() ([]Effect, error) {
	if len(l.transfers) > 0 {
		return nil, invalidf("%d transfers are still pending", len(l.transfers))
	}
	o := l.Outstanding()
	for _, e := range o.Events {
		_ = l.ReapEvent(EventID(e.ID))
	}
	for _, e := range o.Leases {
		_ = l.Release(LeaseID(e.ID))
	}
	for _, e := range o.Holds {
		_ = l.Unhold(HoldID(e.ID))
	}
	names := make([]string, 0, len(l.reservations))
	for n := range l.reservations {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		_ = l.unreserve(n, l.reservations[n].owner)
	}
	var effects []Effect
	for _, v := range l.liveValues() {
		for _, m := range l.matsInOrder(v) {
			effects = append(effects, l.freeEffect(v, m.loc))
			l.removeMat(v, m, RemovalShutdown)
		}
	}
	return effects, nil
}
