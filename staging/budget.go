package staging

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/budget"
)

// errSelfFlushed: a reserve's flush took the task the bytes were for.
var errSelfFlushed = errors.New("staging: the budget flushed the appending task itself")

// errAskAgain: clone bytes of the pipeline's came back since the ledger's
// refusal, whose figures counted them: the reserve asks again.
var errAskAgain = errors.New("staging: clone bytes came back since the refusal")

// ticket is one reservation of GPU bytes for one device clone (or of host
// bytes for one landing buffer): a named reservation on the runtime's
// location, released exactly once.
type ticket struct {
	name     string
	seq      uint64 // the n of its name: the order the reservations were made in
	bytes    int64
	gpu      bool // a device clone: a reservation in the group of the pipeline's cap
	released atomic.Bool
}

// gpuBudget is the GPU-byte budget of device clones. Every clone is a named
// reservation on the runtime's device location made in the group of the
// pipeline's cap, "<Name>/clones" of Config.CloneBudgetBytes, in the
// runtime's ledger (Runtime.ReserveCapped): the ledger alone admits or
// refuses a clone, within the cap and within the location's budget, and
// its refusal says which and by how much (*budget.CapError,
// *budget.BudgetError). What lives here is the orchestration around it:
// the queue of waiting reserves and their wake-ups, the flushes of
// deferred tasks a refusal calls for, failure, and counts of the
// pipeline's own tickets (the bytes the ledger granted it and has not been
// given back, their peak, the releases) for its figures and to know whom
// a release may satisfy. Safe for concurrent use.
type gpuBudget struct {
	rt       Runtime
	loc      string
	prefix   string
	capName  string
	capBytes int64
	// flush escalates the oldest deferred task (budget pressure) and
	// returns it; false when no deferred task is left.
	flush func() (TaskID, bool)

	seq atomic.Uint64 // the last clone number handed out

	mu      sync.Mutex
	waiters list.List // of *budgetWaiter: waiting reserves, first in first out
	failure error     // set by fail: reserve returns it
	drops   map[string]int64
	flushes int64
	// held is the bytes of the clone tickets the ledger granted and that
	// are not given back yet; leaving the part of them being given back
	// (the runtime may have released them already). held − leaving is
	// certainly reserved in the ledger, so never above the cap: the
	// figure reported, and peak the most it was when a ticket was
	// granted.
	held, leaving, peak int64
	// inflight is the part of held of clones of tasks that left Pending
	// (submitted, prioritized, flushed): their copy stages will release
	// them without any further flush.
	inflight int64
	// looked, when not nil, is closed (and dropped) once no waiting
	// reserve is awake: see waitLooks.
	looked chan struct{}
	// releases counts the clone tickets given back (to the runtime first,
	// then to these counts). A reserve that the ledger refused compares it
	// with the count it saw before asking: a release in between may have
	// freed bytes that the refusal counted.
	releases uint64
}

// budgetWaiter is one waiting reserve: n bytes, woken through wake (one
// buffered token: a wake that comes while it is looking is not lost).
type budgetWaiter struct {
	n      int64
	wake   chan struct{}
	at     *list.Element // its place in gpuBudget.waiters
	asleep bool          // waiting for a wake (guarded by gpuBudget.mu)
	// starved: its last look left it short with no deferred task to flush
	// (guarded by gpuBudget.mu); a deferred task appearing wakes it.
	starved bool
}

func (w *budgetWaiter) signal() {
	w.asleep = false // the caller holds gpuBudget.mu
	select {
	case w.wake <- struct{}{}:
	default: // a wake is pending already
	}
}

func newGPUBudget(rt Runtime, loc, prefix string, capBytes int64) (*gpuBudget, error) {
	if capBytes < 0 {
		return nil, fmt.Errorf("%w: CloneBudgetBytes must not be negative, got %d", ErrConfig, capBytes)
	}
	return &gpuBudget{rt: rt, loc: loc, prefix: prefix, capName: prefix + "/clones", capBytes: capBytes,
		drops: map[string]int64{}}, nil
}

// ask asks the runtime for a clone's reservation of n bytes in the group of
// the pipeline's cap; the ledger's refusal as it comes. A clone is named by
// the next number unless the cap refused it (nothing took the name): the
// number is handed back when no later one was handed out, so that the
// names count the clones the cap admitted.
func (b *gpuBudget) ask(ctx context.Context, n int64) (*ticket, error) {
	num := b.seq.Add(1)
	t := &ticket{name: fmt.Sprintf("%s/clone/%d", b.prefix, num), seq: num, bytes: n, gpu: true}
	err := b.rt.ReserveCapped(ctx, b.loc, t.name, b.capName, b.capBytes, n)
	if err != nil {
		var ce *budget.CapError
		if errors.As(err, &ce) {
			b.seq.CompareAndSwap(num, num-1)
		}
		return nil, err
	}
	b.mu.Lock()
	b.held += n
	b.peak = max(b.peak, b.held-b.leaving)
	b.mu.Unlock()
	return t, nil
}

