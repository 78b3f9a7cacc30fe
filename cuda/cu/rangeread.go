//go:build cuda

package cu

import (
	"context"
	"fmt"

	"github.com/residency-go/residency/cuda"
	gcu "gorgonia.org/cu"
)

var _ cuda.RangeReader = (*Backend)(nil)

// ReadAt copies the len(p) bytes of buf from offset off into p, without
// copying the rest of the buffer (see [cuda.RangeReader]). It does not
// wait for stream work on buf. A device range is read with a copy on the
// device's private stream, as Read does.
//
// Checks run in this order, and on any of these failures p is left as it was:
// backend closed (cuda.ErrClosed), ctx done, foreign or nil buf
// (cuda.ErrInvalid), a range not inside buf (*cuda.RangeError), freed buf
// (cuda.ErrFreed).
func (b *Backend) ReadAt(ctx context.Context, buf cuda.Buffer, off int64, p []byte) error {
	if b.closed.Load() {
		return cuda.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	cb, err := b.own(buf, "buffer")
	if err != nil {
		return err
	}
	if err := check.Range(cb, off, len(p)); err != nil {
		return err
	}
	if !b.enter() {
		return cuda.ErrClosed
	}
	defer b.exit()
	if !cb.acquire() {
		return fmt.Errorf("%w: cu backend: read of %d bytes at %d of %s", cuda.ErrFreed, len(p), off, cb)
	}
	defer cb.release()
	if len(p) == 0 {
		return nil
	}
	if cb.kind != cuda.KindCUDA {
		copy(p, cb.hostBytes()[off:])
		return nil
	}
	return cb.dev.toHost(p, cb.dptr+gcu.DevicePtr(off), cb.loc)
}
