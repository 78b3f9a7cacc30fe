// Package cuda defines how the residency runtime talks to memory devices:
// the [Backend] interface that allocates buffers, copies bytes on streams
// and records events, plus the location names, argument checks, fault
// kinds and typed errors every backend shares.
//
// The package itself touches no device. Backends live in subpackages:
//
//   - [github.com/residency-go/residency/cuda/soft] simulates every
//     location with ordinary Go memory and goroutines: the backend of a
//     machine without a GPU. It is never chosen for the caller: a program
//     opens it by name, and [IsSimulated] reports true for it.
//   - github.com/residency-go/residency/cuda/cu drives real GPUs through the
//     CUDA driver API (gorgonia.org/cu). It is compiled only with the build
//     tag `cuda` and needs an NVIDIA driver and device to run (see its
//     package documentation; `make cuda-check` builds it without a GPU).
//
// [github.com/residency-go/residency/cuda/faulty] is a decorator over any
// backend that injects failures (see Fault injection below).
//
// Both backends are tested by one suite, [github.com/residency-go/residency/cuda/conformance],
// which states the contract below as tests (the cu backend's run needs a
// GPU, or the fake driver `make cuda-check` uses).
//
// Two helpers need no tag and no NVIDIA file to build:
// [github.com/residency-go/residency/cuda/discover] lists the GPUs NVML
// reports (none, cleanly, without a driver), and
// [github.com/residency-go/residency/cuda/driverprobe] tells whether the
// CUDA driver initializes, without linking it. [DefaultBudget] turns a
// device's total memory, a headroom and a cap into a default budget; NVML
// figures are observations for that and for diagnostics, never admission
// evidence.
//
// # Locations
//
// A location is named by a string:
//
//	pageable-host   ordinary host memory
//	pinned-host     page-locked host memory (DMA-capable)
//	cuda:N          the memory of GPU N (N = 0, 1, …)
//
// In cluster mode a name may carry a node, "cuda:0@node-b". The grammar is
// the ledger's, [github.com/residency-go/residency/budget.ParseLocation],
// and [Kind] and [LocationName] are its types: one grammar for the runtime
// and every backend. [ParseLocation] returns the kind and device ordinal
// and ignores the node; [ParseLocationName] keeps it. The grammar is
// strict so that every location has one spelling: N is decimal with no
// sign and no leading zero ("cuda:01" is rejected), names are
// case-sensitive, and a node is a non-empty run of letters, digits, '-',
// '_' and '.'. A malformed name is a [*LocationError] naming the string. A backend is configured with a fixed set of locations;
// a well-formed name outside that set gets an error matching
// [ErrUnknownLocation].
//
// # Buffers
//
// [Backend.Allocate] returns a [Buffer] of an exact size at one location,
// charging the location's capacity; [Backend.Free] returns the bytes. A
// request the capacity cannot hold fails with an [*OutOfMemoryError] and
// changes nothing. Freeing twice returns [ErrFreed]; it never panics.
// [Backend.MemInfo] reports free, total and used bytes of a location.
//
// [Backend.Read] and [Backend.Write] move bytes between a buffer and a host
// slice synchronously. They do not wait for stream work: wait on an event
// first. [Backend.Load] fills a buffer by running a [Loader] (the
// reconstruction of a value from its source) synchronously. A backend that
// implements [RangeReader] (soft, cu, and the faulty decorator) also copies
// a range of a buffer into a caller's slice without copying the rest;
// [ReadAt] uses it, or Read and a copy of the range for a backend without
// it. A buffer at a host location of the soft or cu backend implements
// [HostMemory]: [HostBytes] returns its memory in place, for the CPU to
// read and write with no backend call (the write pipeline's CPU block pool
// is such a buffer), valid until the buffer is freed and ordered with
// nothing, like Read and Write.
//
// # Streams and events
//
// A [Stream] is a FIFO queue of asynchronous work owned by one device.
// [Stream.CopyAsync] enqueues a copy and returns at once; [Stream.Record]
// enqueues an [Event] that completes when everything enqueued before it has
// finished; [Stream.WaitEvent] makes later work on one stream wait for an
// event of another, which is how the runtime orders work across devices;
// [Stream.Synchronize] waits for everything enqueued so far.
//
// A typical transfer:
//
//	s, _ := backend.NewStream("cuda:0")
//	_ = s.CopyAsync(devBuf, hostBuf) // returns at once
//	ev, _ := s.Record()
//	…
//	if err := ev.Wait(ctx); err != nil { /* the copy failed */ }
//
// # How failures are reported
//
// An enqueueing call fails at once only for bad input (nil or foreign
// buffer, sizes that differ, a freed buffer, a closed stream). A failure of
// the work itself happens later, on the stream, and is reported exactly
// once: to the first event recorded, or the first Synchronize issued, after
// the failed work. Events recorded later, after successful work, report nil;
// the stream keeps running. A failure nobody collected is returned by
// [Stream.Close]. A failed event does not poison streams that wait on it:
// check its Err before relying on its bytes.
//
// # Argument checks
//
// Every backend checks its arguments the same way, with the same errors,
// through a [Checker]: configuration, locations, sizes, copies, writes,
// loaders and their targets, events. A backend's own checks are only the
// ones that need its state (closed, foreign or freed buffers, capacity).
//
// # Fault injection
//
// Fault injection is not part of a backend: package cuda/faulty wraps any
// backend in a decorator with a [Faults] injector. Arming a fault makes the
// next matching operation fail with an [*InjectedFaultError]; arming twice
// fails the next two. Faults are keyed by kind and exact location string:
//
//	FaultAlloc        the next Allocate at the location
//	FaultCopy         the next CopyAsync whose destination is at the location
//	                  (consumed when enqueued, reported through the next event)
//	FaultReconstruct  the next Load whose target is the location (the target
//	                  is the location the value is reconstructed for, which
//	                  may differ from the temporary buffer being loaded into)
//
// A fault is consumed only by an operation that passed its input checks, so
// an invalid call never uses one up. An injected failure leaves its
// destination untouched and charges nothing.
//
// # Errors
//
// Match errors with errors.Is and errors.As:
//
//	ErrClosed           closed backend or stream
//	ErrFreed            buffer already freed
//	ErrInvalid          bad input; *LocationError for a malformed name
//	ErrUnknownLocation  well-formed but unconfigured location
//	ErrOutOfMemory      *OutOfMemoryError{Location, Requested, Free}
//	ErrInjectedFault    *InjectedFaultError{Kind, Location}
//	*LoaderPanicError   a loader panicked (Value, Stack); a loader's own
//	                    error is returned wrapped
//
// # Concurrency and shutdown
//
// Backends, streams, events, [Checker] and [Faults] are safe for concurrent use.
// [Backend.Close] refuses new work with [ErrClosed], drains every stream,
// stops their goroutines and releases all buffers; it is idempotent.
package cuda
