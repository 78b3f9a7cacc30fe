package cuda

import (
	"context"
	"fmt"
	"reflect"
)

// RangeReader is implemented by a backend that can copy part of a buffer
// into memory of the caller's without copying the whole buffer first (the
// soft and cu backends, and the decorator of cuda/faulty over one of
// them). It is optional: [ReadAt] falls back to [Backend.Read] for a
// backend without it.
type RangeReader interface {
	// ReadAt copies the len(p) bytes of buf that start at offset off into
	// p. It does not wait for stream work on buf: wait on an event first.
	//
	// Checks run in this order, and on any of these failures p is left as it was:
	// backend closed ([ErrClosed]), ctx done, foreign or nil buf
	// ([ErrInvalid]), a range that is not inside buf (a [*RangeError],
	// which matches ErrInvalid), freed buf ([ErrFreed]). An empty p inside
	// buf (0 <= off <= buf.Size()) reads nothing and succeeds.
	ReadAt(ctx context.Context, buf Buffer, off int64, p []byte) error
}

// RangeError is the error of a ranged read whose range is not inside its
// buffer: a negative offset, or one whose end passes the buffer's size.
// It matches errors.Is(err, ErrInvalid).
type RangeError struct {
	Offset int64 // the first byte asked for
	Length int64 // how many bytes were asked for
	Size   int64 // the buffer's size
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("cuda: range of %d bytes at offset %d is not inside a %d-byte buffer", e.Length, e.Offset, e.Size)
}

// Is reports whether target is ErrInvalid.
func (e *RangeError) Is(target error) bool { return target == ErrInvalid }

// Range checks the range of a ranged read of n bytes at off in buf:
// 0 <= off and off+n <= buf.Size(). It returns a [*RangeError] (wrapped
// with the prefix) otherwise.
func (c Checker) Range(buf Buffer, off int64, n int) error {
	size := buf.Size()
	if off < 0 || off > size || int64(n) > size-off {
		return fmt.Errorf("%s: %w", c.Prefix, &RangeError{Offset: off, Length: int64(n), Size: size})
	}
	return nil
}

// ReadAt copies the len(p) bytes of buf that start at off into p, through
// b's [RangeReader] when it has one. Otherwise it reads the whole buffer
// with [Backend.Read] and copies the range out of it (correct, but a copy
// of the whole buffer per call); the range is checked first, so a bad one
// is a [*RangeError] either way and p is left as it was.
func ReadAt(ctx context.Context, b Backend, buf Buffer, off int64, p []byte) error {
	if rr, ok := b.(RangeReader); ok {
		return rr.ReadAt(ctx, buf, off, p)
	}
	if buf == nil {
		return fmt.Errorf("%w: cuda: ranged read of a nil buffer", ErrInvalid)
	}
	if v := reflect.ValueOf(buf); v.Kind() == reflect.Pointer && v.IsNil() {
		return fmt.Errorf("%w: cuda: ranged read of a nil %T", ErrInvalid, buf)
	}
	if err := (Checker{Prefix: "cuda"}).Range(buf, off, len(p)); err != nil {
		return err
	}
	all, err := b.Read(ctx, buf)
	if err != nil {
		return err
	}
	if int64(len(all)) != buf.Size() {
		return fmt.Errorf("cuda: read of %v returned %d bytes", buf, len(all))
	}
	copy(p, all[off:])
	return nil
}
