package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/cuda"
)

// buffer is a simulated allocation: a Go byte slice, whatever its location.
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
	mu      sync.RWMutex // guards data
	data    []byte       // nil once dropped after Free
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
	b.data = nil
	b.mu.Unlock()
}

// copyBuffer copies src's bytes into dst, holding both, and fails with
// cuda.ErrFreed if either was freed. dst and src are distinct buffers of
// the same size.
func copyBuffer(dst, src *buffer) error {
	unlock := lockPair(dst, src)
	defer unlock()
	for _, b := range [...]*buffer{src, dst} {
		if b.data == nil || b.freed.Load() {
			return fmt.Errorf("%w: soft backend: copy %s -> %s: %s was freed before the copy ran",
				cuda.ErrFreed, src.loc, dst.loc, b)
		}
	}
	copy(dst.data, src.data)
	return nil
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
