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

// ticket is one reservation of GPU bytes for one device clone (or of host
// bytes for one landing buffer): a named reservation on the runtime's
// location, released exactly once.
type ticket struct {
	name     string
	seq      uint64 // the n of its name: the order the reservations were made in
	bytes    int64
	gpu      bool            // a device clone: counts against the GPU-byte budget
	claim    budget.CapClaim // a device clone's claim in the pipeline's cap
	released atomic.Bool
}

// gpuBudget is the GPU-byte budget of device clones. Every ticket is a
// named reservation on the runtime's device location, so clones share that
// location's budget with resident values and show in its snapshot; on top,
// the pipeline's own cap (Config.CloneBudgetBytes) bounds them. The cap's
// arithmetic is a budget.CapBook (admit, hold, release; used, peak); what
// lives here is the concurrency around it: the mutex that serializes the
// book, waiting for releases, flushing deferred tasks, failure. Safe for
// concurrent use.
type gpuBudget struct {
	rt     Runtime
	caps   CapReserver // the runtime's caps, when it keeps them (nil: none)
	loc    string
	prefix string
	// flush escalates the oldest deferred task (budget pressure) and
	// returns it; false when no deferred task is left.
	flush func() (TaskID, bool)

	seq atomic.Uint64

	mu      sync.Mutex
	book    *budget.CapBook
	waiters list.List // of *budgetWaiter: waiting reserves, first in first out
	failure error     // set by fail: reserve returns it
	drops   map[string]int64
	flushes int64
	// inflight is the part of the cap's bytes held by clones of tasks that
	// left Pending (submitted, prioritized, flushed): their copy stages
	// will release them without any further flush.
	inflight int64
	// looked, when not nil, is closed (and dropped) once no waiting
	// reserve is awake: see waitLooks.
	looked chan struct{}
	// releases counts the clone tickets given back (to the runtime first,
	// then to the cap). A reserve that the device location refused
	// compares it with the count it saw before asking: a release in
	// between may have freed bytes that the refusal counted.
	releases uint64
}

// budgetWaiter is one waiting reserve: n bytes, woken through wake (one
// buffered token: a wake that comes while it is looking is not lost).
type budgetWaiter struct {
	n      int64
	wake   chan struct{}
	at     *list.Element // its place in gpuBudget.waiters
	asleep bool          // waiting for a wake (guarded by gpuBudget.mu)
}

func (w *budgetWaiter) signal() {
	w.asleep = false // the caller holds gpuBudget.mu
	select {
	case w.wake <- struct{}{}:
	default: // a wake is pending already
	}
}

func newGPUBudget(rt Runtime, loc, prefix string, capBytes int64) (*gpuBudget, error) {
	book, err := budget.NewCapBook(prefix+"/clones", capBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: CloneBudgetBytes: %v", ErrConfig, err)
	}
	b := &gpuBudget{rt: rt, loc: loc, prefix: prefix, book: book, drops: map[string]int64{}}
	b.caps, _ = rt.(CapReserver)
	return b, nil
}

// CapReserver is what a Runtime offers when its ledger keeps caps over
// groups of reservations (*system.System does). The pipeline's GPU-byte
// budget is then such a cap, "<Name>/clones": the ledger admits each
// clone's reservation within the cap and within the device location's
// budget, in one versioned step, and its snapshot shows the cap while
// clones hold bytes. (The pipeline still counts what it asked for, to
// order its waiting appends and decide its flushes before it asks.)
type CapReserver interface {
	// ReserveCapped is Runtime.Reserve for a reservation in the group of
	// the cap capName of capBytes; a *budget.CapError when the group's
	// bytes plus bytes would exceed the cap.
	ReserveCapped(ctx context.Context, loc, name, capName string, capBytes, bytes int64) error
}

// reserveClone asks the runtime for a clone's reservation: in the group of
// the pipeline's cap when the runtime keeps caps, else a plain one.
func (b *gpuBudget) reserveClone(ctx context.Context, name string, n int64) error {
	if b.caps != nil {
		return b.caps.ReserveCapped(ctx, b.loc, name, b.book.Name(), b.book.Cap(), n)
	}
	return b.rt.Reserve(ctx, b.loc, name, n)
}

