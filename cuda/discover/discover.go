// Package discover reports the NVIDIA GPUs of this machine through NVML
// (github.com/NVIDIA/go-nvml): how many, their names, UUIDs, PCI bus ids,
// and total, free and used memory. It needs no build tag and no NVIDIA
// file to build: go-nvml loads libnvidia-ml.so.1 at run time. On a machine
// without the library or without a loaded driver, [Devices] returns an
// [Inventory] with no devices and the reason, not an error.
//
// What NVML reports is an observation for diagnostics and for sizing
// default budgets ([cuda.DefaultBudget]), never admission evidence: the
// runtime admits work by its own arithmetic over configured budgets.
// NVML's device index is PCI bus order and ignores CUDA_VISIBLE_DEVICES;
// match NVML devices with CUDA ordinals by UUID (the cu backend's
// DeviceUUID).
package discover

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/residency-go/residency/cuda"
)

// Inventory is the result of a discovery.
type Inventory struct {
	// DriverVersion is the NVIDIA driver's version ("550.54.15"), and
	// CUDAVersion the CUDA version the driver supports (12040 for 12.4);
	// both empty or 0 when no driver answered.
	DriverVersion string
	CUDAVersion   int
	// Devices are the GPUs in NVML index order.
	Devices []cuda.DeviceInfo
	// NoGPU says why Devices is empty ("" when it is not): no NVML
	// library, no driver loaded, or no device.
	NoGPU string
}

// Devices asks NVML for the GPUs of this machine. No NVML library
// (ERROR_LIBRARY_NOT_FOUND), a driver that is not loaded
// (ERROR_DRIVER_NOT_LOADED) and zero devices are a clean result: an
// Inventory with no devices and NoGPU set, and a nil error. Any other NVML
// failure is an error naming the call and NVML's return code (errors.Is
// matches the nvml.Return). Devices initializes NVML and shuts it down
// again before returning; it is safe for concurrent use.
func Devices() (Inventory, error) {
	return devices(nvml.New())
}

func devices(lib nvml.Interface) (inv Inventory, err error) {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return Inventory{NoGPU: "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver is installed"}, nil
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return Inventory{NoGPU: "the NVIDIA driver is not loaded"}, nil
	default:
		return Inventory{}, fail("nvmlInit", ret)
	}
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS && err == nil {
			err = fail("nvmlShutdown", ret)
		}
	}()

	var ret nvml.Return
	if inv.DriverVersion, ret = lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return Inventory{}, fail("nvmlSystemGetDriverVersion", ret)
	}
	if inv.CUDAVersion, ret = lib.SystemGetCudaDriverVersion(); ret != nvml.SUCCESS {
		return Inventory{}, fail("nvmlSystemGetCudaDriverVersion", ret)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Inventory{}, fail("nvmlDeviceGetCount", ret)
	}
	if n == 0 {
		inv.NoGPU = "the NVIDIA driver reports no device"
		return inv, nil
	}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return Inventory{}, fail(fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d)", i), ret)
		}
		info := cuda.DeviceInfo{Index: i}
		if info.Name, ret = d.GetName(); ret != nvml.SUCCESS {
			return Inventory{}, fail(fmt.Sprintf("nvmlDeviceGetName(%d)", i), ret)
		}
		if info.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
			return Inventory{}, fail(fmt.Sprintf("nvmlDeviceGetUUID(%d)", i), ret)
		}
		pci, ret := d.GetPciInfo()
		if ret != nvml.SUCCESS {
			return Inventory{}, fail(fmt.Sprintf("nvmlDeviceGetPciInfo(%d)", i), ret)
		}
		info.PCIBusID = cString(pci.BusId[:])
		mem, ret := d.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return Inventory{}, fail(fmt.Sprintf("nvmlDeviceGetMemoryInfo(%d)", i), ret)
		}
		info.TotalBytes, info.FreeBytes, info.UsedBytes = clamp(mem.Total), clamp(mem.Free), clamp(mem.Used)
		inv.Devices = append(inv.Devices, info)
	}
	return inv, nil
}

// Error is a failed NVML call.
type Error struct {
	Op     string      // the NVML call
	Return nvml.Return // its return code
}

func (e *Error) Error() string {
	return fmt.Sprintf("nvml: %s: %s (return %d)", e.Op, returnName(e.Return), int32(e.Return))
}

// Unwrap returns the nvml.Return, so errors.Is(err, nvml.ERROR_…) works.
func (e *Error) Unwrap() error { return e.Return }

func fail(op string, ret nvml.Return) error { return &Error{Op: op, Return: ret} }

// returnName is NVML's description of ret, which is its name
// ("ERROR_NO_PERMISSION") while the library is not loaded.
func returnName(ret nvml.Return) string { return ret.Error() }

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

func clamp(v uint64) int64 {
	if v > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(v)
}
