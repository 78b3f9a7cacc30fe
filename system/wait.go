package system

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/residency-go/residency/budget"
)

// Waiting for room: the goroutine plumbing around budget.WaitQueue (the
// pure ordering rule). Each waiting caller blocks on its own turn
// channel; a turn is given to an eligible waiter when room may have been
// made since its last try (the ledger committed a removal, an unreserve or
// a released protection — the supervisor calls OnRoom — or a cache lease
// was released). Nothing polls: with no such event, nobody is tried again.

// WaitOption makes [System.Admit] or a cache's load (package
// system/cache, through its Wait option) wait for room
// instead of refusing at once. Options combine; any of them turns waiting
// on. See docs/semantics.md, "Waiting for room".
type WaitOption func(*WaitConfig)

// WaitConfig is what wait options set: whether to wait for room, in
// which priority class, and whether later waiters may bypass the caller.
// An owner of charges ([Owners]) applies a call's options to one itself
// and builds its budget.WaitSpec from the result.
type WaitConfig struct {
	Wait   bool
	Class  int
	Bypass bool
	// Notify (nil: none) is told each time the caller is queued or a try
	// of it is refused while it waits.
	Notify func(budget.WaitState)
}

// WaitForRoom makes the call wait until it can be admitted, its context
// ends, or the runtime closes, in priority class 0.
func WaitForRoom() WaitOption { return func(c *WaitConfig) { c.Wait = true } }

// WaitClass makes the call wait in priority class class: waiters of
// higher classes are tried first. Implies [WaitForRoom].
func WaitClass(class int) WaitOption {
	return func(c *WaitConfig) { c.Wait, c.Class = true, class }
}

// WaitAllowBypass makes the call wait, letting later waiters at its
// locations be admitted ahead of it while it does not fit (it may then
// wait longer). Without it, a waiter holds up every later waiter of its
// class, and of lower classes, that needs room at one of its locations.
// Implies [WaitForRoom].
func WaitAllowBypass() WaitOption {
	return func(c *WaitConfig) { c.Wait, c.Bypass = true, true }
}

// WaitState tells a waiting caller that it is queued and why: its
// place, the waiters holding it up, and the location and bytes its last
// try was short of ([WaitNotify]).
type WaitState = budget.WaitState

// WaitNotify makes the call wait, as [WaitForRoom], and calls notify on
// the caller's goroutine each time it is queued — after a refused first
// try, or at once when earlier waiters hold it up — and after each try
// that is refused while it waits, with its position, the waiters ahead
// of it, where it is short and by how much, and its class. Keep notify
// quick; it must not wait for the call itself. Options combine: with
// [WaitClass] it waits in that class.
func WaitNotify(notify func(WaitState)) WaitOption {
	return func(c *WaitConfig) { c.Wait, c.Notify = true, notify }
}

