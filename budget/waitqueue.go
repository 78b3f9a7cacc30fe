package budget

import (
	"fmt"
	"math/big"
	"slices"
)

// The wait queue: the pure ordering rule behind callers that wait for room
// (package system: Admit and a cache's Load with a wait option). It holds
// no goroutines and does no I/O; the runtime asks it which waiters may be
// tried now and tries them.
//
// The rule:
//   - Waiters are ordered by class, higher classes first, and first in
//     first out within a class.
//   - A waiter is eligible (may be tried) when no waiter ahead of it that
//     needs room at one of its locations is still waiting — except ahead
//     waiters that allow bypass: those never hold up a later one.
//   - A waiter with no location is always eligible and holds up nobody.
//   - The members of a shared budget ([WaitQueue.ShareBudgets]) count as
//     one location here: room taken at one is taken from the others.
//
// So a big waiter at the head of its location is never starved by later
// small ones that would fit in the room it waits for, unless it opted in
// to being bypassed; waiters at other locations are not held up by it.

// DefaultMaxWaiters is the bound of a wait queue when none is configured.
const DefaultMaxWaiters = 1024

// WaitID identifies a waiter in a [WaitQueue].
type WaitID uint64

// WaitSpec describes one waiter.
type WaitSpec struct {
	// Name says who waits (a request's or a cache key's name), for
	// diagnostics.
	Name string
	// Class is the waiter's priority class: higher classes are tried first.
	Class int
	// Locations are where the waiter needs room. Order and repeats do not
	// matter.
	Locations []string
	// AllowBypass lets later waiters at its locations be tried while this
	// one waits (it may then wait longer).
	AllowBypass bool
}

// QueueFullError refuses a waiter when the queue already holds its
// maximum. It matches errors.Is(err, [ErrBusy]).
type QueueFullError struct {
	Name       string
	MaxWaiters int
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("residency busy: %q cannot wait for room, %d callers are already waiting (the maximum)", e.Name, e.MaxWaiters)
}

// Is reports the ErrBusy category.
func (e *QueueFullError) Is(target error) bool { return target == ErrBusy }

type waitItem struct {
	id   WaitID
	spec WaitSpec
	// reach is spec.Locations with the other members of their shared
	// budgets: where the waiter holds up, and is held up by, others.
	reach []string
}

// WaitQueue is the ordered set of waiters. Not safe for concurrent use.
type WaitQueue struct {
	max   int
	next  WaitID
	items []waitItem // class descending, then arrival
	// blocked is Eligible's scratch (reused: no allocation per call).
	blocked []string
	// members maps each member of a shared budget to all its group's
	// members (ShareBudgets); nil: none.
	members map[string][]string
}

// ShareBudgets makes the queue treat the members of each group as one
// location when it decides who holds up whom (Eligible, Ahead, Holding):
// a waiter at one member holds up later callers at every member, since
// they draw on one figure. [Ledger.WithHeld] applies the same to calls
// that do not wait. Call it before the first Push; the groups are not
// checked here (the ledger checks them).
func (q *WaitQueue) ShareBudgets(groups []SharedBudget) {
	q.members = nil
	for _, g := range groups {
		for _, loc := range g.Locations {
			if q.members == nil {
				q.members = map[string][]string{}
			}
			q.members[loc] = slices.Clone(g.Locations)
		}
	}
}

