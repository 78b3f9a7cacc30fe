// Package faulty injects failures into any device backend: [Wrap] returns
// a [cuda.Backend] that forwards every call to the backend it wraps,
// except the calls that an armed fault makes fail.
//
// Faults are armed on the decorator's [cuda.Faults] ([Backend.Faults]),
// keyed by kind and exact location string. Arming a fault makes the next
// matching operation fail with a [*cuda.InjectedFaultError]; arming twice
// fails the next two:
//
//	FaultAlloc        the next Allocate at the location, before the
//	                  wrapped backend is asked (nothing is charged)
//	FaultCopy         the next CopyAsync whose destination is at the
//	                  location: consumed when the copy is enqueued; the copy
//	                  is not carried out (its destination is untouched) and
//	                  its failure reaches the next event recorded, or the
//	                  next Synchronize issued, on that stream, in stream
//	                  order with the wrapped backend's own failures
//	FaultReconstruct  the next Load whose target is the location (the
//	                  location the value is reconstructed for, which may
//	                  differ from that of the temporary buffer being
//	                  loaded into), without calling the loader
//
// A fault is consumed only by a call that passes its input checks, in the
// order the wrapped backend makes them (closed backend or stream, ctx,
// location, sizes, nil or foreign or freed buffers; see [cuda.Checker]),
// so an invalid call never uses one up. For the buffer checks the
// decorator keeps the set of buffers allocated through it and not yet
// freed: use it, not the wrapped backend, for every allocation.
//
// With no fault armed, every call goes straight to the wrapped backend:
// buffers, streams and events are the wrapped backend's own.
//
// # Usage
//
//	inner, _ := soft.New(soft.Config{Locations: locs})
//	b := faulty.Wrap(inner, soft.ErrorPrefix)
//	defer b.Close() // closes inner too
//	b.Faults().Arm(cuda.FaultCopy, "cuda:0")
//
// The soft backend simulates devices; a test of the runtime passes the
// decorated backend in system.Options.Backend and arms faults to drive
// the runtime's failure paths. The decorator also works over a real
// backend (package cuda/cu), where it fails calls before the driver sees
// them.
//
// A Backend is safe for concurrent use, as are its streams and
// [cuda.Faults]. The injector stays usable after Close.
package faulty
