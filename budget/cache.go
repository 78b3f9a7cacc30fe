package budget

import (
	"fmt"
	"math"
)

// ---- owned reservations: the ledger side of a loader cache ------------------

// CacheOwnerPrefix starts the owner name of every loader cache's
// reservations (`cache "NAME"`, the name Go-quoted), which tells them
// from a scope's in the ledger's messages.
const CacheOwnerPrefix = "cache "

// ResizeOwned sets the bytes of the active reservation name, which must
// belong to owner ("" for an ordinary reservation), to bytes. Shrinking is
// always admitted; growing is admitted like a new charge of the difference
// (a refusal is a [*BudgetError] whose RequestedBytes is the difference and
// whose other figures are the location's as they were). One version when
// the size changes, none when it is already bytes.
//
// An offered charge stays offered with its priority and last use, at its
// new size.
//
// Errors (nothing changed): invalid input (name not active, another owner,
// bytes ≤ 0: release the reservation instead), [*BudgetError],
// [*ChargeBusyError] (the charge is evicting).
func (l *Ledger) ResizeOwned(name, owner string, bytes int64) error {
	r, ok := l.reservations[name]
	if !ok {
		return invalidf("reservation %q is not active (already released or never made)", name)
	}
	if r.owner != owner {
		return invalidf("reservation %q does not belong to %q", name, owner)
	}
	if bytes <= 0 {
		return invalidf("reservation %q: bytes must be positive, got %d (release it instead)", name, bytes)
	}
	if r.state == ChargeEvicting {
		return l.chargeBusy(r)
	}
	if bytes == r.bytes {
		return nil
	}
	lc := &l.locs[r.loc]
	if delta := bytes - r.bytes; delta > 0 {
		if err := l.admits(r.loc, delta); err != nil {
			return err
		}
	}
	old := r.bytes
	lc.reserved += bytes - old
	l.unofferIndex(r)
	r.bytes = bytes
	r.key.bytes = bytes
	l.offerIndex(r)
	if lc.reserved < 0 {
		panic("budget: reserved bytes went negative")
	}
	if c := lc.used + lc.reserved; c > lc.peak {
		lc.peak = c
	}
	l.notePeak(r.loc)
	l.commit("resize", nil, r.loc, bytes, fmt.Sprintf("%s: %d → %d", name, old, bytes))
	return nil
}

// FreeBytes returns the location's bytes neither used nor reserved
// (math.MaxInt64 less the charges for a location without a budget).
func (c OwnerCharges) FreeBytes() int64 {
	if !c.HasBudget {
		return math.MaxInt64 - c.UsedBytes - c.ReservedBytes
	}
	return c.BudgetBytes - c.UsedBytes - c.ReservedBytes
}

// AccountingOverflow is the refusal of requested more bytes at the
// location loc, which has no budget, when its used and reserved bytes are
// those: invalid input when the sum would overflow the location's byte
// accounting (int64), nil otherwise. The ledger refuses every charge at
// such a location by this rule; an owner whose request the controller
// refused reports the same (not a busy budget: there is none).
func AccountingOverflow(loc string, used, reserved, requested int64) error {
	if requested > math.MaxInt64-used-reserved {
		return invalidf("%d more bytes at %s would overflow its byte accounting (used %d + reserved %d)", requested, loc, used, reserved)
	}
	return nil
}

// OwnerCharges is what one owner's reservations charge at one location,
// beside the location's own figures (a read: no version).
type OwnerCharges struct {
	Location      string
	HasBudget     bool
	BudgetBytes   int64
	UsedBytes     int64 // the location's, every owner's
	ReservedBytes int64 // the location's, every owner's
	// OwnedBytes and OwnedReservations count the active reservations of
	// the owner at the location.
	OwnedBytes        int64
	OwnedReservations int
	// Shared names the shared budget the location is a member of ("":
	// none); SharedBytes is its figure and SharedUsedBytes its charged
	// bytes (used+reserved over its members).
	Shared          string
	SharedBytes     int64
	SharedUsedBytes int64
}

// TooLarge returns the refusal of a charge of bytes at c's location that
// can never be admitted, however much room is made: more than the
// location's budget, or more than the figure of its shared budget. nil
// when bytes may fit once room is made (or nothing bounds them). The
// error carries c's figures.
func (c OwnerCharges) TooLarge(bytes int64) *BudgetError {
	switch {
	case c.HasBudget && bytes > c.BudgetBytes:
		return c.refusal(bytes, false)
	case c.Shared != "" && bytes > c.SharedBytes:
		return c.refusal(bytes, true)
	}
	return nil
}

