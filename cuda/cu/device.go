//go:build cuda

package cu

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	gcu "gorgonia.org/cu"
)

// device is one GPU as the backend uses it: its primary context (retained
// in New, released in Close) and a private stream for the synchronous
// transfers of Read, Write and Load.
//
// Every driver call runs through do, on a locked OS thread with the
// device's context pushed, so it is correct from any goroutine.
type device struct {
	ordinal int
	dev     gcu.Device
	ctx     gcu.CUContext

	mu      sync.Mutex // serializes synchronous transfers; guards private
	private gcu.Stream // non-blocking; made on first use
	hasPriv bool       // guarded by mu
}

func openDevice(ordinal int) (*device, error) {
	dev, err := gcu.GetDevice(ordinal)
	if err != nil {
		return nil, wrap(fmt.Sprintf("cuDeviceGet(%d)", ordinal), err)
	}
	d := &device{ordinal: ordinal, dev: dev}
	ua, err := dev.Attribute(gcu.UnifiedAddressing)
	if err != nil {
		return nil, wrap(fmt.Sprintf("cuDeviceGetAttribute(UNIFIED_ADDRESSING) of device %d", ordinal), err)
	}
	if ua != 1 {
		return nil, fmt.Errorf("cu backend: device %d does not support unified addressing, which the backend needs for copies between contexts", ordinal)
	}
	d.ctx, err = dev.RetainPrimaryCtx()
	if err != nil {
		return nil, wrap(fmt.Sprintf("cuDevicePrimaryCtxRetain(%d)", ordinal), err)
	}
	return d, nil
}

// do runs f on a locked OS thread with the device's primary context
// current, then restores the thread's previous context.
func (d *device) do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := gcu.PushCurrentCtx(d.ctx); err != nil {
		return wrap("cuCtxPushCurrent", err)
	}
	err := f()
	if _, perr := gcu.PopCurrentCtx(); perr != nil && err == nil {
		err = wrap("cuCtxPopCurrent", perr)
	}
	return err
}

// transfer runs issue on the device's private stream and waits for it to
// finish, holding the device's transfer lock.
func (d *device) transfer(what string, issue func(s gcu.Stream) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.do(func() error {
		if !d.hasPriv {
			s, err := gcu.MakeStream(gcu.NonBlocking)
			if err != nil {
				return wrap("cuStreamCreate", err)
			}
			d.private, d.hasPriv = s, true
		}
		if err := issue(d.private); err != nil {
			return wrap(what, err)
		}
		return waitStream(d.private)
	})
}

// toHost copies n bytes of device memory at src into dst (Go memory,
// pinned for the duration of the call).
func (d *device) toHost(dst []byte, src gcu.DevicePtr, loc string) error {
	if len(dst) == 0 {
		return nil
	}
	var pin runtime.Pinner
	pin.Pin(&dst[0])
	defer pin.Unpin()
	return d.transfer(fmt.Sprintf("cuMemcpyDtoHAsync(%d B) from %s", len(dst), loc), func(s gcu.Stream) error {
		return gcu.MemcpyDtoHAsync(unsafe.Pointer(&dst[0]), src, int64(len(dst)), s)
	})
}

// fromHost copies src (Go memory, pinned for the duration of the call)
// into device memory at dst.
func (d *device) fromHost(dst gcu.DevicePtr, src []byte, loc string) error {
	if len(src) == 0 {
		return nil
	}
	var pin runtime.Pinner
	pin.Pin(&src[0])
	defer pin.Unpin()
	return d.transfer(fmt.Sprintf("cuMemcpyHtoDAsync(%d B) to %s", len(src), loc), func(s gcu.Stream) error {
		return gcu.MemcpyHtoDAsync(dst, unsafe.Pointer(&src[0]), int64(len(src)), s)
	})
}

// close destroys the private stream and releases the primary context.
func (d *device) close() error {
	var err error
	d.mu.Lock()
	if d.hasPriv {
		err = d.do(func() error { return wrap("cuStreamDestroy", d.private.Destroy()) })
		d.hasPriv = false
	}
	d.mu.Unlock()
	if rerr := d.dev.ReleasePrimaryCtx(); rerr != nil && err == nil {
		err = wrap(fmt.Sprintf("cuDevicePrimaryCtxRelease(%d)", d.ordinal), rerr)
	}
	return err
}

// waitStream blocks the calling thread (which has the stream's context
// current) until the work enqueued on s so far has finished, without
// spinning: it records a blocking-sync event and waits on it.
func waitStream(s gcu.Stream) error {
	ev, err := gcu.MakeEvent(gcu.BlockingSyncEvent | gcu.DisableTiming)
	if err != nil {
		// No event: fall back to a stream synchronize (may spin).
		return wrap("cuStreamSynchronize", s.Synchronize())
	}
	defer gcu.DestroyEvent(&ev)
	if err := ev.Record(s); err != nil {
		return wrap("cuEventRecord", err)
	}
	return wrap("cuEventSynchronize", ev.Synchronize())
}
