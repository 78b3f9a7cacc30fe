package faulty

import (
	"context"
	"sync"

	"github.com/residency-go/residency/cuda"
)

// stream is a stream of the wrapped backend that can fail a copy.
//
// An injected copy failure must reach the first event (or Synchronize)
// after it, in stream order with the wrapped stream's own failures. So
// when a fault fires the stream records an event of the wrapped stream
// (it takes the wrapped stream's earlier failures) and keeps it, then the
// injected failure, in pending; the next Record hands pending to its
// event, which reports the first failure among them and its own. With
// nothing pending, Record returns the wrapped stream's event as it is.
type stream struct {
	cuda.Stream // the wrapped stream: Location, WaitEvent
	b           *Backend

	mu      sync.Mutex // guards pending; held while enqueueing markers
	pending []source   // failures not yet handed to an event, in order
}

// source is one failure to report, in stream order: an injected failure
// (err) or whatever a wrapped event reports (ev).
type source struct {
	err error
	ev  cuda.Event
}

func (s source) failure() error {
	if s.ev != nil {
		return s.ev.Err()
	}
	return s.err
}

// CopyAsync enqueues the copy on the wrapped stream, unless an armed
// FaultCopy at dst.Location() fails it (after the buffer checks and once
// the stream has accepted a marker: a closed stream consumes nothing).
func (s *stream) CopyAsync(dst, src cuda.Buffer) error {
	if dst == nil || s.b.faults.Armed(cuda.FaultCopy, dst.Location()) == 0 ||
		!s.b.isLive(dst) || !s.b.isLive(src) {
		return s.Stream.CopyAsync(dst, src)
	}
	if err := s.b.check.Copy(dst, src); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	before, err := s.Stream.Record() // ErrClosed on a closed stream
	if err != nil {
		return err
	}
	s.pending = append(s.pending, source{ev: before})
	if !s.b.faults.Take(cuda.FaultCopy, dst.Location()) {
		return s.Stream.CopyAsync(dst, src) // another call took the fault
	}
	s.pending = append(s.pending, source{err: s.b.injected(cuda.FaultCopy, dst.Location())})
	return nil
}

// Record records an event of the wrapped stream that also reports what is
// pending.
func (s *stream) Record() (cuda.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev, err := s.Stream.Record()
	if err != nil || len(s.pending) == 0 {
		return ev, err
	}
	e := &event{Event: ev, before: s.pending}
	s.pending = nil
	return e, nil
}

// Synchronize waits for the work enqueued before it and returns the first
// failure not yet reported. With nothing pending it is the wrapped
// stream's Synchronize. Otherwise it records an event and waits for it; if
// ctx ends first, that event goes back to pending, so its failure reaches
// the next event or Synchronize.
func (s *stream) Synchronize(ctx context.Context) error {
	s.mu.Lock()
	if len(s.pending) == 0 {
		s.mu.Unlock()
		return s.Stream.Synchronize(ctx)
	}
	s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	ev, err := s.Record()
	if err != nil {
		return err
	}
	err = ev.Wait(ctx)
	if ctx.Err() != nil && !ev.Query() {
		s.mu.Lock()
		s.pending = append([]source{{ev: ev}}, s.pending...)
		s.mu.Unlock()
	}
	return err
}

// Close closes the wrapped stream and returns the first failure that no
// event or Synchronize reported, pending ones first.
func (s *stream) Close() error {
	err := s.Stream.Close()
	s.mu.Lock()
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, p := range pending {
		if f := p.failure(); f != nil {
			return f
		}
	}
	return err
}

// event is an event of the wrapped stream that also reports the failures
// pending before it: it completes with the wrapped event, and its Err is
// the first failure among them, then the wrapped event's own.
type event struct {
	cuda.Event // Done, Query
	before     []source
}

// Err is nil until the event completes, then the first failure of the
// work before it.
func (e *event) Err() error {
	if !e.Event.Query() {
		return nil
	}
	for _, p := range e.before {
		if f := p.failure(); f != nil {
			return f
		}
	}
	return e.Event.Err()
}

// Wait blocks until the event completes, returning Err, or until ctx
// ends, returning ctx.Err().
func (e *event) Wait(ctx context.Context) error {
	if err := e.Event.Wait(ctx); err != nil && !e.Event.Query() {
		return err
	}
	return e.Err()
}
