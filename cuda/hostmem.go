package cuda

import (
	"errors"
	"fmt"
)

// ErrNoHostMemory is returned for a buffer whose bytes the CPU cannot
// address in place: a buffer at a cuda:N location, or one of a backend
// (or a decorator) that does not implement [HostMemory].
var ErrNoHostMemory = errors.New("cuda: buffer has no host memory to address in place")

// HostMemory is implemented by a buffer whose bytes the CPU can address
// in place: a buffer at a host location (pageable-host, pinned-host) of
// the soft and cu backends. It is optional; [HostBytes] asks for it.
//
// A decorator that wraps buffers forwards it to the buffer it wraps; one
// that hands out its backend's buffers unwrapped (cuda/faulty) has
// nothing to do. Fault injection does not apply to it: getting the view
// and accessing memory through it are not backend operations.
type HostMemory interface {
	// HostBytes returns the buffer's bytes in place: a slice of exactly
	// Size() bytes, the same memory on every call, which the backend's
	// own Read, ReadAt, Write, Load and stream copies of the buffer read
	// and write.
	//
	// The slice is valid until the buffer is freed (by Free, or by the
	// backend's Close); touching it afterwards is undefined (the memory
	// may be given back, or reused by another buffer).
	//
	// Accesses through the slice are plain CPU memory accesses, ordered
	// with nothing: like Read and Write they do not wait for stream work.
	// Before reading bytes that a copy writes into the buffer, wait on an
	// event recorded after the copy; before enqueueing a copy out of the
	// buffer, finish the writes it must see (it reads what the buffer
	// holds when it runs); and never write while a copy into or out of
	// the buffer may run. Goroutines that share the slice synchronize
	// their accesses themselves.
	//
	// Errors: a buffer at a device location matches [ErrNoHostMemory]; a
	// freed buffer [ErrFreed]; memory the backend cannot make an
	// [*OutOfMemoryError].
	HostBytes() ([]byte, error)
}

// HostBytes returns the bytes of buf in place (see [HostMemory]), or an
// error matching [ErrNoHostMemory] when buf does not implement
// HostMemory (nil included).
func HostBytes(buf Buffer) ([]byte, error) {
	hm, ok := buf.(HostMemory)
	if !ok {
		return nil, fmt.Errorf("%w: %v", ErrNoHostMemory, describe(buf))
	}
	return hm.HostBytes()
}

// describe names buf for an error: its location and size, or "nil buffer".
func describe(buf Buffer) string {
	if buf == nil {
		return "nil buffer"
	}
	return fmt.Sprintf("a %d-byte %T at %s", buf.Size(), buf, buf.Location())
}
