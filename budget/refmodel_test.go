package budget

// A deliberately naive reference model of the ledger, written from the
// rules in docs/semantics.md (and, where they leave a detail open, from the
// ledger's documented choices in doc.go and the method comments). FuzzLedger runs it side by side with the real ledger.
//
// It shares no code with the ledger: plain maps and slices, no cached
// figures. used, reserved, use/hold/pending counts and "copy in flight from
// here" are recomputed from scratch whenever they are needed; only the peak
// (a history) and the version are kept. Simulation (explain) deep-copies the
// whole model and runs the same operations on the copy.
//
// Errors are reported as refErr strings (see refErr* below), the same form
// FuzzLedger derives from the ledger's typed errors, so that kinds and
// fields compare exactly; message wording is not compared.

import (
	"fmt"
	"math"
	"regexp"
	"sort"
)

type refLoc struct {
	name      string
	hasBudget bool
	budget    int64
	spill     string // spill target ("" none; refmodel_charges_spill_test.go)
}

type refValue struct {
	id         uint64
	name       string
	bytes      int64
	replicable bool
	source     string // "" when the value has no source
	discarded  bool
	stillborn  bool
	state      map[string]MatState // location → state of the materialization there
}

type refXfer struct {
	value      uint64
	dest       string
	from       string // resident copy read from ("" for initialization and reconstruction)
	temp       string // temporary reconstruction charge ("" none)
	move       bool
	initialize bool
}

type refEndpoint struct {
	value uint64
	loc   string
}

type refResv struct {
	name   string
	loc    string
	bytes  int64
	owner  string
	state  ChargeState // as a charge (refmodel_charges_test.go)
	demote bool        // offered as demotable (refmodel_charges_spill_test.go)
}

type refModel struct {
	manager string
	locs    []refLoc // in location order
	version uint64
	values  []*refValue
	names   map[string]uint64 // names of live values (taken)
	xfers   map[int]*refXfer
	leases  map[int]refEndpoint
	holds   map[int]refEndpoint
	events  map[int]refEndpoint
	resv    []refResv // active, in admission order
	peak    map[string]int64
	nextID  int // lease, hold, event and admission ids (one counter: ids are internal)
	report  *[]uint64
	shared  []refShared // refmodel_shared_test.go
	// held: the room earlier waiters hold during the current operation
	// (Ledger.WithHeld; refmodel_held_test.go); nil otherwise.
	held map[string]int
}

func newRefModel(manager string, locs []refLoc) *refModel {
	m := &refModel{
		manager: manager,
		locs:    append([]refLoc(nil), locs...),
		names:   map[string]uint64{},
		xfers:   map[int]*refXfer{},
		leases:  map[int]refEndpoint{},
		holds:   map[int]refEndpoint{},
		events:  map[int]refEndpoint{},
		peak:    map[string]int64{},
	}
	return m
}

func (m *refModel) clone() *refModel {
	c := *m
	c.locs = append([]refLoc(nil), m.locs...)
	c.shared = append([]refShared(nil), m.shared...)
	c.values = nil
	for _, v := range m.values {
		cv := *v
		cv.state = map[string]MatState{}
		for k, s := range v.state {
			cv.state[k] = s
		}
		c.values = append(c.values, &cv)
	}
	c.names = map[string]uint64{}
	for k, v := range m.names {
		c.names[k] = v
	}
	c.xfers = map[int]*refXfer{}
	for k, x := range m.xfers {
		cx := *x
		c.xfers[k] = &cx
	}
	c.leases, c.holds, c.events = copyEndpoints(m.leases), copyEndpoints(m.holds), copyEndpoints(m.events)
	c.resv = append([]refResv(nil), m.resv...)
	c.peak = map[string]int64{}
	for k, v := range m.peak {
		c.peak[k] = v
	}
	c.report = nil
	return &c
}

func copyEndpoints(in map[int]refEndpoint) map[int]refEndpoint {
	out := map[int]refEndpoint{}
	for k, v := range in {
		out[k] = v
	}
	return out
}

// ---- errors ----------------------------------------------------------------

