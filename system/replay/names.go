package replay

// A replay's memory follows what is alive in the runtime, not the length
// of the script. The Runner keeps a script name while what it names is
// alive (a registered value, a lease or hold not released, an event not
// completed, a scope entered and not exited, a decision the state has not
// moved past). Once finished, a name is still remembered for a while, so
// that a later op naming it gets the precise answer ("value was
// discarded", "already released", "a scope is single-use"), but only the
// most recent finished names are: beyond maxFinishedNames of them (or
// maxFinishedBytes of their names), the oldest is forgotten and reads as a
// name never bound. The runtime's ids of finished leases, holds and events
// are kept as long as the trace may still show them.

// maxFinishedNames bounds how many finished names a replay remembers.
const maxFinishedNames = 4096

// maxFinishedBytes bounds the bytes of the finished names (and of the
// plans of stale decisions) a replay remembers.
const maxFinishedBytes = 4 << 20

// minIDWindow is the fewest finished lease, hold and event ids whose
// script names are kept (for messages), whatever the trace's capacity.
const minIDWindow = 1024

// finished is one finished name: forget drops it from its map unless the
// name was bound anew since.
type finished struct {
	weight int
	forget func()
}

// finishedNames is a FIFO of finished names, bounded in count and weight.
type finishedNames struct {
	maxCount, maxWeight int
	queue               []finished
	head                int // queue[head:] are remembered
	weight              int
}

func (f *finishedNames) add(weight int, forget func()) {
	f.queue = append(f.queue, finished{weight: weight, forget: forget})
	f.weight += weight
	for len(f.queue)-f.head > f.maxCount || (f.weight > f.maxWeight && len(f.queue)-f.head > 0) {
		e := f.queue[f.head]
		f.queue[f.head] = finished{}
		f.head++
		f.weight -= e.weight
		e.forget()
	}
	if f.head > 64 && f.head*2 >= len(f.queue) {
		// Compact: the live part moves to the front, so the backing array
		// stays about twice the live count.
		n := copy(f.queue, f.queue[f.head:])
		clear(f.queue[n:])
		f.queue, f.head = f.queue[:n], 0
	}
}

// finishedIDs is a FIFO of the runtime ids of finished leases, holds and
// events (and scopes): their script names are dropped once window later
// ones finished. Each finish commits at least one transition, so an id
// dropped then is older than anything a trace of window entries holds.
type finishedIDs struct {
	window int
	queue  []func()
	head   int
}

func (f *finishedIDs) add(forget func()) {
	f.queue = append(f.queue, forget)
	for len(f.queue)-f.head > f.window {
		fn := f.queue[f.head]
		f.queue[f.head] = nil
		f.head++
		fn()
	}
	if f.head > 64 && f.head*2 >= len(f.queue) {
		n := copy(f.queue, f.queue[f.head:])
		clear(f.queue[n:])
		f.queue, f.head = f.queue[:n], 0
	}
}

// finishHandle remembers that the value named name (handle h) was
// discarded.
func (r *Runner) finishHandle(name string, id uint64) {
	r.done.add(len(name), func() {
		if h, ok := r.handles[name]; ok && uint64(h.ID) == id {
			delete(r.handles, name)
		}
	})
}

// finishLease remembers that lease name was released; its id's script
// name follows once its events are completed too.
func (r *Runner) finishLease(name string, e *leaseEntry) {
	r.done.add(len(name), func() {
		if r.leases[name] == e {
			delete(r.leases, name)
		}
	})
	if e.pending == 0 {
		r.finishLeaseID(uint64(e.lease.ID()))
	}
}

func (r *Runner) finishLeaseID(id uint64) {
	r.doneIDs.add(func() { delete(r.leaseNames, id) })
}

func (r *Runner) finishHold(name string, e *holdEntry) {
	r.done.add(len(name), func() {
		if r.holds[name] == e {
			delete(r.holds, name)
		}
	})
	id := uint64(e.hold.ID())
	r.doneIDs.add(func() { delete(r.holdNames, id) })
}

func (r *Runner) finishEvent(name string, e *scriptEvent) {
	r.done.add(len(name), func() {
		if r.events[name] == e {
			delete(r.events, name)
		}
	})
	id := uint64(e.id)
	r.doneIDs.add(func() { delete(r.eventNames, id) })
	if l := e.lease; l != nil {
		l.pending--
		if l.released && l.pending == 0 {
			r.finishLeaseID(uint64(l.lease.ID()))
		}
	}
}

// finishScope remembers that scope name is done (exited, or its entry
// failed): its leases' and its own runtime names follow the trace.
func (r *Runner) finishScope(name string, e *scopeEntry) {
	r.done.add(len(name), func() {
		if r.scopes[name] == e {
			delete(r.scopes, name)
		}
	})
	if e.scope == nil {
		return
	}
	for _, id := range e.scope.Leases() {
		r.finishLeaseID(uint64(id))
	}
	runtimeName := e.scope.Name()
	r.doneIDs.add(func() {
		if r.scopeNames[runtimeName] == name {
			delete(r.scopeNames, runtimeName)
		}
	})
}

// sweepDecisions is called after every op: a decision the state version
// has moved past can only be stale when entered, so it is a finished name.
func (r *Runner) sweepDecisions() {
	keep := r.fresh[:0]
	for _, name := range r.fresh {
		d, ok := r.decisions[name]
		if !ok {
			continue
		}
		if d.ExpectedStateVersion == r.version {
			keep = append(keep, name)
			continue
		}
		w := len(name) + 64*(len(d.Plan.Reclaim)+len(d.Plan.Reservations)+len(d.Plan.Enter)+len(d.Evictions)) + len(d.Explanation.Reason)
		r.done.add(w, func() { delete(r.decisions, name) })
	}
	clear(r.fresh[len(keep):])
	r.fresh = keep
}

// namesKept counts the script names the Runner holds (tests).
func (r *Runner) namesKept() int {
	return len(r.handles) + len(r.leases) + len(r.holds) + len(r.events) + len(r.decisions) + len(r.scopes) +
		len(r.leaseNames) + len(r.holdNames) + len(r.eventNames) + len(r.scopeNames)
}
