//go:build cuda

package main

// #cgo LDFLAGS: -lcuda
// #include <cuda.h>
// #include <time.h>
//
// typedef struct {
//	double each_seconds;      // sum over iters of (issue one copy, wait)
//	double pipelined_seconds; // issue iters copies, wait once
//	CUresult err;
//	const char *step;
// } rz_plain;
//
// static double rz_now(void) {
//	struct timespec t;
//	clock_gettime(CLOCK_MONOTONIC, &t);
//	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
// }
//
// // The baseline: device -> pinned host copies with the bare driver API.
// static rz_plain rz_plain_dtoh(int ordinal, size_t n, int iters) {
//	rz_plain r = {0, 0, CUDA_SUCCESS, ""};
//	CUdevice dev;
//	CUcontext ctx = NULL, popped;
//	CUdeviceptr d = 0;
//	void *h = NULL;
//	CUstream s = NULL;
//	int retained = 0, pushed = 0;
// #define RZ_CK(call) do { if ((r.err = (call)) != CUDA_SUCCESS) { r.step = #call; goto out; } } while (0)
//	RZ_CK(cuDeviceGet(&dev, ordinal));
//	RZ_CK(cuDevicePrimaryCtxRetain(&ctx, dev));
//	retained = 1;
//	RZ_CK(cuCtxPushCurrent(ctx));
//	pushed = 1;
//	RZ_CK(cuMemAlloc(&d, n));
//	RZ_CK(cuMemHostAlloc(&h, n, CU_MEMHOSTALLOC_PORTABLE));
//	RZ_CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
//	RZ_CK(cuMemsetD8Async(d, 0x5a, n, s));
//	RZ_CK(cuMemcpyDtoHAsync(h, d, n, s)); // warm-up
//	RZ_CK(cuStreamSynchronize(s));
//	double t0 = rz_now();
//	for (int i = 0; i < iters; i++) {
//		RZ_CK(cuMemcpyDtoHAsync(h, d, n, s));
//		RZ_CK(cuStreamSynchronize(s));
//	}
//	r.each_seconds = rz_now() - t0;
//	t0 = rz_now();
//	for (int i = 0; i < iters; i++) {
//		RZ_CK(cuMemcpyDtoHAsync(h, d, n, s));
//	}
//	RZ_CK(cuStreamSynchronize(s));
//	r.pipelined_seconds = rz_now() - t0;
//	if (((unsigned char *)h)[n - 1] != 0x5a) {
//		r.err = CUDA_ERROR_UNKNOWN;
//		r.step = "check of the copied bytes";
//	}
// out:
//	if (s) cuStreamDestroy(s);
//	if (h) cuMemFreeHost(h);
//	if (d) cuMemFree(d);
//	if (pushed) cuCtxPopCurrent(&popped);
//	if (retained) cuDevicePrimaryCtxRelease(dev);
//	return r;
// }
import "C"

import (
	"fmt"
	"runtime"
	"time"
)

// plainDtoH runs the C baseline on a locked OS thread (it pushes the
// device's primary context on that thread and pops it again).
func plainDtoH(ordinal int, n int64, iters int) (each, pipelined time.Duration, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := C.rz_plain_dtoh(C.int(ordinal), C.size_t(n), C.int(iters))
	if r.err != C.CUDA_SUCCESS {
		var name *C.char
		C.cuGetErrorName(r.err, &name)
		msg := fmt.Sprintf("CUresult %d", int(r.err))
		if name != nil {
			msg = C.GoString(name)
		}
		return 0, 0, fmt.Errorf("plain baseline: %s: %s", C.GoString(r.step), msg)
	}
	return secs(float64(r.each_seconds)), secs(float64(r.pipelined_seconds)), nil
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
