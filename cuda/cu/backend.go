//go:build cuda

package cu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/cuda"
	gcu "gorgonia.org/cu"
)

// BackendName is what [Backend.Name] returns.
const BackendName = "cu (CUDA driver, gorgonia.org/cu)"

// ErrorPrefix starts the messages of the backend's errors. Give it to
// cuda/faulty.Wrap, so that injected failures read like the backend's own.
const ErrorPrefix = "cu backend"

// check makes the argument checks every backend shares.
var check = cuda.Checker{Prefix: ErrorPrefix}

// Config configures a cu backend.
type Config struct {
	// Locations are the locations the backend serves (well-formed names,
	// node-qualified or not, no duplicates, at least one). cuda:N must name
	// a device the driver reports. Every other location is rejected with
	// cuda.ErrUnknownLocation.
	Locations []string

	// Capacity caps the bytes the backend hands out per location; a
	// location missing here, or mapped to 0, is limited only by what the
	// driver or the C library can allocate. Every key must be one of
	// Locations and every value >= 0. With a cap, MemInfo reports the
	// backend's own buffers against it; without one, MemInfo of cuda:N
	// reports the driver's figures for the whole device.
	Capacity map[string]int64
}

// Backend drives real GPUs through the CUDA driver API (gorgonia.org/cu
// plus a small cgo file of ours for pinned host memory). It implements
// [cuda.Backend]: cuda:N is device memory (cuMemAlloc), pinned-host is
// page-locked host memory (cuMemHostAlloc, portable to every context),
// pageable-host is ordinary C heap memory. It does not implement
// [cuda.Simulator]: [cuda.IsSimulated] reports false.
//
// A Backend is safe for concurrent use by multiple goroutines.
type Backend struct {
	names   []string
	devices map[int]*device // by ordinal, one per configured cuda:N
	home    *device         // context for host memory and host streams

	closed    atomic.Bool   // set (under mu) when Close begins
	closeDone chan struct{} // closed when Close has finished
	calls     sync.WaitGroup

	mu       sync.Mutex // guards the fields below and location counters
	locs     map[string]*location
	streams  map[*stream]struct{}
	live     map[*buffer]struct{}
	nextID   uint64
	deferred error // first failure of a deferred release
}

type location struct {
	kind     cuda.Kind
	ordinal  int // N of cuda:N
	dev      *device
	capacity int64 // 0 = no cap
	used     int64 // guarded by Backend.mu
}

var _ cuda.Backend = (*Backend)(nil)

// New returns a backend for cfg, retaining the primary context of every
// configured device (and of device 0, or the lowest configured one, for
// host memory). It returns an error matching cuda.ErrInvalid for a bad
// Config, an error matching cuda.ErrUnknownLocation for a cuda:N the
// driver does not report, and an [*Error] when the driver fails.
func New(cfg Config) (*Backend, error) {
	parsed, err := check.Config(cfg.Locations, cfg.Capacity)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		names:     slices.Clone(cfg.Locations),
		devices:   map[int]*device{},
		closeDone: make(chan struct{}),
		locs:      make(map[string]*location, len(cfg.Locations)),
		streams:   map[*stream]struct{}{},
		live:      map[*buffer]struct{}{},
	}
	count, err := gcu.NumDevices()
	if err != nil {
		return nil, wrap("cuDeviceGetCount", err)
	}
	if count == 0 {
		return nil, fmt.Errorf("cu backend: the driver reports no device")
	}
	var ordinals []int
	for i, name := range cfg.Locations {
		n := parsed[i]
		if n.Kind == cuda.KindCUDA {
			if n.Device >= count {
				return nil, fmt.Errorf("%w: cu backend: %s, but the driver reports %d device(s)", cuda.ErrUnknownLocation, name, count)
			}
			ordinals = append(ordinals, n.Device)
		}
		b.locs[name] = &location{kind: n.Kind, ordinal: n.Device, capacity: cfg.Capacity[name]}
	}

	homeOrdinal := 0
	if len(ordinals) > 0 {
		homeOrdinal = slices.Min(ordinals)
	}
	for _, o := range append(ordinals, homeOrdinal) {
		if b.devices[o] != nil {
			continue
		}
		d, err := openDevice(o)
		if err != nil {
			b.releaseDevices()
			return nil, err
		}
		b.devices[o] = d
	}
	b.home = b.devices[homeOrdinal]
	for _, l := range b.locs {
		if l.kind == cuda.KindCUDA {
			l.dev = b.devices[l.ordinal]
		} else {
			l.dev = b.home
		}
	}
	return b, nil
}

