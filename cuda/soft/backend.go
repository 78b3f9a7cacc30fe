package soft

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/residency-go/residency/cuda"
)

// BackendName is what [Backend.Name] returns.
const BackendName = "soft (simulated devices)"

// ErrorPrefix starts the messages of the backend's errors. Give it to
// cuda/faulty.Wrap, so that injected failures read like the backend's own.
const ErrorPrefix = "soft backend"

// check makes the argument checks every backend shares.
var check = cuda.Checker{Prefix: ErrorPrefix}

// Config configures a simulated backend.
type Config struct {
	// Locations are the simulated locations (well-formed location names,
	// node-qualified or not, no duplicates, at least one). Every other
	// location is rejected with cuda.ErrUnknownLocation.
	Locations []string

	// Capacity is the simulated capacity in bytes per location; a location
	// missing here, or mapped to 0, is unlimited. Every key must be one of
	// Locations and every value >= 0.
	Capacity map[string]int64

	// BandwidthBytesPerSec, when > 0, makes every stream copy of n bytes
	// spend n/BandwidthBytesPerSec seconds in Sleep before its bytes are
	// copied. 0 means copies are not delayed. Read, Write and Load are never
	// delayed.
	BandwidthBytesPerSec int64

	// Sleep simulates the transfer time of a copy; nil means a real timer.
	// ctx is cancelled when the copy's stream (or the backend) is closing,
	// and Sleep should then return early: the copy is still performed, only
	// its simulated delay is cut short. Tests inject a Sleep that blocks on
	// a channel they control.
	Sleep func(ctx context.Context, d time.Duration)
}

// Backend is an honest simulation of a device backend: it implements
// [cuda.Backend] for pageable-host, pinned-host and cuda:N locations with
// ordinary Go memory, one goroutine per stream and real byte copies. No GPU
// and no driver is ever touched.
//
// A Backend is safe for concurrent use by multiple goroutines.
type Backend struct {
	bandwidth int64
	sleep     func(context.Context, time.Duration)
	names     []string             // configured locations, in Config order
	stopCtx   context.Context      // cancelled when Close begins
	stop      context.CancelFunc   // cancels stopCtx
	closed    atomic.Bool          // set (under mu) when Close begins
	closeDone chan struct{}        // closed when Close has finished
	mu        sync.Mutex           // guards the fields below and location counters
	locs      map[string]*location // fixed key set; counters guarded by mu
	streams   map[*stream]struct{} // open streams
	live      map[*buffer]struct{} // buffers not yet freed
	nextID    uint64               // last buffer id handed out
	real      atomic.Int64         // real bytes the buffers hold (see RealBytes)
	recycle   recycler             // bytes of dropped buffers, for the next of their size
	sparseMin int64                // buffers from this size up keep their bytes in a region
	chunk     int64                // a region's chunk size
}

type location struct {
	name     string
	host     bool  // a host location: its buffers have host views (buffer.HostBytes)
	capacity int64 // 0 = unlimited
	used     int64 // guarded by Backend.mu
}

var (
	_ cuda.Backend     = (*Backend)(nil)
	_ cuda.RangeReader = (*Backend)(nil)
)

// New returns a simulated backend for cfg. It starts no goroutine until a
// stream is created. It returns an error matching cuda.ErrInvalid for a bad
// Config: no locations, a malformed or duplicate location, a capacity for an
// unconfigured location, or a negative capacity or bandwidth.
func New(cfg Config) (*Backend, error) {
	if _, err := check.Config(cfg.Locations, cfg.Capacity); err != nil {
		return nil, err
	}
	if cfg.BandwidthBytesPerSec < 0 {
		return nil, fmt.Errorf("%w: soft backend: negative bandwidth %d", cuda.ErrInvalid, cfg.BandwidthBytesPerSec)
	}
	b := &Backend{
		bandwidth: cfg.BandwidthBytesPerSec,
		sleep:     cfg.Sleep,
		names:     slices.Clone(cfg.Locations),
		closeDone: make(chan struct{}),
		locs:      make(map[string]*location, len(cfg.Locations)),
		streams:   make(map[*stream]struct{}),
		live:      make(map[*buffer]struct{}),
		sparseMin: defaultSparseMin,
		chunk:     defaultChunk(),
	}
	if b.sleep == nil {
		b.sleep = timerSleep
	}
	for _, name := range cfg.Locations {
		kind, _, _ := cuda.ParseLocation(name) // checked by check.Config
		b.locs[name] = &location{name: name, host: kind != cuda.KindCUDA, capacity: cfg.Capacity[name]}
	}
	b.stopCtx, b.stop = context.WithCancel(context.Background())
	return b, nil
}