// signalLocked wakes the waiting reserves that the cap's free bytes can
// satisfy, in their order of arrival, stopping at the first that does not
// fit; if none fits and front is set (bytes were released, or a deferred
// task appeared), the first waiter is woken all the same, to look again
// and flush once more. Waking only those, not every waiter, keeps the cost
// of a release independent of how many reserves wait. b.mu must be held.
func (b *gpuBudget) signalLocked(front bool) {
	first := b.waiters.Front()
	if first == nil {
		return
	}
	free := b.book.Cap() - b.book.Used()
	woken := 0
	for e := first; e != nil; e = e.Next() {
		w := e.Value.(*budgetWaiter)
		if w.n > free {
			break
		}
		free -= w.n
		w.signal()
		woken++
	}
	if woken == 0 && front {
		first.Value.(*budgetWaiter).signal()
	}
}

// signalBehindLocked wakes, after the location refused the waiting reserve
// w the cap bytes it had been admitted, the waiters behind w that those
// bytes satisfy, as signalLocked(false) would; w itself and those before it
// (they keep their bytes counted) are not woken. w waits for clone bytes of
// the pipeline's own to come back: woken by its own refusal, it would ask
// the runtime again at once, in a loop, until they did; and two refused
// waiters waking each other would do the same. b.mu must be held.
func (b *gpuBudget) signalBehindLocked(w *budgetWaiter) {
	free := b.book.Cap() - b.book.Used()
	behind := false
	for e := b.waiters.Front(); e != nil; e = e.Next() {
		x := e.Value.(*budgetWaiter)
		if x.n > free {
			break
		}
		free -= x.n
		if behind {
			x.signal()
		}
		behind = behind || x == w
	}
}

