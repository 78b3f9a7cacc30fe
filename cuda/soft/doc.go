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
// buffer's bytes are made on its first write, in one piece of its size:
// Write (which copies the caller's bytes into new memory), Load (zeroed,
// then the loader writes), or a stream copy from a buffer that holds
// bytes. A buffer never written reads as zeros and holds no memory, and so
// does a copy of one (a copy of zeros into a written buffer releases its
// bytes). Free and Close release them at once: their buffer no longer
// holds them. (Freed bytes of a size from 64 KiB up may be handed to the
// next buffer of exactly that size instead of being made anew; what is not
// reused goes back to the Go runtime within two garbage collections, as
// dropped memory does.) So:
//
//   - an allocation that is refused (closed, bad input, an injected fault,
//     capacity) makes nothing, and nor does one that is granted and never
//     written: registering 64 GiB at a location allocates no memory until
//     something writes those bytes;
//   - the real memory of a backend is at most the total size of its live
//     written buffers, reported by [Backend.RealBytes], itself at most the
//     MemInfo.UsedBytes of its locations and so at most their capacities;
//   - Read returns a new slice of the buffer's size (zeros for a buffer
//     never written): the caller's memory, which the backend does not
//     keep; ReadAt copies a range into the caller's slice and makes no
//     real bytes for a buffer never written.
//
// A size the Go runtime refuses to make (beyond its largest slice) fails
// the write with *cuda.OutOfMemoryError; a size it accepts but the machine
// cannot back ends the process (Go's "out of memory"), as any allocation
// in Go would: for simulations larger than the machine, configure
// capacities, or never write the bytes.
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