func (b *Backend) releaseDevices() error {
	var errs []error
	for _, d := range b.devices {
		errs = append(errs, d.close())
	}
	return errors.Join(errs...)
}

// Name returns "cu (CUDA driver, gorgonia.org/cu)".
func (b *Backend) Name() string { return BackendName }

// Locations returns the configured locations in Config order.
func (b *Backend) Locations() []string { return slices.Clone(b.names) }

// DeviceName returns the driver's name of the device of a configured
// cuda:N location ("NVIDIA H100 80GB HBM3").
func (b *Backend) DeviceName(loc string) (string, error) {
	l, err := b.checkLocation(loc)
	if err != nil {
		return "", err
	}
	if l.kind != cuda.KindCUDA {
		return "", fmt.Errorf("%w: cu backend: %s is not a device location", cuda.ErrInvalid, loc)
	}
	name, err := l.dev.dev.Name()
	return name, wrap("cuDeviceGetName", err)
}

// DeviceUUID returns the UUID of the device of a configured cuda:N
// location, as NVML spells it ("GPU-…"), to match a CUDA ordinal with an
// NVML device.
func (b *Backend) DeviceUUID(loc string) (string, error) {
	l, err := b.checkLocation(loc)
	if err != nil {
		return "", err
	}
	if l.kind != cuda.KindCUDA {
		return "", fmt.Errorf("%w: cu backend: %s is not a device location", cuda.ErrInvalid, loc)
	}
	u, err := l.dev.dev.UUID()
	if err != nil {
		return "", wrap("cuDeviceGetUuid", err)
	}
	return "GPU-" + u.String(), nil
}

func (b *Backend) checkLocation(loc string) (*location, error) {
	if l, ok := b.locs[loc]; ok {
		return l, nil
	}
	return nil, check.Unconfigured(loc)
}

func (b *Backend) own(buf cuda.Buffer, what string) (*buffer, error) {
	cb, ok := buf.(*buffer)
	if !ok || cb == nil || cb.backend != b {
		return nil, check.Foreign(what, buf, ok && cb != nil)
	}
	return cb, nil
}

// enter registers a call that Close must wait for; false once closed.
func (b *Backend) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.calls.Add(1)
	return true
}

func (b *Backend) exit() { b.calls.Done() }

func (b *Backend) noteDeferred(err error) {
	if err == nil {
		return
	}
	b.mu.Lock()
	if b.deferred == nil {
		b.deferred = err
	}
	b.mu.Unlock()
}

// Allocate returns a buffer of bytes bytes at loc; its contents are
// unspecified until written.
//
// Checks run in this order, and the first failure is returned with nothing
// allocated: backend closed (cuda.ErrClosed), ctx done, malformed or
// unconfigured loc, bytes <= 0 (cuda.ErrInvalid), the configured capacity
// (*cuda.OutOfMemoryError), then the allocation itself: a refusal by the
// driver (CUDA_ERROR_OUT_OF_MEMORY) or the C library is an
// *cuda.OutOfMemoryError too (wrapping the driver's [*Error]); any other
// driver failure is an [*Error].
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
	if !b.enter() {
		return nil, cuda.ErrClosed
	}
	defer b.exit()

	b.mu.Lock()
	if l.capacity > 0 && bytes > l.capacity-l.used {
		free := l.capacity - l.used
		b.mu.Unlock()
		return nil, &cuda.OutOfMemoryError{Location: loc, Requested: bytes, Free: free}
	}
	l.used += bytes // reserved first, so concurrent allocations never overshoot
	b.nextID++
	buf := &buffer{backend: b, id: b.nextID, loc: loc, kind: l.kind, dev: l.dev, size: bytes}
	b.mu.Unlock()

	if err := b.allocate(buf); err != nil {
		b.mu.Lock()
		l.used -= bytes
		b.mu.Unlock()
		return nil, err
	}
	b.mu.Lock()
	b.live[buf] = struct{}{}
	b.mu.Unlock()
	return buf, nil
}

