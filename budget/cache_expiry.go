package budget

import (
	"container/heap"
	"slices"
	"strings"
	"time"
)

// ---- the cache's book: keep-alive, evict-when-idle and the entry cap --------
//
// The decisions only: the book is told the time (it never reads a clock)
// and whether an entry is held (it never counts leases). The runtime calls
// Use when an entry's first holder takes it, Idle when its last holder
// lets go, Due on every cache operation and when the earliest expiry
// (NextExpiry) comes, and MakeCapRoom before a load of a new key.

// CacheKeepForever is the keep-alive of an entry that never expires: it
// stays until it is evicted for room, on request or by the cache's Close.
// Any negative keep-alive means the same. A new entry of the book keeps
// it until SetKeepAlive says otherwise.
const CacheKeepForever time.Duration = -1

// LongerKeepAlive returns the longer of two keep-alives; a negative one
// (keep forever) is the longest, 0 (unload when idle) the shortest.
func LongerKeepAlive(a, b time.Duration) time.Duration {
	if a < 0 || b < 0 {
		return CacheKeepForever
	}
	return max(a, b)
}

// CacheDueReason says why an entry became due.
type CacheDueReason int

const (
	// DueExpired: its keep-alive ran out (0: it went idle).
	DueExpired CacheDueReason = iota + 1
	// DueEvictWhenIdle: it was marked to go once idle ([CacheBook.MarkEvictWhenIdle]).
	DueEvictWhenIdle
)

func (r CacheDueReason) String() string {
	switch r {
	case DueExpired:
		return "keep-alive expired"
	case DueEvictWhenIdle:
		return "evict when idle"
	}
	return "not due"
}

// CacheDue is an entry that [CacheBook.Due] removed.
type CacheDue[E any] struct {
	Key    string
	Item   E
	Reason CacheDueReason
}

// slotKeep is a ready or loading entry's keep-alive state.
type slotKeep struct {
	keepAlive time.Duration // < 0 forever, 0 unload when idle
	lastUse   time.Time
	idle      bool      // no holder since lastUse (Idle called, Use not since)
	expiry    time.Time // lastUse + keepAlive, while idle with keepAlive > 0
	heapIdx   int       // index in the expiry heap; -1 when not in it
	due       bool      // in the due list
	marked    bool      // evict when idle
}

func newSlotKeep() slotKeep { return slotKeep{keepAlive: CacheKeepForever, heapIdx: -1} }

// expiryBook holds the idle entries with a finite keep-alive by expiry
// (a heap) and the entries that are due but were not evictable when last
// asked (the due list, in the order they became due).
type expiryBook[E any] struct {
	heap        slotHeap[E]
	due         []*cacheSlot[E]
	expirations uint64
}

type slotHeap[E any] []*cacheSlot[E]

func (h slotHeap[E]) Len() int { return len(h) }
func (h slotHeap[E]) Less(i, j int) bool {
	a, b := h[i].keep.expiry, h[j].keep.expiry
	if a.Equal(b) {
		return h[i].key < h[j].key // deterministic among equal expiries
	}
	return a.Before(b)
}
func (h slotHeap[E]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].keep.heapIdx, h[j].keep.heapIdx = i, j
}
func (h *slotHeap[E]) Push(x any) {
	s := x.(*cacheSlot[E])
	s.keep.heapIdx = len(*h)
	*h = append(*h, s)
}
func (h *slotHeap[E]) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	s.keep.heapIdx = -1
	return s
}

// forget takes s out of the heap and the due list (it leaves the book or
// gets a holder).
func (x *expiryBook[E]) forget(s *cacheSlot[E]) {
	if s.keep.heapIdx >= 0 {
		heap.Remove(&x.heap, s.keep.heapIdx)
	}
	if s.keep.due {
		s.keep.due = false
		x.due = slices.DeleteFunc(x.due, func(d *cacheSlot[E]) bool { return d == s })
	}
}

func (x *expiryBook[E]) makeDue(s *cacheSlot[E]) {
	if s.keep.heapIdx >= 0 {
		heap.Remove(&x.heap, s.keep.heapIdx)
	}
	if !s.keep.due {
		s.keep.due = true
		x.due = append(x.due, s)
	}
}