// refusal returns the reason for which the ledger refused a clone (a drop's
// reason), or "" when err is no refusal of the ledger's.
func refusal(err error) string {
	var ce *budget.CapError
	var be *budget.BudgetError
	switch {
	case errors.As(err, &ce):
		return DropBudget
	case errors.As(err, &be):
		return DropLocation
	}
	return ""
}

// signalLocked wakes the waiting reserves that the cap's room, as the
// pipeline's own tickets leave it, can satisfy, in their order of arrival,
// stopping at the first that does not fit; if none fits and front is set
// (bytes were released, or a deferred task appeared), the first waiter is
// woken all the same, to ask again and flush once more. Waking only those,
// not every waiter, keeps the cost of a release independent of how many
// reserves wait; a woken reserve asks the ledger, which decides. b.mu must
// be held.
func (b *gpuBudget) signalLocked(front bool) {
	first := b.waiters.Front()
	if first == nil {
		return
	}
	room := budget.CapRoom(b.capBytes, b.held)
	woken := 0
	for e := first; e != nil; e = e.Next() {
		w := e.Value.(*budgetWaiter)
		if w.n > room {
			break
		}
		room -= w.n
		w.signal()
		woken++
	}
	if woken == 0 && front {
		first.Value.(*budgetWaiter).signal()
	}
}

// poke wakes the first waiting reserve, to ask again and flush, when its
// last look found nothing to flush (a deferred task appeared that a flush
// could take). One whose shortfall is covered by bytes on their way out
// sleeps on: a new task would not be flushed for it.
func (b *gpuBudget) poke() {
	b.mu.Lock()
	if first := b.waiters.Front(); first != nil && first.Value.(*budgetWaiter).starved {
		first.Value.(*budgetWaiter).signal()
	}
	b.mu.Unlock()
}

// addInflight counts n more (or, negative, fewer) bytes on their way out.
func (b *gpuBudget) addInflight(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.inflight += n
	b.mu.Unlock()
}

// aheadLocked is the bytes the reserves queued before w wait for.
func (b *gpuBudget) aheadLocked(w *budgetWaiter) int64 {
	var n int64
	for e := b.waiters.Front(); e != nil && e != w.at; e = e.Next() {
		n = addSat(n, e.Value.(*budgetWaiter).n)
	}
	return n
}

// fail makes every waiting and later reserve return err.
func (b *gpuBudget) fail(err error) {
	b.mu.Lock()
	if b.failure == nil {
		b.failure = err
	}
	for e := b.waiters.Front(); e != nil; e = e.Next() {
		e.Value.(*budgetWaiter).signal()
	}
	b.mu.Unlock()
}