// allocate makes buf's memory.
func (b *Backend) allocate(buf *buffer) error {
	oom := func(cause error) error {
		e := &cuda.OutOfMemoryError{Location: buf.loc, Requested: buf.size}
		if mi, err := b.MemInfo(buf.loc); err == nil {
			e.Free = mi.FreeBytes
		}
		if cause == nil {
			return e
		}
		return fmt.Errorf("%w (%w)", e, cause)
	}
	switch buf.kind {
	case cuda.KindCUDA:
		err := buf.dev.do(func() error {
			p, err := gcu.MemAlloc(buf.size)
			buf.dptr = p
			return wrap(fmt.Sprintf("cuMemAlloc(%d B) at %s", buf.size, buf.loc), err)
		})
		if isCode(err, codeOutOfMemory) {
			return oom(err)
		}
		return err
	case cuda.KindPinnedHost:
		err := buf.dev.do(func() error {
			p, err := memHostAlloc(buf.size)
			buf.host = p
			return wrap(fmt.Sprintf("cuMemHostAlloc(%d B) at %s", buf.size, buf.loc), err)
		})
		if isCode(err, codeOutOfMemory) {
			return oom(err)
		}
		return err
	default:
		buf.host = hostAlloc(buf.size)
		if buf.host == nil {
			return oom(nil)
		}
		return nil
	}
}

// Free marks buf freed and returns its bytes to its location's capacity at
// once. Its memory is released now, or, if a copy already issued to the
// GPU or a Read, Write or Load still uses it, as soon as the last of them
// finishes; copies still queued on a stream (not yet issued) fail with
// cuda.ErrFreed. A second Free returns an error matching cuda.ErrFreed; a
// foreign buffer cuda.ErrInvalid; after Close, cuda.ErrClosed. A driver
// failure to release memory at once is returned as an [*Error]; a deferred
// one is returned by Close.
func (b *Backend) Free(buf cuda.Buffer) error {
	cb, err := b.own(buf, "buffer")
	if err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return cuda.ErrClosed
	}
	cb.mu.Lock()
	if cb.freed {
		cb.mu.Unlock()
		b.mu.Unlock()
		return fmt.Errorf("%w: cu backend: %s", cuda.ErrFreed, cb)
	}
	cb.freed = true
	now := cb.refs == 0
	cb.mu.Unlock()
	b.locs[cb.loc].used -= cb.size
	delete(b.live, cb)
	if now {
		b.calls.Add(1) // Close waits for the release below
	}
	b.mu.Unlock()
	if !now {
		return nil
	}
	defer b.exit()
	return cb.dispose()
}