// timerSleep is the default Config.Sleep: a real timer, cut short by ctx.
func timerSleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Name returns "soft (simulated devices)".
func (b *Backend) Name() string { return BackendName }

// Simulated returns true: every device of this backend is simulated (see
// [cuda.IsSimulated]).
func (b *Backend) Simulated() bool { return true }

// Locations returns the configured locations in Config order.
func (b *Backend) Locations() []string { return slices.Clone(b.names) }

// checkLocation validates a location argument: malformed names get a
// *cuda.LocationError, unconfigured ones cuda.ErrUnknownLocation.
func (b *Backend) checkLocation(loc string) (*location, error) {
	if l, ok := b.locs[loc]; ok {
		return l, nil
	}
	return nil, check.Unconfigured(loc)
}

// own returns buf as one of this backend's buffers, or an ErrInvalid error.
func (b *Backend) own(buf cuda.Buffer, what string) (*buffer, error) {
	sb, ok := buf.(*buffer)
	if !ok || sb == nil || sb.backend != b {
		return nil, check.Foreign(what, buf, ok && sb != nil)
	}
	return sb, nil
}

// Allocate returns a zeroed buffer of bytes bytes at loc, simulated with
// ordinary Go memory whatever the location kind. It charges the capacity
// of loc but makes no real memory: the buffer's bytes are made as they are
// written (see the package doc).
//
// Checks run in this order, and the first failure is returned with nothing
// charged or allocated: backend closed (cuda.ErrClosed), ctx done,
// malformed or unconfigured loc, bytes <= 0 (cuda.ErrInvalid), capacity
// (*cuda.OutOfMemoryError).
func (b *Backend) Allocate(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error) {
	if b.closed.Load() {
		return nil, cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l, err := b.checkLocation(loc)
	if err != nil {
		return nil, err
	}
	if err := check.Size(loc, bytes); err != nil {
		return nil, err
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, cuda.ErrClosed
	}
	if l.capacity > 0 && bytes > l.capacity-l.used {
		return nil, &cuda.OutOfMemoryError{Location: loc, Requested: bytes, Free: l.capacity - l.used}
	}
	l.used += bytes
	b.nextID++
	buf := &buffer{backend: b, id: b.nextID, at: l, size: bytes}
	b.live[buf] = struct{}{}
	return buf, nil
}

// RealBytes returns the real memory the backend's buffers hold now: the
// total size of the live buffers under 32 MiB that hold a non-zero byte,
// and of the chunks of larger ones that do (see the package doc). It is
// at most the total MemInfo.UsedBytes of its locations.
func (b *Backend) RealBytes() int64 { return b.real.Load() }

// makeBytes returns n zero bytes (recycled ones, zeroed, or
// make([]byte, n)), or false if the Go runtime refuses the length. (A
// length the runtime accepts but the machine cannot back is a fatal error
// no simulation can catch; configure capacities.)
func (b *Backend) makeBytes(n int64) (data []byte, ok bool) {
	if d := b.recycle.get(n, true); d != nil {
		return d, true
	}
	defer func() {
		if recover() != nil {
			data, ok = nil, false
		}
	}()
	return make([]byte, n), true
}

// Free releases buf and returns its bytes to its location's capacity at
// once. A second Free of the same buffer returns an error matching
// cuda.ErrFreed; a foreign buffer cuda.ErrInvalid; after Close, cuda.ErrClosed.
// A copy that is running on buf when it is freed completes into memory that
// is then dropped; work still queued on buf fails with cuda.ErrFreed.
func (b *Backend) Free(buf cuda.Buffer) error {
	sb, err := b.own(buf, "buffer")
	if err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return cuda.ErrClosed
	}
	if !sb.freed.CompareAndSwap(false, true) {
		b.mu.Unlock()
		return fmt.Errorf("%w: soft backend: %d-byte buffer at %s", cuda.ErrFreed, sb.size, sb.at.name)
	}
	sb.at.used -= sb.size
	delete(b.live, sb)
	b.mu.Unlock()
	sb.drop()
	return nil
}