func waitConfigOf(opts []WaitOption) WaitConfig {
	var c WaitConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// waitRoom is a runtime's queue of callers waiting for room.
type waitRoom struct {
	// epoch counts the events that may have made room (signal).
	epoch atomic.Uint64
	// queued counts the waiters: a signal kicks the dispatcher only then.
	queued atomic.Int64
	kick   chan struct{} // capacity 1: the dispatcher has work

	mu      sync.Mutex
	q       *budget.WaitQueue
	ws      map[budget.WaitID]*waiter
	closed  bool
	done    chan struct{} // closed by close: wakes every waiter
	started bool          // the dispatcher goroutine runs
	stopped chan struct{} // closed when the dispatcher has returned
	scratch []budget.WaitID
	// departs counts the waiters that left the queue (guarded by mu).
	departs uint64
	// budgets of the budgeted locations (fixed for the runtime's life),
	// for refusing at once what can never fit.
	budgets map[string]int64
	// onChange, when set (tests), runs under mu after every change of the
	// queue or of a waiter.
	onChange func()
	// events receives wait_started and wait_ended (nil: none); now is the
	// clock of a waiter's Since and waited time.
	events *eventLog
	now    func() time.Time
	// changed is closed at the next change of the queue (AwaitWaiters);
	// nil until someone waits for one.
	changed chan struct{}
}

// waiter is one waiting caller.
type waiter struct {
	turn   chan struct{} // capacity 1: try now
	spec   budget.WaitSpec
	trying bool      // it has a turn it has not finished
	tried  bool      // it has had a turn
	epoch  uint64    // the epoch when it got its last turn
	since  time.Time // when it was queued
	tries  int       // the turns it has been given
	// held: its last try was refused for room a waiter ahead of it held
	// (a *WaitersAheadError), so a waiter leaving the queue after that
	// try began (departs) gives it another turn, room made or not.
	held    bool
	departs uint64
}

func newWaitRoom(max int, locs []LocationConfig, shared []SharedBudget) (*waitRoom, error) {
	q, err := budget.NewWaitQueue(max)
	if err != nil {
		return nil, err
	}
	q.ShareBudgets(shared) // checked by the ledger, which Start creates next
	budgets := map[string]int64{}
	for _, l := range locs {
		if l.HasBudget {
			budgets[l.Name] = l.BudgetBytes
		}
	}
	return &waitRoom{q: q, ws: map[budget.WaitID]*waiter{}, kick: make(chan struct{}, 1),
		done: make(chan struct{}), stopped: make(chan struct{}), budgets: budgets, now: time.Now}, nil
}

// signal records that room may have been made. It never blocks: the
// supervisor calls it on the goroutine running its step (often the
// releasing caller's). It hands out the turns itself when the room's lock
// is free, and leaves them to the dispatcher goroutine otherwise.
func (r *waitRoom) signal() {
	r.epoch.Add(1)
	if r.queued.Load() == 0 {
		return
	}
	if r.mu.TryLock() {
		if !r.closed {
			r.dispatchLocked()
		}
		r.mu.Unlock()
		return
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run is the dispatcher: it hands out turns after signals.
func (r *waitRoom) run() {
	defer close(r.stopped)
	for {
		select {
		case <-r.kick:
			r.mu.Lock()
			r.dispatchLocked()
			r.mu.Unlock()
		case <-r.done:
			return
		}
	}
}

// dispatchLocked gives a turn to every eligible waiter that is not trying
// and has not been tried since the last signal (r.mu held).
func (r *waitRoom) dispatchLocked() {
	ep := r.epoch.Load()
	r.scratch = r.q.Eligible(r.scratch[:0])
	for _, id := range r.scratch {
		w := r.ws[id]
		if w.trying || (w.tried && w.epoch >= ep && !(w.held && r.departs > w.departs)) {
			continue
		}
		w.trying, w.tried, w.epoch, w.departs = true, true, ep, r.departs
		w.tries++
		w.turn <- struct{}{}
	}
	r.changedLocked()
}

func (r *waitRoom) changedLocked() {
	if r.onChange != nil {
		r.onChange()
	}
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// heldRoom is budget.WaitQueue.HeldAhead under the room's lock: the
// room the waiters ahead of a call hold, which it must not take (the
// supervisor runs calls that do not wait, class 0 and id 0, and the
// tries of waiting calls under budget.Ledger.WithHeld with it). Nil,
// without the lock, while nobody waits.
func (r *waitRoom) heldRoom(class int, id budget.WaitID) map[string]int {
	if r.queued.Load() == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.q.HeldAhead(id, class)
}

// ahead is budget.WaitQueue.Ahead under the room's lock: how many
// waiters hold up a new call described by spec.
func (r *waitRoom) ahead(spec budget.WaitSpec) int {
	if r.queued.Load() == 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.q.Ahead(spec)
}

// wait tries the caller described by spec at once — unless waiters
// ahead of it (its class or higher, at one of its locations, not
// allowing bypass) hold it up and heldTry is false: a try that respects
// the room they hold (heldTry: the runtime runs it under
// budget.Ledger.WithHeld) may still be made, to check the call and
// admit it elsewhere — and queues it only after that try is refused, or
// when it was held up. It then calls try on each of its turns until try
// reports done (admitted, or refused for a reason that waiting cannot
// change), ctx ends or the room closes. try is given the caller's id in
// the queue (0 before it is queued). A full queue refuses at once with a [*QueueFullError]
// (errors.Is [ErrBusy]): a call that fits at once never gets it.
// notify (nil: none) is told when the caller is queued and after each
// refused turn. Whatever happens, the caller leaves the queue before
// wait returns.
func (r *waitRoom) wait(ctx context.Context, spec budget.WaitSpec, notify func(WaitState), heldTry bool, try func(id budget.WaitID) (done bool, err error)) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	held := r.q.Ahead(spec) > 0
	departs := r.departs
	r.mu.Unlock()
	ep := r.epoch.Load() // room made after this gives a queued caller a turn
	var refusal error
	tried := !held || heldTry
	if tried {
		done, err := try(0)
		if done {
			return err
		}
		refusal = err
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	id, err := r.q.Push(spec)
	if err != nil {
		n := r.q.Len()
		r.mu.Unlock()
		r.events.waitEnded(spec, err, 0, 0, n)
		return err
	}
	w := &waiter{turn: make(chan struct{}, 1), spec: spec, since: r.now(), tried: tried, epoch: ep, held: heldRefusal(refusal), departs: departs}
	if tried {
		w.tries = 1 // its try before it was queued
	}
	r.ws[id] = w
	r.queued.Add(1)
	n := r.q.Len()
	if !r.started {
		r.started = true
		go r.run()
	}
	r.dispatchLocked()
	r.mu.Unlock()
	r.events.waitStarted(spec, n)
	r.notify(notify, id, spec, refusal)
	for {
		select {
		case <-w.turn:
		case <-ctx.Done():
			return r.leave(id, w, ctx.Err())
		case <-r.done:
			return r.leave(id, w, ErrClosed)
		}
		done, err := try(id)
		if done {
			return r.leave(id, w, err)
		}
		r.mu.Lock()
		w.trying, w.held = false, heldRefusal(err)
		r.dispatchLocked() // a signal, or a departure it waited for, during the try gives it another turn
		r.mu.Unlock()
		r.notify(notify, id, spec, err)
	}
}

// heldRefusal says whether a try was refused for room that waiters ahead
// of it hold (it may be admitted once one of them leaves the queue).
func heldRefusal(err error) bool {
	var wa *WaitersAheadError
	return errors.As(err, &wa)
}

// notify tells a queued caller where it stands (nil notify: nothing).
func (r *waitRoom) notify(notify func(WaitState), id budget.WaitID, spec budget.WaitSpec, refusal error) {
	if notify == nil {
		return
	}
	r.mu.Lock()
	pos, _ := r.q.Position(id)
	ahead := r.q.Holding(id)
	r.mu.Unlock()
	st := WaitState{Name: spec.Name, Class: spec.Class, Locations: slices.Clone(spec.Locations), Position: pos, Ahead: ahead, Refusal: refusal}
	st.Location, st.Shortfall = shortOf(refusal)
	notify(st)
}

// shortOf is where a refusal was short of room and by how many bytes,
// by its figures ("" and 0: none known).
func shortOf(err error) (string, int64) {
	var be *BudgetError
	var cb *CacheBusyError
	var pe *PlanError
	switch {
	case errors.As(err, &cb):
		return cb.Refusal.Short()
	case errors.As(err, &be):
		return be.Short()
	case errors.As(err, &pe):
		return pe.Location, pe.Shortfall
	}
	return "", 0
}

// leave removes a waiter, gives turns to those it held up, writes its
// wait_ended event (err: how its wait ended) and returns err.
func (r *waitRoom) leave(id budget.WaitID, w *waiter, err error) error {
	r.mu.Lock()
	if r.q.Remove(id) {
		delete(r.ws, id)
		r.queued.Add(-1)
		r.departs++
	}
	if !r.closed {
		r.dispatchLocked()
	}
	tries, n := w.tries, r.q.Len()
	r.mu.Unlock()
	r.events.waitEnded(w.spec, err, r.now().Sub(w.since), tries, n)
	return err
}

// WaiterInfo describes one caller waiting for room ([System.Waiters]).
type WaiterInfo struct {
	// Name is the request's name (Admit) or the cache key (Load).
	Name string
	// Class is its priority class ([WaitClass]; 0 by default).
	Class int
	// Locations are where it needs room.
	Locations []string
	// AllowBypass: later waiters at its locations may be admitted ahead of
	// it ([WaitAllowBypass]).
	AllowBypass bool
	// Since is when it was queued.
	Since time.Time
	// Tries counts the turns it has been given: each is one try to admit
	// it, made when room may have been made.
	Tries int
	// Eligible: no waiter ahead of it holds it up, so it is tried whenever
	// room may have been made.
	Eligible bool
}

// Waiters returns the callers waiting for room (Admit and a cache's Load
// with a [WaitOption]) in queue order: higher classes first, first in
// first out within a class. It is a copy taken under the queue's lock:
// it sends nothing to the runtime, changes nothing and never blocks on a
// waiter. Empty when nobody waits, and after Close.
func (s *System) Waiters() []WaiterInfo { return s.room.waiters() }

// AwaitWaiters waits until cond holds over the callers waiting for room
// ([System.Waiters]) and returns that list: cond is called with the list
// now and again after each change of the queue (a caller queued, tried
// or gone), never in a loop of its own. It returns ctx.Err() if ctx ends
// first, and the list with [ErrClosed] if the runtime closes first (the
// queue is then empty for good). cond runs on the caller's goroutine,
// outside every lock.
func (s *System) AwaitWaiters(ctx context.Context, cond func([]WaiterInfo) bool) ([]WaiterInfo, error) {
	r := s.room
	for {
		r.mu.Lock()
		ws := r.waitersLocked()
		closed := r.closed
		if r.changed == nil && !closed {
			r.changed = make(chan struct{})
		}
		ch := r.changed
		r.mu.Unlock()
		if cond(ws) {
			return ws, nil
		}
		if closed {
			return ws, ErrClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (r *waitRoom) waiters() []WaiterInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waitersLocked()
}

func (r *waitRoom) waitersLocked() []WaiterInfo {
	ids := make([]budget.WaitID, 0, len(r.ws))
	for id := range r.ws {
		ids = append(ids, id)
	}
	// The queue's order (budget.WaitQueue.Push): class descending, then
	// arrival, which is the order of the ids it hands out.
	slices.SortFunc(ids, func(a, b budget.WaitID) int {
		if c := cmp.Compare(r.ws[b].spec.Class, r.ws[a].spec.Class); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	eligible := r.q.Eligible(nil)
	out := make([]WaiterInfo, len(ids))
	for i, id := range ids {
		w := r.ws[id]
		out[i] = WaiterInfo{Name: w.spec.Name, Class: w.spec.Class, Locations: slices.Clone(w.spec.Locations),
			AllowBypass: w.spec.AllowBypass, Since: w.since, Tries: w.tries, Eligible: slices.Contains(eligible, id)}
	}
	return out
}

// close wakes every waiter (they return ErrClosed) and stops the
// dispatcher. Idempotent.
func (r *waitRoom) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.done)
	started := r.started
	r.changedLocked()
	r.mu.Unlock()
	if started {
		<-r.stopped
	}
}

// roomWaitable says whether a refusal may turn into an admission once room
// is made: the controller found no plan, a budget was short, or something
// was in use or in flight, or a cache refused to drop an entry that
// became busy since its offer. Anything else (invalid input, an unknown
// location, a failed entry, the search limit, a closed runtime) is final.
func roomWaitable(err error) bool {
	var pe *PlanError
	var be *BudgetError
	var xe *PlanExecutionError
	var qf *budget.QueueFullError
	var cb *budget.ChargeBusyError
	switch {
	case errors.As(err, &cb), errors.As(err, &xe) && xe.FailedAction != nil && xe.FailedAction.Charge != "":
		// An owner refused to drop an idle entry that became busy since
		// its offer, or the entry left its cache by another way before
		// its step (the run failed, nothing admitted): decide again.
		return true
	case errors.As(err, &xe) && (errors.As(xe.Cause, &be) || errors.Is(xe.Cause, ErrBusy)):
		// The run paused for a demotion's copy, and meanwhile another
		// call took the room its drops had freed (or protected what it
		// was to evict): nothing of the request was admitted, its victims
		// stay evicted; decide again.
		return true
	case err == nil, errors.As(err, &xe), errors.As(err, &qf), errors.Is(err, ErrClosed):
		return false
	case errors.As(err, &pe), errors.As(err, &be), errors.Is(err, ErrBusy):
		return true
	}
	return false
}

// cannotFit refuses a request that no amount of waiting can admit
// (budget.CannotFit); the values it requires are sized from one snapshot.
func (s *System) cannotFit(ctx context.Context, req Request) error {
	sizes := map[uint64]int64{}
	if len(req.Requirements) > 0 {
		if snap, err := s.Snapshot(ctx); err == nil {
			for _, v := range snap.Values {
				sizes[v.Handle.ID] = v.Bytes
			}
		}
	}
	size := func(h Handle) (int64, bool) {
		n, ok := sizes[h.ID]
		return n, ok
	}
	if err := budget.CannotFit(req, s.room.budgets, size); err != nil {
		return err
	}
	return budget.CannotFitShared(req, s.shared, size)
}