// Short returns the refusal of bytes more at c's location with c's
// figures: nil when they fit both the location's budget (if any) and its
// shared budget's figure (if any). The location's budget is checked
// first, as the ledger does.
func (c OwnerCharges) Short(bytes int64) *BudgetError {
	switch {
	case c.HasBudget && (bytes > c.BudgetBytes || c.UsedBytes+c.ReservedBytes > c.BudgetBytes-bytes):
		return c.refusal(bytes, false)
	case c.Shared != "" && (bytes > c.SharedBytes || c.SharedUsedBytes > c.SharedBytes-bytes):
		return c.refusal(bytes, true)
	}
	return nil
}

// Refusal is TooLarge and Short over reservations admitted together (a
// split load's parts), each location with its figures in at: the first
// part that can never fit, or the parts at the members of one shared
// budget whose sum is above its figure (never true: waiting cannot help);
// else the first part short of room now, or the first shared budget
// short of the parts' sum now. nil: every part fits now. A location
// missing from at bounds nothing.
func Refusal(specs []ReservationSpec, at map[string]OwnerCharges) (be *BudgetError, never bool) {
	sums := map[string]int64{}
	for _, s := range specs {
		c := at[s.Location]
		if be := c.TooLarge(s.Bytes); be != nil {
			return be, true
		}
		if c.Shared != "" {
			sums[c.Shared] = addSat(sums[c.Shared], s.Bytes)
		}
	}
	for _, s := range specs {
		c := at[s.Location]
		if c.Shared != "" && sums[c.Shared] > c.SharedBytes {
			return c.sharedRefusal(s.Bytes, sums[c.Shared]), true
		}
	}
	for _, s := range specs {
		c := at[s.Location]
		if be := c.Short(s.Bytes); be != nil {
			return be, false
		}
		if c.Shared != "" && c.SharedUsedBytes > c.SharedBytes-sums[c.Shared] {
			return c.sharedRefusal(s.Bytes, sums[c.Shared]), false
		}
	}
	return nil, false
}

// sharedRefusal is the shared budget's refusal of bytes at c's location,
// with together bytes asked of the group.
func (c OwnerCharges) sharedRefusal(bytes, together int64) *BudgetError {
	e := c.refusal(bytes, true)
	e.SharedRequestedBytes = together
	return e
}

func (c OwnerCharges) refusal(bytes int64, shared bool) *BudgetError {
	e := &BudgetError{Location: c.Location, BudgetBytes: c.BudgetBytes, UsedBytes: c.UsedBytes, ReservedBytes: c.ReservedBytes, RequestedBytes: bytes}
	if shared {
		e.Shared, e.SharedBytes, e.SharedUsedBytes, e.SharedRequestedBytes = c.Shared, c.SharedBytes, c.SharedUsedBytes, bytes
	}
	return e
}

// NeverFits reports whether a charge that would hold total bytes can
// never be admitted where e refused: above the shared budget's figure
// when a shared budget refused, above the location's budget otherwise.
func (e *BudgetError) NeverFits(total int64) bool {
	if e.Shared != "" {
		return total > e.SharedBytes
	}
	return total > e.BudgetBytes
}

// OwnerCharges returns the figures of loc and what owner's active
// reservations charge there. Errors: a malformed location (invalid
// input), an unconfigured one ([*UnavailableError]), an empty owner
// (invalid input).
func (l *Ledger) OwnerCharges(loc, owner string) (OwnerCharges, error) {
	if owner == "" {
		return OwnerCharges{}, invalidf("reservation owner is empty")
	}
	i, err := l.location(loc)
	if err != nil {
		return OwnerCharges{}, err
	}
	lc := &l.locs[i]
	out := OwnerCharges{Location: lc.name, HasBudget: lc.hasBudget, BudgetBytes: lc.budget, UsedBytes: lc.used, ReservedBytes: lc.reserved}
	if g := l.sharedOf(i); g != nil {
		out.Shared, out.SharedBytes, out.SharedUsedBytes = g.name, g.bytes, l.sharedCharged(g)
	}
	for _, r := range lc.reservations {
		if r.owner == owner {
			out.OwnedBytes += r.bytes
			out.OwnedReservations++
		}
	}
	return out, nil
}

