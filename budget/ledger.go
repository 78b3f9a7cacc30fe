package budget

import (
	"fmt"
	"math"
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
}

type reservation struct {
	name  string
	loc   int
	bytes int64
	owner string // "" for ordinary reservations; a run/scope owner otherwise
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

// Ledger is the byte-accounting state machine. Not safe for concurrent use.
type Ledger struct {
	id      string
	version uint64
	locs    []location
	locIdx  map[string]int
	vals    valueTable // live values; retired ones leave nothing
	byName  map[string]*value
	resv    map[string]*reservation
	// parentResv: a simulation clone's parent's active reservations,
	// whose names its reserve refuses like its own.
	parentResv map[string]*reservation
	xfers      map[AdmissionID]*transfer
	leases     map[LeaseID]*lease
	events     map[EventID]*event
	holds      map[HoldID]*hold
	nextAdm    AdmissionID
	nextLse    LeaseID
	nextEvt    EventID
	nextHld    HoldID

	trace traceRing
	sink  *[]Transition // when set, committed transitions are appended
	sim   bool          // a simulation clone (explain/decide)
	// dirty lists the values changed since the last freeze (snapshot.go);
	// dirtyRetired counts those retired since.
	dirty        []*value
	dirtyRetired int
	scratch      *decideScratch // Decide's reusable candidate buffers

	// Cumulative committed transitions by kind, and removals by detail
	// (evict, reclaim, move source, discard, shutdown, …), since New: the
	// exact counts behind a snapshot (the trace ring forgets).
	counts   map[string]uint64
	removals map[string]uint64
}

// New returns an empty ledger with the configured locations. Errors: a
// missing manager id, a malformed or duplicate location, a budget ≤ 0, a
// negative trace capacity ([*InvalidInputError]).
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
		parsed = append(parsed, location{name: lc.Name, parsed: n, hasBudget: lc.HasBudget, budget: lc.BudgetBytes})
	}
	sort.SliceStable(parsed, func(i, j int) bool { return locationLess(parsed[i].parsed, parsed[j].parsed) })
	l := &Ledger{
		id:     cfg.ManagerID,
		locs:   parsed,
		locIdx: make(map[string]int, len(parsed)),
		vals:   newValueTable(),
		byName: map[string]*value{},
		resv:   map[string]*reservation{},
		xfers:  map[AdmissionID]*transfer{},
		leases: map[LeaseID]*lease{},
		events: map[EventID]*event{},
		holds:  map[HoldID]*hold{},
		trace:  newTraceRing(cfg.TraceCapacity),
	}
	for i := range l.locs {
		l.locIdx[l.locs[i].name] = i
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

func (l *Ledger) commit(kind string, v *value, loc int, bytes int64, detail string) uint64 {
	l.version++
	if !l.sim {
		if l.counts == nil {
			l.counts = map[string]uint64{}
		}
		l.counts[kind]++
		if kind == "remove" {
			if l.removals == nil {
				l.removals = map[string]uint64{}
			}
			l.removals[detail]++
		}
	}
	if l.trace.cap == 0 && l.sink == nil {
		return l.version
	}
	t := Transition{Version: l.version, Kind: kind, Bytes: bytes, Detail: detail}
	if v != nil {
		t.Handle = v.name
	}
	if loc >= 0 {
		t.Location = l.locs[loc].name
	}
	l.trace.push(t)
	if l.sink != nil {
		*l.sink = append(*l.sink, t)
	}
	return l.version
}

func (l *Ledger) charge(loc int, bytes int64) {
	lc := &l.locs[loc]
	lc.used += bytes
	if c := lc.used + lc.reserved; c > lc.peak {
		lc.peak = c
	}
}

func (l *Ledger) uncharge(loc int, bytes int64) {
	lc := &l.locs[loc]
	lc.used -= bytes
	if lc.used < 0 {
		panic(fmt.Sprintf("budget: used bytes of %s went negative (%d): released more than charged", lc.name, lc.used))
	}
}

// admits checks whether requested more bytes fit at loc.
// The comparison is exact: it is written so that no sum can overflow
// (used+reserved never exceeds the budget, or math.MaxInt64 without one).
// Without a budget, a charge that would make used+reserved unrepresentable
// is invalid input rather than a wrapped-around figure.
func (l *Ledger) admits(loc int, requested int64) error {
	lc := &l.locs[loc]
	if !lc.hasBudget {
		if requested > math.MaxInt64-lc.used-lc.reserved {
			return invalidf("%d more bytes at %s would overflow its byte accounting (used %d + reserved %d)", requested, lc.name, lc.used, lc.reserved)
		}
		return nil
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
	if h.ID == 0 || h.ID > l.vals.maxID {
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
	if i, ok := l.locIdx[name]; ok {
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

// retire forgets a value whose handle is retired: its name is free and its
// id answers Unavailable (discarded) from now on.
func (l *Ledger) retire(v *value) {
	v.discarded = true
	delete(l.byName, v.name)
	l.vals.retire(v)
	l.forgetDirty(v)
}

// ---- two-phase transfers ---------------------------------------------------

// admitTransfer commits an admission whose budget checks have passed.
func (l *Ledger) admitTransfer(v *value, dest, src, temp int, moveSrc bool, kind EffectKind, detail string) Admission {
	l.nextAdm++
	x := &transfer{id: l.nextAdm, v: v, dest: dest, src: src, temp: temp, moveSrc: moveSrc, kind: kind}
	l.xfers[x.id] = x
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
	if err := l.admits(d, v.bytes); err != nil {
		return Admission{}, err
	}
	temp := -1
	if v.source != d {
		temp = v.source
		if err := l.admits(temp, v.bytes); err != nil {
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
	if dm := v.mat(t); dm != nil {
		if dm.state != Resident {
			return Admission{}, &UnavailableError{Handle: v.name, Location: l.locs[t].name, Detail: "a transition into this endpoint is in flight", Reason: UnavailableInFlight}
		}
		l.removeMat(v, src, "move source (destination already resident)")
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
	x, ok := l.xfers[id]
	if !ok {
		return nil, invalidf("admission %d is not pending", id)
	}
	delete(l.xfers, id)
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
		sm := v.mat(x.src)
		l.removeMat(v, sm, "move source")
		return []Effect{l.freeEffect(v, x.src)}, nil
	}
	return nil, nil
}

// Fail commits the failure of an admitted transfer: the destination charge
// and any temporary charge are released, a move's source is resident again
// (1 version). Unknown or already settled id: invalid input.
func (l *Ledger) Fail(id AdmissionID, cause error) error {
	x, ok := l.xfers[id]
	if !ok {
		return invalidf("admission %d is not pending", id)
	}
	delete(l.xfers, id)
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
	detail := "transfer failed"
	if x.kind == EffectInitialize {
		// A registration whose first materialization failed: the value
		// never existed for anyone else. Retire the handle and free its
		// name so the caller can register again.
		l.retire(v)
		detail = "registration failed; handle retired"
	}
	if cause != nil {
		detail += ": " + cause.Error()
	}
	l.commit("fail", v, x.dest, v.bytes, detail)
	return nil
}

// Pending reports the number of admitted transfers not yet settled.
func (l *Ledger) Pending() int { return len(l.xfers) }

// ---- removal ---------------------------------------------------------------

func (l *Ledger) freeEffect(v *value, loc int) Effect {
	return Effect{Kind: EffectFree, Handle: l.handle(v), Location: l.locs[loc].name, Bytes: v.bytes}
}

// removeMat removes a materialization, releases its charge, raises the
// location's inflation to its priority and commits one version.
func (l *Ledger) removeMat(v *value, m *mat, detail string) {
	lc := &l.locs[m.loc]
	if m.prio > lc.inflation {
		lc.inflation = m.prio
	}
	l.unindex(v, m)
	v.removeMat(m.loc)
	l.reindex(v)
	l.uncharge(m.loc, v.bytes)
	l.commit("remove", v, m.loc, v.bytes, detail)
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
	if !v.hasSource && v.residentCount() == 1 {
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
	l.removeMat(v, m, "evict")
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
		l.removeMat(v, m, "discard")
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

// ---- protections -----------------------------------------------------------

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
	l.nextLse++
	id := l.nextLse
	l.leases[id] = &lease{v: v, loc: i, open: true}
	m.lastUse = l.commit("acquire", v, i, 0, fmt.Sprintf("lease %d", id))
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
		return invalidf("lease %d is not active (already released or never issued)", id)
	}
	delete(l.leases, id)
	m := ls.v.mat(ls.loc)
	m.uses--
	if m.uses < 0 {
		panic("budget: use count went negative")
	}
	m.lastUse = l.commit("release", ls.v, ls.loc, 0, fmt.Sprintf("lease %d", id))
	l.reindex(ls.v)
	return nil
}

// RecordEvent records a pending consumer event on an active lease's
// materialization (1 version). Released lease: invalid input.
func (l *Ledger) RecordEvent(id LeaseID) (EventID, error) {
	ls, ok := l.leases[id]
	if !ok {
		return 0, invalidf("cannot record an event on lease %d: not active (already released or never issued)", id)
	}
	ls.v.mat(ls.loc).pending++
	l.nextEvt++
	e := l.nextEvt
	l.events[e] = &event{v: ls.v, loc: ls.loc}
	l.reindex(ls.v)
	l.commit("record_event", ls.v, ls.loc, 0, fmt.Sprintf("event %d on lease %d", e, id))
	return e, nil
}

// ReapEvent reaps a completed event (1 version). Unknown or already reaped:
// invalid input.
func (l *Ledger) ReapEvent(id EventID) error {
	e, ok := l.events[id]
	if !ok {
		return invalidf("event %d is not pending (already reaped or never recorded)", id)
	}
	delete(l.events, id)
	m := e.v.mat(e.loc)
	m.pending--
	if m.pending < 0 {
		panic("budget: pending event count went negative")
	}
	l.reindex(e.v)
	l.commit("reap_event", e.v, e.loc, 0, fmt.Sprintf("event %d", id))
	return nil
}

// Hold takes a hold on h's resident materialization at loc (1 version).
func (l *Ledger) Hold(h Handle, loc string) (HoldID, error) {
	v, i, m, err := l.residentEndpoint(h, loc, "hold needs a resident materialization")
	if err != nil {
		return 0, err
	}
	m.holds++
	l.nextHld++
	id := l.nextHld
	l.holds[id] = &hold{v: v, loc: i}
	m.lastUse = l.commit("hold", v, i, 0, fmt.Sprintf("hold %d", id))
	l.reindex(v)
	return id, nil
}

// Unhold releases a hold (1 version). Released or unknown: invalid input.
func (l *Ledger) Unhold(id HoldID) error {
	hd, ok := l.holds[id]
	if !ok {
		return invalidf("hold %d is not active (already released or never issued)", id)
	}
	delete(l.holds, id)
	m := hd.v.mat(hd.loc)
	m.holds--
	if m.holds < 0 {
		panic("budget: hold count went negative")
	}
	m.lastUse = l.commit("unhold", hd.v, hd.loc, 0, fmt.Sprintf("hold %d", id))
	l.reindex(hd.v)
	return nil
}

// ---- reservations ----------------------------------------------------------

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

func (l *Ledger) reserve(loc, name string, bytes int64, owner string) error {
	if name == "" {
		return invalidf("reservation name is empty")
	}
	if _, dup := l.resv[name]; dup || l.parentResv[name] != nil {
		return invalidf("duplicate reservation name %q (already active)", name)
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
	r := &reservation{name: name, loc: i, bytes: bytes, owner: owner}
	l.resv[name] = r
	lc := &l.locs[i]
	lc.reservations = append(lc.reservations, r)
	lc.reserved += bytes
	if c := lc.used + lc.reserved; c > lc.peak {
		lc.peak = c
	}
	l.commit("reserve", nil, i, bytes, name)
	return nil
}

// Unreserve releases an ordinary named reservation (1 version). Not
// active, or owned by a scope: invalid input.
func (l *Ledger) Unreserve(name string) error { return l.unreserve(name, "") }

// UnreserveOwned releases a reservation owned by owner.
func (l *Ledger) UnreserveOwned(name, owner string) error { return l.unreserve(name, owner) }

func (l *Ledger) unreserve(name, owner string) error {
	r, ok := l.resv[name]
	if !ok {
		return invalidf("reservation %q is not active (already released or never made)", name)
	}
	if r.owner != owner {
		if owner == "" {
			return invalidf("reservation %q belongs to scope %q; it is released when the scope exits", name, r.owner)
		}
		return invalidf("reservation %q does not belong to %q", name, owner)
	}
	delete(l.resv, name)
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
	l.commit("unreserve", nil, r.loc, r.bytes, name)
	return nil
}

// FailDirect is [Ledger.Fail] for a direct place, copy or move (not part of
// a plan): it commits the failure and returns the *PlanExecutionError the
// caller reports — phase execute, the failed action (index 0), the partial
// report (the admission and the failure), and the cause.
func (l *Ledger) FailDirect(id AdmissionID, cause error) error {
	x, ok := l.xfers[id]
	if !ok {
		return invalidf("admission %d is not pending", id)
	}
	a := Action{Handle: l.handle(x.v), Location: l.locs[x.dest].name}
	if x.src >= 0 {
		a.From = l.locs[x.src].name
	}
	report := []Transition{x.admitted}
	var sink []Transition
	l.sink = &sink
	_ = l.Fail(id, cause)
	l.sink = nil
	report = append(report, sink...)
	return &PlanExecutionError{Phase: PhaseExecute, FailedAction: &a, FailedActionIndex: 0, FailedReservationIndex: -1, PartialReport: Report{Transitions: report}, Cause: cause}
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

// Shutdown is the ledger side of closing a runtime: it force-releases every
// lease, hold and pending event (reported by [Ledger.Outstanding] first),
// every reservation, and removes every materialization, committing each as
// a transition, and returns the free effects. It refuses while transfers
// are pending (settle them first). Afterwards every location's used and
// reserved bytes are zero.
func (l *Ledger) Shutdown() ([]Effect, error) {
	if len(l.xfers) > 0 {
		return nil, invalidf("%d transfers are still pending", len(l.xfers))
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
	names := make([]string, 0, len(l.resv))
	for n := range l.resv {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		_ = l.unreserve(n, l.resv[n].owner)
	}
	var effects []Effect
	for _, v := range l.liveValues() {
		for _, m := range l.matsInOrder(v) {
			effects = append(effects, l.freeEffect(v, m.loc))
			l.removeMat(v, m, "shutdown")
		}
	}
	return effects, nil
}

// Recording runs f and returns the transitions committed while it ran.
// The runtime uses it to build the report of a scope exit.
func (l *Ledger) Recording(f func()) Report {
	var sink []Transition
	prev := l.sink
	l.sink = &sink
	defer func() { l.sink = prev }()
	f()
	return Report{Transitions: sink}
}

// EventPending reports whether event id is recorded and not yet reaped.
func (l *Ledger) EventPending(id EventID) bool {
	_, ok := l.events[id]
	return ok
}