func refInvalid() string { return "invalid" }
func refPlan() string    { return "plan" }
func refBudget(loc string, budget, used, reserved, requested int64) string {
	return fmt.Sprintf("budget{%s %d used=%d reserved=%d requested=%d}", loc, budget, used, reserved, requested)
}
func refInUse(h, loc string, uses, holds, pending int) string {
	return fmt.Sprintf("in-use{%s@%s %d/%d/%d}", h, loc, uses, holds, pending)
}
func refUnavailable(h, loc string, reason UnavailableReason) string {
	return fmt.Sprintf("unavailable{%q@%q reason=%d}", h, loc, reason)
}
func refStale(expected, actual uint64) string {
	return fmt.Sprintf("stale{expected=%d actual=%d}", expected, actual)
}

// ---- derived figures, recomputed from scratch --------------------------------

func (m *refModel) value(id uint64) *refValue { return m.values[id-1] }

func (m *refModel) used(loc string) int64 {
	var n int64
	for _, v := range m.values {
		if _, ok := v.state[loc]; ok {
			n += v.bytes
		}
	}
	for _, x := range m.xfers {
		if x.temp == loc {
			n += m.value(x.value).bytes
		}
	}
	return n
}

func (m *refModel) reserved(loc string) int64 {
	var n int64
	for _, r := range m.resv {
		if r.loc == loc {
			n += r.bytes
		}
	}
	return n
}

func (m *refModel) counts(id uint64, loc string) (uses, holds, pending int) {
	e := refEndpoint{id, loc}
	for _, x := range m.leases {
		if x == e {
			uses++
		}
	}
	for _, x := range m.holds {
		if x == e {
			holds++
		}
	}
	for _, x := range m.events {
		if x == e {
			pending++
		}
	}
	return
}

// readers: copies in flight that read the materialization of id at loc.
func (m *refModel) readers(id uint64, loc string) int {
	n := 0
	for _, x := range m.xfers {
		if x.value == id && x.from == loc && !x.move {
			n++
		}
	}
	return n
}

func (m *refModel) protected(id uint64, loc string) bool {
	u, h, p := m.counts(id, loc)
	return u+h+p > 0
}

func (m *refModel) locIndex(name string) int {
	for i, l := range m.locs {
		if l.name == name {
			return i
		}
	}
	return -1
}

// matLocs lists the value's materializations in location order.
func (m *refModel) matLocs(v *refValue) []string {
	var out []string
	for _, l := range m.locs {
		if _, ok := v.state[l.name]; ok {
			out = append(out, l.name)
		}
	}
	return out
}

// bump commits one transition: version + 1, peaks follow.
func (m *refModel) bump() {
	m.version++
	if m.report != nil {
		*m.report = append(*m.report, m.version)
	}
	m.notePeaks()
}

func (m *refModel) notePeaks() {
	for _, l := range m.locs {
		if c := m.used(l.name) + m.reserved(l.name); c > m.peak[l.name] {
			m.peak[l.name] = c
		}
	}
	m.noteSharedPeaks()
}

// ---- validation --------------------------------------------------------------

var refLocationSyntax = regexp.MustCompile(`^(pageable-host|pinned-host|cuda:(0|[1-9][0-9]{0,5}))(@[A-Za-z0-9._-]+)?$`)

func (m *refModel) checkLoc(name string) string {
	if m.locIndex(name) >= 0 {
		return ""
	}
	if !refLocationSyntax.MatchString(name) {
		return refInvalid()
	}
	return refUnavailable("", name, UnavailableLocation)
}

func (m *refModel) resolve(h Handle) (*refValue, string) {
	if h.Manager != m.manager {
		return nil, refUnavailable(h.Name, "", UnavailableForeign)
	}
	if h.ID == 0 || h.ID > uint64(len(m.values)) {
		return nil, refInvalid()
	}
	v := m.value(h.ID)
	if v.discarded { // whatever the name: nothing of a retired value is kept
		return nil, refUnavailable(h.Name, "", UnavailableDiscarded)
	}
	if v.name != h.Name {
		return nil, refInvalid()
	}
	return v, ""
}

