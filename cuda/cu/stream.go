//go:build cuda

package cu

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/cuda"
	gcu "gorgonia.org/cu"
)

// stream is a CUDA stream (non-blocking) with two goroutines, each on a
// locked OS thread with the device's context current for its whole life:
//
//   - the feeder takes work from an unbounded FIFO queue and issues it to
//     the CUDA stream: a copy becomes one cuMemcpy*Async call (a copy
//     between two host buffers waits for the stream, then copies on the
//     host); Record and Synchronize record a CUDA event; WaitEvent of one
//     of our events becomes cuStreamWaitEvent once that event has been
//     recorded, and of any other event a host wait before later work is
//     issued;
//   - the completer waits for the recorded CUDA events in order
//     (cuEventSynchronize, blocking rather than spinning), and completes
//     events and Synchronize calls with the first failure not yet
//     reported: failures to issue work and freed buffers
//     (which the feeder hands it in queue order) and asynchronous driver
//     errors.
//
// Buffers used by issued copies are kept alive until the completer has
// seen the next CUDA event after them; the feeder records one when it runs
// out of work, so memory freed during a copy is released soon after the
// copy finishes.
type stream struct {
	backend *Backend
	loc     string
	dev     *device
	cs      gcu.Stream // owned by the feeder

	mu       sync.Mutex // guards the fields below
	cond     sync.Cond  // L is &mu; signalled when queue grows or closing is set
	queue    []op
	closing  bool
	leftover error // failure no marker reported; written before done closes

	cmu   sync.Mutex // guards items and fed
	ccond sync.Cond  // L is &cmu
	items []item
	fed   bool // the feeder has handed over its last item

	compDone chan struct{} // closed when the completer returns
	done     chan struct{} // closed when the stream is destroyed

	issued atomic.Int64 // copies issued to the device so far (tests wait on it)
}

var _ cuda.Stream = (*stream)(nil)

type opKind int

const (
	opCopy opKind = iota
	opRecord
	opWait
	opSync
)

type op struct {
	kind opKind
	dst  *buffer
	src  *buffer
	ev   *event
	wait cuda.Event
	sync *syncMarker
}

// item is what the feeder hands the completer, in queue order: either a
// failure of work issued (or refused) before the next mark, or a mark.
type item struct {
	fail error

	cuev   gcu.Event // the recorded CUDA event of a mark, if hasEv
	hasEv  bool
	markEr error // failure to record the mark itself
	ev     *event
	sync   *syncMarker // neither ev nor sync: an internal mark
	refs   []*buffer   // buffers of copies issued before the mark
}

func newStream(b *Backend, loc string, dev *device) *stream {
	s := &stream{backend: b, loc: loc, dev: dev, compDone: make(chan struct{}), done: make(chan struct{})}
	s.cond.L = &s.mu
	s.ccond.L = &s.cmu
	return s
}

// start creates the CUDA stream on the feeder's thread and starts both
// goroutines, or returns the driver's failure with nothing started.
func (s *stream) start() error {
	ready := make(chan error, 1)
	go s.feed(ready)
	return <-ready
}

// Location returns the location whose device owns the stream.
func (s *stream) Location() string { return s.loc }

// String describes the stream for logs.
func (s *stream) String() string { return "cu stream on " + s.loc }

func (s *stream) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

func (s *stream) enqueue(o op) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return cuda.ErrClosed
	}
	s.queue = append(s.queue, o)
	s.cond.Signal()
	return nil
}

// CopyAsync enqueues a copy of src into dst; see [cuda.Stream.CopyAsync].
// Bad input fails at once. A buffer freed before the copy is issued to the GPU makes it
// fail with cuda.ErrFreed.
func (s *stream) CopyAsync(dst, src cuda.Buffer) error {
	if s.isClosing() {
		return cuda.ErrClosed
	}
	d, err := s.backend.own(dst, "copy destination")
	if err != nil {
		return err
	}
	sr, err := s.backend.own(src, "copy source")
	if err != nil {
		return err
	}
	if err := check.Copy(d, sr); err != nil {
		return err
	}
	for _, b := range [...]*buffer{sr, d} {
		if b.isFreed() {
			return fmt.Errorf("%w: cu backend: copy %s -> %s: %s", cuda.ErrFreed, sr.loc, d.loc, b)
		}
	}
	return s.enqueue(op{kind: opCopy, dst: d, src: sr})
}

