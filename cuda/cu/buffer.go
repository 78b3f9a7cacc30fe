//go:build cuda

package cu

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/residency-go/residency/cuda"
	gcu "gorgonia.org/cu"
)

// buffer is one allocation: device memory (cuMemAlloc) for cuda:N, page-
// locked host memory (cuMemHostAlloc) for pinned-host, C heap memory
// (malloc) for pageable-host. Host memory is C memory, never Go memory, so
// that asynchronous copies may keep using it after the call that issued
// them has returned.
//
// Lifetime: Free marks the buffer freed at once (later uses fail with
// cuda.ErrFreed and its bytes return to the location's capacity), but the
// memory itself is released only when no copy issued to the GPU and no
// Read, Write or Load still uses it (refs == 0).
type buffer struct {
	backend *Backend
	id      uint64
	loc     string
	kind    cuda.Kind
	dev     *device // the owning GPU; for host buffers the backend's home device
	size    int64
	dptr    gcu.DevicePtr  // cuda:N
	host    unsafe.Pointer // pinned-host, pageable-host

	mu    sync.Mutex // guards freed and refs
	freed bool
	refs  int
}

var (
	_ cuda.Buffer     = (*buffer)(nil)
	_ cuda.HostMemory = (*buffer)(nil)
)

// Location returns the location the buffer was allocated at.
func (b *buffer) Location() string { return b.loc }

// Size returns the buffer's length in bytes.
func (b *buffer) Size() int64 { return b.size }

// String describes the buffer for logs, e.g. "cu buffer #3 (4096 B at cuda:0)".
func (b *buffer) String() string {
	return fmt.Sprintf("cu buffer #%d (%d B at %s)", b.id, b.size, b.loc)
}

// hostBytes returns the host memory of a host buffer as a slice. The
// caller holds a reference.
func (b *buffer) hostBytes() []byte { return unsafe.Slice((*byte)(b.host), b.size) }

// HostBytes returns the memory of a host buffer (page-locked for
// pinned-host, C heap memory for pageable-host) in place; see
// [cuda.HostMemory]. It is the memory the backend's copies, Read, Write
// and Load use. A cuda:N buffer matches cuda.ErrNoHostMemory, a freed
// one cuda.ErrFreed.
func (b *buffer) HostBytes() ([]byte, error) {
	if b.kind == cuda.KindCUDA {
		return nil, fmt.Errorf("%w: cu backend: %s is device memory", cuda.ErrNoHostMemory, b)
	}
	if b.isFreed() {
		return nil, fmt.Errorf("%w: cu backend: host view of %s", cuda.ErrFreed, b)
	}
	return b.hostBytes(), nil
}

func (b *buffer) isFreed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.freed
}

// acquire takes a reference that keeps the memory alive, or fails with
// cuda.ErrFreed.
func (b *buffer) acquire() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return false
	}
	b.refs++
	return true
}

// release drops a reference; the last one of a freed buffer releases its
// memory.
func (b *buffer) release() {
	b.mu.Lock()
	b.refs--
	last := b.freed && b.refs == 0
	b.mu.Unlock()
	if last {
		b.backend.noteDeferred(b.dispose())
	}
}

// dispose releases the memory. Called exactly once, when the buffer is
// freed and unreferenced.
func (b *buffer) dispose() error {
	switch b.kind {
	case cuda.KindCUDA:
		return b.dev.do(func() error { return wrap(fmt.Sprintf("cuMemFree(%d B) at %s", b.size, b.loc), gcu.MemFree(b.dptr)) })
	case cuda.KindPinnedHost:
		return b.dev.do(func() error {
			return wrap(fmt.Sprintf("cuMemFreeHost(%d B) at %s", b.size, b.loc), memFreeHost(b.host))
		})
	default:
		hostFree(b.host)
		return nil
	}
}