func (m *refModel) admitLoc(loc string, requested int64) string {
	l := m.locs[m.locIndex(loc)]
	used, reserved := m.used(loc), m.reserved(loc)
	if !l.hasBudget {
		if requested > math.MaxInt64-used-reserved {
			return refInvalid()
		}
		return ""
	}
	if used+reserved+requested > l.budget {
		return refBudget(loc, l.budget, used, reserved, requested)
	}
	return ""
}

// ---- operations --------------------------------------------------------------

// refAdm is an admission: id > 0 when a transfer is pending.
type refAdm struct {
	id int
}

func (m *refModel) newXfer(x *refXfer) refAdm {
	m.nextID++
	m.xfers[m.nextID] = x
	m.value(x.value).state[x.dest] = Entering
	if x.move {
		m.value(x.value).state[x.from] = Leaving
	}
	m.bump()
	return refAdm{id: m.nextID}
}

func (m *refModel) Register(s ValueSpec) (Handle, refAdm, string) {
	if s.Name == "" {
		return Handle{}, refAdm{}, refInvalid()
	}
	if _, taken := m.names[s.Name]; taken {
		return Handle{}, refAdm{}, refInvalid()
	}
	if s.Bytes <= 0 {
		return Handle{}, refAdm{}, refInvalid()
	}
	if (s.At == "") == (s.Source == "") {
		return Handle{}, refAdm{}, refInvalid()
	}
	loc := s.At
	if s.Source != "" {
		loc = s.Source
	}
	if e := m.checkLoc(loc); e != "" {
		return Handle{}, refAdm{}, e
	}
	if s.At != "" {
		if e := m.admit(s.At, s.Bytes); e != "" {
			return Handle{}, refAdm{}, e
		}
	}
	v := &refValue{id: uint64(len(m.values) + 1), name: s.Name, bytes: s.Bytes, replicable: s.Mode == Replicable, source: s.Source, state: map[string]MatState{}}
	m.values = append(m.values, v)
	m.names[s.Name] = v.id
	h := Handle{Manager: m.manager, ID: v.id, Name: v.name}
	if s.Source != "" {
		m.bump()
		return h, refAdm{}, ""
	}
	return h, m.newXfer(&refXfer{value: v.id, dest: s.At, initialize: true}), ""
}

func (m *refModel) Place(h Handle, dest string) (refAdm, string) {
	v, e := m.resolve(h)
	if e != "" {
		return refAdm{}, e
	}
	if e := m.checkLoc(dest); e != "" {
		return refAdm{}, e
	}
	return m.place(v, dest)
}

func (m *refModel) place(v *refValue, dest string) (refAdm, string) {
	if st, ok := v.state[dest]; ok {
		if st == Resident {
			return refAdm{}, ""
		}
		return refAdm{}, refUnavailable(v.name, dest, UnavailableInFlight)
	}
	if !v.replicable && len(v.state) > 0 {
		// The one materialization of an exclusive value (the leaving one
		// during a move) must be resident and alone: then place is a move.
		var only string
		for loc, st := range v.state {
			if only == "" || st == Leaving {
				only = loc
			}
		}
		if len(v.state) > 1 || v.state[only] != Resident {
			return refAdm{}, refUnavailable(v.name, only, UnavailableInFlight)
		}
		return m.move(v, only, dest)
	}
	// Source preference: pinned-host, pageable-host, cuda:0, cuda:1, ….
	best := ""
	for _, pref := range m.sourcePreference() {
		if st, ok := v.state[pref]; ok && st == Resident {
			best = pref
			break
		}
	}
	if best != "" {
		if e := m.admit(dest, v.bytes); e != "" {
			return refAdm{}, e
		}
		return m.newXfer(&refXfer{value: v.id, dest: dest, from: best}), ""
	}
	if v.source == "" {
		return refAdm{}, refUnavailable(v.name, dest, UnavailableSource)
	}
	if e := m.admitRoom(dest, v.bytes); e != "" {
		return refAdm{}, e
	}
	temp := ""
	if v.source != dest {
		temp = v.source
		if e := m.admitTemp(dest, temp, v.bytes); e != "" {
			return refAdm{}, e
		}
	}
	// Held room last, the destination's before the temporary's.
	if e := m.heldAt(dest); e != "" {
		return refAdm{}, e
	}
	if temp != "" {
		if e := m.heldAt(temp); e != "" {
			return refAdm{}, e
		}
	}
	return m.newXfer(&refXfer{value: v.id, dest: dest, temp: temp}), ""
}

