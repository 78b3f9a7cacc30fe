package soft

import (
	"context"

	"github.com/residency-go/residency/cuda"
)

// The operations of a large buffer on its region (see region). Each is
// called with the buffer's mu held: for writing, except readRegion.

// chunks returns the number of chunks of the buffer.
func (b *buffer) chunks() int {
	return int((b.size + b.backend.chunk - 1) / b.backend.chunk)
}

// span returns the byte range [lo, hi) of chunk i.
func (b *buffer) span(i int) (lo, hi int64) {
	lo = int64(i) * b.backend.chunk
	return lo, min(lo+b.backend.chunk, b.size)
}

// ensureRegion makes the buffer's region, all zero, if it has none.
func (b *buffer) ensureRegion() error {
	if b.sparse != nil {
		return nil
	}
	r, ok := newRegion(b.size, b.backend.chunk)
	if !ok {
		return b.oom()
	}
	b.sparse = r
	return nil
}

// markDirty records that chunk i may hold non-zero bytes.
func (b *buffer) markDirty(i int) {
	if b.sparse.setDirty(i) {
		lo, hi := b.span(i)
		b.backend.real.Add(hi - lo)
	}
}

// cleanChunk makes chunk i zero, releasing its memory, if it is dirty.
// The chunks of a buffer in place stay dirty: its host view may write
// any of them (see HostBytes).
func (b *buffer) cleanChunk(i int) {
	if b.sparse == nil || !b.sparse.isDirty(i) {
		return
	}
	lo, hi := b.span(i)
	b.sparse.zeroRange(b.sparse.mem[lo:hi])
	if b.inPlace {
		return
	}
	b.sparse.clearDirty(i)
	b.backend.real.Add(lo - hi)
}

// releaseRegion gives back the buffer's region, whatever it holds.
func (b *buffer) releaseRegion() {
	r := b.sparse
	if r == nil {
		return
	}
	for i := r.nextDirty(0); i >= 0; i = r.nextDirty(i + 1) {
		lo, hi := b.span(i)
		b.backend.real.Add(lo - hi)
	}
	r.release()
	b.sparse = nil
}

// releaseIfClean gives back the region if no chunk of it is dirty.
func (b *buffer) releaseIfClean() {
	if b.sparse != nil && b.sparse.ndirty == 0 {
		b.releaseRegion()
	}
}

// readRegion copies the dirty chunks' bytes in [off, off+len(p)) into p,
// leaving the rest of p as it is (zeros: the caller's).
func (b *buffer) readRegion(p []byte, off int64) {
	r, end := b.sparse, off+int64(len(p))
	for i := r.nextDirty(int(off / b.backend.chunk)); i >= 0; i = r.nextDirty(i + 1) {
		lo, hi := b.span(i)
		if lo >= end {
			return
		}
		lo, hi = max(lo, off), min(hi, end)
		copy(p[lo-off:hi-off], r.mem[lo:hi])
	}
}

// writeRegion copies data into the buffer chunk by chunk: a chunk of data
// that is all zero is not written and cleans the chunk it replaces.
func (b *buffer) writeRegion(data []byte) error {
	for i := range b.chunks() {
		lo, hi := b.span(i)
		part := data[lo:hi]
		if allZero(part) {
			b.cleanChunk(i)
			continue
		}
		if err := b.ensureRegion(); err != nil {
			return err
		}
		copy(b.sparse.mem[lo:hi], part)
		b.markDirty(i)
	}
	b.releaseIfClean()
	return nil
}

// copyRegion copies src's dirty chunks into dst and cleans at dst the
// chunks src lacks; dst and src are large buffers of the same size.
func copyRegion(dst, src *buffer) error {
	if src.sparse == nil && !dst.inPlace {
		dst.releaseRegion() // a copy of zeros is zeros: no real bytes
		return nil
	}
	if err := dst.ensureRegion(); err != nil {
		return err
	}
	for i := range dst.chunks() {
		if src.sparse == nil || !src.sparse.isDirty(i) {
			dst.cleanChunk(i)
			continue
		}
		lo, hi := dst.span(i)
		copy(dst.sparse.mem[lo:hi], src.sparse.mem[lo:hi])
		dst.markDirty(i)
	}
	return nil
}

// loadRegion runs loader on the whole region, then finds the chunks it
// wrote: a chunk that was not dirty becomes dirty if its pages were
// touched (see touchedChunks) and hold a non-zero byte; a touched chunk
// that is still zero gives its pages back. A loader that writes nothing
// leaves the buffer holding nothing.
func (b *buffer) loadRegion(ctx context.Context, loader cuda.Loader, target string) error {
	if err := b.ensureRegion(); err != nil {
		return err
	}
	r := b.sparse
	err := check.RunLoader(ctx, loader, r.mem, b.at.name, target)
	touchedChunks(r.mem, b.backend.chunk, r.isDirty, func(i int) {
		lo, hi := b.span(i)
		if allZero(r.mem[lo:hi]) {
			r.zeroRange(r.mem[lo:hi])
		} else {
			b.markDirty(i)
		}
	})
	b.releaseIfClean()
	return err
}
