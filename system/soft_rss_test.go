package system

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
)

// readmeChildEnv names the environment variable that makes
// TestREADMEExampleRSS's child process run the README's example with a
// value of that many bytes and print its figures.
const readmeChildEnv = "RESIDENCY_README_RSS_BYTES"

// readmeRSSLimit is the README's promise for its own example on the soft
// backend: a 14 GiB value whose loader writes nothing costs the process
// less than this much resident memory.
const readmeRSSLimit = 200 << 20

// TestREADMEExampleRSS runs the README's example (a 14 GiB value loaded
// from pageable-host by a loader that writes nothing, admitted onto a
// simulated 80 GiB GPU) in a child process, so that the child's peak
// resident set (VmHWM of /proc/self/status) measures this example alone,
// and checks that it stays under 200 MB: on the soft backend a simulated
// device costs only the bytes written to it. Linux only (VmHWM).
func TestREADMEExampleRSS(t *testing.T) {
	if os.Getenv(readmeChildEnv) != "" {
		t.Skip("the child process runs TestREADMEExampleRSSChild")
	}
	if runtime.GOOS != "linux" {
		t.Skip("VmHWM of /proc/self/status is Linux's")
	}
	if mode, err := os.ReadFile("/proc/sys/vm/overcommit_memory"); err == nil && strings.TrimSpace(string(mode)) == "2" {
		t.Skip("strict overcommit: the kernel refuses a 14 GiB mapping even if it is never written")
	}
	res := runREADMEChild(t, 14<<30)
	t.Logf("README example, 14 GiB value: peak RSS %d MiB, Admit %v, Register %v",
		res.hwm>>20, res.admit, res.register)
	require.Less(t, res.hwm, int64(readmeRSSLimit), "peak RSS of the README example")
}

// readmeFigures is what the child reports.
type readmeFigures struct {
	hwm      int64 // peak resident bytes
	register time.Duration
	admit    time.Duration
}

// runREADMEChild runs the example with a value of n bytes in a child
// process and parses its figures.
func runREADMEChild(t testing.TB, n int64) readmeFigures {
	t.Helper()
	out := runChild(t, "^TestREADMEExampleRSSChild$", readmeChildEnv+"="+strconv.FormatInt(n, 10))
	var f readmeFigures
	sc := bufio.NewScanner(bytes.NewReader(out))
	found := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		var reg, adm int64
		if _, err := fmt.Sscanf(line, "FIGURES hwm=%d register_ns=%d admit_ns=%d", &f.hwm, &reg, &adm); err == nil {
			f.register, f.admit, found = time.Duration(reg), time.Duration(adm), true
		}
	}
	require.True(t, found, "no figures from the child: %s", out)
	return f
}

// TestREADMEExampleRSSChild is the child of TestREADMEExampleRSS: it runs
// only when the parent sets readmeChildEnv.
func TestREADMEExampleRSSChild(t *testing.T) {
	arg := os.Getenv(readmeChildEnv)
	if arg == "" {
		t.Skip("run by TestREADMEExampleRSS in a child process")
	}
	n, err := strconv.ParseInt(arg, 10, 64)
	require.NoError(t, err)
	ctx := context.Background()
	locs := []LocationConfig{
		NoLimit("pageable-host"),
		Limit("pinned-host", 64<<30),
		Limit("cuda:0", 80<<30),
		Limit("cuda:1", 80<<30),
	}
	backend, err := SoftBackend(locs, soft.Config{})
	require.NoError(t, err)
	defer backend.Close()
	sys, err := Start(ctx, Options{Locations: locs, Backend: backend})
	require.NoError(t, err)
	defer sys.Close(ctx)

	loadWeights := func(context.Context, []byte) error { return nil } // writes nothing
	t0 := time.Now()
	h, err := sys.Register(ctx, Value{Name: "llama-7b", Bytes: n, Source: "pageable-host", Loader: loadWeights})
	require.NoError(t, err)
	t1 := time.Now()
	scope, d, err := sys.Admit(ctx, Request{Name: "chat", Requirements: []Requirement{
		{Handle: h, Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}},
	}}, WaitForRoom())
	require.NoError(t, err)
	t2 := time.Now()
	require.NotEmpty(t, d.Plan.Enter, "the value was placed")
	require.NoError(t, scope.Exit(ctx))
	hwm, err := procStatus("VmHWM")
	require.NoError(t, err)
	fmt.Printf("FIGURES hwm=%d register_ns=%d admit_ns=%d\n", hwm, t1.Sub(t0).Nanoseconds(), t2.Sub(t1).Nanoseconds())
}

// runChild runs this test binary again in a child process, running only
// the tests that match run, with env added to its environment, and
// returns its output.
func runChild(t testing.TB, run, env string) []byte {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run", run, "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child: %s", out)
	return out
}

// procStatus returns a memory figure of /proc/self/status in bytes:
// "VmHWM" (the peak resident set) or "VmRSS" (the resident set now).
func procStatus(field string) (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}
