// Package cu is the device backend for real GPUs: a [cuda.Backend] on the
// CUDA driver API through gorgonia.org/cu, built only with the `cuda` build
// tag (go build -tags cuda). Without the tag this package is empty, and
// nothing in the module links the CUDA driver.
//
// gorgonia.org/cu calls cuInit when the program starts and exits the
// process if that fails (no driver, or no device), so a binary built with
// the tag runs only where an NVIDIA driver and at least one device are
// present; it needs libcuda.so.1 (from the driver) at run time. Building
// needs cuda.h and a libcuda.so to link against: `make cuda-check` fetches
// both from Debian's nvidia-cuda-dev package (CUDA 11.8 on Debian 12) into
// a cache outside the repository and builds everything tagged `cuda`.
//
// # What the backend does
//
//   - cuda:N is device memory of CUDA device N (cuMemAlloc), pinned-host
//     page-locked host memory (cuMemHostAlloc, portable to every context),
//     pageable-host ordinary C heap memory. Host memory is C memory, never
//     Go memory, so asynchronous copies may use it. New buffers' contents
//     are unspecified.
//   - Each device is driven through its primary context (retained by New,
//     released by Close). Every driver call runs on a locked OS thread with
//     that context pushed and popped again, so every method is safe from
//     any goroutine and leaves the calling thread's context as it was.
//   - A stream is a non-blocking CUDA stream fed by a goroutine of its own;
//     a second goroutine waits for its events. Copies are issued with
//     cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync (same device)
//     and cuMemcpyPeerAsync (two devices); a copy between two host buffers
//     waits for the stream, then copies on the host. Events are CUDA events
//     (blocking-sync, no timing); WaitEvent of a cu event is
//     cuStreamWaitEvent, so the device, not a host thread, waits.
//   - Read and Write of device memory are copies on a private stream of the
//     device, complete when they return; one per device at a time.
//   - MemInfo of cuda:N without a configured capacity is cuMemGetInfo: the
//     whole device as the driver sees it. With Config.Capacity the backend
//     accounts its own buffers against the cap, exactly as the soft backend
//     does, and refuses what does not fit before asking the driver.
//   - Driver failures are [*Error] values naming the call and CUDA's name
//     of the result (CUDA_ERROR_OUT_OF_MEMORY); a driver out-of-memory is
//     also a *cuda.OutOfMemoryError. Fault injection is the decorator of
//     package cuda/faulty, as over any backend: wrapped with
//     faulty.Wrap(b, cu.ErrorPrefix), injected failures say
//     "cu backend: injected … fault" and never reach the driver.
//
// # Tests
//
// The backend's tests run the conformance suite (package cuda/conformance)
// that the soft backend passes, plus tests of its own. They carry the build
// tags `cuda` and `gpu`, because their binary links the driver and cannot
// start without one: run them with `go test -tags cuda,gpu ./cuda/cu` on a
// GPU machine. With `-tags cuda` alone, cuda/conformance's
// TestCUBackendOnGPU probes for a driver and device (package
// cuda/driverprobe, which links nothing) and runs them in a child process,
// or skips with the reason.
//
// Without a GPU, `make cuda-check` runs them against a fake driver of ours
// (cuda/cu/fakedriver): host memory and one thread per stream, which checks
// the backend's context handling, ordering and memory lifetimes and aborts
// on misuse. It is not a model of a GPU; nothing it measures is. `make
// gpu-check` builds the test binary, the GPU-gated test, a bandwidth
// benchmark (cmd/gpubench) and a run script for a GPU machine.
package cu
