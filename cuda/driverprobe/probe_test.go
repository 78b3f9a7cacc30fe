package driverprobe

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On any machine the probe either finds a device or says cleanly why not;
// it never crashes the process.
func TestProbeAnswersCleanly(t *testing.T) {
	res, err := Probe()
	if err != nil {
		require.ErrorIs(t, err, ErrNoDriver)
		var pe *Error
		require.ErrorAs(t, err, &pe)
		assert.NotEmpty(t, pe.Step)
		assert.NotEmpty(t, pe.Name)
		t.Logf("no GPU here: %v", err)
		return
	}
	assert.Positive(t, res.Devices)
	assert.Positive(t, res.DriverVersion)
	t.Logf("driver %d, %d device(s)", res.DriverVersion, res.Devices)
}

func TestProbeMissingLibrary(t *testing.T) {
	_, err := probe(filepath.Join(t.TempDir(), "libcuda.so.1"))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, ErrNoDriver)
	assert.Contains(t, pe.Step, "dlopen")
	assert.Zero(t, pe.Code)
}

// With the link-time stub of the driver (make cuda-check puts one in its
// cache; RESIDENCY_CUDA_STUB names it), cuInit fails with
// CUDA_ERROR_STUB_LIBRARY, and the probe names it.
func TestProbeStubLibrary(t *testing.T) {
	stub := os.Getenv("RESIDENCY_CUDA_STUB")
	if stub == "" {
		t.Skip("RESIDENCY_CUDA_STUB not set (make cuda-check sets it to the cached stub libcuda.so)")
	}
	_, err := probe(stub)
	var pe *Error
	require.ErrorAs(t, err, &pe)
	assert.True(t, errors.Is(err, ErrNoDriver))
	assert.Equal(t, "cuInit", pe.Step)
	assert.Equal(t, "CUDA_ERROR_STUB_LIBRARY", pe.Name)
	assert.Equal(t, 34, pe.Code)
}