// reserve takes n bytes of the budget. With wait, a refusal flushes
// deferred tasks, oldest enqueue time first, and waits for their releases,
// until the ledger grants the bytes, ctx ends, or nothing of the
// pipeline's is left to free (then the location's *budget.BudgetError; see
// makeRoomLocked):
//
//   - the cap refused (*budget.CapError): flush just enough deferred tasks
//     that the bytes on their way out (clones of tasks already queued,
//     flushed or submitted) cover the shortfall the refusal names and what
//     the reserves queued before this one wait for; a look that finds them
//     covered flushes nothing;
//   - the location refused (*budget.BudgetError; its budget is shared with
//     others, whose bytes the pipeline cannot see): flush one task when
//     none is on its way out, and sleep until a release of the pipeline's
//     own.
//
// A refusal after which clone bytes of the pipeline's came back (released
// between the runtime's answer and this look: the refusal may have counted
// them) decides nothing: the reserve asks again at once. The number of
// flushes therefore depends on the tasks and their sizes, not on when the
// copies happen to finish. Waiting reserves queue first in first out: a
// new one asks nothing while others wait (it flushes for the cap's room as
// the pipeline's own tickets leave it), and a release wakes only the
// waiters that room can satisfy (or the first, to ask again). Without wait
// (try-reserve) a refusal fails at once with a *DropError, counted by
// reason (DropBudget for the cap, DropLocation for the location); a
// try-reserve does not queue, and asks even while reserves wait. A clone
// larger than the whole cap is ErrConfig at once, waiting or not.
//
// self is the task the bytes are for: when a flush takes that very task, the
// reserve stops with errSelfFlushed (the task left Pending: it can no longer
// take the chunk once its copy stage runs, which is what brings the bytes
// back).
func (b *gpuBudget) reserve(ctx context.Context, n int64, wait bool, self TaskID) (*ticket, error) {
	if n <= 0 || n > b.capBytes {
		return nil, fmt.Errorf("%w: a device clone of %d bytes exceeds the whole GPU-byte budget (%d)", ErrConfig, n, b.capBytes)
	}
	var w *budgetWaiter // our place in the queue, once we waited
	defer func() {
		if w != nil {
			b.mu.Lock()
			b.waiters.Remove(w.at)
			b.signalLocked(false) // bytes we were woken for and did not take
			b.lookedLocked()
			b.mu.Unlock()
		}
	}()
	for {
		b.mu.Lock()
		if b.failure != nil {
			err := b.failure
			b.mu.Unlock()
			return nil, err
		}
		var refused error
		var seen uint64
		// A new waiting reserve goes behind those already queued; a queued
		// one asks when woken.
		if !wait || w != nil || b.waiters.Len() == 0 {
			seen = b.releases
			b.mu.Unlock()
			t, err := b.ask(ctx, n)
			if err == nil {
				return t, nil
			}
			reason := refusal(err)
			if reason == "" {
				return nil, err
			}
			b.mu.Lock()
			if !wait {
				b.drops[reason]++
				b.mu.Unlock()
				drop := &DropError{Reason: reason, Requested: n}
				if reason == DropLocation {
					drop.Err = err
				}
				return nil, drop
			}
			if b.releases != seen {
				// Bytes of ours came back since the runtime was asked;
				// the refusal may have counted them: ask again.
				b.mu.Unlock()
				continue
			}
			refused = err
		}
		if w == nil {
			w = &budgetWaiter{n: n, wake: make(chan struct{}, 1)}
			w.at = b.waiters.PushBack(w)
		}
		err := b.makeRoomLocked(w, n, self, refused, seen)
		if errors.Is(err, errAskAgain) {
			continue
		}
		if err != nil {
			return nil, err
		}
		b.mu.Lock()
		if b.failure != nil {
			// fail ran while this reserve asked, before it was among the
			// waiters fail wakes: nothing will wake it, so look here.
			err := b.failure
			b.mu.Unlock()
			return nil, err
		}
		w.asleep = len(w.wake) == 0 // a signal clears it, under b.mu
		b.lookedLocked()
		b.mu.Unlock()
		select {
		case <-w.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// makeRoomLocked flushes deferred tasks for the waiting reserve w of n
// bytes (self: the appending task), after the ledger's refusal refused
// (nil: w is new behind other waiters and asked nothing), seen being the
// releases counted before it asked. Called with b.mu held, and, after a
// refusal, with no clone bytes released since the runtime was asked
// (reserve asks again otherwise); returns with it released.
// errSelfFlushed: a flush took self; errAskAgain: clone bytes came back
// while it flushed for a refusal of the cap; refused (the location's):
// nothing of the pipeline holds bytes or could be flushed, and nothing
// held when the runtime answered has come back since, so the location is
// full of others' bytes.
func (b *gpuBudget) makeRoomLocked(w *budgetWaiter, n int64, self TaskID, refused error, seen uint64) error {
	var be *budget.BudgetError
	if errors.As(refused, &be) {
		return b.makeLocationRoomLocked(w, self, refused)
	}
	var ce *budget.CapError
	errors.As(refused, &ce)
	// The cap is short by what the bytes on their way out do not cover:
	// the refusal's shortfall, or, for a reserve that asked nothing, what
	// the cap lacks as the pipeline's own tickets leave it.
	selfFlushed := false
	w.starved = false
	for !selfFlushed {
		short := budget.CapShortfall(b.capBytes, b.held, n)
		if ce != nil {
			if b.releases != seen {
				b.mu.Unlock()
				return errAskAgain
			}
			short = ce.Shortfall()
		}
		if budget.Uncovered(short, b.aheadLocked(w), b.inflight) == 0 {
			break
		}
		w.starved = true // until the flush says otherwise: a poke meanwhile wakes it
		b.mu.Unlock()
		id, flushed := b.flush()
		b.mu.Lock()
		if !flushed {
			break
		}
		w.starved = false
		b.flushes++
		selfFlushed = id == self
	}
	b.mu.Unlock()
	if selfFlushed {
		return errSelfFlushed
	}
	return nil
}

// makeLocationRoomLocked is makeRoomLocked after the location's refusal:
// it flushes one task if none is on its way out.
func (b *gpuBudget) makeLocationRoomLocked(w *budgetWaiter, self TaskID, refused error) error {
	inflight, held := b.inflight, b.held
	w.starved = inflight == 0 // until the flush says otherwise: a poke meanwhile wakes it
	b.mu.Unlock()
	if inflight != 0 {
		return nil
	}
	if id, ok := b.flush(); ok {
		b.mu.Lock()
		b.flushes++
		w.starved = false
		b.mu.Unlock()
		if id == self {
			return errSelfFlushed
		}
	} else if held == 0 {
		// Nothing of ours holds bytes or could be flushed: the location
		// is full of others' bytes.
		return refused
	}
	return nil
}

// release returns t's bytes: first to the runtime's location (and, for a
// clone, the cap's group), then to the pipeline's counts, waking waiting
// reserves. A second release of a ticket is a bug and returns an error.
func (b *gpuBudget) release(ctx context.Context, t *ticket) error {
	if t.released.Swap(true) {
		return fmt.Errorf("staging: ticket %s released twice", t.name)
	}
	if !t.gpu {
		return b.rt.Unreserve(ctx, t.name)
	}
	b.mu.Lock()
	b.leaving += t.bytes
	b.mu.Unlock()
	err := b.rt.Unreserve(ctx, t.name)
	b.mu.Lock()
	b.releasedLocked(t)
	b.signalLocked(true)
	b.mu.Unlock()
	return err
}

// releasedLocked counts the clone ticket t given back. b.mu must be held.
func (b *gpuBudget) releasedLocked(t *ticket) {
	b.leaving -= t.bytes
	b.held -= t.bytes
	b.releases++
	if b.held < 0 || b.leaving < 0 {
		panic("staging: clone bytes given back that were never granted")
	}
}

// releaseAll returns the bytes of tickets (one task's clones) together,
// inflight of them having been on their way out. It wakes no waiting
// reserve: the task's end does (wakeAll), so that a reserve woken by the
// release of a task it flushed finds that task written or the pipeline's
// failure published, whichever happened, never a race between the two.
func (b *gpuBudget) releaseAll(ctx context.Context, ts []*ticket, inflight int64) error {
	var errs []error
	var held []*ticket
	b.mu.Lock()
	for _, t := range ts {
		if t.released.Swap(true) {
			errs = append(errs, fmt.Errorf("staging: ticket %s released twice", t.name))
			continue
		}
		held = append(held, t)
		if t.gpu {
			b.leaving += t.bytes
		}
	}
	b.mu.Unlock()
	for _, t := range held {
		errs = append(errs, b.rt.Unreserve(ctx, t.name))
	}
	b.mu.Lock()
	for _, t := range held {
		if t.gpu {
			b.releasedLocked(t)
		}
	}
	b.inflight -= inflight
	b.mu.Unlock()
	return errors.Join(errs...)
}

// wakeAll wakes the waiting reserves the free bytes satisfy, or the first
// in line (a task that released clones ended).
func (b *gpuBudget) wakeAll() {
	b.mu.Lock()
	b.signalLocked(true)
	b.mu.Unlock()
}

// lookedLocked closes looked once no waiting reserve is awake. b.mu must
// be held.
func (b *gpuBudget) lookedLocked() {
	if b.looked != nil && b.awakeLocked() == 0 {
		close(b.looked)
		b.looked = nil
	}
}

// awakeLocked counts the waiting reserves that are awake: queued and not
// asleep yet, or woken and looking again. b.mu must be held.
func (b *gpuBudget) awakeLocked() int {
	n := 0
	for e := b.waiters.Front(); e != nil; e = e.Next() {
		if !e.Value.(*budgetWaiter).asleep {
			n++
		}
	}
	return n
}

// waitLooks waits until no waiting reserve is awake (each has taken its
// bytes, given up, or gone back to sleep), or ctx ends. The copy queue of
// a Serial pipeline calls it before each claim: a reserve woken by a
// task's end looks at the budget before the next task's copy stage runs,
// never while it runs.
func (b *gpuBudget) waitLooks(ctx context.Context) {
	for {
		b.mu.Lock()
		if b.awakeLocked() == 0 {
			b.mu.Unlock()
			return
		}
		if b.looked == nil {
			b.looked = make(chan struct{})
		}
		ch := b.looked
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

type budgetState struct {
	used, peak, flushes int64
	drops               map[string]int64
	asleep              int // waiting reserves asleep with no wake on its way
}

func (b *gpuBudget) state() budgetState {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := make(map[string]int64, len(b.drops))
	for k, v := range b.drops {
		d[k] = v
	}
	asleep := 0
	for e := b.waiters.Front(); e != nil; e = e.Next() {
		if e.Value.(*budgetWaiter).asleep {
			asleep++
		}
	}
	return budgetState{used: b.held - b.leaving, peak: b.peak, flushes: b.flushes, drops: d, asleep: asleep}
}

// addSat is a+b for non-negative b, held at math.MaxInt64 instead of
// wrapping (each waiting clone may be as large as the whole cap).
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
