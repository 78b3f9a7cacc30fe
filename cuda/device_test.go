package cuda_test

import (
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultBudget(t *testing.T) {
	const gib = int64(1) << 30
	h100 := cuda.DeviceInfo{Index: 0, Name: "NVIDIA H100 80GB HBM3", TotalBytes: 80 * gib, FreeBytes: 79 * gib, UsedBytes: gib}
	for _, c := range []struct {
		name          string
		cap, headroom int64
		want          int64
	}{
		{"total", 0, 0, 80 * gib},
		{"headroom", 0, 4 * gib, 76 * gib},
		{"cap below", 40 * gib, 4 * gib, 40 * gib},
		{"cap above", 100 * gib, 4 * gib, 76 * gib},
		{"cap equal", 76 * gib, 4 * gib, 76 * gib},
		{"one byte left", 0, 80*gib - 1, 1},
	} {
		got, err := cuda.DefaultBudget(h100, c.cap, c.headroom)
		require.NoError(t, err, c.name)
		assert.Equal(t, c.want, got, c.name)
	}
	for name, c := range map[string]struct {
		info          cuda.DeviceInfo
		cap, headroom int64
	}{
		"negative cap":      {h100, -1, 0},
		"negative headroom": {h100, 0, -1},
		"headroom = total":  {h100, 0, 80 * gib},
		"headroom > total":  {h100, 10, 81 * gib},
		"no total":          {cuda.DeviceInfo{Name: "broken"}, 0, 0},
	} {
		_, err := cuda.DefaultBudget(c.info, c.cap, c.headroom)
		assert.ErrorIs(t, err, cuda.ErrInvalid, name)
	}
}

func TestInjectedFaultErrorNamesItsBackend(t *testing.T) {
	soft := &cuda.InjectedFaultError{Kind: cuda.FaultCopy, Location: "cuda:1", Backend: "soft backend"}
	assert.Equal(t, "soft backend: injected copy fault at cuda:1", soft.Error())
	unnamed := &cuda.InjectedFaultError{Kind: cuda.FaultCopy, Location: "cuda:1"}
	assert.Equal(t, "cuda: injected copy fault at cuda:1", unnamed.Error())
	cu := &cuda.InjectedFaultError{Kind: cuda.FaultAlloc, Location: "cuda:0", Backend: "cu backend"}
	assert.Equal(t, "cu backend: injected alloc fault at cuda:0", cu.Error())
	assert.ErrorIs(t, cu, cuda.ErrInjectedFault)
}
