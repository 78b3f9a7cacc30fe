package budget

import (
	"maps"
	"slices"
)

// Snapshot is one atomic, tensor-free copy of the ledger at one version.
// It shares nothing with the ledger.
type Snapshot struct {
	StateVersion uint64
	ManagerID    string
	Locations    []LocationRecord
	Values       []ValueRecord
	// TransitionCounts counts every committed transition since the
	// runtime started, by kind (the trace's kinds: "register", "admit",
	// "complete", "remove", "acquire", …); they add up to StateVersion.
	// RemovalCounts counts the "remove" transitions by kind
	// ([RemovalKind]: evict, reclaim, move source, discard, shutdown).
	// Unlike the trace ring they never forget. nil when nothing was
	// committed.
	TransitionCounts map[string]uint64
	RemovalCounts    map[RemovalKind]uint64
	// Caps are the caps over groups of reservations (capgroups.go), by
	// name; nil when none is set.
	Caps []CapRecord `json:",omitempty"`
	// SharedBudgets are the shared budgets' figures (sharedbudgets.go), by
	// name; nil when none is configured.
	SharedBudgets []SharedBudgetRecord `json:",omitempty"`
}

// LocationRecord is a location's figures.
type LocationRecord struct {
	Location      string
	HasBudget     bool
	BudgetBytes   int64
	UsedBytes     int64
	ReservedBytes int64
	PeakBytes     int64
	// TemporaryBytes is the part of UsedBytes charged by reconstructions in
	// flight (their temporary buffers); the rest is the materializations'.
	TemporaryBytes int64
	Reservations   []ReservationRecord
}

// ReservationRecord is one active named reservation.
type ReservationRecord struct {
	Name  string
	Bytes int64
	Owner string // "" unless owned (by a scope or a cache)
}

// ValueRecord is a value's state.
type ValueRecord struct {
	Handle         Handle
	Bytes          int64
	ReplicaMode    ReplicaMode
	HasSource      bool
	SourceLocation string
	// Discarded is always false: a snapshot lists live values only.
	//
	// Deprecated: kept for source compatibility; discarded values are no
	// longer listed (their discard is in the trace).
	Discarded        bool
	Recoverable      bool
	Materializations []MaterializationRecord
}

// MaterializationRecord is one materialization's state.
type MaterializationRecord struct {
	Location          string
	State             MatState
	ChargedBytes      int64
	UseCount          int
	HoldCount         int
	PendingEventCount int
}

// Location returns the record of name, if configured.
func (s *Snapshot) Location(name string) (LocationRecord, bool) {
	for _, r := range s.Locations {
		if r.Location == name {
			return r, true
		}
	}
	return LocationRecord{}, false
}

// Value returns the record of the value named name: the latest
// registration under that name, which is the live value when there is one
// (a discarded value's name may be registered again).
func (s *Snapshot) Value(name string) (ValueRecord, bool) {
	for i := len(s.Values) - 1; i >= 0; i-- {
		if r := s.Values[i]; r.Handle.Name == name {
			return r, true
		}
	}
	return ValueRecord{}, false
}

// Snapshot returns an atomic copy of the state: every location in location
// order and every live value in registration order, materializations in
// location order. Discarded values are not listed (the trace shows their
// discard), nor is a value whose registration failed (it never existed).
// A read: no version. It is l.Freeze().Snapshot().
func (l *Ledger) Snapshot() Snapshot { return l.Freeze().Snapshot() }

// FrozenSnapshot is one atomic copy of the ledger at one version, taken
// by [Ledger.Freeze] in time independent of the number of values and
// rendered into a [Snapshot] later, by any goroutine, without the ledger:
// the runtime freezes inside its serialized section and renders outside
// it, so a snapshot of a million values does not stall the runtime.
//
// It shares immutable data with the ledger: every live value's record is
// an immutable record, replaced (never changed) when the value changes,
// and the ledger keeps them in chunks that it copies before changing one
// that a frozen snapshot still holds (copy on write).
type FrozenSnapshot struct {
	version   uint64
	manager   string
	locations []LocationRecord
	counts    map[string]uint64
	removals  map[RemovalKind]uint64
	caps      []CapRecord
	shared    []SharedBudgetRecord
	chunks    []*recChunk
	n         int // records in chunks (live values and holes)
	live      int
}