// arm schedules an idle entry: due now (marked, or keep-alive 0), at its
// expiry (keep-alive > 0), or never (keep forever).
func (x *expiryBook[E]) arm(s *cacheSlot[E]) {
	k := &s.keep
	switch {
	case !k.idle || s.state != CacheReady:
	case k.marked || k.keepAlive == 0:
		x.makeDue(s)
	case k.keepAlive > 0:
		k.expiry = k.lastUse.Add(k.keepAlive)
		if k.heapIdx >= 0 {
			heap.Fix(&x.heap, k.heapIdx)
		} else {
			heap.Push(&x.heap, s)
		}
	}
}

// SetKeepAlive sets key's keep-alive (negative: keep forever; 0: unload
// when idle). An idle entry's expiry follows at once (from its last use).
// Errors (nothing changed): the key has no entry (invalid input).
func (b *CacheBook[E]) SetKeepAlive(key string, d time.Duration) error {
	s, ok := b.entries[key]
	if !ok {
		return invalidf("cache key %q has no entry", key)
	}
	if d < 0 {
		d = CacheKeepForever
	}
	b.expiry.forget(s)
	s.keep.keepAlive = d
	b.expiry.arm(s)
	return nil
}

// ExtendKeepAlive sets key's keep-alive to the longer of its own and d
// ([LongerKeepAlive]): a request can extend an entry's life, never
// shorten it. Errors as SetKeepAlive.
func (b *CacheBook[E]) ExtendKeepAlive(key string, d time.Duration) error {
	s, ok := b.entries[key]
	if !ok {
		return invalidf("cache key %q has no entry", key)
	}
	return b.SetKeepAlive(key, LongerKeepAlive(s.keep.keepAlive, d))
}

// Use records that a ready entry was taken by its first holder at now:
// its last use is now and it does not expire while held. Errors (nothing
// changed): key is not ready (invalid input).
func (b *CacheBook[E]) Use(key string, now time.Time) error {
	s, ok := b.entries[key]
	if !ok || s.state != CacheReady {
		return invalidf("cache key %q is not ready", key)
	}
	b.use(s, now)
	return nil
}

// UseSlot is [CacheBook.Use] of the handle's entry. Errors (nothing
// changed): the entry is not ready in this book (invalid input).
func (b *CacheBook[E]) UseSlot(h CacheSlot[E], now time.Time) error {
	s := b.slotOf(h, CacheReady)
	if s == nil {
		return invalidf("cache slot is not a ready entry of this book")
	}
	b.use(s, now)
	return nil
}

func (b *CacheBook[E]) use(s *cacheSlot[E], now time.Time) {
	if s.keep.heapIdx >= 0 || s.keep.due {
		b.expiry.forget(s)
	}
	s.keep.lastUse, s.keep.idle = now, false
}

// Idle records that a ready entry's last holder let go at now: its
// keep-alive counts from now, and an entry marked evict-when-idle (or
// with keep-alive 0) is due at once. Errors (nothing changed): key is not
// ready (invalid input).
func (b *CacheBook[E]) Idle(key string, now time.Time) error {
	s, ok := b.entries[key]
	if !ok || s.state != CacheReady {
		return invalidf("cache key %q is not ready", key)
	}
	b.idle(s, now)
	return nil
}

// IdleSlot is [CacheBook.Idle] of the handle's entry. Errors (nothing
// changed): the entry is not ready in this book (invalid input).
func (b *CacheBook[E]) IdleSlot(h CacheSlot[E], now time.Time) error {
	s := b.slotOf(h, CacheReady)
	if s == nil {
		return invalidf("cache slot is not a ready entry of this book")
	}
	b.idle(s, now)
	return nil
}

func (b *CacheBook[E]) idle(s *cacheSlot[E], now time.Time) {
	b.expiry.forget(s)
	s.keep.lastUse, s.keep.idle = now, true
	b.expiry.arm(s)
}

// MarkEvictWhenIdle marks key's entry, ready or loading, to leave as soon
// as it is idle: an idle ready entry is due at once. It returns the key's
// state (absent: nothing marked).
func (b *CacheBook[E]) MarkEvictWhenIdle(key string) CacheState {
	s, ok := b.entries[key]
	if !ok {
		return CacheAbsent
	}
	s.keep.marked = true
	b.expiry.arm(s)
	return s.state
}

