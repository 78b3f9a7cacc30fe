//go:build cuda

package cu

// What gorgonia.org/cu v0.9.6 lacks: pinned host allocation
// (cuMemHostAlloc/cuMemFreeHost) and the name of a CUresult
// (cuGetErrorName).

// #cgo LDFLAGS: -lcuda
// #include <cuda.h>
// #include <stdlib.h>
//
// // cgo's own C.malloc aborts the program when malloc fails; this one
// // returns NULL.
// static void *rz_malloc(size_t n) { return malloc(n); }
import "C"

import (
	"reflect"
	"unsafe"
)

// memHostAlloc allocates n bytes of page-locked host memory, portable
// (pinned for every context), in the calling thread's current context.
func memHostAlloc(n int64) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	r := C.cuMemHostAlloc(&p, C.size_t(n), C.CU_MEMHOSTALLOC_PORTABLE)
	if r != C.CUDA_SUCCESS {
		return nil, resultError(int(r))
	}
	return p, nil
}

// memFreeHost frees memory from memHostAlloc.
func memFreeHost(p unsafe.Pointer) error {
	if r := C.cuMemFreeHost(p); r != C.CUDA_SUCCESS {
		return resultError(int(r))
	}
	return nil
}

// hostAlloc allocates n bytes of ordinary (pageable) C memory, so that
// asynchronous copies may use it after the call that issued them returns
// (Go memory may not be kept by C). nil means the C library refused.
func hostAlloc(n int64) unsafe.Pointer {
	if uint64(n) > uint64(^C.size_t(0)) {
		return nil
	}
	return C.rz_malloc(C.size_t(n))
}

func hostFree(p unsafe.Pointer) { C.free(p) }

// errorName returns the CUDA name of a CUresult ("CUDA_ERROR_OUT_OF_MEMORY")
// and its description, or "" for a code the driver does not know.
func errorName(code int) (name, desc string) {
	var s *C.char
	if C.cuGetErrorName(C.CUresult(code), &s) == C.CUDA_SUCCESS && s != nil {
		name = C.GoString(s)
	}
	s = nil
	if C.cuGetErrorString(C.CUresult(code), &s) == C.CUDA_SUCCESS && s != nil {
		desc = C.GoString(s)
	}
	return name, desc
}

// resultCode returns the CUresult carried by an error of gorgonia.org/cu
// (its unexported integer type), and false for any other error.
func resultCode(err error) (int, bool) {
	v := reflect.ValueOf(err)
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Type().PkgPath() == "gorgonia.org/cu" {
			return int(v.Int()), true
		}
	}
	return 0, false
}