// Record enqueues a new event; see [cuda.Stream.Record].
func (s *stream) Record() (cuda.Event, error) {
	ev := newEvent()
	if err := s.enqueue(op{kind: opRecord, ev: ev}); err != nil {
		return nil, err
	}
	return ev, nil
}

// WaitEvent makes later work on the stream wait for ev. An event of a cu
// backend is waited for on the device (cuStreamWaitEvent); any other event
// (of the soft backend, say) by the stream's feeding goroutine, on the
// host, before it issues later work.
func (s *stream) WaitEvent(ev cuda.Event) error {
	if s.isClosing() {
		return cuda.ErrClosed
	}
	if err := check.Event(ev); err != nil {
		return err
	}
	return s.enqueue(op{kind: opWait, wait: ev})
}

// Synchronize waits for the work enqueued before it; see
// [cuda.Stream.Synchronize].
func (s *stream) Synchronize(ctx context.Context) error {
	if s.isClosing() {
		return cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m := &syncMarker{done: make(chan struct{})}
	if err := s.enqueue(op{kind: opSync, sync: m}); err != nil {
		return err
	}
	return m.wait(ctx)
}

// Close refuses new work, drains the queue, waits for the device to finish
// the stream's work, destroys the CUDA stream and stops both goroutines.
// The first call returns the first failure no event or Synchronize
// reported; later calls wait for the stream to stop and return nil.
func (s *stream) Close() error {
	s.mu.Lock()
	first := !s.closing
	s.closing = true
	s.cond.Broadcast()
	s.mu.Unlock()
	<-s.done
	if !first {
		return nil
	}
	s.backend.forget(s)
	return s.leftover
}

// ---- feeder -------------------------------------------------------------

func (s *stream) feed(ready chan<- error) {
	defer close(s.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := gcu.PushCurrentCtx(s.dev.ctx); err != nil {
		close(s.compDone)
		ready <- wrap("cuCtxPushCurrent", err)
		return
	}
	defer gcu.PopCurrentCtx()
	cs, err := gcu.MakeStream(gcu.NonBlocking)
	if err != nil {
		close(s.compDone)
		ready <- wrap(fmt.Sprintf("cuStreamCreate on %s", s.loc), err)
		return
	}
	s.cs = cs
	go s.complete()
	ready <- nil

	var refs []*buffer // buffers of issued copies not yet behind a mark
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			if len(refs) > 0 { // idle: let the completer release them when done
				s.mu.Unlock()
				s.hand(s.mark(nil, nil, &refs))
				s.mu.Lock()
				continue
			}
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			break
		}
		o := s.queue[0]
		s.queue[0] = op{}
		s.queue = s.queue[1:]
		s.mu.Unlock()

		switch o.kind {
		case opCopy:
			held, err := s.copy(o.dst, o.src)
			refs = append(refs, held...)
			if err != nil {
				s.hand(item{fail: err})
			}
		case opRecord:
			s.hand(s.mark(o.ev, nil, &refs))
		case opSync:
			s.hand(s.mark(nil, o.sync, &refs))
		case opWait:
			s.waitFor(o.wait)
		}
	}

	// A last mark, so that the completer sees all work done.
	s.hand(s.mark(nil, nil, &refs))
	s.cmu.Lock()
	s.fed = true
	s.ccond.Signal()
	s.cmu.Unlock()
	<-s.compDone
	_ = s.cs.Destroy()
}

// hand passes it to the completer.
func (s *stream) hand(it item) {
	s.cmu.Lock()
	s.items = append(s.items, it)
	s.ccond.Signal()
	s.cmu.Unlock()
}

// mark records a CUDA event after the work issued so far and returns the
// completer's item for it, taking over *refs.
func (s *stream) mark(ev *event, m *syncMarker, refs *[]*buffer) item {
	it := item{ev: ev, sync: m, refs: *refs}
	*refs = nil
	cuev, err := gcu.MakeEvent(gcu.BlockingSyncEvent | gcu.DisableTiming)
	if err == nil {
		if err = cuev.Record(s.cs); err != nil {
			_ = gcu.DestroyEvent(&cuev)
			err = wrap(fmt.Sprintf("cuEventRecord on %s", s.loc), err)
		} else {
			it.cuev, it.hasEv = cuev, true
		}
	} else {
		err = wrap("cuEventCreate", err)
	}
	if err != nil {
		// Without an event, wait for the stream here, so that the mark still
		// completes after the work before it.
		it.markEr = err
		if serr := s.cs.Synchronize(); serr != nil {
			it.markEr = fmt.Errorf("%w; then %w", err, wrap("cuStreamSynchronize", serr))
		}
	}
	if ev != nil {
		ev.setIssued(it.cuev, it.hasEv)
	}
	return it
}

