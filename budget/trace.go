package budget

import "strconv"

// Where committed transitions go: the trace, a bounded ring of them, and
// recorders, which collect them for a report. Both store a transition as
// committed (traceEntry), its detail possibly still in raw parts, and
// render it as a [Transition] only when it is read: the lease path formats
// nothing while it commits.

// traceDetailKind says how a stored transition's detail reads.
type traceDetailKind uint8

const (
	detailText         traceDetailKind = iota // text, as committed
	detailLease                               // "lease <id>"
	detailHold                                // "hold <id>"
	detailEvent                               // "event <id>"
	detailEventOnLease                        // "event <id> on lease <lease>"
	detailReservation                         // a reservation's name, as text
)

// traceDetail is a transition's detail as stored: a text, or the ids of
// a lease, hold or event detail, formatted when read. The same parts fill
// the Transition's structured fields (ID, Lease, Name, Failure).
type traceDetail struct {
	kind    traceDetailKind
	text    string
	id      uint64
	lease   uint64      // detailEventOnLease: the lease the event was recorded on
	failure FailureKind // a "fail" transition's kind of failure
}

func textDetail(text string) traceDetail { return traceDetail{text: text} }

func idDetail(kind traceDetailKind, id uint64) traceDetail {
	return traceDetail{kind: kind, id: id}
}

// String formats the detail as a Transition's Detail reads.
func (d traceDetail) String() string {
	switch d.kind {
	case detailLease:
		return "lease " + strconv.FormatUint(d.id, 10)
	case detailHold:
		return "hold " + strconv.FormatUint(d.id, 10)
	case detailEvent:
		return "event " + strconv.FormatUint(d.id, 10)
	case detailEventOnLease:
		return "event " + strconv.FormatUint(d.id, 10) + " on lease " + strconv.FormatUint(d.lease, 10)
	default:
		return d.text
	}
}

// traceEntry is a committed transition as stored.
type traceEntry struct {
	version  uint64
	kind     string
	handle   string
	location string
	bytes    int64
	detail   traceDetail
	removal  RemovalKind
}

// transition renders the entry.
func (e *traceEntry) transition() Transition {
	t := Transition{Version: e.version, Kind: e.kind, Handle: e.handle, Location: e.location, Bytes: e.bytes, Detail: e.detail.String(), Removal: e.removal, Failure: e.detail.failure}
	switch e.detail.kind {
	case detailLease, detailHold, detailEvent:
		t.ID = e.detail.id
	case detailEventOnLease:
		t.ID, t.Lease = e.detail.id, e.detail.lease
	case detailReservation:
		t.Name = e.detail.text
	}
	return t
}

// renderEntries renders entries in order; nil when there are none.
func renderEntries(out []Transition, entries ...[]traceEntry) []Transition {
	for _, es := range entries {
		for i := range es {
			out = append(out, es[i].transition())
		}
	}
	return out
}

type traceRing struct {
	cap   int
	buf   []traceEntry
	next  int
	count int
}

func newTraceRing(capacity int) traceRing { return traceRing{cap: capacity} }

func (r *traceRing) push(e *traceEntry) {
	if r.cap == 0 {
		return
	}
	if len(r.buf) < r.cap {
		r.buf = append(r.buf, *e)
	} else {
		r.buf[r.next] = *e
	}
	r.next = (r.next + 1) % r.cap
	if r.count < r.cap {
		r.count++
	}
}

// items renders the entries in the ring, oldest first (never nil).
func (r *traceRing) items() []Transition {
	out := make([]Transition, 0, r.count)
	if r.count < r.cap {
		return renderEntries(out, r.buf[:r.count])
	}
	return renderEntries(out, r.buf[r.next:], r.buf[:r.next])
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
	entries []traceEntry
}

// transitions renders the transitions recorded so far, in commit order,
// into a fresh slice of exactly their number; nil when there are none.
func (r *recorder) transitions() []Transition {
	if len(r.entries) == 0 {
		return nil
	}
	return renderEntries(make([]Transition, 0, len(r.entries)), r.entries)
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
	return Report{Transitions: rec.transitions()}
}
