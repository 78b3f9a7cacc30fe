package soft

import (
	"bytes"
	"math/bits"
	"os"
	"runtime"
)

// Large buffers (from Backend.sparseMin bytes up) keep their bytes in a
// region: one contiguous piece of memory of the buffer's size, so that a
// Loader gets it whole, divided into chunks of Backend.chunk bytes, with
// one bit per chunk that is set while the chunk may hold a non-zero byte
// (dirty). A chunk that is not dirty is all zeros in the memory too, and
// costs nothing where the memory is an OS mapping whose untouched pages
// are not backed (Linux: see mapMemory): copies move only the dirty
// chunks and zero at the destination the chunks the source lacks, reads
// copy only the dirty chunks, and a Load finds the chunks its loader wrote
// afterwards (see buffer.loadRegion). A region with no dirty chunk is
// given back at once, so a large buffer never written holds nothing.

// defaultSparseMin is Backend.sparseMin: the size from which a buffer's
// bytes are a region. Smaller buffers are one Go slice, made whole on the
// first non-zero write.
const defaultSparseMin = 32 << 20

// defaultChunk is Backend.chunk: the granularity of a region's dirty
// chunks, a multiple of the OS page size.
func defaultChunk() int64 {
	return max(64<<10, int64(os.Getpagesize()))
}

// region is the memory of a large buffer; guarded by its buffer's mu.
type region struct {
	mem     []byte   // the buffer's bytes, len = buffer size
	dirty   []uint64 // bit i: chunk i may hold a non-zero byte
	ndirty  int      // set bits in dirty
	cleanup runtime.Cleanup
	mapped  bool // mem is an OS mapping (unmapMemory gives it back)
}

// isDirty reports whether chunk i may hold a non-zero byte.
func (r *region) isDirty(i int) bool { return r.dirty[i/64]&(1<<(i%64)) != 0 }

// setDirty sets chunk i's bit and reports whether it was clear.
func (r *region) setDirty(i int) bool {
	if r.isDirty(i) {
		return false
	}
	r.dirty[i/64] |= 1 << (i % 64)
	r.ndirty++
	return true
}

// clearDirty clears chunk i's bit and reports whether it was set.
func (r *region) clearDirty(i int) bool {
	if !r.isDirty(i) {
		return false
	}
	r.dirty[i/64] &^= 1 << (i % 64)
	r.ndirty--
	return true
}

// nextDirty returns the first dirty chunk from i on, or -1.
func (r *region) nextDirty(i int) int {
	for w := i / 64; w < len(r.dirty); w++ {
		word := r.dirty[w]
		if w == i/64 {
			word &^= 1<<(i%64) - 1
		}
		if word != 0 {
			return w*64 + bits.TrailingZeros64(word)
		}
	}
	return -1
}

// newRegion returns a region of n bytes, all zero and none dirty, in
// chunks of chunk bytes; false if the memory cannot be had.
func newRegion(n, chunk int64) (*region, bool) {
	mem, mapped, ok := mapMemory(n)
	if !ok {
		return nil, false
	}
	nchunks := (n + chunk - 1) / chunk
	r := &region{mem: mem, dirty: make([]uint64, (nchunks+63)/64), mapped: mapped}
	if mapped { // a region its buffer forgot (a backend never closed) still goes back
		r.cleanup = runtime.AddCleanup(r, unmapMemory, mem)
	}
	return r, true
}

// release gives the region's memory back; the region is not used again.
func (r *region) release() {
	if r.mapped {
		r.cleanup.Stop()
		unmapMemory(r.mem)
	}
	r.mem, r.dirty, r.ndirty = nil, nil, 0
}

// zeroRange makes p, a chunk of a region, all zero, giving back its pages
// where the memory is a mapping.
func (r *region) zeroRange(p []byte) {
	if !r.mapped || !dropPages(p) {
		clear(p)
	}
}

// zeroBlock is compared against to find zero bytes.
var zeroBlock [16 << 10]byte

// allZero reports whether every byte of p is zero.
func allZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroBlock))
		if !bytes.Equal(p[:n], zeroBlock[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

// goMemory returns n zero bytes of Go memory, or false if the Go runtime
// refuses the length.
func goMemory(n int64) (mem []byte, ok bool) {
	defer func() {
		if recover() != nil {
			mem, ok = nil, false
		}
	}()
	return make([]byte, n), true
}

// visitAll calls visit(i) for each of the n chunks that skip(i) does not
// exclude.
func visitAll(n int, skip func(i int) bool, visit func(i int)) {
	for i := range n {
		if !skip(i) {
			visit(i)
		}
	}
}
