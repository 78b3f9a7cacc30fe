package budget

// valueTable holds the live values: those registered and not retired (a
// registration in flight included). A retired value (discarded, or whose
// registration failed) leaves nothing behind: its id is at or below the
// high-water mark and absent from the table, which is all it takes to
// answer "discarded" for it forever (ids are never reused).
//
// Lookups by id go through a map; registration order (snapshots,
// shutdown) through order, a slice in id order whose retired entries are
// nil until a compaction removes them. Compaction runs when the holes
// outnumber the live entries, so the table's size stays within a constant
// factor of the live count, whatever the number of values ever retired.
type valueTable struct {
	byID  map[uint64]*value
	order []*value // id order; nil = retired, awaiting compaction
	recs  recArray // the snapshot record of every slot of order
	holes int
	maxID uint64 // the highest id ever issued
	// peak is the most entries byID held since it was made: a Go map
	// keeps the buckets it grew to, so a compaction makes a fresh one once
	// the live count has fallen well below that.
	peak int
}

func newValueTable() valueTable { return valueTable{byID: map[uint64]*value{}} }

// nextID returns the id of the next registration (not yet issued).
func (t *valueTable) nextID() uint64 { return t.maxID + 1 }

func (t *valueTable) add(v *value) {
	t.maxID = v.id
	v.slot = len(t.order)
	t.order = append(t.order, v)
	t.recs.push(nil) // the record comes with the next freeze
	t.byID[v.id] = v
	t.peak = max(t.peak, len(t.byID))
}

func (t *valueTable) get(id uint64) *value { return t.byID[id] }

// retire removes v from the table.
func (t *valueTable) retire(v *value) {
	if t.byID[v.id] != v {
		return
	}
	delete(t.byID, v.id)
	t.order[v.slot] = nil
	t.recs.set(v.slot, nil)
	t.holes++
	if t.holes > 64 && t.holes > len(t.byID) {
		t.compact()
	}
}

func (t *valueTable) compact() {
	live := make([]*value, 0, len(t.byID)+len(t.byID)/4+8)
	for _, v := range t.order {
		if v != nil {
			v.slot = len(live)
			live = append(live, v)
		}
	}
	t.order, t.holes = live, 0
	recs := recArray{gen: t.recs.gen}
	for _, v := range live {
		recs.push(v.rec) // an out-of-date one is replaced at the next freeze, by slot
	}
	t.recs = recs
	if len(live) < t.peak/4 {
		m := make(map[uint64]*value, len(live))
		for _, v := range live {
			m[v.id] = v
		}
		t.byID, t.peak = m, len(live)
	}
}

// len returns the number of live values.
func (t *valueTable) len() int { return len(t.byID) }

// each calls f for every live value in registration order.
func (t *valueTable) each(f func(v *value)) {
	for _, v := range t.order {
		if v != nil {
			f(v)
		}
	}
}

// valueByID returns the live value with id, or nil.
func (l *Ledger) valueByID(id uint64) *value { return l.vals.get(id) }

// liveValues returns the live values in registration order.
func (l *Ledger) liveValues() []*value {
	out := make([]*value, 0, l.vals.len())
	l.vals.each(func(v *value) { out = append(out, v) })
	return out
}

// LiveValues returns the number of live values (registered and not
// retired, registrations in flight included). A read: no version.
func (l *Ledger) LiveValues() int { return l.vals.len() }
