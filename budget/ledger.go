package budget

import (
	"fmt"
	"sort"
)

type location struct {
	name      string
	parsed    LocationName
	hasBudget bool
	budget    int64
	used      int64
	reserved  int64
	peak      int64
	inflation int64 // L of the controller's priority
	// reservations active here, in admission order.
	reservations []*reservation
	// The controller's accounting (candindex.go): the candidates here in
	// candidate order, and the bytes of every materialization here by
	// category.
	cands    candIndex
	catBytes [numCats]int64
	// spill is the index of the location's spill target, -1 for none.
	spill int
	// shared is the index+1 of the location's shared budget, 0 for none
	// (sharedbudgets.go).
	shared int
}

type mat struct {
	loc     int
	state   MatState
	uses    int
	holds   int
	pending int
	prio    int64  // H = L(location) + freq at the last completion or lease
	lastUse uint64 // version of the last completion, lease, hold or release
	readers int    // in-flight copies reading this materialization
	// How the location's accounting counts it (candindex.go).
	cat matCat
	key candidate
}

func (m *mat) protected() bool { return m.uses > 0 || m.holds > 0 || m.pending > 0 }

// busy: the source of an in-flight copy; it cannot be removed until the
// copy settles (it would free bytes a stream is still reading).
func (m *mat) busy() bool { return m.readers > 0 }

type value struct {
	id        uint64
	name      string
	bytes     int64
	mode      ReplicaMode
	hasSource bool
	source    int // location index of the source; -1 when none
	discarded bool
	freq      int64
	mats      []*mat // any order; at most one per location
	inflight  int    // admitted transfers not yet completed or failed
	slot      int    // position in the value table's registration order
	// rec is the value's immutable snapshot record as of the last freeze;
	// dirty: changed since (listed in the ledger's dirty list).
	rec   *ValueRecord
	dirty bool
}

func (v *value) mat(loc int) *mat {
	for _, m := range v.mats {
		if m.loc == loc {
			return m
		}
	}
	return nil
}

// keptCount counts the materializations that keep v's data whatever
// happens next: resident ones, and the source of a move in flight (the
// move leaves either its destination, or, failed, its source resident
// again). Evicting one of them is losing data only when it is the last.
func (v *value) keptCount() int {
	n := 0
	for _, m := range v.mats {
		if m.state == Resident || m.state == Leaving {
			n++
		}
	}
	return n
}

func (v *value) residentCount() int {
	n := 0
	for _, m := range v.mats {
		if m.state == Resident {
			n++
		}
	}
	return n
}

func (v *value) removeMat(loc int) {
	for i, m := range v.mats {
		if m.loc == loc {
			v.mats = append(v.mats[:i], v.mats[i+1:]...)
			return
		}
	}
}

// Ledger is the byte-accounting state machine. Not safe for concurrent use.
type Ledger struct {
	id           string
	version      uint64
	locs         []location
	locIndex     map[string]int
	vals         valueTable // live values; retired ones leave nothing
	byName       map[string]*value
	reservations map[string]*reservation
	// parentReservations: a simulation clone's parent's active reservations,
	// whose names its reserve refuses like its own.
	parentReservations map[string]*reservation
	transfers          map[AdmissionID]*transfer
	leases             map[LeaseID]*lease
	events             map[EventID]*event
	holds              map[HoldID]*hold
	nextAdmission      AdmissionID
	nextLease          LeaseID
	nextEvent          EventID
	nextHold           HoldID

	trace traceRing
	// recorder, when set, collects every committed transition for a
	// report; only recordInto sets it (trace.go).
	recorder *recorder
	sim      bool // a simulation clone (explain/decide)
	// dirty lists the values changed since the last freeze (snapshot.go);
	// dirtyRetired counts those retired since.
	dirty        []*value
	dirtyRetired int
	scratch      *decideScratch // Decide's reusable candidate buffers
	// charges: the offered charges by candidate id (charges.go);
	// nextCharge numbers reservations; simDropped: the charges a
	// simulation evicted.
	charges    map[uint64]*reservation
	nextCharge uint64
	simDropped map[*reservation]bool

	// Cumulative committed transitions by kind, and removals by
	// [RemovalKind], since New: the exact counts behind a snapshot (the
	// trace ring forgets).
	counts   map[string]uint64
	removals map[RemovalKind]uint64
	// roomReleases counts the committed transitions that may make room
	// (RoomKind, waitqueue.go).
	roomReleases uint64
	// caps: the caps over groups of reservations, by name (capgroups.go).
	caps map[string]*capGroup
	// shared: the shared budgets, by name (sharedbudgets.go).
	shared []sharedGroup
	// held: while WithHeld runs, the earlier waiters holding each
	// location's room (indexed by location; nil otherwise). held.go.
	held []int
}

