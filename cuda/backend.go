package cuda

import "context"

// Backend performs physical allocations, copies and events for locations.
//
// A Backend is safe for concurrent use by multiple goroutines. Every method
// except Name and Close returns an error matching [ErrClosed] once Close
// has been called.
//
// A backend that only simulates devices says so by implementing
// [Simulator] (see [IsSimulated]).
type Backend interface {
	// Name describes the backend for logs and diagnostics. The soft backend
	// answers "soft (simulated devices)".
	Name() string

	// Allocate returns a new buffer of exactly bytes bytes at loc.
	//
	// A request that the location's capacity cannot hold returns an
	// [*OutOfMemoryError]. A malformed loc returns a
	// [*LocationError], a well-formed but unconfigured loc an error matching
	// [ErrUnknownLocation], bytes <= 0 an error matching [ErrInvalid].
	// On any error nothing is allocated and no capacity is charged.
	Allocate(ctx context.Context, loc string, bytes int64) (Buffer, error)

	// Free releases buf and returns its bytes to its location's capacity.
	// Freeing a buffer twice returns an error matching [ErrFreed]; it
	// never panics. Work still queued on a stream that touches buf fails
	// with ErrFreed when it runs.
	Free(buf Buffer) error

	// NewStream returns a new stream owned by the device of loc. Host
	// locations get host streams. Close the stream, or the backend, to
	// stop its goroutine.
	NewStream(loc string) (Stream, error)

	// Load runs loader synchronously to fill dst, the reconstruction of a
	// value for the location target. target may differ from dst.Location()
	// when dst is a temporary buffer; an empty target means dst.Location().
	//
	// A loader error is returned wrapped (errors.Is finds it); a loader
	// panic, or a loader calling runtime.Goexit, is recovered and
	// returned as a [*LoaderPanicError] (the loader runs on a goroutine of
	// its own, which Load waits for). After any loader failure the
	// contents of dst are unspecified.
	Load(ctx context.Context, dst Buffer, target string, loader Loader) error

	// Read copies the bytes of buf into a new host slice. It does not wait
	// for stream work on buf: wait on an event first.
	Read(ctx context.Context, buf Buffer) ([]byte, error)

	// Write copies data into buf; len(data) must equal buf.Size(). It does
	// not wait for stream work on buf: wait on an event first.
	Write(ctx context.Context, buf Buffer, data []byte) error

	// MemInfo reports the memory of loc. TotalBytes == 0 means the
	// location has no capacity limit (see [MemInfo.Unlimited]).
	MemInfo(loc string) (MemInfo, error)

	// Close stops every stream goroutine of the backend, after draining
	// the work already queued, and releases every live buffer. It is
	// idempotent: later and concurrent calls wait for the first to finish
	// and return nil. After Close every other method returns ErrClosed.
	Close() error
}

// Simulator is implemented by a backend that may only simulate its
// devices. Simulated reports true when no real device is behind the
// backend (the soft backend), so that a program can say so in what it
// prints. A decorator (cuda/faulty, say) implements it by asking the
// backend it wraps.
type Simulator interface {
	Simulated() bool
}

// IsSimulated reports whether b says that it simulates its devices: b
// implements [Simulator] and its Simulated returns true. A backend that
// does not implement Simulator is taken to drive real devices.
func IsSimulated(b Backend) bool {
	s, ok := b.(Simulator)
	return ok && s.Simulated()
}

// Loader fills dst, a buffer of exactly the size being loaded. It should
// honour ctx. It must not keep dst after it returns, and must not call the
// backend with the buffer it is loading into.
type Loader func(ctx context.Context, dst []byte) error

// Buffer is a physical allocation at one location. Its methods stay valid
// after the buffer is freed.
type Buffer interface {
	// Location is the location the buffer was allocated at.
	Location() string
	// Size is the buffer's length in bytes.
	Size() int64
}

// Stream is an ordered queue of asynchronous work owned by one device.
// Work runs in the order it was enqueued. A Stream is safe for concurrent
// use; work enqueued concurrently runs in some order consistent with each
// caller's own order.
//
// Failures of queued work are never returned by the call that enqueued it.
// Each failure is reported exactly once: to the first event recorded (or
// the first Synchronize issued) after the failed work; a failure not
// reported by the time the stream closes is returned by Close. The stream
// keeps executing later work after a failure.
type Stream interface {
	// Location is the location whose device owns the stream.
	Location() string

	// CopyAsync enqueues a copy of src into dst. It returns an error at
	// once only for bad input: a nil or foreign buffer, dst == src, sizes
	// that differ ([ErrInvalid]), a freed buffer ([ErrFreed]) or a closed
	// stream ([ErrClosed]). A copy that fails when it runs is reported
	// as described on [Stream].
	CopyAsync(dst, src Buffer) error

	// Record returns an event that completes once all work enqueued on
	// this stream before it has finished. The event's Err is the first
	// not-yet-reported failure of that work.
	Record() (Event, error)

	// WaitEvent makes work enqueued on this stream after the call wait
	// until ev completes. It does not block the caller. The failure of
	// ev, if any, is not inherited by this stream: check ev.Err.
	WaitEvent(ev Event) error

	// Synchronize blocks until all work enqueued before it has finished,
	// and returns the first not-yet-reported failure of that work. If ctx
	// ends first it returns ctx.Err() and reports nothing, leaving any
	// failure to the next event or Synchronize.
	Synchronize(ctx context.Context) error

	// Close refuses new work with ErrClosed, drains the work already
	// enqueued and stops the stream goroutine. The first call returns the
	// first failure that no event or Synchronize reported; it is
	// idempotent, and later calls return nil once the stream has stopped.
	Close() error
}

// Event marks a point in a stream. It completes when all work enqueued
// before it on its stream has finished. An Event is safe for concurrent
// use.
type Event interface {
	// Done returns a channel that is closed when the event completes.
	Done() <-chan struct{}
	// Err is nil until the event completes; then it is the failure, if
	// any, of the work before it (see [Stream]).
	Err() error
	// Query reports whether the event has completed. It never blocks.
	Query() bool
	// Wait blocks until the event completes, returning Err, or until ctx
	// ends, returning ctx.Err().
	Wait(ctx context.Context) error
}

// MemInfo is a snapshot of one location's memory.
//
// For a limited location FreeBytes + UsedBytes == TotalBytes. For an
// unlimited one TotalBytes is 0 and FreeBytes is math.MaxInt64 - UsedBytes.
type MemInfo struct {
	FreeBytes  int64
	TotalBytes int64
	UsedBytes  int64
}

// Unlimited reports whether the location has no capacity limit.
func (m MemInfo) Unlimited() bool { return m.TotalBytes == 0 }
