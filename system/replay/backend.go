package replay

import (
	"context"
	"fmt"
	"github.com/residency-go/residency/internal/jsonline"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
)

// BufferLimit is the most real memory a replay keeps per buffer (1 MiB):
// a larger value or staging buffer is accounted at its full size, but
// only its first BufferLimit bytes are kept.
const BufferLimit = 1 << 20

// faultsOf returns the fault injector of a runtime started on a replay's
// backend (or any backend behind cuda/faulty).
func faultsOf(sys *system.System) *cuda.Faults {
	if t, ok := sys.Backend().(*truncatingBackend); ok {
		return t.Faults()
	}
	return faulty.Of(sys.Backend())
}

// truncatingBackend is the device backend of a replay: the soft backend
// (an honest simulation in Go memory, streams and events) behind the fault
// injector, except that every buffer keeps at most limit real bytes
// while reporting its full size. A capacity what-if with "80GiB" budgets
// and "14GiB" values thus runs on a laptop: the ledger accounts every
// byte exactly, as always, and copies, loads and faults go through the
// simulated devices as usual; only the contents beyond the first limit
// bytes of a large value are not kept. Values up to limit bytes are kept
// whole.
type truncatingBackend struct {
	inner *faulty.Backend
	limit int64
}

func newBackend(locations []string) (*truncatingBackend, error) {
	b, err := soft.New(soft.Config{Locations: locations})
	if err != nil {
		return nil, err
	}
	return &truncatingBackend{inner: faulty.Wrap(b, soft.ErrorPrefix), limit: BufferLimit}, nil
}

// Faults returns the injector of the replay's fault op.
func (t *truncatingBackend) Faults() *cuda.Faults { return t.inner.Faults() }

// truncBuffer is a buffer of logical size size backed by a smaller (or
// equal) real buffer.
type truncBuffer struct {
	real cuda.Buffer
	size int64
}

func (b *truncBuffer) Location() string { return b.real.Location() }
func (b *truncBuffer) Size() int64      { return b.size }

// HostBytes forwards the host view of the real buffer (cuda.HostMemory)
// when it holds the whole buffer: a truncated buffer has no memory for
// its bytes beyond the limit, and so no view of its size.
func (b *truncBuffer) HostBytes() ([]byte, error) {
	if b.real.Size() != b.size {
		return nil, fmt.Errorf("%w: a %d-byte buffer at %s keeps only its first %d bytes in a replay",
			cuda.ErrNoHostMemory, b.size, b.real.Location(), b.real.Size())
	}
	return cuda.HostBytes(b.real)
}

var errForeignBuffer = fmt.Errorf("%w: buffer not allocated by this backend", cuda.ErrInvalid)

func unwrap(buf cuda.Buffer) (cuda.Buffer, error) {
	tb, ok := buf.(*truncBuffer)
	if !ok || tb == nil {
		return nil, errForeignBuffer
	}
	return tb.real, nil
}

func (t *truncatingBackend) Name() string {
	return fmt.Sprintf("%s, keeping at most %s of each buffer", t.inner.Name(), jsonline.FormatBytes(t.limit))
}

// Simulated reports true: the soft backend simulates every device.
func (t *truncatingBackend) Simulated() bool { return cuda.IsSimulated(t.inner) }

func (t *truncatingBackend) Allocate(ctx context.Context, loc string, bytes int64) (cuda.Buffer, error) {
	n := min(bytes, t.limit)
	if bytes <= 0 {
		n = bytes // let the inner backend refuse it
	}
	real, err := t.inner.Allocate(ctx, loc, n)
	if err != nil {
		return nil, err
	}
	return &truncBuffer{real: real, size: bytes}, nil
}

func (t *truncatingBackend) Free(buf cuda.Buffer) error {
	real, err := unwrap(buf)
	if err != nil {
		return err
	}
	return t.inner.Free(real)
}

func (t *truncatingBackend) NewStream(loc string) (cuda.Stream, error) {
	s, err := t.inner.NewStream(loc)
	if err != nil {
		return nil, err
	}
	return &truncStream{Stream: s}, nil
}

func (t *truncatingBackend) Load(ctx context.Context, dst cuda.Buffer, target string, loader cuda.Loader) error {
	real, err := unwrap(dst)
	if err != nil {
		return err
	}
	return t.inner.Load(ctx, real, target, loader)
}

func (t *truncatingBackend) Read(ctx context.Context, buf cuda.Buffer) ([]byte, error) {
	real, err := unwrap(buf)
	if err != nil {
		return nil, err
	}
	return t.inner.Read(ctx, real)
}

func (t *truncatingBackend) Write(ctx context.Context, buf cuda.Buffer, data []byte) error {
	real, err := unwrap(buf)
	if err != nil {
		return err
	}
	if int64(len(data)) != buf.Size() {
		return fmt.Errorf("%w: writing %d bytes into a buffer of %d", cuda.ErrInvalid, len(data), buf.Size())
	}
	return t.inner.Write(ctx, real, data[:real.Size()])
}

func (t *truncatingBackend) MemInfo(loc string) (cuda.MemInfo, error) { return t.inner.MemInfo(loc) }
func (t *truncatingBackend) Close() error                             { return t.inner.Close() }

// truncStream unwraps buffers on their way to the soft stream.
type truncStream struct{ cuda.Stream }

func (s *truncStream) CopyAsync(dst, src cuda.Buffer) error {
	d, err := unwrap(dst)
	if err != nil {
		return err
	}
	r, err := unwrap(src)
	if err != nil {
		return err
	}
	if dst.Size() != src.Size() {
		return fmt.Errorf("%w: copy of %d bytes into a buffer of %d", cuda.ErrInvalid, src.Size(), dst.Size())
	}
	return s.Stream.CopyAsync(d, r)
}

var (
	_ cuda.Backend    = (*truncatingBackend)(nil)
	_ cuda.Simulator  = (*truncatingBackend)(nil)
	_ cuda.HostMemory = (*truncBuffer)(nil)
)
