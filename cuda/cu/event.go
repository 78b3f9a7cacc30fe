//go:build cuda

package cu

import (
	"context"
	"sync"

	"github.com/residency-go/residency/cuda"
	gcu "gorgonia.org/cu"
)

// event is a stream marker backed by a CUDA event. The stream's feeding
// goroutine records the CUDA event when it reaches the marker (issued is
// then closed); the stream's completion goroutine waits for it on the
// device (cuEventSynchronize on a blocking-sync event), sets the error and
// closes done, and destroys the CUDA event. A stream that WaitEvents a
// pending event makes the device wait for it (cuStreamWaitEvent), without
// blocking any host thread beyond the moment the event is recorded.
type event struct {
	issued chan struct{} // closed once the CUDA event is recorded, or could not be
	done   chan struct{} // closed on completion

	mu   sync.Mutex // guards cuev and has; held while waiting streams use cuev
	cuev gcu.Event
	has  bool  // cuev is recorded and not yet destroyed
	err  error // written once, before done is closed
}

var _ cuda.Event = (*event)(nil)

func newEvent() *event {
	return &event{issued: make(chan struct{}), done: make(chan struct{})}
}

// setIssued publishes the recorded CUDA event (ok false: none).
func (e *event) setIssued(cuev gcu.Event, ok bool) {
	e.mu.Lock()
	e.cuev, e.has = cuev, ok
	e.mu.Unlock()
	close(e.issued)
}

// complete destroys the CUDA event (on the completing thread, which has a
// context current), sets err and completes the event.
func (e *event) complete(err error) {
	e.mu.Lock()
	if e.has {
		_ = gcu.DestroyEvent(&e.cuev)
		e.has = false
	}
	e.err = err
	close(e.done)
	e.mu.Unlock()
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

// syncMarker is the queue entry of one Synchronize call (as in the soft
// backend): the failure is delivered to it unless the caller gave up first,
// in which case the failure stays pending for the next marker.
type syncMarker struct {
	done      chan struct{}
	mu        sync.Mutex
	abandoned bool
	err       error
}

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
