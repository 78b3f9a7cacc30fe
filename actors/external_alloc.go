package actors

import (
	"context"
	"fmt"

	"github.com/residency-go/residency/cuda"
)

// Buffers owned outside the engine (e.g. a write pipeline's device clones
// and pinned buffers), allocated and freed by the location actor of their
// location, one message at a time among the location's other allocations
// and frees: the location actor stays the one allocator at its location.
// These buffers are not in the buffer table; their owner charges them
// (with named reservations) and frees them.

// allocOwned asks a location actor for a buffer the sender owns.
type allocOwned struct {
	ctx   context.Context
	bytes int64
	reply chan ownedBuffer
}

type ownedBuffer struct {
	buf cuda.Buffer
	err error
}

// freeOwned asks a location actor to free a buffer allocOwned returned.
type freeOwned struct {
	buf   cuda.Buffer
	reply chan error
}

// owned handles the messages above (false for any other message).
func (a *locationActor) owned(m any) bool {
	switch m := m.(type) {
	case *allocOwned:
		if err := a.eng.ctx.Err(); err != nil {
			m.reply <- ownedBuffer{err: err} // the engine is stopping
			return true
		}
		buf, err := a.eng.backend.Allocate(m.ctx, a.loc, m.bytes)
		if err == nil && (m.ctx.Err() != nil || a.eng.ctx.Err() != nil) {
			// Made after its asker gave up, or the engine began to stop
			// (its asker may have stopped waiting).
			_ = a.eng.backend.Free(buf)
			buf, err = nil, context.Cause(m.ctx)
			if err == nil {
				err = a.eng.ctx.Err()
			}
		}
		m.reply <- ownedBuffer{buf: buf, err: err}
	case *freeOwned:
		m.reply <- a.eng.backend.Free(m.buf)
	default:
		return false
	}
	return true
}

// AllocateAt returns a buffer of bytes at loc, allocated by loc's
// location actor and owned by the caller (free it with FreeAt). The
// allocation runs under ctx; one that returns after ctx ended is freed
// again. Errors: the backend's; an unknown location; ErrEngineStopped
// once the engine stopped. Safe for concurrent use.
func (e *Engine) AllocateAt(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error) {
	pid := e.locations[loc]
	if pid == nil {
		return nil, fmt.Errorf("allocation at %s: no such location", loc)
	}
	if e.ctx.Err() != nil {
		return nil, fmt.Errorf("allocation at %s abandoned: the runtime is stopping", loc)
	}
	reply := make(chan ownedBuffer, 1)
	e.root.Send(pid, &allocOwned{ctx: ctx, bytes: bytes, reply: reply})
	select {
	case r := <-reply:
		return r.buf, r.err
	case <-e.ctx.Done():
		return nil, e.ownedAfterStop(reply)
	}
}

// ownedAfterStop is the answer of an allocation whose engine is stopping:
// the location actor's, if it came; otherwise it never allocates.
func (e *Engine) ownedAfterStop(reply chan ownedBuffer) error {
	select {
	case r := <-reply:
		if r.err == nil {
			_ = e.backend.Free(r.buf)
		}
	default:
	}
	return fmt.Errorf("allocation abandoned: the runtime is stopping")
}

// FreeAt frees buf, a buffer AllocateAt returned, through the location
// actor of its location, and returns once it is freed. Once the engine is
// stopping (its location actors take no more work) it frees buf on the
// backend directly. Safe for concurrent use.
func (e *Engine) FreeAt(_ context.Context, buf cuda.Buffer) error {
	pid := e.locations[buf.Location()]
	if pid == nil {
		return fmt.Errorf("free at %s: no such location", buf.Location())
	}
	if e.ctx.Err() != nil {
		return e.backend.Free(buf) // the location actors take no more work
	}
	reply := make(chan error, 1)
	e.root.Send(pid, &freeOwned{buf: buf, reply: reply})
	select {
	case err := <-reply:
		return err
	case <-e.ctx.Done():
		select {
		case err := <-reply:
			return err
		default:
			return fmt.Errorf("free at %s: the runtime is stopping", buf.Location())
		}
	}
}
