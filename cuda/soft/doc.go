// Package soft is an honest simulation of a device backend: it implements
// [cuda.Backend] without any GPU, driver or cgo, so that the residency
// runtime, its pipelines and its race tests run anywhere. Its Name is
// "soft (simulated devices)" and Simulated reports true
// (cuda.IsSimulated); nothing it does should be mistaken for a measurement
// of real hardware. The runtime never picks it for the caller: a program
// opens it by name (soft.New, or system.SoftBackend) and says so.
//
// # What is simulated, and how
//
// Every location (pageable-host, pinned-host and cuda:N alike) is ordinary
// Go memory. Pinned memory is not page-locked and "device" memory is not on
// a device; what is real is the data. Copies move real bytes with copy(),
// so every test that reads a buffer back checks the data, not a
// bookkeeping entry.
//
// # Real memory: what Allocate promises
//
// Allocate charges the location's capacity and makes no real memory. A
// buffer's bytes are made as they are written, so a simulated 80 GiB GPU
// costs only the bytes written to it:
//
//   - a buffer under 32 MiB is one piece of memory of its size, made on its
//     first write of a non-zero byte: by Write (which copies the caller's
//     bytes into new memory), by a stream copy from a buffer that holds
//     bytes, or by Load (made zeroed for the loader, and given back after
//     it if the loader left it all zero);
//   - a buffer from 32 MiB up keeps its bytes in chunks of 64 KiB (or the
//     OS page size, if larger), and holds only the chunks that hold a
//     non-zero byte. A stream copy copies only those chunks and makes the
//     others zero at its destination; Read and ReadAt copy only those; a
//     Write makes only the chunks of its data that are not all zero. A
//     loader is handed the whole buffer in one piece, as it must be: on
//     Linux a private anonymous mapping with no swap reserved, whose pages
//     the kernel backs only when they are written, and after the loader
//     returns the backend finds the chunks it wrote (asking
//     /proc/self/pagemap which pages were touched, then looking for a
//     non-zero byte in those) and gives the rest back. A loader that
//     writes nothing leaves the buffer holding nothing. (Elsewhere, and
//     where the kernel refuses such a mapping, the piece is Go memory,
//     which the loader's buffer then costs in full while it runs; what it
//     left zero is given back as on Linux.)
//
// Zeros are never held: writing or copying zeros over bytes gives back
// what they replace, and a buffer never written reads as zeros. Free and
// Close release a buffer's bytes at once. (Freed bytes of a buffer from
// 64 KiB to 32 MiB may be handed to the next buffer of exactly that size
// instead of being made anew; what is not reused goes back to the Go
// runtime within two garbage collections, as dropped memory does.) So:
//
//   - an allocation that is refused (closed, bad input, an injected fault,
//     capacity) makes nothing, and nor does one that is granted and never
//     written: registering 64 GiB at a location allocates no memory until
//     something writes those bytes;
//   - the real memory of a backend is at most the total size of what was
//     written into its live buffers (whole small buffers, 64 KiB chunks
//     of large ones), reported by [Backend.RealBytes], itself at most the
//     MemInfo.UsedBytes of its locations and so at most their capacities;
//   - Read returns a new slice of the buffer's size (zeros where nothing
//     was written): the caller's memory, which the backend does not keep;
//     ReadAt copies a range into the caller's slice and makes no real
//     bytes for what was never written.
//
// A buffer at a host location has a host view (cuda.HostBytes): its
// memory in place, which the caller reads and writes directly. From the
// first view on, the buffer holds its whole size in real memory until it
// is freed, and zeros written or copied over it are stored like other
// bytes (see cuda.HostMemory).
//
// Each buffer also costs a record of about a hundred bytes of Go memory
// while it is allocated, whatever its size.
//
// A size the Go runtime refuses to make (beyond its largest slice) fails
// the write with *cuda.OutOfMemoryError; a size it accepts but the machine
// cannot back ends the process (Go's "out of memory", or the kernel's
// out-of-memory killer for a mapping written beyond the machine's memory),
// as any allocation would: for simulations larger than the machine,
// configure capacities, or never write the bytes.
//
// A loader that keeps its dst after it returns, which the cuda.Loader
// contract forbids, may crash the process when it next touches it: the
// mapping may have been given back.
//
// The race detector does not watch the memory of a mapping: races on the
// bytes of buffers from 32 MiB up are not reported (those on their
// bookkeeping are).
//
// Each stream has one goroutine that runs its work in FIFO order. An event
// completes when the goroutine reaches it, that is, after the bytes of
// every earlier copy are in place. WaitEvent makes the goroutine block until
// another stream's event completes. So the orderings the runtime relies on
// (copy before event, event before dependent work on another stream) are
// enforced by real concurrency, and the race detector sees them.
//
// Capacity: each location may have a byte capacity (Config.Capacity; 0 or
// absent means unlimited). Allocate reserves capacity atomically, so
// concurrent allocations never exceed it, and fails with
// *cuda.OutOfMemoryError when it would; Free returns the bytes at once.
// MemInfo reports exactly the bytes of live buffers.
//
// Bandwidth: with Config.BandwidthBytesPerSec > 0 each stream copy of n
// bytes first calls Config.Sleep for n/bandwidth seconds, then copies. The
// bytes appear all at once at the end of the delay. Read, ReadAt, Write and
// Load are not delayed. Tests inject a Sleep that blocks on a channel they control,
// which makes "the copy is in flight" a state they can hold and inspect;
// with testing/synctest the default timer-based Sleep runs on the bubble's
// fake clock.
//
// # Usage
//
//	b, err := soft.New(soft.Config{
//		Locations: []string{"pageable-host", "pinned-host", "cuda:0"},
//		Capacity:  map[string]int64{"cuda:0": 1 << 30},
//	})
//	if err != nil { … }
//	defer b.Close()
//	host, _ := b.Allocate(ctx, "pinned-host", n)
//	dev, _ := b.Allocate(ctx, "cuda:0", n)
//	_ = b.Write(ctx, host, data)
//	s, _ := b.NewStream("cuda:0")
//	_ = s.CopyAsync(dev, host)
//	ev, _ := s.Record()
//	err = ev.Wait(ctx) // dev now holds data, or err says why not
//
// # Faults
//
// The backend injects no failure itself. Wrap it with package cuda/faulty
// (faulty.Wrap(b, soft.ErrorPrefix)) to arm allocation, copy and
// reconstruction faults; the injected failures then read "soft backend:
// injected … fault at L", like the backend's own errors.
//
// # Concurrency and shutdown
//
// A Backend and everything it returns are safe for concurrent use. A buffer
// is guarded by a read-write lock, so a Read that races with a copy sees the
// bytes before or after it, never a torn mixture; the runtime should still
// order its accesses with events, as it must on real devices. A Loader runs
// with its destination locked and must not call the backend on that buffer.
//
// Close refuses new work with cuda.ErrClosed, cuts short the simulated
// delays of queued copies (their bytes are still copied), drains and stops
// every stream goroutine, and frees every live buffer. It is idempotent;
// after it returns no goroutine of the backend is left.
package soft