func (m *refModel) sourcePreference() []string {
	var out []string
	for _, kind := range []string{"pinned-host", "pageable-host"} {
		for _, l := range m.locs {
			if l.name == kind {
				out = append(out, l.name)
			}
		}
	}
	var gpus []string
	for _, l := range m.locs {
		if l.name != "pinned-host" && l.name != "pageable-host" {
			gpus = append(gpus, l.name)
		}
	}
	sort.SliceStable(gpus, func(i, j int) bool { return m.locIndex(gpus[i]) < m.locIndex(gpus[j]) })
	return append(out, gpus...)
}

func (m *refModel) residentAt(v *refValue, loc string) string {
	st, ok := v.state[loc]
	if !ok {
		return refUnavailable(v.name, loc, UnavailableEndpoint)
	}
	if st != Resident {
		return refUnavailable(v.name, loc, UnavailableInFlight)
	}
	return ""
}

func (m *refModel) Copy(h Handle, from, to string) (refAdm, string) {
	v, e := m.resolve(h)
	if e != "" {
		return refAdm{}, e
	}
	if e := m.checkLoc(from); e != "" {
		return refAdm{}, e
	}
	if e := m.checkLoc(to); e != "" {
		return refAdm{}, e
	}
	if !v.replicable {
		return refAdm{}, refPlan()
	}
	if e := m.residentAt(v, from); e != "" {
		return refAdm{}, e
	}
	if st, ok := v.state[to]; ok {
		if st == Resident {
			return refAdm{}, ""
		}
		return refAdm{}, refUnavailable(v.name, to, UnavailableInFlight)
	}
	if e := m.admit(to, v.bytes); e != "" {
		return refAdm{}, e
	}
	return m.newXfer(&refXfer{value: v.id, dest: to, from: from}), ""
}

func (m *refModel) Move(h Handle, from, to string) (refAdm, string) {
	v, e := m.resolve(h)
	if e != "" {
		return refAdm{}, e
	}
	if e := m.checkLoc(from); e != "" {
		return refAdm{}, e
	}
	if e := m.checkLoc(to); e != "" {
		return refAdm{}, e
	}
	if e := m.residentAt(v, from); e != "" {
		return refAdm{}, e
	}
	if from == to {
		return refAdm{}, ""
	}
	return m.move(v, from, to)
}

// move: from must be resident (checked by the caller), unprotected and not
// read by a copy in flight.
func (m *refModel) move(v *refValue, from, to string) (refAdm, string) {
	if m.protected(v.id, from) {
		u, h, p := m.counts(v.id, from)
		return refAdm{}, refInUse(v.name, from, u, h, p)
	}
	if m.readers(v.id, from) > 0 {
		return refAdm{}, refUnavailable(v.name, from, UnavailableInFlight)
	}
	if st, ok := v.state[to]; ok {
		if st != Resident {
			return refAdm{}, refUnavailable(v.name, to, UnavailableInFlight)
		}
		delete(v.state, from) // to already resident: only the removal
		m.bump()
		return refAdm{}, ""
	}
	if e := m.admit(to, v.bytes); e != "" {
		return refAdm{}, e
	}
	return m.newXfer(&refXfer{value: v.id, dest: to, from: from, move: true}), ""
}

func (m *refModel) Complete(id int) string {
	x, ok := m.xfers[id]
	if !ok {
		return refInvalid()
	}
	delete(m.xfers, id)
	v := m.value(x.value)
	v.state[x.dest] = Resident
	m.bump()
	if x.move {
		delete(v.state, x.from)
		m.bump()
	}
	return ""
}

