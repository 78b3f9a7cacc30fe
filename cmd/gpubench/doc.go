// Command gpubench measures device→host copy bandwidth on a real GPU, two
// ways side by side, so that the overhead of the runtime's cu backend over
// the bare driver is a number:
//
//   - plain: cuMemcpyDtoHAsync of N bytes from device memory into pinned
//     host memory (cuMemHostAlloc) on one non-blocking stream, written in
//     C against the driver API, with nothing of ours in the loop;
//   - backend: the same copy through the cu backend (package cuda/cu):
//     Backend.Allocate at cuda:N and pinned-host, Stream.CopyAsync, then
//     Stream.Record and Event.Wait; and the copy into pageable-host, for
//     reference.
//
// Each is measured per copy (issue one copy, wait for it; N iterations)
// and pipelined (issue N copies, wait once), after one warm-up copy.
//
// Usage (on a machine with an NVIDIA driver; build with -tags cuda, or take
// the binary make gpu-check leaves in bin/gpu-check):
//
//	gpubench [-device 0] [-bytes 268435456] [-iters 20]
//
// The device→host write pipeline (package staging) sits on top of the
// backend's copy path: when it is in, the row to add here is a whole step
// written through it (device buffer → pinned staging slot → committed
// host block), beside these two, at the same sizes.
//
// Without the cuda build tag the command only says that it needs it.
package main
