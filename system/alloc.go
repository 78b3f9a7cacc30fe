package system

import (
	"context"

	"github.com/residency-go/residency/cuda"
)

// AllocateAt returns a buffer of bytes at loc, allocated by the runtime's
// actor of that location (the one allocator there) and owned by the
// caller, who charges it (e.g. with Reserve) and frees it with FreeAt. It
// is not a value's buffer: the ledger does not know it. The allocation
// runs under ctx. ErrClosed after Close. Safe for concurrent use. (Package
// staging allocates its clones and pinned buffers with it.)
func (s *System) AllocateAt(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	return s.eng.AllocateAt(ctx, loc, bytes)
}

// FreeAt frees buf, a buffer AllocateAt returned, through the actor of
// its location, and returns once it is freed. Safe for concurrent use.
func (s *System) FreeAt(ctx context.Context, buf cuda.Buffer) error {
	return s.eng.FreeAt(ctx, buf)
}
