package budget

// Where committed transitions go: the trace, a bounded ring of them, and
// recorders, which collect them for a report.

type traceRing struct {
	cap   int
	buf   []Transition
	next  int
	count int
}

func newTraceRing(capacity int) traceRing { return traceRing{cap: capacity} }

func (r *traceRing) push(t Transition) {
	if r.cap == 0 {
		return
	}
	if len(r.buf) < r.cap {
		r.buf = append(r.buf, t)
	} else {
		r.buf[r.next] = t
	}
	r.next = (r.next + 1) % r.cap
	if r.count < r.cap {
		r.count++
	}
}

func (r *traceRing) items() []Transition {
	out := make([]Transition, 0, r.count)
	if r.count < r.cap {
		return append(out, r.buf[:r.count]...)
	}
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// Trace returns the committed transitions still in the trace ring, oldest
// first. Empty when the capacity is 0. Older transitions may have been
// overwritten.
func (l *Ledger) Trace() []Transition { return l.trace.items() }

// A recorder collects the transitions committed while it is active, for a
// report: a run's (its steps and their settlements), a direct transfer's
// failure, a scope exit's. One becomes active only through
// [Ledger.recordInto].
type recorder struct {
	transitions []Transition
}

// recordInto runs f with rec collecting every transition f commits, and
// makes the previous recorder active again when f returns. Recordings
// nest: the innermost one collects (the outer one does not see those
// transitions).
func (l *Ledger) recordInto(rec *recorder, f func()) {
	prev := l.recorder
	l.recorder = rec
	defer func() { l.recorder = prev }()
	f()
}

// Recording runs f and returns the transitions committed while it ran.
// The runtime uses it to build the report of a scope exit.
func (l *Ledger) Recording(f func()) Report {
	var rec recorder
	l.recordInto(&rec, f)
	return Report{Transitions: rec.transitions}
}
