package discover

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/residency-go/residency/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On this machine (no NVIDIA driver, CI included) discovery is a clean "no
// GPU": no error, no devices, a reason. On a GPU machine it lists them.
func TestDevicesOnThisMachine(t *testing.T) {
	inv, err := Devices()
	require.NoError(t, err)
	if len(inv.Devices) == 0 {
		assert.NotEmpty(t, inv.NoGPU)
		t.Logf("no GPU: %s", inv.NoGPU)
		return
	}
	assert.Empty(t, inv.NoGPU)
	for _, d := range inv.Devices {
		assert.NotEmpty(t, d.Name)
		assert.Positive(t, d.TotalBytes)
		t.Logf("%d: %s %s (%s), %d of %d bytes free", d.Index, d.Name, d.UUID, d.PCIBusID, d.FreeBytes, d.TotalBytes)
	}
}

func busID(s string) [32]int8 {
	var b [32]int8
	for i := range len(s) {
		b[i] = int8(s[i])
	}
	return b
}

func fakeDevice(name, uuid, bus string, total, free uint64) *mock.Device {
	return &mock.Device{
		GetNameFunc:    func() (string, nvml.Return) { return name, nvml.SUCCESS },
		GetUUIDFunc:    func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{BusId: busID(bus)}, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: total, Free: free, Used: total - free}, nvml.SUCCESS
		},
	}
}

func fakeLib(devs ...nvml.Device) *mock.Interface {
	return &mock.Interface{
		InitFunc:                       func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                   func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "550.54.15", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 12040, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
	}
}

func TestDevicesListsEveryGPU(t *testing.T) {
	const gib = 1 << 30
	lib := fakeLib(
		fakeDevice("NVIDIA H100 80GB HBM3", "GPU-aaaa", "00000000:3B:00.0", 80*gib, 79*gib),
		fakeDevice("NVIDIA L4", "GPU-bbbb", "00000000:5E:00.0", 24*gib, 20*gib),
	)
	inv, err := devices(lib)
	require.NoError(t, err)
	assert.Equal(t, Inventory{
		DriverVersion: "550.54.15",
		CUDAVersion:   12040,
		Devices: []cuda.DeviceInfo{
			{Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA H100 80GB HBM3", PCIBusID: "00000000:3B:00.0", TotalBytes: 80 * gib, FreeBytes: 79 * gib, UsedBytes: gib},
			{Index: 1, UUID: "GPU-bbbb", Name: "NVIDIA L4", PCIBusID: "00000000:5E:00.0", TotalBytes: 24 * gib, FreeBytes: 20 * gib, UsedBytes: 4 * gib},
		},
	}, inv)
	assert.Len(t, lib.ShutdownCalls(), 1, "NVML shut down again")

	budget, err := cuda.DefaultBudget(inv.Devices[0], 0, 4*gib)
	require.NoError(t, err)
	assert.Equal(t, int64(76*gib), budget)
}

func TestDevicesNoGPUIsClean(t *testing.T) {
	for _, ret := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED} {
		lib := fakeLib()
		lib.InitFunc = func() nvml.Return { return ret }
		inv, err := devices(lib)
		require.NoError(t, err, "%v", ret)
		assert.Empty(t, inv.Devices)
		assert.NotEmpty(t, inv.NoGPU)
		assert.Empty(t, lib.ShutdownCalls(), "no Shutdown after a failed Init")
	}
	inv, err := devices(fakeLib()) // a driver with zero devices
	require.NoError(t, err)
	assert.Empty(t, inv.Devices)
	assert.Equal(t, "the NVIDIA driver reports no device", inv.NoGPU)
}

func TestDevicesFailuresAreErrors(t *testing.T) {
	lib := fakeLib()
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
	_, err := devices(lib)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "nvmlInit", e.Op)
	assert.True(t, errors.Is(err, nvml.ERROR_NO_PERMISSION))

	broken := fakeDevice("x", "GPU-x", "0", 1, 1)
	broken.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	lib = fakeLib(broken)
	_, err = devices(lib)
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "nvmlDeviceGetMemoryInfo(0)", e.Op)
	assert.ErrorIs(t, err, nvml.ERROR_GPU_IS_LOST)
	assert.Contains(t, err.Error(), "ERROR_GPU_IS_LOST")
	assert.Len(t, lib.ShutdownCalls(), 1, "NVML shut down after a failure")
}
