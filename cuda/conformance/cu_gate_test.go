//go:build cuda

package conformance_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/residency-go/residency/cuda/driverprobe"
)

// TestCUBackendOnGPU runs the cu backend's tests (the conformance suite
// among them) when this machine has a usable CUDA driver and device, and
// skips with the reason when it has not. It links no driver itself: the cu
// backend's test binary exits at start-up without a GPU, so it runs as a
// child process, either the binary named by RESIDENCY_CU_TEST_BINARY (make
// gpu-check builds one) or `go test -tags cuda,gpu ../cu`.
func TestCUBackendOnGPU(t *testing.T) {
	res, err := driverprobe.Probe()
	if err != nil {
		t.Skipf("no GPU, so the cu backend's tests cannot run here: %v", err)
	}
	t.Logf("CUDA driver %d, %d device(s)", res.DriverVersion, res.Devices)

	var cmd *exec.Cmd
	if bin := os.Getenv("RESIDENCY_CU_TEST_BINARY"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command(abs, "-test.count=1", "-test.v")
	} else {
		goTool, err := exec.LookPath("go")
		if err != nil {
			t.Fatalf("a GPU is present but neither RESIDENCY_CU_TEST_BINARY nor the go command is available to run the cu backend's tests: %v", err)
		}
		args := []string{"test", "-tags", "cuda,gpu", "-count=1", "-v"}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd = exec.Command(goTool, append(args, "../cu")...)
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	t.Logf("running %s", cmd)
	if err := cmd.Run(); err != nil {
		t.Fatalf("the cu backend's tests failed: %v", err)
	}
}
