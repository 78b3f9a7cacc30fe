package cuda

import "fmt"

// DeviceInfo describes one GPU as NVML reports it (package cuda/discover
// fills it in). It is an observation, for diagnostics and for sizing
// default budgets; it is never admission evidence: the runtime admits work
// by its own arithmetic over the budgets it was configured with, whatever
// NVML says at that moment.
type DeviceInfo struct {
	// Index is NVML's index of the device (PCI bus order). It is not
	// necessarily the CUDA ordinal N of cuda:N: CUDA orders devices fastest
	// first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA_VISIBLE_DEVICES
	// hides and renumbers devices for CUDA but not for NVML. Match devices
	// by UUID.
	Index int
	// UUID is the device's UUID as NVML spells it ("GPU-…").
	UUID string
	// Name is the product name ("NVIDIA H100 80GB HBM3").
	Name string
	// PCIBusID is the PCI bus id ("00000000:3B:00.0").
	PCIBusID string
	// TotalBytes, FreeBytes and UsedBytes are NVML's memory figures at
	// the time of discovery (used includes memory the driver reserves and
	// other processes' allocations).
	TotalBytes int64
	FreeBytes  int64
	UsedBytes  int64
}

// DefaultBudget returns a default byte budget for a device location: its
// total memory less headroomBytes (left for the CUDA context, libraries,
// other processes and fragmentation), and at most capBytes when capBytes
// > 0. Both are settable by the caller; 0 means no headroom, or no cap.
//
// The figure is derived from an NVML observation (see [DeviceInfo]) and
// is only configuration: pass it as the location's budget (system.Limit),
// after which the runtime holds work to it strictly and never asks NVML
// again.
//
// It returns an error matching [ErrInvalid] for a negative cap or headroom,
// a device with no total memory, or a headroom that leaves nothing.
func DefaultBudget(info DeviceInfo, capBytes, headroomBytes int64) (int64, error) {
	switch {
	case capBytes < 0:
		return 0, fmt.Errorf("%w: negative budget cap %d", ErrInvalid, capBytes)
	case headroomBytes < 0:
		return 0, fmt.Errorf("%w: negative headroom %d", ErrInvalid, headroomBytes)
	case info.TotalBytes <= 0:
		return 0, fmt.Errorf("%w: device %d (%s) reports %d bytes of total memory", ErrInvalid, info.Index, info.Name, info.TotalBytes)
	case headroomBytes >= info.TotalBytes:
		return 0, fmt.Errorf("%w: headroom of %d bytes leaves nothing of device %d (%s), which has %d bytes", ErrInvalid, headroomBytes, info.Index, info.Name, info.TotalBytes)
	}
	b := info.TotalBytes - headroomBytes
	if capBytes > 0 && capBytes < b {
		b = capBytes
	}
	return b, nil
}
