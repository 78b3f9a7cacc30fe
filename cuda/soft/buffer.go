package soft

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/cuda"
)

// buffer is a simulated allocation. A buffer smaller than
// Backend.sparseMin keeps its bytes in one Go slice, made on its first
// non-zero write; a larger one in a region (see region), whose chunks are
// made as they are written. Either way a buffer never written holds no
// memory and reads as zeros (see the package doc).
//
// Lock order: Backend.mu before any buffer.mu; two buffer locks are taken in
// increasing id order (see lockPair). Stream goroutines never hold
// Backend.mu.
type buffer struct {
	backend *Backend
	id      uint64    // unique per backend, > 0
	at      *location // where it was allocated
	size    int64
	mu      sync.RWMutex // guards data, sparse, inPlace and dropped
	data    []byte       // a small buffer's bytes, len size; nil: all zero
	sparse  *region      // a large buffer's bytes; nil: all zero
	freed   atomic.Bool  // set once, by Free or Backend.Close
	dropped bool         // the buffer was freed and its bytes released
	inPlace bool         // HostBytes handed out its memory: see HostBytes
}

var (
	_ cuda.Buffer     = (*buffer)(nil)
	_ cuda.HostMemory = (*buffer)(nil)
)

// Location returns the location the buffer was allocated at.
func (b *buffer) Location() string { return b.at.name }

// Size returns the buffer's length in bytes.
func (b *buffer) Size() int64 { return b.size }

// String describes the buffer for logs, e.g. "soft buffer #3 (4096 B at cuda:0)".
func (b *buffer) String() string {
	return fmt.Sprintf("soft buffer #%d (%d B at %s)", b.id, b.size, b.at.name)
}

// drop releases the bytes of a freed buffer, waiting for any copy, Read,
// Write or Load that holds them.
func (b *buffer) drop() {
	b.mu.Lock()
	b.setData(nil)
	b.releaseRegion()
	b.dropped = true
	b.mu.Unlock()
}

// gone reports whether the buffer was freed; b.mu is held.
func (b *buffer) gone() bool { return b.dropped || b.freed.Load() }

// large reports whether the buffer's bytes are a region.
func (b *buffer) large() bool { return b.size >= b.backend.sparseMin }

// setData replaces a small buffer's bytes (nil: all zero) and keeps the
// backend's count of real bytes; b.mu is held for writing.
func (b *buffer) setData(d []byte) {
	b.backend.real.Add(int64(len(d)) - int64(len(b.data)))
	if b.data != nil && !b.inPlace && !b.backend.closed.Load() {
		b.backend.recycle.put(b.data) // nothing else holds them: see recycler
	}
	b.data = d
}

// materialize makes a small buffer's bytes, zeroed, if it has none yet;
// b.mu is held for writing. A size the Go runtime refuses is an
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
		&cuda.OutOfMemoryError{Location: b.at.name, Requested: b.size})
}

// read copies the len(p) bytes from off into p (zeros where nothing was
// written); b.mu is held. p is zero already if zeroed.
func (b *buffer) read(p []byte, off int64, zeroed bool) {
	switch {
	case b.data != nil:
		copy(p, b.data[off:])
	case b.sparse != nil:
		if !zeroed {
			clear(p)
		}
		b.readRegion(p, off)
	case !zeroed:
		clear(p)
	}
}

// write copies data, of the buffer's size, into the buffer; b.mu is held
// for writing. Zeros are not written: they release what they replace.
func (b *buffer) write(data []byte) error {
	if b.large() {
		return b.writeRegion(data)
	}
	if b.data != nil && b.inPlace {
		copy(b.data, data)
		return nil
	}
	if allZero(data) {
		b.setData(nil)
		return nil
	}
	if b.data != nil {
		copy(b.data, data)
		return nil
	}
	d, ok := b.backend.cloneBytes(data)
	if !ok {
		return b.oom()
	}
	b.setData(d)
	return nil
}

// load runs loader on the buffer's bytes; b.mu is held for writing. What
// the loader left zero holds no memory afterwards (a small buffer that had
// none and is still all zero; a large buffer's chunks it did not write).
func (b *buffer) load(ctx context.Context, loader cuda.Loader, target string) error {
	if b.large() {
		return b.loadRegion(ctx, loader, target)
	}
	fresh := b.data == nil
	if err := b.materialize(); err != nil {
		return err
	}
	err := check.RunLoader(ctx, loader, b.data, b.at.name, target)
	if fresh && allZero(b.data) {
		b.setData(nil)
	}
	return err
}

// copyBuffer copies src's bytes into dst, holding both, and fails with
// cuda.ErrFreed if either was freed. dst and src are distinct buffers of
// the same size. Only written bytes are copied: what src lacks is zero,
// and releases what it replaces at dst.
func copyBuffer(dst, src *buffer) error {
	unlock := lockPair(dst, src)
	defer unlock()
	for _, b := range [...]*buffer{src, dst} {
		if b.gone() {
			return fmt.Errorf("%w: soft backend: copy %s -> %s: %s was freed before the copy ran",
				cuda.ErrFreed, src.at.name, dst.at.name, b)
		}
	}
	switch {
	case dst.large():
		return copyRegion(dst, src)
	case src.data == nil && dst.inPlace:
		clear(dst.data)
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
