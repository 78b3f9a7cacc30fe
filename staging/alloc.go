package staging

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/cuda"
)

// Every buffer the pipeline allocates or frees on the backend (device
// clones, landing buffers, staging slots' buffers, the CPU block pool:
// pool.go) goes through the actor
// of its location: the runtime's, when the Runtime is a
// [LocationAllocator] (*system.System is: one actor per location stays the
// one allocator there), else one location actor of the pipeline's own per
// location (package actors' Allocators), spawned in its actor system with
// the pipeline. The pipeline itself never calls the backend's Allocate or
// Free.

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

// ownLocations is the pipeline's own location actors (package actors'
// Allocators), one per location it allocates at, for a Runtime that is no
// LocationAllocator; their answers in the pipeline's errors.
type ownLocations struct{ a *actors.Allocators }

// startOwnLocations spawns one location actor per location of locs, each
// on a goroutine of its own.
func startOwnLocations(root *actor.RootContext, be cuda.Backend, locs ...string) (*ownLocations, error) {
	a, err := actors.StartAllocators(root, be, func() (actor.Dispatcher, func()) {
		r := newOwnGoroutine()
		return r, r.close
	}, locs...)
	if err != nil {
		return nil, errNotSpawned("location actors", err)
	}
	return &ownLocations{a: a}, nil
}

// stop stops the location actors. Idempotent.
func (o *ownLocations) stop() { o.a.Stop() }

// AllocateAt asks loc's actor for a buffer of bytes.
func (o *ownLocations) AllocateAt(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error) {
	buf, err := o.a.AllocateAt(ctx, loc, bytes)
	return buf, allocErr(err)
}

// FreeAt asks the actor of buf's location to free it.
func (o *ownLocations) FreeAt(ctx context.Context, buf cuda.Buffer) error {
	return allocErr(o.a.FreeAt(ctx, buf))
}

// allocErr words the location actors' own refusals as the pipeline's:
// stopped actors are a closed pipeline, a location without one is a
// configuration error.
func allocErr(err error) error {
	var na *actors.NoAllocatorError
	switch {
	case errors.Is(err, actors.ErrAllocatorsStopped):
		return ErrClosed
	case errors.As(err, &na):
		return fmt.Errorf("%w: the pipeline has no location actor for %s", ErrConfig, na.Location)
	}
	return err
}