// ---- the cache's book: entries, recency and victims -------------------------

// CacheState is the state of a key in a [CacheBook].
type CacheState int

const (
	// CacheAbsent: the key has no entry.
	CacheAbsent CacheState = iota
	// CacheLoading: a load of the key is in flight.
	CacheLoading
	// CacheReady: the key is resident.
	CacheReady
)

func (s CacheState) String() string {
	switch s {
	case CacheLoading:
		return "loading"
	case CacheReady:
		return "ready"
	default:
		return "absent"
	}
}

// CacheBook is the bookkeeping of a loader cache: which keys are loading,
// which are ready, in which order the ready ones were last used, and how
// many were evicted. It holds one item of the caller's type per key (the
// runtime keeps its entry there) and knows nothing about bytes, values or
// goroutines: whether an entry may be evicted is the caller's answer,
// asked through the evictable function at the moment a victim is chosen.
//
// Like the ledger it is pure and not safe for concurrent use; every method
// is O(1) except [CacheBook.Victim], which walks the ready entries from the
// least recently used one until one is evictable.
type CacheBook[E any] struct {
	entries   map[string]*cacheSlot[E]
	head      *cacheSlot[E] // least recently used ready entry
	tail      *cacheSlot[E] // most recently used ready entry
	ready     int
	evictions uint64
	expiry    expiryBook[E] // keep-alive expiries and due entries (cache_expiry.go)
}

type cacheSlot[E any] struct {
	book       *CacheBook[E] // the book it belongs to (a handle from another book is refused)
	key        string
	item       E
	state      CacheState
	prev, next *cacheSlot[E]
	keep       slotKeep // keep-alive and evict-when-idle (cache_expiry.go)
}

// NewCacheBook returns an empty book.
func NewCacheBook[E any]() *CacheBook[E] {
	return &CacheBook[E]{entries: map[string]*cacheSlot[E]{}}
}

// Get returns key's item and state. A ready entry becomes the most
// recently used one.
func (b *CacheBook[E]) Get(key string) (E, CacheState) {
	s, ok := b.entries[key]
	if !ok {
		var zero E
		return zero, CacheAbsent
	}
	if s.state == CacheReady {
		b.unlink(s)
		b.pushBack(s)
	}
	return s.item, s.state
}

// CacheSlot is a handle on one entry of a [CacheBook]: a caller that
// keeps it beside its item steps the entry on ([CacheBook.UseSlot],
// [CacheBook.IdleSlot]) without a lookup by key. It refers to that one
// entry, not to its key: once the entry leaves the book (evicted,
// drained, expired, its load aborted) the handle is absent, also when the
// key has a new entry since. The zero handle is absent. Like the book, a
// handle is read and used under the lock that guards its book.
type CacheSlot[E any] struct{ s *cacheSlot[E] }

// State returns the state of the handle's entry: [CacheAbsent] once it
// left the book (or for the zero handle).
func (h CacheSlot[E]) State() CacheState {
	if h.s == nil {
		return CacheAbsent
	}
	return h.s.state
}

// GetSlot is [CacheBook.Get] that also returns the entry's handle (the
// zero handle for an absent key).
func (b *CacheBook[E]) GetSlot(key string) (E, CacheState, CacheSlot[E]) {
	s, ok := b.entries[key]
	if !ok {
		var zero E
		return zero, CacheAbsent, CacheSlot[E]{}
	}
	if s.state == CacheReady {
		b.unlink(s)
		b.pushBack(s)
	}
	return s.item, s.state, CacheSlot[E]{s}
}

// slotOf returns h's entry if it is in this book and in state st; nil
// otherwise.
func (b *CacheBook[E]) slotOf(h CacheSlot[E], st CacheState) *cacheSlot[E] {
	if h.s == nil || h.s.book != b || h.s.state != st {
		return nil
	}
	return h.s
}

// Peek is Get without touching the recency order.
func (b *CacheBook[E]) Peek(key string) (E, CacheState) {
	s, ok := b.entries[key]
	if !ok {
		var zero E
		return zero, CacheAbsent
	}
	return s.item, s.state
}

// StartLoad records that a load of key is in flight, with its item.
// Errors (nothing changed): the key already has an entry (invalid input).
func (b *CacheBook[E]) StartLoad(key string, item E) error {
	_, err := b.StartLoadSlot(key, item)
	return err
}

