package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/cuda"
)

// buffer is a simulated allocation: a Go byte slice, whatever its location,
// made on the buffer's first write (see the package doc: lazily).
//
// Lock order: Backend.mu before any buffer.mu; two buffer locks are taken in
// increasing id order (see lockPair). Stream goroutines never hold
// Backend.mu.
type buffer struct {
	backend *Backend
	id      uint64 // unique per backend, > 0
	loc     string
	size    int64
	freed   atomic.Bool  // set once, by Free or Backend.Close
	mu      sync.RWMutex // guards data and dropped
	data    []byte       // the bytes, len size; nil: all zero (never written, or a copy of such a buffer)
	dropped bool         // the buffer was freed and its bytes released
}

var _ cuda.Buffer = (*buffer)(nil)

// Location returns the location the buffer was allocated at.
func (b *buffer) Location() string { return b.loc }

// Size returns the buffer's length in bytes.
func (b *buffer) Size() int64 { return b.size }

// String describes the buffer for logs, e.g. "soft buffer #3 (4096 B at cuda:0)".
func (b *buffer) String() string {
	return fmt.Sprintf("soft buffer #%d (%d B at %s)", b.id, b.size, b.loc)
}

// drop releases the bytes of a freed buffer, waiting for any copy, Read,
// Write or Load that holds them.
func (b *buffer) drop() {
	b.mu.Lock()
	b.setData(nil)
	b.dropped = true
	b.mu.Unlock()
}

// gone reports whether the buffer was freed; b.mu is held.
func (b *buffer) gone() bool { return b.dropped || b.freed.Load() }

// setData replaces the buffer's bytes (nil: all zero) and keeps the
// backend's count of real bytes; b.mu is held for writing.
func (b *buffer) setData(d []byte) {
	b.backend.real.Add(int64(len(d)) - int64(len(b.data)))
	if b.data != nil && !b.backend.closed.Load() {
		b.backend.recycle.put(b.data) // nothing else holds them: see recycler
	}
	b.data = d
}

// materialize makes the buffer's bytes, zeroed, if it has none yet; b.mu
// is held for writing. A size the Go runtime refuses is an
// *cuda.OutOfMemoryError.
func (b *buffer) materialize() error {
	if b.data != nil {
		return nil
	}
	d, ok := b.backend.makeBytes(b.size)
	if !ok {
		return b.oom()
	}
	b.setData(d)
	return nil
}

// oom is the error of bytes the Go runtime would not make.
func (b *buffer) oom() error {
	return fmt.Errorf("soft backend: the %d real bytes of %s: %w", b.size, b,
		&cuda.OutOfMemoryError{Location: b.loc, Requested: b.size})
}

// copyBuffer copies src's bytes into dst, holding both, and fails with
// cuda.ErrFreed if either was freed. dst and src are distinct buffers of
// the same size.
func copyBuffer(dst, src *buffer) error {
	unlock := lockPair(dst, src)
	defer unlock()
	for _, b := range [...]*buffer{src, dst} {
		if b.gone() {
			return fmt.Errorf("%w: soft backend: copy %s -> %s: %s was freed before the copy ran",
				cuda.ErrFreed, src.loc, dst.loc, b)
		}
	}
	switch {
	case src.data == nil:
		dst.setData(nil) // a copy of zeros is zeros: no real bytes
	case dst.data == nil:
		d, ok := dst.backend.cloneBytes(src.data)
		if !ok {
			return dst.oom()
		}
		dst.setData(d)
	default:
		copy(dst.data, src.data)
	}
	return nil
}

// cloneBytes returns a copy of p in new memory (recycled, or not zeroed
// first), or false if the Go runtime refuses the length.
func (b *Backend) cloneBytes(p []byte) (out []byte, ok bool) {
	if d := b.recycle.get(int64(len(p)), false); d != nil {
		copy(d, p)
		return d, true
	}
	defer func() {
		if recover() != nil {
			out, ok = nil, false
		}
	}()
	return append(make([]byte, 0, len(p)), p...), true
}

// lockPair locks dst for writing and src for reading, in id order so that
// opposite copies on two streams cannot deadlock.
func lockPair(dst, src *buffer) (unlock func()) {
	if dst.id < src.id {
		dst.mu.Lock()
		src.mu.RLock()
	} else {
		src.mu.RLock()
		dst.mu.Lock()
	}
	return func() {
		dst.mu.Unlock()
		src.mu.RUnlock()
	}
}
