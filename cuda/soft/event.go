package soft

import (
	"context"
	"sync"

	"github.com/residency-go/residency/cuda"
)

// event is a simulated event: a channel closed once the work before the
// event has run.
type event struct {
	done chan struct{}
	err  error // written once, before done is closed; read only after
}

var _ cuda.Event = (*event)(nil)

func newEvent() *event { return &event{done: make(chan struct{})} }

// complete sets the event's error and completes it, once: the stream
// goroutine does, or Record on an idle stream.
func (e *event) complete(err error) {
	e.err = err
	close(e.done)
}

// Done returns a channel closed when the event completes.
func (e *event) Done() <-chan struct{} { return e.done }

// Query reports whether the event has completed, without blocking.
func (e *event) Query() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// Err returns nil until the event completes, then the first failure of the
// work before it that no earlier event or Synchronize reported.
func (e *event) Err() error {
	select {
	case <-e.done:
		return e.err
	default:
		return nil
	}
}

// Wait blocks until the event completes (returning Err) or ctx ends
// (returning ctx.Err()). A completed event wins over a done ctx.
func (e *event) Wait(ctx context.Context) error {
	select {
	case <-e.done:
		return e.err
	case <-ctx.Done():
		if e.Query() {
			return e.err
		}
		return ctx.Err()
	}
}

// syncMarker is the queue entry of one Synchronize call. The stream
// goroutine delivers the pending failure to it, unless the caller gave up
// first (abandoned), in which case the failure stays pending for the next
// event or Synchronize.
type syncMarker struct {
	done      chan struct{} // closed on delivery
	mu        sync.Mutex    // guards abandoned and err
	abandoned bool
	err       error
}

// deliver hands err to the waiting caller and reports whether it did; it
// does not if the caller has abandoned the marker.
func (m *syncMarker) deliver(err error) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.abandoned {
		return false
	}
	m.err = err
	close(m.done)
	return true
}

// wait waits for delivery or ctx. On ctx it abandons the marker, unless the
// delivery won the race, in which case the delivered error is returned.
func (m *syncMarker) wait(ctx context.Context) error {
	select {
	case <-m.done:
	case <-ctx.Done():
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.done:
		return m.err
	default:
		m.abandoned = true
		return ctx.Err()
	}
}