// StartLoadSlot is [CacheBook.StartLoad] that also returns the new
// entry's handle ([CacheSlot]), valid through its load and while it is
// ready.
func (b *CacheBook[E]) StartLoadSlot(key string, item E) (CacheSlot[E], error) {
	if s, ok := b.entries[key]; ok {
		return CacheSlot[E]{}, invalidf("cache key %q is already %s", key, s.state)
	}
	s := &cacheSlot[E]{book: b, key: key, item: item, state: CacheLoading, keep: newSlotKeep()}
	b.entries[key] = s
	return CacheSlot[E]{s}, nil
}

// FinishLoad makes the loading entry of key ready with item, as the most
// recently used entry. Errors (nothing changed): key is not loading.
func (b *CacheBook[E]) FinishLoad(key string, item E) error {
	s, ok := b.entries[key]
	if !ok || s.state != CacheLoading {
		return invalidf("cache key %q is not loading", key)
	}
	s.item, s.state = item, CacheReady
	b.pushBack(s)
	b.ready++
	return nil
}

// AbortLoad removes the loading entry of key (its load failed). Errors
// (nothing changed): key is not loading.
func (b *CacheBook[E]) AbortLoad(key string) error {
	s, ok := b.entries[key]
	if !ok || s.state != CacheLoading {
		return invalidf("cache key %q is not loading", key)
	}
	delete(b.entries, key)
	s.state = CacheAbsent // its handles are absent from now
	return nil
}

// Victim removes and returns the least recently used ready entry for which
// evictable returns true, and counts an eviction. Loading entries are never
// victims. None: ok is false and nothing changed.
func (b *CacheBook[E]) Victim(evictable func(E) bool) (key string, item E, ok bool) {
	for s := b.head; s != nil; s = s.next {
		if evictable(s.item) {
			b.remove(s)
			b.evictions++
			return s.key, s.item, true
		}
	}
	return "", item, false
}

// CacheEvictOutcome is the outcome of [CacheBook.Evict].
type CacheEvictOutcome int

const (
	// EvictAbsent: no entry; nothing changed.
	EvictAbsent CacheEvictOutcome = iota
	// EvictBusy: loading, or ready but not evictable; nothing changed.
	EvictBusy
	// Evicted: the entry was removed and the eviction counted.
	Evicted
)

// Evict removes key's ready entry if evictable says it may go, and counts
// an eviction.
func (b *CacheBook[E]) Evict(key string, evictable func(E) bool) (E, CacheEvictOutcome) {
	s, ok := b.entries[key]
	if !ok {
		var zero E
		return zero, EvictAbsent
	}
	if s.state != CacheReady || !evictable(s.item) {
		return s.item, EvictBusy
	}
	b.remove(s)
	b.evictions++
	return s.item, Evicted
}

// Drain removes every ready entry, least recently used first, and returns
// their items. Loading entries stay (their loads settle them). Not counted
// as evictions.
func (b *CacheBook[E]) Drain() []E {
	out := make([]E, 0, b.ready)
	for b.head != nil {
		s := b.head
		b.remove(s)
		out = append(out, s.item)
	}
	return out
}

// Len returns the number of entries, ready and loading.
func (b *CacheBook[E]) Len() int { return len(b.entries) }

// Ready returns the number of ready entries.
func (b *CacheBook[E]) Ready() int { return b.ready }

// Evictions returns the number of entries removed by Victim, Evict, Due
// or MakeCapRoom.
func (b *CacheBook[E]) Evictions() uint64 { return b.evictions }

// Order returns the keys of the ready entries, least recently used first.
func (b *CacheBook[E]) Order() []string {
	out := make([]string, 0, b.ready)
	for s := b.head; s != nil; s = s.next {
		out = append(out, s.key)
	}
	return out
}

func (b *CacheBook[E]) remove(s *cacheSlot[E]) {
	b.expiry.forget(s)
	b.unlink(s)
	delete(b.entries, s.key)
	s.state = CacheAbsent // its handles are absent from now
	b.ready--
}

func (b *CacheBook[E]) unlink(s *cacheSlot[E]) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		b.head = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		b.tail = s.prev
	}
	s.prev, s.next = nil, nil
}

func (b *CacheBook[E]) pushBack(s *cacheSlot[E]) {
	s.prev, s.next = b.tail, nil
	if b.tail != nil {
		b.tail.next = s
	} else {
		b.head = s
	}
	b.tail = s
}
