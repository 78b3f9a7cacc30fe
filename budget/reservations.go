package budget

import (
	"strconv"
	"strings"
)

// Named reservations (the owned ones' resizing and charges: cache.go).

type reservation struct {
	name  string
	loc   int
	bytes int64
	owner string // "" for ordinary reservations; a run/scope owner otherwise
	// As a charge (charges.go): its state, its candidate key while
	// offered, and its sequence number (a stable id, from admission).
	state ChargeState
	key   candidate
	seq   uint64
	// demote: offered as demotable (OfferDemotableCharge): the controller
	// may demote it to its location's spill target (charges_spill.go).
	demote bool
	// taken: where its entry was last taken (TouchCharge); an offer ranks
	// it from there.
	taken takeStamp
	// cap: the cap whose group it is in (ReserveCapped, capgroups.go).
	cap *capGroup
}

// Reserve admits a named reservation of bytes at loc (1 version). Errors
// (nothing changed): invalid input (empty or active duplicate name,
// bytes ≤ 0, malformed location), Unavailable, BudgetError.
func (l *Ledger) Reserve(loc, name string, bytes int64) error {
	return l.reserve(loc, name, bytes, "")
}

// ReserveOwned is Reserve for a reservation that belongs to owner (a
// scope): [Ledger.Unreserve] refuses it; [Ledger.UnreserveOwned] releases it.
func (l *Ledger) ReserveOwned(loc, name string, bytes int64, owner string) error {
	if owner == "" {
		return invalidf("reservation owner is empty")
	}
	return l.reserve(loc, name, bytes, owner)
}

// shownName is how a message writes the name of an active reservation: a
// loader cache's charge as it is (its name quotes the cache's own name:
// `cache "m"/k#1`), any other Go-quoted.
func (l *Ledger) shownName(name string) string {
	if r, ok := l.reservations[name]; ok && strings.HasPrefix(r.owner, CacheOwnerPrefix) {
		return name
	}
	return strconv.Quote(name)
}

func (l *Ledger) reserve(loc, name string, bytes int64, owner string) error {
	return l.reserveIn(loc, name, bytes, owner, nil)
}

func (l *Ledger) reserveIn(loc, name string, bytes int64, owner string, c *capGroup) error {
	if name == "" {
		return invalidf("reservation name is empty")
	}
	if _, dup := l.reservations[name]; dup || l.parentReservations[name] != nil {
		return invalidf("duplicate reservation name %s (already active)", l.shownName(name))
	}
	if bytes <= 0 {
		return invalidf("reservation %q: bytes must be positive, got %d", name, bytes)
	}
	i, err := l.location(loc)
	if err != nil {
		return err
	}
	if err := l.admits(i, bytes); err != nil {
		return err
	}
	l.nextCharge++
	r := &reservation{name: name, loc: i, bytes: bytes, owner: owner, seq: l.nextCharge, cap: c}
	l.reservations[name] = r
	lc := &l.locs[i]
	lc.reservations = append(lc.reservations, r)
	lc.reserved += bytes
	if c := lc.used + lc.reserved; c > lc.peak {
		lc.peak = c
	}
	l.notePeak(i)
	l.commitDetail("reserve", nil, i, bytes, traceDetail{kind: detailReservation, text: name})
	return nil
}

// Unreserve releases an ordinary named reservation (1 version). Not
// active, or owned by a scope: invalid input.
func (l *Ledger) Unreserve(name string) error { return l.unreserve(name, "") }

// UnreserveOwned releases a reservation owned by owner.
func (l *Ledger) UnreserveOwned(name, owner string) error { return l.unreserve(name, owner) }

func (l *Ledger) unreserve(name, owner string) error {
	r, ok := l.reservations[name]
	if !ok {
		return invalidf("reservation %q is not active (already released or never made)", name)
	}
	if r.owner != owner {
		if owner == "" && strings.HasPrefix(r.owner, CacheOwnerPrefix) {
			// A cache's charge name quotes the cache's name itself
			// (`cache "m"/k#1`): it is written as it is.
			return invalidf("reservation %s is a charge of %s; only the cache releases it (when its entry leaves the cache)", name, r.owner)
		}
		if owner == "" {
			return invalidf("reservation %q belongs to scope %q; it is released when the scope exits", name, r.owner)
		}
		return invalidf("reservation %q does not belong to %q", name, owner)
	}
	l.unofferIndex(r)
	delete(l.reservations, name)
	lc := &l.locs[r.loc]
	for i, x := range lc.reservations {
		if x == r {
			lc.reservations = append(lc.reservations[:i], lc.reservations[i+1:]...)
			break
		}
	}
	lc.reserved -= r.bytes
	if lc.reserved < 0 {
		panic("budget: reserved bytes went negative")
	}
	if r.cap != nil {
		l.leaveCap(r.cap, r.bytes)
	}
	l.commitDetail("unreserve", nil, r.loc, r.bytes, traceDetail{kind: detailReservation, text: name})
	return nil
}