// MemInfo reports the memory of loc. With a configured capacity it is the
// backend's own accounting: UsedBytes the sizes of live buffers, TotalBytes
// the capacity. Without one, for cuda:N it is the driver's view of the
// whole device (cuMemGetInfo: free and total, used = total - free, other
// processes included), and a host location is unlimited (TotalBytes 0,
// UsedBytes the sizes of live buffers).
func (b *Backend) MemInfo(loc string) (cuda.MemInfo, error) {
	if b.closed.Load() {
		return cuda.MemInfo{}, cuda.ErrClosed
	}
	l, err := b.checkLocation(loc)
	if err != nil {
		return cuda.MemInfo{}, err
	}
	if l.capacity == 0 && l.kind == cuda.KindCUDA {
		var free, total int64
		err := l.dev.do(func() error {
			var err error
			free, total, err = gcu.MemInfo()
			return wrap("cuMemGetInfo", err)
		})
		if err != nil {
			return cuda.MemInfo{}, err
		}
		return cuda.MemInfo{FreeBytes: free, TotalBytes: total, UsedBytes: total - free}, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return cuda.MemInfo{FreeBytes: cuda.FreeBytes(l.capacity, l.used), TotalBytes: l.capacity, UsedBytes: l.used}, nil
}

// NewStream returns a new stream on the device of loc (host locations: the
// home device, the lowest configured cuda:N or device 0). It is a CUDA
// stream created non-blocking (no implicit synchronization with the legacy
// default stream), fed by a goroutine of its own; see [cuda.Stream].
func (b *Backend) NewStream(loc string) (cuda.Stream, error) {
	if b.closed.Load() {
		return nil, cuda.ErrClosed
	}
	l, err := b.checkLocation(loc)
	if err != nil {
		return nil, err
	}
	if !b.enter() {
		return nil, cuda.ErrClosed
	}
	defer b.exit()
	s := newStream(b, loc, l.dev)
	if err := s.start(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.closed.Load() { // Close began while the stream was starting
		b.mu.Unlock()
		_ = s.Close()
		return nil, cuda.ErrClosed
	}
	b.streams[s] = struct{}{}
	b.mu.Unlock()
	return s, nil
}

func (b *Backend) forget(s *stream) {
	b.mu.Lock()
	delete(b.streams, s)
	b.mu.Unlock()
}

// Load runs loader synchronously to fill dst. For a host buffer the loader
// writes into the buffer's own memory; for a device buffer it writes into
// a temporary Go slice of dst's size, which is then copied to the device
// (so a device load needs that much host memory for its duration).
//
// Checks run in this order: backend closed, ctx done, foreign or nil dst or
// nil loader (cuda.ErrInvalid), freed dst (cuda.ErrFreed), malformed target
// (empty target = dst.Location()). A loader error is returned wrapped; a
// loader panic as *cuda.LoaderPanicError.
func (b *Backend) Load(ctx context.Context, dst cuda.Buffer, target string, loader cuda.Loader) error {
	if b.closed.Load() {
		return cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	cb, err := b.own(dst, "load destination")
	if err != nil {
		return err
	}
	if err := check.Loader(loader); err != nil {
		return err
	}
	if cb.isFreed() {
		return fmt.Errorf("%w: cu backend: load into %s", cuda.ErrFreed, cb)
	}
	if err := check.LoadTarget(target); err != nil {
		return err
	}
	if target == "" {
		target = cb.loc
	}
	if !b.enter() {
		return cuda.ErrClosed
	}
	defer b.exit()
	if !cb.acquire() {
		return fmt.Errorf("%w: cu backend: load into %s", cuda.ErrFreed, cb)
	}
	defer cb.release()

	into := func(data []byte) error { return check.RunLoader(ctx, loader, data, cb.loc, target) }
	if cb.kind != cuda.KindCUDA {
		return into(cb.hostBytes())
	}
	tmp := make([]byte, cb.size)
	if err := into(tmp); err != nil {
		return err
	}
	return cb.dev.fromHost(cb.dptr, tmp, cb.loc)
}

// Read returns a copy of buf's bytes in a new slice. It does not wait for
// stream work on buf: wait on an event first. A device buffer is read with
// a copy on the device's private stream, one Read or Write per device at
// a time.
func (b *Backend) Read(ctx context.Context, buf cuda.Buffer) ([]byte, error) {
	if b.closed.Load() {
		return nil, cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cb, err := b.own(buf, "buffer")
	if err != nil {
		return nil, err
	}
	if !b.enter() {
		return nil, cuda.ErrClosed
	}
	defer b.exit()
	if !cb.acquire() {
		return nil, fmt.Errorf("%w: cu backend: read of %s", cuda.ErrFreed, cb)
	}
	defer cb.release()
	out := make([]byte, cb.size)
	if cb.kind != cuda.KindCUDA {
		copy(out, cb.hostBytes())
		return out, nil
	}
	if err := cb.dev.toHost(out, cb.dptr, cb.loc); err != nil {
		return nil, err
	}
	return out, nil
}

// Write copies data into buf; len(data) must equal buf.Size()
// (cuda.ErrInvalid otherwise). It does not wait for stream work on buf. A
// device buffer is written with a copy on the device's private stream,
// complete when Write returns.
func (b *Backend) Write(ctx context.Context, buf cuda.Buffer, data []byte) error {
	if b.closed.Load() {
		return cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	cb, err := b.own(buf, "buffer")
	if err != nil {
		return err
	}
	if err := check.Write(cb, len(data)); err != nil {
		return err
	}
	if !b.enter() {
		return cuda.ErrClosed
	}
	defer b.exit()
	if !cb.acquire() {
		return fmt.Errorf("%w: cu backend: write into %s", cuda.ErrFreed, cb)
	}
	defer cb.release()
	if cb.kind != cuda.KindCUDA {
		copy(cb.hostBytes(), data)
		return nil
	}
	return cb.dev.fromHost(cb.dptr, data, cb.loc)
}

// Close refuses new work with cuda.ErrClosed, waits for calls in progress
// (a running Load included), drains and stops every stream, releases every
// live buffer and the primary contexts it retained. Failures that no event
// reported are dropped (close each stream first to see them). It returns
// the driver's failures to release memory or contexts, if any; later and
// concurrent calls wait for the first to finish and return nil.
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

	b.calls.Wait()
	for _, s := range streams {
		_ = s.Close() // undelivered failures are dropped, as documented
	}

	b.mu.Lock()
	bufs := make([]*buffer, 0, len(b.live))
	for buf := range b.live {
		buf.mu.Lock()
		buf.freed = true
		buf.mu.Unlock()
		b.locs[buf.loc].used -= buf.size
		bufs = append(bufs, buf)
	}
	clear(b.live)
	errs := []error{b.deferred}
	b.mu.Unlock()
	for _, buf := range bufs {
		errs = append(errs, buf.dispose()) // no references remain: streams and calls are done
	}
	errs = append(errs, b.releaseDevices())
	close(b.closeDone)
	return errors.Join(errs...)
}