// poke wakes the first waiting reserves so they look again (a deferred task
// appeared that a flush could take).
func (b *gpuBudget) poke() {
	b.mu.Lock()
	b.signalLocked(true)
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

// reserve takes n bytes of the budget. With wait, a full budget flushes
// deferred tasks, oldest enqueue time first, and waits for their releases,
// until the bytes fit, ctx ends, or nothing of the pipeline's is left to
// free (then the location's *budget.BudgetError; see makeRoomLocked):
//
//   - the pipeline's cap is short: flush just enough deferred tasks that
//     the bytes on their way out (clones of tasks already queued, flushed
//     or submitted) cover what this reserve, and those queued before it,
//     lack; a look that finds them covered flushes nothing;
//   - the location refused (its budget is shared with others, whose bytes
//     the pipeline cannot see): flush one task when none is on its way out,
//     and sleep until a release of the pipeline's own. A refusal after which
//     clone bytes of the pipeline's came back (released between the
//     runtime's answer and this look: the refusal may have counted them)
//     decides nothing: the reserve asks again at once.
//
// The number of flushes therefore depends on the tasks and their sizes,
// not on when the copies happen to finish. Waiting reserves queue first in
// first out: a new one takes no bytes while others wait, and a release
// wakes only the waiters its bytes can satisfy (or the first, to look
// again). Without wait (try-reserve) a full budget fails at once with a
// *DropError, counted by reason; a try-reserve does not queue, and takes
// free bytes even while reserves wait.
//
// The cap admits the bytes before the runtime is asked (so two reserves in
// flight cannot both take the cap's last bytes) and holds them once the
// runtime admitted them too; a runtime refusal gives them back.
//
// self is the task the bytes are for: when a flush takes that very task, the
// reserve stops with errSelfFlushed (the task left Pending: it can no longer
// take the chunk once its copy stage runs, which is what brings the bytes
// back).
func (b *gpuBudget) reserve(ctx context.Context, n int64, wait bool, self TaskID) (*ticket, error) {
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
		if !b.book.Fits(n) {
			capBytes := b.book.Cap()
			b.mu.Unlock()
			return nil, fmt.Errorf("%w: a device clone of %d bytes exceeds the whole GPU-byte budget (%d)", ErrConfig, n, capBytes)
		}
		if b.failure != nil {
			err := b.failure
			b.mu.Unlock()
			return nil, err
		}
		var refused error
		// A new waiting reserve goes behind those already queued; a queued
		// one looks when woken.
		turn := !wait || w != nil || b.waiters.Len() == 0
		if turn && b.book.Admits(n) {
			t := &ticket{gpu: true}
			if err := b.book.Admit(&t.claim, n); err != nil { // a bug: Admits said yes, the claim is unused
				b.mu.Unlock()
				return nil, err
			}
			seen := b.releases
			b.mu.Unlock()
			t.seq = b.seq.Add(1)
			t.name, t.bytes = fmt.Sprintf("%s/clone/%d", b.prefix, t.seq), n
			err := b.reserveClone(ctx, t.name, n)
			b.mu.Lock()
			if err == nil {
				err = b.book.Hold(&t.claim)
				b.mu.Unlock()
				if err != nil { // a bug: the claim was admitted, and only this call has it
					return nil, errors.Join(err, b.rt.Unreserve(context.Background(), t.name))
				}
				return t, nil
			}
			_ = b.book.Release(&t.claim) // admitted, released once: cannot fail
			if w == nil {
				b.signalLocked(false)
			} else {
				b.signalBehindLocked(w)
			}
			var be *budget.BudgetError
			if !errors.As(err, &be) {
				b.mu.Unlock()
				return nil, err
			}
			if !wait {
				b.drops[DropLocation]++
				b.mu.Unlock()
				return nil, &DropError{Reason: DropLocation, Requested: n, Err: err}
			}
			if b.releases != seen {
				// Bytes of ours came back since the runtime was asked;
				// the refusal may have counted them: ask again.
				b.mu.Unlock()
				continue
			}
			refused = err
		} else if !wait {
			b.drops[DropBudget]++
			b.mu.Unlock()
			return nil, &DropError{Reason: DropBudget, Requested: n}
		}
		if w == nil {
			w = &budgetWaiter{n: n, wake: make(chan struct{}, 1)}
			w.at = b.waiters.PushBack(w)
		}
		if err := b.makeRoomLocked(w, n, self, refused); err != nil {
			return nil, err
		}
		b.mu.Lock()
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
// bytes (self: the appending task). When the cap is short (refused nil),
// it flushes, oldest first, until the clones on their way out cover what
// the cap lacks for w and those ahead of it; when the device location
// refused (refused), it flushes one task if none is on its way out.
// Called with b.mu held, and, after a refusal, with no clone bytes released
// since the runtime was asked (reserve asks again otherwise); returns with
// it released. errSelfFlushed: a flush took self; refused: nothing of the
// pipeline holds bytes or could be flushed, and nothing held when the
// runtime answered has come back since, so the location is full of others'
// bytes.
func (b *gpuBudget) makeRoomLocked(w *budgetWaiter, n int64, self TaskID, refused error) error {
	if refused == nil {
		// The cap is short by what the bytes on their way out do not
		// cover.
		selfFlushed := false
		for addSat(addSat(b.book.Used()-b.inflight, b.aheadLocked(w)), n) > b.book.Cap() && !selfFlushed {
			b.mu.Unlock()
			id, flushed := b.flush()
			b.mu.Lock()
			if !flushed {
				break
			}
			b.flushes++
			selfFlushed = id == self
		}
		b.mu.Unlock()
		if selfFlushed {
			return errSelfFlushed
		}
	} else {
		inflight, used := b.inflight, b.book.Used()
		b.mu.Unlock()
		if inflight == 0 {
			if id, ok := b.flush(); ok {
				b.mu.Lock()
				b.flushes++
				b.mu.Unlock()
				if id == self {
					return errSelfFlushed
				}
			} else if used == 0 {
				// Nothing of ours holds bytes or could be flushed: the
				// location is full of others' bytes.
				return refused
			}
		}
	}
	return nil
}

// release returns t's bytes: first to the runtime's location, then to the
// pipeline's cap, waking waiting reserves. A second release of a ticket is a
// bug and returns an error.
func (b *gpuBudget) release(ctx context.Context, t *ticket) error {
	if t.released.Swap(true) {
		return fmt.Errorf("staging: ticket %s released twice", t.name)
	}
	err := b.rt.Unreserve(ctx, t.name)
	if t.gpu {
		b.mu.Lock()
		cerr := b.book.Release(&t.claim)
		b.releases++
		b.signalLocked(true)
		b.mu.Unlock()
		err = errors.Join(err, cerr)
	}
	return err
}

// releaseAll returns the bytes of tickets (one task's clones) together,
// inflight of them having been on their way out. It wakes no waiting
// reserve: the task's end does (wakeAll), so that a reserve woken by the
// release of a task it flushed finds that task written or the pipeline's
// failure published, whichever happened, never a race between the two.
func (b *gpuBudget) releaseAll(ctx context.Context, ts []*ticket, inflight int64) error {
	var errs []error
	var held []*ticket
	for _, t := range ts {
		if t.released.Swap(true) {
			errs = append(errs, fmt.Errorf("staging: ticket %s released twice", t.name))
			continue
		}
		errs = append(errs, b.rt.Unreserve(ctx, t.name))
		held = append(held, t)
	}
	b.mu.Lock()
	for _, t := range held {
		if t.gpu {
			errs = append(errs, b.book.Release(&t.claim))
			b.releases++
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
	return budgetState{used: b.book.Used(), peak: b.book.Peak(), flushes: b.flushes, drops: d, asleep: asleep}
}

// addSat is a+b for non-negative b, held at math.MaxInt64 instead of
// wrapping (each waiting clone may be as large as the whole cap).
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