func (m *refModel) Fail(id int) string {
	x, ok := m.xfers[id]
	if !ok {
		return refInvalid()
	}
	delete(m.xfers, id)
	v := m.value(x.value)
	delete(v.state, x.dest)
	if x.move {
		v.state[x.from] = Resident
	}
	if x.initialize {
		// The ledger's documented choice: a failed registration retires
		// the handle and frees the name.
		v.discarded = true
		v.stillborn = true
		delete(m.names, v.name)
	}
	m.bump()
	return ""
}

func (m *refModel) Evict(h Handle, loc string) string {
	v, e := m.resolve(h)
	if e != "" {
		return e
	}
	if e := m.checkLoc(loc); e != "" {
		return e
	}
	return m.evict(v, loc)
}

func (m *refModel) evict(v *refValue, loc string) string {
	st, ok := v.state[loc]
	if !ok {
		return refUnavailable(v.name, loc, UnavailableEndpoint)
	}
	if st != Resident {
		return refUnavailable(v.name, loc, UnavailableInFlight)
	}
	if m.protected(v.id, loc) {
		u, h, p := m.counts(v.id, loc)
		return refInUse(v.name, loc, u, h, p)
	}
	if m.readers(v.id, loc) > 0 {
		return refUnavailable(v.name, loc, UnavailableInFlight)
	}
	kept := 0 // resident copies and move sources: each keeps the data
	for _, s := range v.state {
		if s == Resident || s == Leaving {
			kept++
		}
	}
	if v.source == "" && kept == 1 {
		return refPlan()
	}
	delete(v.state, loc)
	m.bump()
	return ""
}

func (m *refModel) Discard(h Handle) string {
	v, e := m.resolve(h)
	if e != "" {
		return e
	}
	// Protection first, over every materialization in location order;
	// then the first one in flight (entering, leaving or read by a copy).
	locs := m.matLocs(v)
	for _, loc := range locs {
		if m.protected(v.id, loc) {
			u, hd, p := m.counts(v.id, loc)
			return refInUse(v.name, loc, u, hd, p)
		}
	}
	for _, loc := range locs {
		if v.state[loc] != Resident || m.readers(v.id, loc) > 0 {
			return refUnavailable(v.name, loc, UnavailableInFlight)
		}
	}
	for _, loc := range locs {
		delete(v.state, loc)
		m.bump()
	}
	v.discarded = true
	delete(m.names, v.name) // the name is free for a new registration
	m.bump()
	return ""
}

func (m *refModel) Acquire(h Handle, loc string) (int, string) {
	v, e := m.resolve(h)
	if e != "" {
		return 0, e
	}
	if e := m.checkLoc(loc); e != "" {
		return 0, e
	}
	if e := m.residentAt(v, loc); e != "" {
		return 0, e
	}
	m.nextID++
	m.leases[m.nextID] = refEndpoint{v.id, loc}
	m.bump()
	return m.nextID, ""
}

func (m *refModel) Release(id int) string {
	if _, ok := m.leases[id]; !ok {
		return refInvalid()
	}
	delete(m.leases, id)
	m.bump()
	return ""
}

func (m *refModel) RecordEvent(lease int) (int, string) {
	e, ok := m.leases[lease]
	if !ok {
		return 0, refInvalid()
	}
	m.nextID++
	m.events[m.nextID] = e
	m.bump()
	return m.nextID, ""
}

func (m *refModel) ReapEvent(id int) string {
	if _, ok := m.events[id]; !ok {
		return refInvalid()
	}
	delete(m.events, id)
	m.bump()
	return ""
}

func (m *refModel) Hold(h Handle, loc string) (int, string) {
	v, e := m.resolve(h)
	if e != "" {
		return 0, e
	}
	if e := m.checkLoc(loc); e != "" {
		return 0, e
	}
	if e := m.residentAt(v, loc); e != "" {
		return 0, e
	}
	m.nextID++
	m.holds[m.nextID] = refEndpoint{v.id, loc}
	m.bump()
	return m.nextID, ""
}

