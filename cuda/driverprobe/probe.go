// Package driverprobe tells whether a CUDA driver and a device are usable
// in this process, without linking the driver: it loads libcuda.so.1 at run
// time (dlopen), calls cuInit, cuDriverGetVersion and cuDeviceGetCount, and
// reports what it found. It needs no NVIDIA file to build.
//
// The cu backend (package cuda/cu, build tag `cuda`) links the driver and
// exits at start-up when cuInit fails, so a program or test that wants to
// decide first, and skip cleanly, asks this package in a process that does
// not link it.
package driverprobe

// #cgo LDFLAGS: -ldl
// #include <dlfcn.h>
// #include <stdlib.h>
//
// typedef int (*rz_int_uint)(unsigned int);
// typedef int (*rz_intp)(int *);
// typedef int (*rz_name)(int, const char **);
//
// static int rz_call_init(void *f, unsigned int flags) { return ((rz_int_uint)f)(flags); }
// static int rz_call_intp(void *f, int *out) { return ((rz_intp)f)(out); }
// static const char *rz_call_name(void *f, int code) {
//	const char *s = 0;
//	if (f == 0 || ((rz_name)f)(code, &s) != 0) return 0;
//	return s;
// }
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Library is the file name the probe loads: the driver's, as the dynamic
// loader finds it (LD_LIBRARY_PATH, the system's library path).
const Library = "libcuda.so.1"

// Result is what the probe found.
type Result struct {
	// DriverVersion is cuDriverGetVersion's answer (e.g. 12040 for 12.4).
	DriverVersion int
	// Devices is cuDeviceGetCount's answer.
	Devices int
}

// ErrNoDriver matches every failure of the probe: no driver library, a
// driver that fails cuInit (the CUDA error name says why:
// CUDA_ERROR_NO_DEVICE, CUDA_ERROR_STUB_LIBRARY, …), or no device.
var ErrNoDriver = errors.New("no usable CUDA driver and device")

// Error is a failure of the probe. It matches errors.Is(err, ErrNoDriver).
type Error struct {
	Step string // "dlopen libcuda.so.1", "cuInit", "cuDeviceGetCount", …
	Code int    // the CUresult; 0 for dlopen and dlsym failures
	Name string // CUDA's name of Code, or the dynamic loader's message
}

func (e *Error) Error() string {
	if e.Code != 0 {
		return fmt.Sprintf("CUDA driver probe: %s: %s (CUresult %d)", e.Step, e.Name, e.Code)
	}
	return fmt.Sprintf("CUDA driver probe: %s: %s", e.Step, e.Name)
}

// Is reports whether target is ErrNoDriver.
func (e *Error) Is(target error) bool { return target == ErrNoDriver }

// Probe loads the driver library, initializes it and counts devices. It
// returns the result when cuInit succeeds and at least one device is
// present, and otherwise an [*Error] (matching [ErrNoDriver]) naming the
// step that failed. The library stays loaded (unloading a CUDA driver is
// not safe). Probe is safe for concurrent use.
func Probe() (Result, error) {
	return probe(Library)
}

func probe(lib string) (Result, error) {
	name := C.CString(lib)
	defer C.free(unsafe.Pointer(name))
	h := C.dlopen(name, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return Result{}, &Error{Step: "dlopen " + lib, Name: dlerror()}
	}
	sym := func(s string) (unsafe.Pointer, error) {
		cs := C.CString(s)
		defer C.free(unsafe.Pointer(cs))
		p := C.dlsym(h, cs)
		if p == nil {
			return nil, &Error{Step: "dlsym " + s, Name: dlerror()}
		}
		return p, nil
	}
	nameFn, _ := sym("cuGetErrorName")
	fail := func(step string, code C.int) error {
		e := &Error{Step: step, Code: int(code)}
		if s := C.rz_call_name(nameFn, code); s != nil {
			e.Name = C.GoString(s)
		} else if n, ok := knownResults[int(code)]; ok {
			e.Name = n // the stub library, for one, does not name results
		} else {
			e.Name = "unknown CUresult"
		}
		return e
	}
	initFn, err := sym("cuInit")
	if err != nil {
		return Result{}, err
	}
	if r := C.rz_call_init(initFn, 0); r != 0 {
		return Result{}, fail("cuInit", r)
	}
	var res Result
	verFn, err := sym("cuDriverGetVersion")
	if err != nil {
		return Result{}, err
	}
	var v C.int
	if r := C.rz_call_intp(verFn, &v); r != 0 {
		return Result{}, fail("cuDriverGetVersion", r)
	}
	res.DriverVersion = int(v)
	countFn, err := sym("cuDeviceGetCount")
	if err != nil {
		return Result{}, err
	}
	var n C.int
	if r := C.rz_call_intp(countFn, &n); r != 0 {
		return Result{}, fail("cuDeviceGetCount", r)
	}
	res.Devices = int(n)
	if n == 0 {
		return res, &Error{Step: "cuDeviceGetCount", Name: "0 devices"}
	}
	return res, nil
}

// knownResults names the CUresults an initialization can fail with, for
// libraries whose cuGetErrorName does not answer (the stub's does not).
var knownResults = map[int]string{
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	999: "CUDA_ERROR_UNKNOWN",
}

func dlerror() string {
	if s := C.dlerror(); s != nil {
		return C.GoString(s)
	}
	return "unknown dynamic loader error"
}
