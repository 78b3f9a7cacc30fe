package soft

import (
	"fmt"

	"github.com/residency-go/residency/cuda"
)

// HostBytes returns the bytes of a buffer at a host location in place
// (see [cuda.HostMemory]): a buffer under 32 MiB its one piece of memory,
// a larger one its whole region (on Linux the mapping its loaders get).
//
// From the first call on the buffer is in place for the rest of its life:
// it holds its whole size in real memory (RealBytes counts it whole) and
// every chunk of a large buffer is dirty, so that Read, ReadAt, Load and
// stream copies see every byte written through the view; zeros written
// or copied over it are stored like any other bytes instead of releasing
// memory, and Free does not hand its memory to another buffer.
//
// A buffer at a cuda:N location matches cuda.ErrNoHostMemory, a freed
// buffer cuda.ErrFreed; memory the Go runtime (or the kernel) refuses is
// an *cuda.OutOfMemoryError.
func (b *buffer) HostBytes() ([]byte, error) {
	if !b.at.host {
		return nil, fmt.Errorf("%w: soft backend: %s is device memory", cuda.ErrNoHostMemory, b)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gone() {
		return nil, fmt.Errorf("%w: soft backend: host view of %s", cuda.ErrFreed, b)
	}
	if !b.inPlace {
		if err := b.placeInMemory(); err != nil {
			return nil, err
		}
		b.inPlace = true
	}
	if b.large() {
		return b.sparse.mem, nil
	}
	return b.data, nil
}

// placeInMemory makes all of the buffer's bytes real: a small buffer's
// piece of memory, or a large buffer's region with every chunk dirty;
// b.mu is held for writing.
func (b *buffer) placeInMemory() error {
	if !b.large() {
		return b.materialize()
	}
	if err := b.ensureRegion(); err != nil {
		return err
	}
	for i := range b.chunks() {
		b.markDirty(i)
	}
	return nil
}