func (m *refModel) Unhold(id int) string {
	if _, ok := m.holds[id]; !ok {
		return refInvalid()
	}
	delete(m.holds, id)
	m.bump()
	return ""
}

func (m *refModel) findResv(name string) int {
	for i, r := range m.resv {
		if r.name == name {
			return i
		}
	}
	return -1
}

func (m *refModel) Reserve(loc, name string, bytes int64, owner string) string {
	if name == "" || m.findResv(name) >= 0 || bytes <= 0 {
		return refInvalid()
	}
	if e := m.checkLoc(loc); e != "" {
		return e
	}
	if e := m.admit(loc, bytes); e != "" {
		return e
	}
	m.resv = append(m.resv, refResv{name: name, loc: loc, bytes: bytes, owner: owner})
	m.bump()
	return ""
}

func (m *refModel) Unreserve(name, owner string) string {
	i := m.findResv(name)
	if i < 0 || m.resv[i].owner != owner {
		return refInvalid()
	}
	m.resv = append(m.resv[:i], m.resv[i+1:]...)
	m.bump()
	return ""
}

// ---- observable state ----------------------------------------------------------

// State renders everything the comparison looks at, in one string per line.
func (m *refModel) State() []string {
	out := []string{fmt.Sprintf("version %d", m.version)}
	for _, l := range m.locs {
		var temp int64
		for _, x := range m.xfers {
			if x.temp == l.name {
				temp += m.value(x.value).bytes
			}
		}
		line := fmt.Sprintf("loc %s budget=%v/%d used=%d reserved=%d peak=%d temp=%d", l.name, l.hasBudget, l.budget, m.used(l.name), m.reserved(l.name), m.peak[l.name], temp)
		for _, r := range m.resv {
			if r.loc == l.name {
				line += fmt.Sprintf(" [%s %d %q]", r.name, r.bytes, r.owner)
			}
		}
		out = append(out, line)
	}
	out = append(out, m.sharedState()...)
	for _, v := range m.values {
		if v.stillborn || v.discarded { // snapshots list live values only
			continue
		}
		mode := "exclusive"
		if v.replicable {
			mode = "replicable"
		}
		recoverable := !v.discarded && v.source != ""
		for _, s := range v.state {
			if s == Resident && !v.discarded {
				recoverable = true
			}
		}
		line := fmt.Sprintf("value %d %s %d %s source=%q recoverable=%v", v.id, v.name, v.bytes, mode, v.source, recoverable)
		for _, loc := range m.matLocs(v) {
			u, h, p := m.counts(v.id, loc)
			line += fmt.Sprintf(" (%s %s %d %d/%d/%d)", loc, v.state[loc], v.bytes, u, h, p)
		}
		out = append(out, line)
	}
	return out
}

// ledgerState renders a ledger snapshot in the same form as State.
func ledgerState(s Snapshot) []string {
	out := []string{fmt.Sprintf("version %d", s.StateVersion)}
	for _, l := range s.Locations {
		line := fmt.Sprintf("loc %s budget=%v/%d used=%d reserved=%d peak=%d temp=%d", l.Location, l.HasBudget, l.BudgetBytes, l.UsedBytes, l.ReservedBytes, l.PeakBytes, l.TemporaryBytes)
		for _, r := range l.Reservations {
			line += fmt.Sprintf(" [%s %d %q]", r.Name, r.Bytes, r.Owner)
		}
		out = append(out, line)
	}
	out = append(out, ledgerSharedState(s)...)
	for _, v := range s.Values {
		line := fmt.Sprintf("value %d %s %d %s source=%q recoverable=%v", v.Handle.ID, v.Handle.Name, v.Bytes, v.ReplicaMode, v.SourceLocation, v.Recoverable)
		for _, m := range v.Materializations {
			line += fmt.Sprintf(" (%s %s %d %d/%d/%d)", m.Location, m.State, m.ChargedBytes, m.UseCount, m.HoldCount, m.PendingEventCount)
		}
		out = append(out, line)
	}
	return out
}
