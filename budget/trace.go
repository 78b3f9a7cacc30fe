package budget

// The trace: a bounded ring of committed transitions.

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
