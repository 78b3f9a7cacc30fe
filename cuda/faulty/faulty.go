package faulty

import (
	"context"
	"errors"
	"sync"

	"github.com/residency-go/residency/cuda"
)

// Backend is a [cuda.Backend] that fails the operations its armed faults
// name and forwards everything else to the backend it wraps.
type Backend struct {
	inner  cuda.Backend
	label  string
	check  cuda.Checker
	faults *cuda.Faults

	mu   sync.Mutex               // guards live
	live map[cuda.Buffer]struct{} // buffers allocated through b, not yet freed
}

var (
	_ cuda.Backend     = (*Backend)(nil)
	_ cuda.Simulator   = (*Backend)(nil)
	_ cuda.RangeReader = (*Backend)(nil)
)

// Wrap returns a decorator over inner with no fault armed. label starts
// the message of every injected failure, as inner's name for itself in its
// own errors ("soft backend": [soft.ErrorPrefix]); empty means "cuda".
// Closing the decorator closes inner.
//
// [soft.ErrorPrefix]: https://pkg.go.dev/github.com/residency-go/residency/cuda/soft#ErrorPrefix
func Wrap(inner cuda.Backend, label string) *Backend {
	return &Backend{
		inner:  inner,
		label:  label,
		check:  cuda.Checker{Prefix: label},
		faults: cuda.NewFaults(),
		live:   map[cuda.Buffer]struct{}{},
	}
}

// Of returns the injector of b when b is a decorator of this package, and
// nil otherwise.
func Of(b cuda.Backend) *cuda.Faults {
	if fb, ok := b.(*Backend); ok {
		return fb.faults
	}
	return nil
}

// Faults returns the decorator's fault injector. It is never nil and stays
// usable after Close.
func (b *Backend) Faults() *cuda.Faults { return b.faults }

// Inner returns the wrapped backend.
func (b *Backend) Inner() cuda.Backend { return b.inner }

// Name returns the wrapped backend's name.
func (b *Backend) Name() string { return b.inner.Name() }

// Simulated reports whether the wrapped backend simulates its devices
// ([cuda.IsSimulated]).
func (b *Backend) Simulated() bool { return cuda.IsSimulated(b.inner) }

func (b *Backend) injected(kind cuda.FaultKind, loc string) error {
	return &cuda.InjectedFaultError{Kind: kind, Location: loc, Backend: b.label}
}

// Allocate allocates through the wrapped backend, unless an armed
// FaultAlloc at loc fails it first (after the closed, ctx, location and
// size checks).
func (b *Backend) Allocate(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error) {
	if b.faults.Armed(cuda.FaultAlloc, loc) > 0 {
		if err := b.checkAllocate(ctx, loc, bytes); err != nil {
			return nil, err
		}
		if b.faults.Take(cuda.FaultAlloc, loc) {
			return nil, b.injected(cuda.FaultAlloc, loc)
		}
	}
	buf, err := b.inner.Allocate(ctx, loc, bytes)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.live[buf] = struct{}{}
	b.mu.Unlock()
	return buf, nil
}

// checkAllocate makes Allocate's input checks in the wrapped backend's
// order: closed, ctx, location (both through MemInfo), size.
func (b *Backend) checkAllocate(ctx context.Context, loc string, bytes int64) error {
	_, err := b.inner.MemInfo(loc)
	if errors.Is(err, cuda.ErrClosed) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	return b.check.Size(loc, bytes)
}

// Free frees buf through the wrapped backend.
func (b *Backend) Free(buf cuda.Buffer) error {
	err := b.inner.Free(buf)
	if err == nil {
		b.mu.Lock()
		delete(b.live, buf)
		b.mu.Unlock()
	}
	return err
}

// isLive reports whether buf was allocated through b and not freed since.
func (b *Backend) isLive(buf cuda.Buffer) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.live[buf]
	return ok
}

// NewStream returns a stream of the wrapped backend, decorated so that a
// FaultCopy can fail a copy enqueued on it.
func (b *Backend) NewStream(loc string) (cuda.Stream, error) {
	s, err := b.inner.NewStream(loc)
	if err != nil {
		return nil, err
	}
	return &stream{Stream: s, b: b}, nil
}

// Load loads through the wrapped backend, unless an armed FaultReconstruct
// at target (empty: dst.Location()) fails it first, without calling
// loader, after the closed, ctx, buffer, loader and target checks.
func (b *Backend) Load(ctx context.Context, dst cuda.Buffer, target string, loader cuda.Loader) error {
	key := target
	if key == "" && dst != nil {
		key = dst.Location()
	}
	// A buffer not allocated through b (foreign, nil or freed) is refused
	// by the wrapped backend, which consumes no fault.
	if b.faults.Armed(cuda.FaultReconstruct, key) > 0 && b.isLive(dst) {
		if err := b.checkLoad(ctx, dst, target, loader); err != nil {
			return err
		}
		if b.faults.Take(cuda.FaultReconstruct, key) {
			return b.injected(cuda.FaultReconstruct, key)
		}
	}
	return b.inner.Load(ctx, dst, target, loader)
}

// checkLoad makes Load's input checks for a live dst: closed (through
// MemInfo), ctx, loader, target.
func (b *Backend) checkLoad(ctx context.Context, dst cuda.Buffer, target string, loader cuda.Loader) error {
	if _, err := b.inner.MemInfo(dst.Location()); errors.Is(err, cuda.ErrClosed) {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.check.Loader(loader); err != nil {
		return err
	}
	return b.check.LoadTarget(target)
}

// Read reads through the wrapped backend.
func (b *Backend) Read(ctx context.Context, buf cuda.Buffer) ([]byte, error) {
	return b.inner.Read(ctx, buf)
}

// ReadAt reads a range through the wrapped backend ([cuda.ReadAt]: its
// own ranged read, or a whole Read when it has none).
func (b *Backend) ReadAt(ctx context.Context, buf cuda.Buffer, off int64, p []byte) error {
	return cuda.ReadAt(ctx, b.inner, buf, off, p)
}

// Write writes through the wrapped backend.
func (b *Backend) Write(ctx context.Context, buf cuda.Buffer, data []byte) error {
	return b.inner.Write(ctx, buf, data)
}

// MemInfo reports the wrapped backend's MemInfo.
func (b *Backend) MemInfo(loc string) (cuda.MemInfo, error) { return b.inner.MemInfo(loc) }

// Close closes the wrapped backend (which frees every live buffer). The
// injector stays usable.
func (b *Backend) Close() error {
	err := b.inner.Close()
	b.mu.Lock()
	clear(b.live)
	b.mu.Unlock()
	return err
}
