package staging

import (
	"context"
	"errors"
	"fmt"

	"github.com/residency-go/residency/cuda"
)

// The CPU block pool's memory: a buffer at cfg.Host, allocated and freed
// through the host location's actor like every other buffer of the
// pipeline (alloc.go), and written and read in place through its host
// view (cuda.HostMemory). A view is plain memory: a pool write or read is
// a copy(), never a backend call that could fail or inject a fault.

// allocatePool allocates the pool of n bytes through the actor of
// cfg.Host and takes its host view. A buffer without a view (a device
// location, a backend whose buffers have none) is an ErrConfig naming
// the location; the buffer is freed again on any failure.
func (p *Pipeline) allocatePool(ctx context.Context, n int64) error {
	loc := p.cfg.Host
	buf, err := p.allocate(ctx, loc, n)
	if err != nil {
		return fmt.Errorf("the CPU block pool of %d bytes at %s: %w", n, loc, err)
	}
	mem, err := cuda.HostBytes(buf)
	if err != nil {
		_ = p.free(buf)
		if errors.Is(err, cuda.ErrNoHostMemory) {
			return fmt.Errorf("%w: the CPU block pool at %s needs host memory the CPU writes in place, and the backend's buffer there has none: %w", ErrConfig, loc, err)
		}
		return fmt.Errorf("the CPU block pool of %d bytes at %s: %w", n, loc, err)
	}
	p.poolMu.Lock()
	p.pool, p.poolMem = buf, mem
	p.poolMu.Unlock()
	return nil
}

// freePool frees the pool through the actor of its location, once: later
// calls do nothing. It waits for a pool write or read in progress; the
// pool is not written or read afterwards (readPool answers ErrClosed).
func (p *Pipeline) freePool() {
	p.poolMu.Lock()
	buf := p.pool
	p.pool, p.poolMem = nil, nil
	p.poolMu.Unlock()
	if buf != nil {
		_ = p.free(buf)
	}
}