// StateVersion returns the version the snapshot was taken at.
func (f *FrozenSnapshot) StateVersion() uint64 { return f.version }

// Snapshot renders the frozen snapshot: a fresh copy that shares nothing
// with the ledger or with other renderings. Safe for concurrent use.
func (f *FrozenSnapshot) Snapshot() Snapshot {
	s := Snapshot{StateVersion: f.version, ManagerID: f.manager, Locations: make([]LocationRecord, len(f.locations)), Values: make([]ValueRecord, 0, f.live),
		TransitionCounts: maps.Clone(f.counts), RemovalCounts: maps.Clone(f.removals), Caps: cloneCaps(f.caps), SharedBudgets: cloneSharedRecords(f.shared)}
	for i, r := range f.locations {
		r.Reservations = slices.Clone(r.Reservations)
		s.Locations[i] = r
	}
	matCount := 0
	f.each(func(r *ValueRecord) { matCount += len(r.Materializations) })
	mats := make([]MaterializationRecord, 0, matCount)
	f.each(func(r *ValueRecord) {
		v := *r
		if len(r.Materializations) > 0 {
			start := len(mats)
			mats = append(mats, r.Materializations...)
			v.Materializations = mats[start:len(mats):len(mats)]
		}
		s.Values = append(s.Values, v)
	})
	return s
}

func (f *FrozenSnapshot) each(fn func(*ValueRecord)) {
	for i := 0; i < f.n; i++ {
		if r := f.chunks[i/recChunkSize].recs[i%recChunkSize]; r != nil {
			fn(r)
		}
	}
}

// Freeze takes an atomic snapshot of the state without rendering it: the
// locations' records (with their reservations), the records of the values
// changed since the last freeze, and a copy of the list of the record
// chunks (one pointer per 1,024 registrations). Its cost grows with the
// locations, the reservations, the transfers in flight and the values
// changed since the last freeze (at most 1,024: beyond that, mutations
// rebuild the records as they go), not with the values live. A read: no
// version.
func (l *Ledger) Freeze() *FrozenSnapshot {
	f := &FrozenSnapshot{version: l.version, manager: l.id, locations: make([]LocationRecord, len(l.locs)),
		counts: maps.Clone(l.counts), removals: maps.Clone(l.removals), caps: l.capRecords(), shared: l.sharedRecords()}
	for i := range l.locs {
		lc := &l.locs[i]
		r := LocationRecord{Location: lc.name, HasBudget: lc.hasBudget, BudgetBytes: lc.budget, UsedBytes: lc.used, ReservedBytes: lc.reserved, PeakBytes: lc.peak}
		if len(lc.reservations) > 0 {
			r.Reservations = make([]ReservationRecord, len(lc.reservations))
			for j, x := range lc.reservations {
				r.Reservations[j] = ReservationRecord{Name: x.name, Bytes: x.bytes, Owner: x.owner}
			}
		}
		f.locations[i] = r
	}
	for _, x := range l.transfers {
		if x.temp >= 0 {
			f.locations[x.temp].TemporaryBytes += x.v.bytes
		}
	}
	l.flushRecords()
	f.chunks, f.n = l.vals.recs.freeze()
	f.live = l.vals.len()
	return f
}

// touch marks v's record out of date; the next freeze replaces it.
func (l *Ledger) touch(v *value) {
	if l.sim || v.dirty {
		return
	}
	v.dirty = true
	l.dirty = append(l.dirty, v)
	if len(l.dirty) >= maxDirty {
		// Bound the work of the next freeze (the first snapshot after a
		// million registrations must not rebuild a million records inside
		// the supervisor): rebuild them now, 1,024 at a time, amortized
		// over the mutations that changed them.
		l.flushRecords()
	}
}