// New returns an empty ledger with the configured locations. Errors: a
// missing manager id, a malformed or duplicate location, a budget ≤ 0, a
// negative trace capacity, a spill target that is malformed, not
// configured or equal to its own location, a malformed shared budget
// (sharedbudgets.go) ([*InvalidInputError]).
func New(cfg Config) (*Ledger, error) {
	if cfg.ManagerID == "" {
		return nil, invalidf("manager id is required")
	}
	if cfg.TraceCapacity < 0 {
		return nil, invalidf("trace capacity %d is negative", cfg.TraceCapacity)
	}
	if len(cfg.Locations) == 0 {
		return nil, invalidf("at least one location is required")
	}
	parsed := make([]location, 0, len(cfg.Locations))
	seen := map[string]bool{}
	for _, lc := range cfg.Locations {
		n, err := ParseLocation(lc.Name)
		if err != nil {
			return nil, err
		}
		if n.String() != lc.Name {
			return nil, invalidf("location %q is not in canonical form %q", lc.Name, n.String())
		}
		if seen[lc.Name] {
			return nil, invalidf("location %q configured twice", lc.Name)
		}
		seen[lc.Name] = true
		if lc.HasBudget && lc.BudgetBytes <= 0 {
			return nil, invalidf("budget of %s must be positive, got %d", lc.Name, lc.BudgetBytes)
		}
		parsed = append(parsed, location{name: lc.Name, parsed: n, hasBudget: lc.HasBudget, budget: lc.BudgetBytes, spill: -1})
	}
	sort.SliceStable(parsed, func(i, j int) bool { return locationLess(parsed[i].parsed, parsed[j].parsed) })
	l := &Ledger{
		id:           cfg.ManagerID,
		locs:         parsed,
		locIndex:     make(map[string]int, len(parsed)),
		vals:         newValueTable(),
		byName:       map[string]*value{},
		reservations: map[string]*reservation{},
		transfers:    map[AdmissionID]*transfer{},
		leases:       map[LeaseID]*lease{},
		events:       map[EventID]*event{},
		holds:        map[HoldID]*hold{},
		trace:        newTraceRing(cfg.TraceCapacity),
	}
	for i := range l.locs {
		l.locIndex[l.locs[i].name] = i
	}
	if err := l.configureSpill(cfg.Locations); err != nil {
		return nil, err
	}
	if err := l.configureShared(cfg.SharedBudgets); err != nil {
		return nil, err
	}
	return l, nil
}

// ManagerID returns the ledger's manager id.
func (l *Ledger) ManagerID() string { return l.id }

// Version returns the current state version.
func (l *Ledger) Version() uint64 { return l.version }

// Locations returns the configured location names in location order.
func (l *Ledger) Locations() []string {
	out := make([]string, len(l.locs))
	for i := range l.locs {
		out[i] = l.locs[i].name
	}
	return out
}

// Lookup returns the handle of the live value registered under name. A
// discarded value's name, like that of a failed registration, is free:
// Lookup does not find it, and a new registration under it gets a new
// handle (a new ID; IDs are never reused), which Lookup then returns.
func (l *Ledger) Lookup(name string) (Handle, bool) {
	v, ok := l.byName[name]
	if !ok {
		return Handle{}, false
	}
	return l.handle(v), true
}

func (l *Ledger) handle(v *value) Handle { return Handle{Manager: l.id, ID: v.id, Name: v.name} }

// ---- commits ---------------------------------------------------------------

// commit commits one transition: the version, the counts, the trace and
// the active recorder. detail is its text; commitDetail takes one that is
// formatted when read.
func (l *Ledger) commit(kind string, v *value, loc int, bytes int64, detail string) uint64 {
	return l.commitEntry(kind, v, loc, bytes, textDetail(detail), RemovalNone)
}

func (l *Ledger) commitDetail(kind string, v *value, loc int, bytes int64, detail traceDetail) uint64 {
	return l.commitEntry(kind, v, loc, bytes, detail, RemovalNone)
}

// commitEntry commits a transition; removal is a "remove" transition's
// kind (RemovalNone for the others).
func (l *Ledger) commitEntry(kind string, v *value, loc int, bytes int64, detail traceDetail, removal RemovalKind) uint64 {
	l.version++
	if !l.sim {
		if l.counts == nil {
			l.counts = map[string]uint64{}
		}
		l.counts[kind]++
		if RoomKind(kind) {
			l.roomReleases++
		}
		if kind == "remove" {
			if l.removals == nil {
				l.removals = map[RemovalKind]uint64{}
			}
			l.removals[removal]++
		}
	}
	if l.trace.cap == 0 && l.recorder == nil {
		return l.version
	}
	e := traceEntry{version: l.version, kind: kind, bytes: bytes, detail: detail, removal: removal}
	if v != nil {
		e.handle = v.name
	}
	if loc >= 0 {
		e.location = l.locs[loc].name
	}
	l.trace.push(&e)
	if l.recorder != nil {
		l.recorder.entries = append(l.recorder.entries, e)
	}
	return l.version
}