// MemInfo reports the simulated memory of loc: UsedBytes is the total size
// of its live buffers, TotalBytes its configured capacity (0 = unlimited).
func (b *Backend) MemInfo(loc string) (cuda.MemInfo, error) {
	if b.closed.Load() {
		return cuda.MemInfo{}, cuda.ErrClosed
	}
	l, err := b.checkLocation(loc)
	if err != nil {
		return cuda.MemInfo{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return cuda.MemInfo{FreeBytes: cuda.FreeBytes(l.capacity, l.used), TotalBytes: l.capacity, UsedBytes: l.used}, nil
}

// NewStream returns a new simulated stream owned by loc's (simulated)
// device, with its own goroutine. Close the stream or the backend to stop
// the goroutine.
func (b *Backend) NewStream(loc string) (cuda.Stream, error) {
	if b.closed.Load() {
		return nil, cuda.ErrClosed
	}
	if _, err := b.checkLocation(loc); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, cuda.ErrClosed
	}
	s := newStream(b, loc)
	b.streams[s] = struct{}{}
	go s.run()
	return s, nil
}

func (b *Backend) forget(s *stream) {
	b.mu.Lock()
	delete(b.streams, s)
	b.mu.Unlock()
}

// Load runs loader on dst's own bytes, synchronously, holding dst for
// writing so that no copy or Read of dst overlaps it.
//
// Checks run in this order: backend closed, ctx done, foreign or nil dst or
// nil loader (cuda.ErrInvalid), freed dst (cuda.ErrFreed), malformed target
// (empty target = dst.Location()). target need not be configured on this
// backend: it only names the location the value is loaded for.
//
// The loader gets dst's bytes in one piece, zeros where nothing was
// written; afterwards what it left zero holds no memory (see the package
// doc). A loader error is returned wrapped (errors.Is and errors.As see
// it); a loader panic is recovered and returned as *cuda.LoaderPanicError.
// After a loader failure the bytes of dst are whatever the loader left
// there.
func (b *Backend) Load(ctx context.Context, dst cuda.Buffer, target string, loader cuda.Loader) error {
	if b.closed.Load() {
		return cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sb, err := b.own(dst, "load destination")
	if err != nil {
		return err
	}
	if err := check.Loader(loader); err != nil {
		return err
	}
	if sb.freed.Load() {
		return fmt.Errorf("%w: soft backend: load into %d-byte buffer at %s", cuda.ErrFreed, sb.size, sb.at.name)
	}
	if err := check.LoadTarget(target); err != nil {
		return err
	}
	if target == "" {
		target = sb.at.name
	}

	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.dropped {
		return fmt.Errorf("%w: soft backend: load into %d-byte buffer at %s", cuda.ErrFreed, sb.size, sb.at.name)
	}
	return sb.load(ctx, loader, target)
}

// Read returns a copy of buf's bytes in a new slice (zeros for a buffer
// never written; a size the Go runtime refuses is an
// *cuda.OutOfMemoryError). It does not wait for stream work on buf; wait
// on an event first.
func (b *Backend) Read(ctx context.Context, buf cuda.Buffer) ([]byte, error) {
	if b.closed.Load() {
		return nil, cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sb, err := b.own(buf, "buffer")
	if err != nil {
		return nil, err
	}
	sb.mu.RLock()
	defer sb.mu.RUnlock()
	if sb.gone() {
		return nil, fmt.Errorf("%w: soft backend: read of %d-byte buffer at %s", cuda.ErrFreed, sb.size, sb.at.name)
	}
	if sb.data != nil {
		out, ok := b.cloneBytes(sb.data)
		if !ok {
			return nil, sb.oom()
		}
		return out, nil
	}
	out, ok := b.makeBytes(sb.size)
	if !ok {
		return nil, sb.oom()
	}
	sb.read(out, 0, true)
	return out, nil
}

// Write copies data into buf; len(data) must equal buf.Size()
// (cuda.ErrInvalid otherwise). It does not wait for stream work on buf.
func (b *Backend) Write(ctx context.Context, buf cuda.Buffer, data []byte) error {
	if b.closed.Load() {
		return cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sb, err := b.own(buf, "buffer")
	if err != nil {
		return err
	}
	if err := check.Write(sb, len(data)); err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.gone() {
		return fmt.Errorf("%w: soft backend: write into %d-byte buffer at %s", cuda.ErrFreed, sb.size, sb.at.name)
	}
	return sb.write(data)
}

// Close refuses new work, cuts short the simulated delays of queued copies,
// drains and stops every stream of the backend, then frees every live
// buffer. Failures that no event reported are dropped (close each stream
// yourself first to see them). Close is idempotent: later and concurrent
// calls wait until the first has finished and return nil. It returns nil.
//
// A stream blocked in WaitEvent on an event that never completes (an event
// of another backend that is never closed) keeps Close waiting.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		<-b.closeDone
		return nil
	}
	b.closed.Store(true)
	streams := make([]*stream, 0, len(b.streams))
	for s := range b.streams {
		streams = append(streams, s)
	}
	b.mu.Unlock()

	b.stop()
	for _, s := range streams {
		_ = s.Close() // undelivered failures are dropped, as documented
	}

	b.mu.Lock()
	bufs := make([]*buffer, 0, len(b.live))
	for buf := range b.live {
		buf.freed.Store(true)
		buf.at.used -= buf.size
		bufs = append(bufs, buf)
	}
	clear(b.live)
	b.mu.Unlock()
	for _, buf := range bufs {
		buf.drop()
	}
	b.recycle.clear()
	close(b.closeDone)
	return nil
}

// copyDuration is the simulated transfer time of n bytes: n/bandwidth
// seconds, rounded down to the nanosecond, saturating at the longest
// time.Duration.
func (b *Backend) copyDuration(n int64) time.Duration {
	if b.bandwidth <= 0 || n <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(n), uint64(time.Second))
	if hi >= uint64(b.bandwidth) {
		return time.Duration(math.MaxInt64)
	}
	q, _ := bits.Div64(hi, lo, uint64(b.bandwidth))
	if q > math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(q)
}

// ReadAt copies the len(p) bytes of buf from offset off into p (zeros for
// a buffer never written), without copying the rest of the buffer (see
// [cuda.RangeReader]). It does not wait for stream work on buf.
//
// Checks run in this order, and on any of these failures p is left as it was:
// backend closed (cuda.ErrClosed), ctx done, foreign or nil buf
// (cuda.ErrInvalid), a range not inside buf (*cuda.RangeError), freed buf
// (cuda.ErrFreed).
func (b *Backend) ReadAt(ctx context.Context, buf cuda.Buffer, off int64, p []byte) error {
	if b.closed.Load() {
		return cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sb, err := b.own(buf, "buffer")
	if err != nil {
		return err
	}
	if err := check.Range(sb, off, len(p)); err != nil {
		return err
	}
	sb.mu.RLock()
	defer sb.mu.RUnlock()
	if sb.gone() {
		return fmt.Errorf("%w: soft backend: read of %d bytes at %d of %s", cuda.ErrFreed, len(p), off, sb)
	}
	sb.read(p, off, false)
	return nil
}