// maxDirty bounds the records a freeze rebuilds.
const maxDirty = 1024

// flushRecords replaces the record of every value changed since the last
// freeze.
func (l *Ledger) flushRecords() {
	for _, v := range l.dirty {
		if !v.dirty {
			continue
		}
		v.dirty = false
		if v.discarded {
			continue
		}
		v.rec = l.record(v)
		l.vals.recs.set(v.slot, v.rec)
	}
	clear(l.dirty)
	l.dirty, l.dirtyRetired = l.dirty[:0], 0
}

// forgetDirty is called when a value is retired: the list of changed
// values must not keep retired ones alive, so once they are the majority
// it is filtered (amortized O(1) per retirement).
func (l *Ledger) forgetDirty(v *value) {
	if !v.dirty {
		return
	}
	v.dirty = false
	l.dirtyRetired++
	if l.dirtyRetired > 64 && l.dirtyRetired > len(l.dirty)/2 {
		kept := l.dirty[:0]
		for _, x := range l.dirty {
			if x.dirty {
				kept = append(kept, x)
			}
		}
		clear(l.dirty[len(kept):])
		l.dirty, l.dirtyRetired = kept, 0
	}
}

// record builds v's immutable snapshot record.
func (l *Ledger) record(v *value) *ValueRecord {
	r := &ValueRecord{Handle: l.handle(v), Bytes: v.bytes, ReplicaMode: v.mode, HasSource: v.hasSource, Recoverable: l.recoverable(v)}
	if v.hasSource {
		r.SourceLocation = l.locs[v.source].name
	}
	if len(v.mats) > 0 {
		ms := make([]MaterializationRecord, 0, len(v.mats))
		for _, m := range v.mats {
			ms = append(ms, MaterializationRecord{Location: l.locs[m.loc].name, State: m.state, ChargedBytes: v.bytes, UseCount: m.uses, HoldCount: m.holds, PendingEventCount: m.pending})
		}
		if len(ms) > 1 {
			sortMatRecords(ms, l)
		}
		r.Materializations = ms
	}
	return r
}

func sortMatRecords(ms []MaterializationRecord, l *Ledger) {
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && l.locIndex[ms[j].Location] < l.locIndex[ms[j-1].Location]; j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}

// recoverable: the value has a resident materialization or a source.
func (l *Ledger) recoverable(v *value) bool {
	if v.discarded {
		return false
	}
	return v.hasSource || v.residentCount() > 0
}

// ---- the record chunks -------------------------------------------------------

const recChunkSize = 1024

// recChunk holds the records of 1,024 consecutive slots of the value
// table. A chunk whose gen is below its array's gen may be held by a
// frozen snapshot: it is never changed again, only copied.
type recChunk struct {
	gen  uint64
	recs [recChunkSize]*ValueRecord
}

// recArray is the records of the value table's slots, persistent: freeze
// hands out the current chunks and later changes copy a chunk before
// changing it (once per chunk and freeze).
type recArray struct {
	chunks []*recChunk
	n      int
	gen    uint64
}

func (a *recArray) set(i int, r *ValueRecord) {
	chunk := i / recChunkSize
	c := a.chunks[chunk]
	if c.gen != a.gen {
		fresh := *c
		fresh.gen = a.gen
		a.chunks[chunk], c = &fresh, &fresh
	}
	c.recs[i%recChunkSize] = r
}

func (a *recArray) push(r *ValueRecord) {
	if a.n%recChunkSize == 0 {
		a.chunks = append(a.chunks, &recChunk{gen: a.gen})
	}
	a.n++
	a.set(a.n-1, r)
}

func (a *recArray) freeze() ([]*recChunk, int) {
	out := slices.Clone(a.chunks)
	a.gen++
	return out, a.n
}