func (l *Ledger) charge(loc int, bytes int64) {
	lc := &l.locs[loc]
	lc.used += bytes
	if c := lc.used + lc.reserved; c > lc.peak {
		lc.peak = c
	}
	l.notePeak(loc)
}

func (l *Ledger) uncharge(loc int, bytes int64) {
	lc := &l.locs[loc]
	lc.used -= bytes
	if lc.used < 0 {
		panic(fmt.Sprintf("budget: used bytes of %s went negative (%d): released more than charged", lc.name, lc.used))
	}
}

// admits checks whether requested more bytes fit at loc, and then at its
// shared budget, if any.
// The comparison is exact: it is written so that no sum can overflow
// (used+reserved never exceeds the budget, or math.MaxInt64 without one).
// Without a budget, a charge that would make used+reserved unrepresentable
// is invalid input rather than a wrapped-around figure.
func (l *Ledger) admits(loc int, requested int64) error {
	if err := l.admitsLocation(loc, requested); err != nil {
		return err
	}
	if err := l.admitsShared(loc, requested, 0); err != nil {
		return err
	}
	return l.heldErr(loc) // last: it refuses only what would fit (held.go)
}

// admitsLocation is admits at the location alone, without its group.
func (l *Ledger) admitsLocation(loc int, requested int64) error {
	lc := &l.locs[loc]
	if !lc.hasBudget {
		return AccountingOverflow(lc.name, lc.used, lc.reserved, requested)
	}
	if requested <= lc.budget-lc.used-lc.reserved {
		return nil
	}
	return &BudgetError{Location: lc.name, BudgetBytes: lc.budget, UsedBytes: lc.used, ReservedBytes: lc.reserved, RequestedBytes: requested}
}

// ---- validation ------------------------------------------------------------

// value resolves a handle: foreign → Unavailable(foreign); an id never
// issued, or a live id with another name → invalid input; an issued id
// that is not live → Unavailable(discarded). A retired value (discarded,
// or whose registration failed) leaves no record: ids are never reused,
// so an issued id absent from the table can only be a retired one, and
// that is the whole answer (whatever name the handle carries).
func (l *Ledger) value(h Handle) (*value, error) {
	if h.Manager != l.id {
		return nil, &UnavailableError{Handle: h.Name, Detail: fmt.Sprintf("foreign handle: it belongs to another manager (%q, this is %q)", h.Manager, l.id), Reason: UnavailableForeign}
	}
	if h.ID == 0 {
		// A handle no Register returned: only its name can say which.
		return nil, invalidf("unknown handle %q (register it first)", h.Name)
	}
	if h.ID > l.vals.maxID {
		return nil, invalidf("unknown handle %q (id %d)", h.Name, h.ID)
	}
	v := l.vals.get(h.ID)
	if v == nil {
		return nil, &UnavailableError{Handle: h.Name, Detail: "value was discarded", Reason: UnavailableDiscarded}
	}
	if v.name != h.Name {
		return nil, invalidf("handle id %d names %q, not %q", h.ID, v.name, h.Name)
	}
	return v, nil
}

// location resolves a name: malformed → invalid input; well formed but not
// configured → Unavailable(location).
func (l *Ledger) location(name string) (int, error) {
	if i, ok := l.locIndex[name]; ok {
		return i, nil
	}
	if _, err := ParseLocation(name); err != nil {
		return -1, err
	}
	return -1, &UnavailableError{Location: name, Detail: "location is not configured", Reason: UnavailableLocation}
}

func (l *Ledger) residentMat(v *value, loc int, what string) (*mat, error) {
	m := v.mat(loc)
	if m == nil {
		return nil, &UnavailableError{Handle: v.name, Location: l.locs[loc].name, Detail: "no resident materialization (" + what + ")", Reason: UnavailableEndpoint}
	}
	if m.state != Resident {
		return nil, &UnavailableError{Handle: v.name, Location: l.locs[loc].name, Detail: "materialization is " + m.state.String() + ", not resident (" + what + ")", Reason: UnavailableInFlight}
	}
	return m, nil
}

// residentEndpoint resolves (h, loc) to a resident materialization; what
// says why one is needed, for the UnavailableError.
func (l *Ledger) residentEndpoint(h Handle, loc, what string) (*value, int, *mat, error) {
	v, err := l.value(h)
	if err != nil {
		return nil, 0, nil, err
	}
	i, err := l.location(loc)
	if err != nil {
		return nil, 0, nil, err
	}
	m, err := l.residentMat(v, i, what)
	if err != nil {
		return nil, 0, nil, err
	}
	return v, i, m, nil
}

func (l *Ledger) inUse(v *value, m *mat) error {
	return &InUseError{Handle: v.name, Location: l.locs[m.loc].name, UseCount: m.uses, HoldCount: m.holds, PendingEventCount: m.pending}
}