// waitFor makes later work wait for ev.
func (s *stream) waitFor(ev cuda.Event) {
	e, ok := ev.(*event)
	if !ok {
		<-ev.Done() // a foreign event: wait on the host before issuing more
		return
	}
	<-e.issued
	e.mu.Lock()
	if e.has {
		if err := s.cs.Wait(e.cuev, 0); err == nil {
			e.mu.Unlock()
			return
		}
	}
	e.mu.Unlock()
	<-e.done // not recorded, or the device wait failed: wait on the host
}

// copy issues one copy and returns the buffers it keeps alive until the
// next mark completes (none when it completed synchronously or failed).
func (s *stream) copy(dst, src *buffer) ([]*buffer, error) {
	if !src.acquire() {
		return nil, fmt.Errorf("%w: cu backend: copy %s -> %s: %s was freed before the copy ran", cuda.ErrFreed, src.loc, dst.loc, src)
	}
	if !dst.acquire() {
		src.release()
		return nil, fmt.Errorf("%w: cu backend: copy %s -> %s: %s was freed before the copy ran", cuda.ErrFreed, src.loc, dst.loc, dst)
	}
	n := dst.size
	var err error
	var what string
	switch dh, sh := dst.kind != cuda.KindCUDA, src.kind != cuda.KindCUDA; {
	case dh && sh:
		// Host to host: in stream order, on the host.
		if err = waitStream(s.cs); err == nil {
			copy(dst.hostBytes(), src.hostBytes())
		}
		dst.release()
		src.release()
		if err != nil {
			return nil, fmt.Errorf("cu backend: copy %s -> %s on %s: %w", src.loc, dst.loc, s.loc, err)
		}
		return nil, nil
	case dh:
		what = "cuMemcpyDtoHAsync"
		err = gcu.MemcpyDtoHAsync(dst.host, src.dptr, n, s.cs)
	case sh:
		what = "cuMemcpyHtoDAsync"
		err = gcu.MemcpyHtoDAsync(dst.dptr, src.host, n, s.cs)
	case dst.dev == src.dev:
		what = "cuMemcpyDtoDAsync"
		err = gcu.MemcpyDtoDAsync(dst.dptr, src.dptr, n, s.cs)
	default:
		what = "cuMemcpyPeerAsync"
		err = gcu.MemcpyPeerAsync(dst.dptr, dst.dev.ctx, src.dptr, src.dev.ctx, n, s.cs)
	}
	if err != nil {
		dst.release()
		src.release()
		return nil, wrap(fmt.Sprintf("%s(%d B) %s -> %s on %s", what, n, src.loc, dst.loc, s.loc), err)
	}
	s.issued.Add(1)
	return []*buffer{src, dst}, nil
}

// ---- completer ----------------------------------------------------------

func (s *stream) complete() {
	defer close(s.compDone)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var pending error
	note := func(err error) {
		if pending == nil {
			pending = err
		}
	}
	if err := gcu.PushCurrentCtx(s.dev.ctx); err != nil {
		note(wrap("cuCtxPushCurrent", err)) // events still synchronize without it
	} else {
		defer gcu.PopCurrentCtx()
	}
	for {
		s.cmu.Lock()
		for len(s.items) == 0 && !s.fed {
			s.ccond.Wait()
		}
		if len(s.items) == 0 {
			s.cmu.Unlock()
			break
		}
		it := s.items[0]
		s.items[0] = item{}
		s.items = s.items[1:]
		s.cmu.Unlock()

		if it.fail != nil {
			note(it.fail)
			continue
		}
		if it.hasEv {
			if err := it.cuev.Synchronize(); err != nil {
				note(wrap(fmt.Sprintf("cuEventSynchronize on %s", s.loc), err))
			}
		}
		if it.markEr != nil {
			note(it.markEr)
		}
		for _, b := range it.refs {
			b.release()
		}
		switch {
		case it.ev != nil:
			it.ev.complete(pending)
			pending = nil
		case it.sync != nil:
			if it.hasEv {
				_ = gcu.DestroyEvent(&it.cuev)
			}
			if it.sync.deliver(pending) {
				pending = nil
			}
		default:
			if it.hasEv {
				_ = gcu.DestroyEvent(&it.cuev)
			}
		}
	}
	s.mu.Lock()
	s.leftover = pending
	s.mu.Unlock()
}
