package soft

import (
	"context"
	"fmt"
	"sync"

	"github.com/residency-go/residency/cuda"
)

// stream is a simulated stream: an unbounded FIFO queue served by one
// goroutine. Enqueueing never blocks.
//
// A stream with nothing queued and nothing running does a small copy
// without a simulated delay (at most inlineCopyMax bytes, no
// Config.BandwidthBytesPerSec), and the record of an event, on the
// goroutine that enqueued it: the work is done in the same order, and
// failures are reported to the same event or Synchronize, as if the
// stream goroutine had done it; only the hand-off to that goroutine and
// back is saved.
type stream struct {
	backend *Backend
	loc     string
	ctx     context.Context    // cancelled when the stream or backend closes; cuts copy delays short
	cancel  context.CancelFunc // cancels ctx
	done    chan struct{}      // closed when run returns

	mu       sync.Mutex // guards the fields below
	cond     sync.Cond  // signalled when queue grows or closing is set; L is &mu
	queue    []op       // queue[head:] is waiting; the backing array is reused once drained
	head     int
	closing  bool
	leftover error // failure no marker reported; written by run before done closes
	// busy is set while an op runs, on the stream goroutine or inline;
	// pending (the first failure not yet reported to a marker) is read
	// and written only by whoever set busy, or under mu while busy is
	// unset.
	busy    bool
	pending error
}

// inlineCopyMax is the largest copy an idle stream does on the
// enqueueing goroutine (a copy of this size takes microseconds).
const inlineCopyMax = 256 << 10

var _ cuda.Stream = (*stream)(nil)

type opKind int

const (
	opCopy   opKind = iota // copy src into dst (or fail with fail)
	opRecord               // complete ev
	opWait                 // wait for wait.Done()
	opSync                 // deliver to sync
)

type op struct {
	kind opKind
	dst  *buffer
	src  *buffer
	ev   *event
	wait cuda.Event
	sync *syncMarker
}

func newStream(b *Backend, loc string) *stream {
	s := &stream{backend: b, loc: loc, done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(b.stopCtx)
	s.cond.L = &s.mu
	return s
}

// Location returns the location whose simulated device owns the stream.
func (s *stream) Location() string { return s.loc }

// String describes the stream for logs.
func (s *stream) String() string { return "soft stream on " + s.loc }

// isClosing reports whether Close has begun. Enqueueing checks again under
// the lock; this early check only gives closed streams a consistent error.
func (s *stream) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// enqueue appends o unless the stream is closing.
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

// CopyAsync enqueues a copy of src into dst. See [cuda.Stream.CopyAsync]:
// bad input fails at once. When it runs, the copy first spends its simulated transfer time
// (Config.BandwidthBytesPerSec), then copies the bytes with both buffers
// held. A buffer freed after enqueue makes the copy fail with
// cuda.ErrFreed, at once, without the delay.
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
		if b.freed.Load() {
			return fmt.Errorf("%w: soft backend: copy %s -> %s: %s", cuda.ErrFreed, sr.at.name, d.at.name, b)
		}
	}
	if d.size <= inlineCopyMax && s.backend.copyDuration(d.size) == 0 {
		return s.copyInline(d, sr)
	}
	return s.enqueue(op{kind: opCopy, dst: d, src: sr})
}

// copyInline does the copy at once when the stream is idle (see
// [stream]), else enqueues it.
func (s *stream) copyInline(dst, src *buffer) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return cuda.ErrClosed
	}
	if s.head != len(s.queue) || s.busy {
		s.queue = append(s.queue, op{kind: opCopy, dst: dst, src: src})
		s.cond.Signal()
		s.mu.Unlock()
		return nil
	}
	s.busy = true
	s.mu.Unlock()
	err := copyBuffer(dst, src)
	if s.pending == nil {
		s.pending = err
	}
	s.mu.Lock()
	s.busy = false
	s.cond.Signal() // the stream goroutine may wait for busy to clear
	s.mu.Unlock()
	return nil
}

// Record enqueues a new event; see [cuda.Stream.Record].
func (s *stream) Record() (cuda.Event, error) {
	ev := newEvent()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, cuda.ErrClosed
	}
	if s.head == len(s.queue) && !s.busy { // idle: everything before it has run
		ev.complete(s.pending)
		s.pending = nil
		return ev, nil
	}
	s.queue = append(s.queue, op{kind: opRecord, ev: ev})
	s.cond.Signal()
	return ev, nil
}

// WaitEvent makes later work on the stream wait for ev, which may come
// from any stream of any backend (only ev.Done is used).
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

// Close refuses new work, cuts short the simulated delays of queued copies
// (their bytes are still copied), drains the queue and stops the goroutine.
// The first call returns the first failure no event or Synchronize
// reported; later calls wait for the stream to stop and return nil.
func (s *stream) Close() error {
	s.mu.Lock()
	first := !s.closing
	s.closing = true
	s.cond.Broadcast()
	s.mu.Unlock()
	if !first {
		<-s.done
		return nil
	}
	s.cancel()
	<-s.done
	s.backend.forget(s)
	return s.leftover // written by run before done was closed
}

// run is the stream goroutine.
func (s *stream) run() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for s.busy || (s.head == len(s.queue) && !s.closing) {
			s.cond.Wait()
		}
		if s.head == len(s.queue) {
			s.leftover = s.pending
			s.mu.Unlock()
			return
		}
		o := s.queue[s.head]
		s.queue[s.head] = op{} // let the buffers go
		s.head++
		if s.head == len(s.queue) { // drained: reuse the array
			s.queue, s.head = s.queue[:0], 0
		}
		s.busy = true
		s.mu.Unlock()
		s.runOp(o)
		s.mu.Lock()
		s.busy = false
		s.mu.Unlock()
	}
}

// runOp runs one queued op (busy is set).
func (s *stream) runOp(o op) {
	switch o.kind {
	case opCopy:
		err := s.copy(o.dst, o.src)
		if s.pending == nil {
			s.pending = err
		}
	case opRecord:
		o.ev.complete(s.pending)
		s.pending = nil
	case opWait:
		<-o.wait.Done()
	case opSync:
		if o.sync.deliver(s.pending) {
			s.pending = nil
		}
	}
}

// copy performs one stream copy: a buffer freed since enqueue fails it at
// once; otherwise it spends the simulated transfer time, then moves the
// bytes (copyBuffer checks again, under the buffer locks).
func (s *stream) copy(dst, src *buffer) error {
	if dst.freed.Load() || src.freed.Load() {
		return copyBuffer(dst, src) // reports which one, as ErrFreed
	}
	if d := s.backend.copyDuration(dst.size); d > 0 && s.ctx.Err() == nil {
		s.backend.sleep(s.ctx, d)
	}
	return copyBuffer(dst, src)
}
