package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/cuda"
)

// Allocators is one location actor per location for a component that
// runs beside no runtime's location actors (a staging pipeline on a
// Runtime that offers none): each actor is then the one allocator at its
// location, allocating and freeing one message at a time. A component on
// a runtime uses the runtime's actors instead ([Engine.AllocateAt]).
type Allocators struct {
	root    *actor.RootContext
	pids    map[string]*actor.PID
	closers []func()
	stopped chan struct{} // closed once the actors are stopped
}

// ErrAllocatorsStopped is the answer of an Allocators whose actors have
// stopped.
var ErrAllocatorsStopped = errors.New("residency: the location actors have stopped")

// NoAllocatorError is the answer of an Allocators asked for a location it
// has no actor for.
type NoAllocatorError struct{ Location string }

func (e *NoAllocatorError) Error() string {
	return fmt.Sprintf("residency: no location actor for %s", e.Location)
}

// StartAllocators spawns one location actor per distinct location of
// locs in root's actor system, each on the dispatcher dispatcher returns
// (with the function that ends it, called by Stop).
func StartAllocators(root *actor.RootContext, be cuda.Backend, dispatcher func() (actor.Dispatcher, func()), locs ...string) (*Allocators, error) {
	o := &Allocators{root: root, pids: map[string]*actor.PID{}, stopped: make(chan struct{})}
	for _, loc := range locs {
		if o.pids[loc] != nil {
			continue
		}
		d, end := dispatcher()
		o.closers = append(o.closers, end)
		pid, err := root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &allocActor{be: be, loc: loc} },
			actor.WithDispatcher(d)), "location/"+loc)
		if err != nil {
			o.Stop()
			return nil, fmt.Errorf("residency: spawning the location actor of %s: %w", loc, err)
		}
		o.pids[loc] = pid
	}
	return o, nil
}

// Stop stops the location actors (each after the message it is
// processing) and their dispatchers. Idempotent.
func (o *Allocators) Stop() {
	select {
	case <-o.stopped:
		return
	default:
	}
	for _, pid := range o.pids {
		_ = o.root.StopFuture(pid).Wait()
	}
	close(o.stopped)
	for _, end := range o.closers {
		end()
	}
}

func (o *Allocators) isStopped() bool {
	select {
	case <-o.stopped:
		return true
	default:
		return false
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

// allocActor allocates and frees at one location, one message at a time.
type allocActor struct {
	be  cuda.Backend
	loc string
}

func (a *allocActor) Receive(ctx actor.Context) {
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

// AllocateAt asks loc's actor for a buffer of bytes, allocated under ctx
// (an allocation made after ctx ended is freed again). Errors: the
// backend's, ctx's, a [*NoAllocatorError], [ErrAllocatorsStopped].
func (o *Allocators) AllocateAt(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error) {
	pid := o.pids[loc]
	if pid == nil {
		return nil, &NoAllocatorError{Location: loc}
	}
	if o.isStopped() {
		return nil, ErrAllocatorsStopped
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
			return nil, ErrAllocatorsStopped
		}
	}
}

// FreeAt asks the actor of buf's location to free it and returns its
// answer. Errors: the backend's, a [*NoAllocatorError],
// [ErrAllocatorsStopped].
func (o *Allocators) FreeAt(_ context.Context, buf cuda.Buffer) error {
	pid := o.pids[buf.Location()]
	if pid == nil {
		return &NoAllocatorError{Location: buf.Location()}
	}
	if o.isStopped() {
		return ErrAllocatorsStopped
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
			return ErrAllocatorsStopped
		}
	}
}
