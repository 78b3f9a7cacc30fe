package budget

import (
	"fmt"
	"slices"
)

// ---- room held for earlier waiters ------------------------------------------
//
// A caller that waits for room (the wait queue, waitqueue.go) is never
// passed by later waiters of its class or lower. The same holds for calls
// that do not wait: while such a call runs under Ledger.WithHeld, every
// location an earlier waiter holds is closed to new charges. A charge there
// — a transfer's destination or temporary, a reservation, a demotion into
// a spill target — is refused with a *WaitersAheadError and nothing
// changes; what needs no new charge (an endpoint already resident, a lease,
// an eviction) goes ahead. The check comes after the budget's: a charge
// that would not fit anyway is refused for the budget (a *BudgetError),
// so the refusal for held room says the call would have been admitted.
// A location in a shared budget is closed when any member of its group is
// held: the members draw on one figure. The controller (Decide) counts an assignment that adds bytes at a held
// location as infeasible (after its budget and victims are checked) and a
// held spill target as having no room for a demotion (the victim is
// dropped instead), so a request with tiers is placed elsewhere when it
// can be; when some assignment was feasible but for held room and none is
// feasible otherwise, Decide refuses with *WaitersAheadError.
//
// The ledger does not know the waiters: the runtime computes held from its
// queue at the step that runs the call (WaitQueue.HeldAt for a call that
// does not wait, WaitQueue.HeldAhead for a waiting call's try: so no try
// takes room a waiter ahead of it holds, even for a temporary outside
// the locations it names).

// WaitersAheadError refuses a call that does not wait for room, or one
// try of a call that does: it needs a new charge at Location, where
// Waiters earlier callers wait for room (of the call's class or higher,
// not allowing bypass). It matches errors.Is(err, ErrBusy). Nothing
// changed. Wait with a wait option to be queued behind them, or retry
// once they are admitted (a waiting call is tried again by itself).
type WaitersAheadError struct {
	Location string
	Waiters  int
	// Detail (may be empty) is the controller's account of the request's
	// other assignments when every one was blocked.
	Detail string
}

func (e *WaitersAheadError) Error() string {
	s := fmt.Sprintf("residency busy: %d earlier callers wait for room at %s, and a later call takes none of it (wait for room to be queued behind them, or retry)", e.Waiters, e.Location)
	if e.Detail != "" {
		s += "; " + e.Detail
	}
	return s
}

// Is reports the ErrBusy category.
func (e *WaitersAheadError) Is(target error) bool { return target == ErrBusy }

// WithHeld runs f with the locations of held (a name and how many
// earlier waiters hold its room; unknown names and counts ≤ 0 are
// ignored) closed to new charges, and restores the room held before when
// f returns (a WithHeld inside f replaces it for its own f). A
// simulation inside f (Explain, StartRun's check, Decide) sees the same
// held room.
func (l *Ledger) WithHeld(held map[string]int, f func()) {
	prev := l.held
	defer func() { l.held = prev }()
	l.held = nil
	for name, n := range held {
		if i, ok := l.locIndex[name]; ok && n > 0 {
			if l.held == nil {
				l.held = make([]int, len(l.locs))
			}
			l.held[i] = n
		}
	}
	f()
}

// HeldOutside returns held without the locations of locs and the other
// members of their shared budgets: the room earlier waiters hold away
// from where a call that orders itself against the wait queue charges
// (a cache's load checks those locations itself), so that such a call
// takes none of it elsewhere — no demotion into a held spill target, no
// temporary at a held source. nil when nothing is left.
func (l *Ledger) HeldOutside(held map[string]int, locs []string) map[string]int {
	var out map[string]int
	for name, n := range held {
		i, ok := l.locIndex[name]
		if !ok || n <= 0 || l.reaches(i, locs) {
			continue
		}
		if out == nil {
			out = map[string]int{}
		}
		out[name] = n
	}
	return out
}

// reaches says whether location i is one of locs or shares a shared
// budget with one of them.
func (l *Ledger) reaches(i int, locs []string) bool {
	for _, name := range locs {
		j, ok := l.locIndex[name]
		if !ok {
			continue
		}
		if j == i || (l.locs[i].shared > 0 && l.locs[i].shared == l.locs[j].shared) {
			return true
		}
	}
	return false
}

// RequestLocations returns every location req names (its requirements'
// tiers, then its reservations), each once, in that order.
func RequestLocations(req Request) []string {
	var out []string
	add := func(loc string) {
		if !slices.Contains(out, loc) {
			out = append(out, loc)
		}
	}
	for _, rq := range req.Requirements {
		for _, tier := range rq.Tiers {
			for _, loc := range tier {
				add(loc)
			}
		}
	}
	for _, rs := range req.Reservations {
		add(rs.Location)
	}
	return out
}

// heldErr is the refusal of a new charge at loc while earlier waiters
// hold its room (or that of a member of its shared budget); nil when none
// does or no WithHeld is running.
func (l *Ledger) heldErr(loc int) error {
	if l.held == nil {
		return nil
	}
	at, n := loc, l.held[loc]
	if g := l.sharedOf(loc); g != nil {
		for _, m := range g.members {
			if l.held[m] > n {
				at, n = m, l.held[m]
			}
		}
	}
	if n == 0 {
		return nil
	}
	return &WaitersAheadError{Location: l.locs[at].name, Waiters: n}
}