// Due moves the entries whose expiry is at or before now to the due list,
// then removes and returns every due entry that evictable allows, in the
// order they became due, counting each as an eviction (and an expiration
// when its keep-alive ran out). A due entry evictable refuses (its idle
// predicate says busy) stays due and is asked again at the next call.
func (b *CacheBook[E]) Due(now time.Time, evictable func(E) bool) []CacheDue[E] {
	x := &b.expiry
	for x.heap.Len() > 0 && !x.heap[0].keep.expiry.After(now) {
		x.makeDue(x.heap[0])
	}
	var out []CacheDue[E]
	for _, s := range slices.Clone(x.due) {
		if !evictable(s.item) {
			continue
		}
		reason := DueExpired
		if s.keep.marked {
			reason = DueEvictWhenIdle
		} else {
			x.expirations++
		}
		b.remove(s)
		b.evictions++
		out = append(out, CacheDue[E]{Key: s.key, Item: s.item, Reason: reason})
	}
	return out
}

// NextExpiry returns the earliest expiry of an idle entry with a finite
// keep-alive that is not due yet (ok false: none). Entries already due
// are not included: they are asked again at the next Due call, not at a
// time.
func (b *CacheBook[E]) NextExpiry() (at time.Time, ok bool) {
	if b.expiry.heap.Len() == 0 {
		return time.Time{}, false
	}
	return b.expiry.heap[0].keep.expiry, true
}

// Expirations returns the number of entries removed by Due because their
// keep-alive ran out (also counted in Evictions).
func (b *CacheBook[E]) Expirations() uint64 { return b.expiry.expirations }

// CacheCapOutcome is the outcome of [CacheBook.MakeCapRoom].
type CacheCapOutcome int

const (
	// CapFits: a new entry fits under the cap (or there is none); nothing changed.
	CapFits CacheCapOutcome = iota
	// CapEvicted: the book was full; its least recently used evictable
	// entry was removed and counted as an eviction.
	CapEvicted
	// CapFull: the book is full and nothing is evictable; nothing changed.
	CapFull
)

// MakeCapRoom decides whether one more entry fits under a cap of
// maxEntries (≤ 0: no cap), counting the book's entries (ready and
// loading) plus pending ones the caller is about to add. If not, it
// evicts the least recently used evictable ready entry (as Victim).
func (b *CacheBook[E]) MakeCapRoom(maxEntries, pending int, evictable func(E) bool) (key string, item E, out CacheCapOutcome) {
	if maxEntries <= 0 || len(b.entries)+pending < maxEntries {
		return "", item, CapFits
	}
	key, item, ok := b.Victim(evictable)
	if !ok {
		return "", item, CapFull
	}
	return key, item, CapEvicted
}

// CacheBookEntry describes one entry of the book ([CacheBook.Entries]).
type CacheBookEntry[E any] struct {
	Key   string
	Item  E
	State CacheState
	// KeepAlive is the entry's keep-alive (negative: forever).
	KeepAlive time.Duration
	// LastUse is when its first holder last took it or its last holder
	// last let go (zero: never, as while it loads).
	LastUse time.Time
	// Idle: no holder since LastUse.
	Idle bool
	// Expiry is when an idle entry with a finite keep-alive leaves (zero
	// while held, loading, or kept forever). Due: it is past (or it is
	// marked, or its keep-alive is 0) and it waits for its idle
	// predicate.
	Expiry time.Time
	Due    bool
	// EvictWhenIdle: marked to leave once idle.
	EvictWhenIdle bool
}

// Entries returns every entry, ready and loading, ordered by key.
func (b *CacheBook[E]) Entries() []CacheBookEntry[E] {
	out := make([]CacheBookEntry[E], 0, len(b.entries))
	for _, s := range b.entries {
		k := s.keep
		e := CacheBookEntry[E]{Key: s.key, Item: s.item, State: s.state, KeepAlive: k.keepAlive,
			LastUse: k.lastUse, Idle: k.idle && s.state == CacheReady, Due: k.due, EvictWhenIdle: k.marked}
		if e.Idle && k.keepAlive > 0 {
			e.Expiry = k.expiry
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b CacheBookEntry[E]) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// EvictAll removes every ready entry that evictable allows, least
// recently used first, counting each as an eviction, and returns their
// items. Loading entries stay.
func (b *CacheBook[E]) EvictAll(evictable func(E) bool) []E {
	var out []E
	for s := b.head; s != nil; {
		next := s.next
		if evictable(s.item) {
			b.remove(s)
			b.evictions++
			out = append(out, s.item)
		}
		s = next
	}
	return out
}
