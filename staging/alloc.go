package staging

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/cuda"
)

// Every buffer the pipeline allocates or frees on the backend (device
// clones, landing buffers, staging slots' buffers) goes through the actor
// of its location: the runtime's, when the Runtime is a
// [LocationAllocator] (*system.System is: one actor per location stays the
// one allocator there), else one location actor of the pipeline's own per
// location, spawned in its actor system with the pipeline.

// LocationAllocator is what a Runtime offers when its locations have
// actors that allocate: the pipeline then makes every backend allocation
// and free through them. Both calls are safe for concurrent use.
type LocationAllocator interface {
	// AllocateAt returns a buffer of bytes at loc, allocated by loc's
	// actor, owned by the caller (free it with FreeAt). It honours ctx:
	// an allocation that returns after ctx ended is freed again.
	AllocateAt(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error)
	// FreeAt frees buf, a buffer AllocateAt returned, through the actor of
	// its location, and returns once it is freed.
	FreeAt(ctx context.Context, buf cuda.Buffer) error
}

// allocate returns a buffer of n bytes at loc through loc's actor.
func (p *Pipeline) allocate(ctx context.Context, loc string, n int64) (cuda.Buffer, error) {
	return p.alloc.AllocateAt(ctx, loc, n)
}

// free frees buf through the actor of its location.
func (p *Pipeline) free(buf cuda.Buffer) error {
	return p.alloc.FreeAt(context.Background(), buf)
}

// ownLocations is the pipeline's own location actors, one per location it
// allocates at, for a Runtime that is no LocationAllocator.
type ownLocations struct {
	be      cuda.Backend
	root    *actor.RootContext
	pids    map[string]*actor.PID
	runs    []*ownGoroutine
	stopped chan struct{} // closed once the actors are stopped
}

// startOwnLocations spawns one location actor per location of locs, each
// on a goroutine of its own.
func startOwnLocations(root *actor.RootContext, be cuda.Backend, locs ...string) (*ownLocations, error) {
	o := &ownLocations{be: be, root: root, pids: map[string]*actor.PID{}, stopped: make(chan struct{})}
	for _, loc := range locs {
		if o.pids[loc] != nil {
			continue
		}
		run := newOwnGoroutine()
		o.runs = append(o.runs, run)
		pid, err := root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &locationActor{be: be, loc: loc} },
			actor.WithDispatcher(run)), "location/"+loc)
		if err != nil {
			o.stop()
			return nil, errNotSpawned("location actor of "+loc, err)
		}
		o.pids[loc] = pid
	}
	return o, nil
}

// stop stops the location actors (each after the message it is
// processing) and their goroutines. Idempotent.
func (o *ownLocations) stop() {
	select {
	case <-o.stopped:
		return
	default:
	}
	for _, pid := range o.pids {
		_ = o.root.StopFuture(pid).Wait()
	}
	close(o.stopped)
	for _, r := range o.runs {
		r.close()
	}
}

// allocBuffer asks a location actor for a buffer of bytes, allocated
// under ctx; the answer comes on reply.
type allocBuffer struct {
	ctx   context.Context
	bytes int64
	reply chan allocResult
}

type allocResult struct {
	buf cuda.Buffer
	err error
}

// freeBuffer asks a location actor to free buf; the answer comes on
// reply.
type freeBuffer struct {
	buf   cuda.Buffer
	reply chan error
}

// locationActor allocates and frees the pipeline's buffers at one
// location, one message at a time.
type locationActor struct {
	be  cuda.Backend
	loc string
}

func (a *locationActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *allocBuffer:
		buf, err := a.be.Allocate(m.ctx, a.loc, m.bytes)
		if err == nil && m.ctx.Err() != nil {
			_ = a.be.Free(buf) // made after its asker gave up
			buf, err = nil, m.ctx.Err()
		}
		m.reply <- allocResult{buf: buf, err: err}
	case *freeBuffer:
		m.reply <- a.be.Free(m.buf)
	}
}

// AllocateAt asks loc's actor for a buffer of bytes.
func (o *ownLocations) AllocateAt(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error) {
	pid := o.pids[loc]
	if pid == nil {
		return nil, errNoLocationActor(loc)
	}
	reply := make(chan allocResult, 1)
	o.root.Send(pid, &allocBuffer{ctx: ctx, bytes: bytes, reply: reply})
	// The actor answers each allocation under its ctx; only a stopped
	// actor never answers.
	select {
	case r := <-reply:
		return r.buf, r.err
	case <-o.stopped:
		select {
		case r := <-reply:
			return r.buf, r.err
		default:
			return nil, ErrClosed
		}
	}
}

// FreeAt asks the actor of buf's location to free it.
func (o *ownLocations) FreeAt(_ context.Context, buf cuda.Buffer) error {
	pid := o.pids[buf.Location()]
	if pid == nil {
		return errNoLocationActor(buf.Location())
	}
	reply := make(chan error, 1)
	o.root.Send(pid, &freeBuffer{buf: buf, reply: reply})
	select {
	case err := <-reply:
		return err
	case <-o.stopped:
		select {
		case err := <-reply:
			return err
		default:
			return ErrClosed
		}
	}
}

func errNoLocationActor(loc string) error {
	return fmt.Errorf("%w: the pipeline has no location actor for %s", ErrConfig, loc)
}