// reach returns locs with the other members of their shared budgets
// (locs itself when none is a member).
func (q *WaitQueue) reach(locs []string) []string {
	if q.members == nil {
		return locs
	}
	var out []string
	for _, loc := range locs {
		ms, ok := q.members[loc]
		if !ok {
			ms = []string{loc}
		}
		for _, m := range ms {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	return out
}

// NewWaitQueue returns an empty queue bounded to max waiters (0:
// [DefaultMaxWaiters]; negative: [*InvalidInputError]).
func NewWaitQueue(max int) (*WaitQueue, error) {
	if max < 0 {
		return nil, invalidf("maximum waiters %d is negative (0 means the default %d)", max, DefaultMaxWaiters)
	}
	if max == 0 {
		max = DefaultMaxWaiters
	}
	return &WaitQueue{max: max}, nil
}

// Max returns the queue's bound.
func (q *WaitQueue) Max() int { return q.max }

// Len returns the number of waiters.
func (q *WaitQueue) Len() int { return len(q.items) }

// Push adds a waiter behind every waiter of its class and of higher
// classes. A full queue refuses it with a [*QueueFullError] and is left
// unchanged.
func (q *WaitQueue) Push(spec WaitSpec) (WaitID, error) {
	if len(q.items) >= q.max {
		return 0, &QueueFullError{Name: spec.Name, MaxWaiters: q.max}
	}
	q.next++
	spec.Locations = slices.Clone(spec.Locations)
	at := len(q.items)
	for at > 0 && q.items[at-1].spec.Class < spec.Class {
		at--
	}
	q.items = slices.Insert(q.items, at, waitItem{id: q.next, spec: spec, reach: q.reach(spec.Locations)})
	return q.next, nil
}

// Remove removes a waiter (admitted, canceled or refused for good); false
// if it is not in the queue.
func (q *WaitQueue) Remove(id WaitID) bool {
	for i := range q.items {
		if q.items[i].id == id {
			q.items = slices.Delete(q.items, i, i+1)
			return true
		}
	}
	return false
}

// Eligible appends to dst the waiters that may be tried now, in queue
// order, and returns it (see the rule above).
func (q *WaitQueue) Eligible(dst []WaitID) []WaitID {
	blocked := q.blocked[:0]
	for _, it := range q.items {
		if !overlaps(it.reach, blocked) {
			dst = append(dst, it.id)
		}
		if !it.spec.AllowBypass {
			for _, loc := range it.reach {
				if !slices.Contains(blocked, loc) {
					blocked = append(blocked, loc)
				}
			}
		}
	}
	q.blocked = blocked
	return dst
}

// Ahead returns how many waiters hold up a new caller described by spec:
// those of its class or higher at one of its locations that do not allow
// bypass. A new caller held up by none may be tried at once, before it
// is queued; one held up by any joins the queue behind them without
// taking room they wait for (so a waiter is never starved by later
// arrivals of its class or lower that would each fit).
func (q *WaitQueue) Ahead(spec WaitSpec) int {
	n := 0
	reach := q.reach(spec.Locations)
	for _, it := range q.items {
		if it.spec.Class >= spec.Class && !it.spec.AllowBypass && overlaps(it.reach, reach) {
			n++
		}
	}
	return n
}

// HeldAt returns, for a call of class that does not wait, how many
// waiters hold the room of each location: those of its class or higher
// that do not allow bypass, counted at every location they name (nil
// when none). The runtime runs such a call under Ledger.WithHeld with it
// (held.go), so that it never takes room a waiter ahead of it waits for.
func (q *WaitQueue) HeldAt(class int) map[string]int {
	var held map[string]int
	for _, it := range q.items {
		if it.spec.Class < class || it.spec.AllowBypass {
			continue
		}
		for i, loc := range it.spec.Locations {
			if slices.Contains(it.spec.Locations[:i], loc) {
				continue // named twice: one waiter
			}
			if held == nil {
				held = map[string]int{}
			}
			held[loc]++
		}
	}
	return held
}

// HeldAhead returns the room held for a try of the waiter id (0: a
// caller of class that is not queued, which is HeldAt(class)): how many
// of the waiters ahead of it in queue order that do not allow bypass
// name each location. The runtime runs a waiting caller's try under
// [Ledger.WithHeld] with it, so that no try takes room a waiter ahead of
// it waits for — not even outside the locations the caller names (a
// reconstruction's temporary at its source, a demotion into a spill
// target). nil when none holds any.
func (q *WaitQueue) HeldAhead(id WaitID, class int) map[string]int {
	if id == 0 {
		return q.HeldAt(class)
	}
	var held map[string]int
	for _, it := range q.items {
		if it.id == id {
			return held
		}
		if it.spec.AllowBypass {
			continue
		}
		for i, loc := range it.spec.Locations {
			if slices.Contains(it.spec.Locations[:i], loc) {
				continue
			}
			if held == nil {
				held = map[string]int{}
			}
			held[loc]++
		}
	}
	return held
}

// Holding returns how many waiters ahead of the waiter id hold it up
// (not allowing bypass, at one of its locations): 0 when it is eligible
// or not in the queue.
func (q *WaitQueue) Holding(id WaitID) int {
	var reach []string
	for _, it := range q.items {
		if it.id == id {
			reach = it.reach
		}
	}
	n := 0
	for _, it := range q.items {
		if it.id == id {
			return n
		}
		if !it.spec.AllowBypass && overlaps(it.reach, reach) {
			n++
		}
	}
	return 0
}

// Position returns a waiter's place in queue order (0: the head); false
// if it is not in the queue.
func (q *WaitQueue) Position(id WaitID) (int, bool) {
	for i, it := range q.items {
		if it.id == id {
			return i, true
		}
	}
	return 0, false
}

// Waiting returns the waiters in queue order.
func (q *WaitQueue) Waiting() []WaitSpec {
	out := make([]WaitSpec, len(q.items))
	for i, it := range q.items {
		out[i] = it.spec
		out[i].Locations = slices.Clone(it.spec.Locations)
	}
	return out
}

// Spec returns a waiter's spec; false if it is not in the queue.
func (q *WaitQueue) Spec(id WaitID) (WaitSpec, bool) {
	for _, it := range q.items {
		if it.id == id {
			return it.spec, true
		}
	}
	return WaitSpec{}, false
}

// bigSum is a+b in decimal, exactly (it may exceed int64).
func bigSum(a, b int64) string {
	return new(big.Int).Add(big.NewInt(a), big.NewInt(b)).String()
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// RoomKind says whether a committed transition of kind may make room for
// a waiter: it frees bytes (a removal, a failed transfer, an unreserve, a
// shrinking resize) or ends a protection or a transfer that kept a victim
// from being evicted (a lease release, an unhold, a reaped event, a
// completed transfer, a discard), or offers a new victim (an idle cache
// entry's charge offered, doc_cache.go).
func RoomKind(kind string) bool {
	switch kind {
	case "remove", "fail", "unreserve", "resize", "release", "unhold", "reap_event", "complete", "discard", "offer_charge":
		return true
	}
	return false
}

// RoomReleases returns the number of committed transitions since New that
// may have made room ([RoomKind]). The runtime compares it before and after
// each request to wake callers waiting for room.
func (l *Ledger) RoomReleases() uint64 { return l.roomReleases }

// CannotFit returns a [*PlanError] for a request that no amount of
// waiting can admit, nil otherwise: its reservations at one location add
// up to more than that location's budget, or a required value's charge is
// larger than the budget of every location of its tiers. budgets lists the
// budgeted locations (a location absent from it has no budget); bytes
// gives a required value's charge (false: unknown, assumed to fit). Other
// combinations that can never fit together are not detected.
func CannotFit(req Request, budgets map[string]int64, bytes func(Handle) (int64, bool)) error {
	sums := map[string]int64{}
	for _, r := range req.Reservations {
		b, ok := budgets[r.Location]
		if !ok || r.Bytes <= 0 {
			continue
		}
		if r.Bytes > b-sums[r.Location] { // sums stay ≤ b: nothing wraps
			return &PlanError{Reason: fmt.Sprintf("request %q reserves %s bytes at %s, more than its whole budget of %d: it can never be admitted", req.Name, bigSum(sums[r.Location], r.Bytes), r.Location, b)}
		}
		sums[r.Location] += r.Bytes
	}
	for _, rq := range req.Requirements {
		n, ok := bytes(rq.Handle)
		if !ok {
			continue
		}
		fits := false
		for _, tier := range rq.Tiers {
			for _, loc := range tier {
				if b, ok := budgets[loc]; !ok || n <= b {
					fits = true
				}
			}
		}
		if !fits && len(rq.Tiers) > 0 {
			return &PlanError{Reason: fmt.Sprintf("request %q requires %s (%d bytes), larger than the whole budget of every location it names: it can never be admitted", req.Name, rq.Handle.Name, n)}
		}
	}
	return nil
}

// CannotFitShared is [CannotFit] for the shared budgets: nil, unless req
// reserves more bytes at the members of one group than its whole figure,
// or requires a value larger than the figure of the group of every
// location it names (a location outside every group fits as far as the
// groups go). Such a request can never be admitted, however long it waits.
func CannotFitShared(req Request, groups []SharedBudget, bytes func(Handle) (int64, bool)) error {
	if len(groups) == 0 {
		return nil
	}
	groupOf := map[string]int{}
	for i, g := range groups {
		for _, loc := range g.Locations {
			groupOf[loc] = i
		}
	}
	sums := make([]int64, len(groups))
	for _, r := range req.Reservations {
		i, ok := groupOf[r.Location]
		if !ok || r.Bytes <= 0 {
			continue
		}
		if r.Bytes > groups[i].Bytes-sums[i] { // sums stay ≤ the figure: nothing wraps
			return &PlanError{Reason: fmt.Sprintf("request %q reserves %s bytes at the members of shared budget %q, more than its whole figure of %d: it can never be admitted", req.Name, bigSum(sums[i], r.Bytes), groups[i].Name, groups[i].Bytes)}
		}
		sums[i] += r.Bytes
	}
	for _, rq := range req.Requirements {
		n, ok := bytes(rq.Handle)
		if !ok || len(rq.Tiers) == 0 {
			continue
		}
		fits := false
		for _, tier := range rq.Tiers {
			for _, loc := range tier {
				if i, ok := groupOf[loc]; !ok || n <= groups[i].Bytes {
					fits = true
				}
			}
		}
		if !fits {
			return &PlanError{Reason: fmt.Sprintf("request %q requires %s (%d bytes), larger than the shared budget of every location it names: it can never be admitted", req.Name, rq.Handle.Name, n)}
		}
	}
	return nil
}

// WaitState tells a waiting caller that it is queued and why (the
// runtime's wait option WaitNotify).
type WaitState struct {
	// Name, Class and Locations are the waiter's (its WaitSpec).
	Name      string
	Class     int
	Locations []string
	// Position is its place in queue order (0: the head); Ahead counts
	// the waiters ahead of it that hold it up (of its class or higher, at
	// one of its locations, not allowing bypass).
	Position int
	Ahead    int
	// Location and Shortfall: where its last try was short of room and by
	// how many bytes, by that refusal's figures (requested − free); ""
	// and 0 when not known — it was queued behind waiters without a try,
	// or refused for want of a victim rather than of bytes.
	Location  string
	Shortfall int64
	// Refusal is the refusal of its last try (nil: queued behind waiters
	// ahead of it without a try).
	Refusal error
}

// Short returns the location and the bytes a *BudgetError's figures are
// short of (requested − free at the refusal); "" and 0 for nil or a
// request that fit.
func (e *BudgetError) Short() (string, int64) {
	if e == nil {
		return "", 0
	}
	if e.Shared != "" {
		if n := subSat(addSat(e.SharedUsedBytes, e.SharedRequestedBytes), e.SharedBytes); n > 0 {
			return e.Location, n
		}
		return "", 0
	}
	if n := e.RequestedBytes - (e.BudgetBytes - e.UsedBytes - e.ReservedBytes); n > 0 {
		return e.Location, n
	}
	return "", 0
}
