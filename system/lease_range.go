package system

import (
	"context"
	"fmt"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
)

// ReadAt copies the len(p) leased bytes that start at offset off into p,
// without copying the rest of the value: a ranged read of the leased
// buffer (see [cuda.ReadAt]; a backend without ranged reads reads the
// whole buffer and copies the range out). As for [Lease.Read], the caller
// keeps the lease until ReadAt has returned.
//
// A released lease, or a range that is not inside the value (off < 0, or
// off+len(p) past its size), is an [*InvalidInputError]; p is then left as
// it was. An empty p inside the value reads nothing.
func (l *Lease) ReadAt(ctx context.Context, off int64, p []byte) error {
	if l.released.Load() {
		return &budget.InvalidInputError{Message: fmt.Sprintf("lease %d was released", l.id)}
	}
	b := l.Buffer()
	if b == nil {
		return fmt.Errorf("residency: no buffer for %s at %s", l.handle.Name, l.location)
	}
	if size := b.Size(); off < 0 || off > size || int64(len(p)) > size-off {
		return &budget.InvalidInputError{Message: fmt.Sprintf("lease %d: %d bytes at offset %d are not inside the %d bytes of %s at %s",
			l.id, len(p), off, size, l.handle.Name, l.location)}
	}
	return cuda.ReadAt(ctx, l.sys.backend, b, off, p)
}
