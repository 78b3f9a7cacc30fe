package soft

import (
	"sync"
	"sync/atomic"
)

// recycler hands the bytes of freed buffers to the next buffer of the same
// size, so that a simulation that frees and writes buffers of a few sizes
// over and over (a replay placing and evicting 1 MiB values) makes no
// garbage: each dropped megabyte would otherwise cost the Go collector a
// cycle every few frees, and every new one would be zeroed by the Go
// runtime before being overwritten.
//
// Bytes wait in a sync.Pool per size: the Go runtime reclaims what is not
// reused within two collections, as it would the dropped slice itself, so
// a freed buffer's memory goes back to the Go runtime as before, only not
// at the first collection. Only sizes from recycleMin up are kept (smaller
// ones cost the allocator little), and at most recycleSizes distinct sizes
// (a simulation of many sizes allocates as before for the others). A
// recycled slice has exactly the size asked for, so the real memory of
// the live buffers is still their total size (RealBytes).
type recycler struct {
	pools sync.Map // int64 size → *sync.Pool of *[]byte of that length
	sizes atomic.Int32
}

const (
	recycleMin   = 64 << 10
	recycleSizes = 32
)

// pool returns the pool of size n, making it if there is room; nil if n is
// not recycled.
func (r *recycler) pool(n int64, create bool) *sync.Pool {
	if n < recycleMin {
		return nil
	}
	if p, ok := r.pools.Load(n); ok {
		return p.(*sync.Pool)
	}
	if !create || r.sizes.Load() >= recycleSizes {
		return nil
	}
	p, loaded := r.pools.LoadOrStore(n, &sync.Pool{})
	if !loaded {
		r.sizes.Add(1)
	}
	return p.(*sync.Pool)
}

// get returns recycled bytes of length n (zeroed if zero), or nil if there
// are none.
func (r *recycler) get(n int64, zero bool) []byte {
	p := r.pool(n, false)
	if p == nil {
		return nil
	}
	d, _ := p.Get().(*[]byte)
	if d == nil {
		return nil
	}
	if zero {
		clear(*d)
	}
	return *d
}

// put keeps d, bytes no buffer holds any more, for a buffer of its size.
func (r *recycler) put(d []byte) {
	if int64(len(d)) >= recycleMin { // before d escapes: no allocation otherwise
		r.keep(d)
	}
}

func (r *recycler) keep(d []byte) {
	if p := r.pool(int64(len(d)), true); p != nil {
		p.Put(&d)
	}
}

// clear drops every kept slice (Backend.Close).
func (r *recycler) clear() {
	r.pools.Range(func(k, _ any) bool {
		r.pools.Delete(k)
		return true
	})
	r.sizes.Store(0)
}
