package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/system/cluster"
)

// buildDemo builds this command without the race detector (the nodes run
// protoactor's cluster, whose own code races) for the node processes.
func buildDemo(t *testing.T) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "demo")
	out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return exe
}

// signalWriter collects output and closes seen once it contains want.
type signalWriter struct {
	mu   sync.Mutex
	b    bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.b.Write(p)
	if w.want != "" && strings.Contains(w.b.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// requireGone checks that every process the demo started has exited and
// its temporary folder is removed.
func requireGone(t *testing.T, pids []int, dir string) {
	t.Helper()
	require.NotEmpty(t, pids)
	for _, pid := range pids {
		err := syscall.Kill(pid, 0)
		require.True(t, errors.Is(err, syscall.ESRCH), "process %d still exists (kill -0: %v)", pid, err)
	}
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "temporary folder %s: %v", dir, err)
}

// The cluster demo runs its numbered steps with each provider (etcd when
// installed), the copies read back identical, the placement lands on a
// node that holds the value and says why, the dead node's request is an
// UnavailableError, and nothing is left behind: no process, no folder.
func TestClusterDemo(t *testing.T) {
	exe := buildDemo(t)
	for _, provider := range []string{"automanaged", "etcd"} {
		t.Run(provider, func(t *testing.T) {
			if provider == "etcd" && nodeproc.EtcdBinary() == "" {
				t.Skip("etcd is not installed: run `make etcd` (Debian's etcd-server) to run this test")
			}
			var pids []int
			var dir string
			out, errOut := &signalWriter{}, &signalWriter{}
			code := clusterDemo(context.Background(), clusterDemoOptions{provider: provider, exe: exe,
				started: func(p []int, d string) { pids, dir = p, d }}, out, errOut)
			require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			s := out.String()
			for _, want := range []string{"\n1. ", "\n2. Started node-a, node-b and node-c", "\n4. node-b copies", "\n11. Stopping", "Done."} {
				require.Contains(t, s, want)
			}
			// The placement step: node-c's request lands on a node that
			// holds the value (node-a: node-b holds it too, with as much
			// room, and loses the tie by name), not on node-c, which has
			// more room; the chosen copy is leased while the request is
			// held, and no longer after its release.
			i7, i8 := strings.Index(s, "\n7. "), strings.Index(s, "\n8. ")
			require.True(t, i7 >= 0 && i8 > i7, s)
			step7 := s[i7:i8]
			for _, want := range []string{
				`node-c asks the cluster to run a request, "serve-weights" (work that needs values resident while it runs), that needs "weights" in the cuda:0 of any node (cuda:0@*)`,
				`1. node-a  has "weights" in cuda:0 already`,
				`3. node-c  does not have it`,
				`Chosen: node-a, because "weights" is already in its cuda:0, so nothing has to be copied, although node-c has more free memory`,
				"admitted it on the first try",
				"keeps a lease on that copy (leases: 1)",
				"releases it (leases: 0)",
				"(Placement.Why;",
				"\n   node node-a ranked 1; already resident there: weights at cuda:0@node-a",
			} {
				require.Contains(t, step7, want)
			}
			// The summaries step shows both copies (it must not print a
			// summary published before the value was loaded).
			i6 := strings.Index(s, "\n6. ")
			require.True(t, i6 >= 0 && i7 > i6, s)
			for _, node := range []string{"node-a", "node-b"} {
				require.Contains(t, s[i6:i7], "   "+node+"  cuda:0   16.0 MiB used of 64 MiB")
			}
			require.Equal(t, 2, strings.Count(s, "— identical"), s)
			require.Contains(t, s, "refused after")
			require.Contains(t, s, "UnavailableError")
			require.Contains(t, s, "resident at cuda:0@node-a and cuda:0@node-b")
			require.Len(t, pids, map[string]int{"automanaged": 3, "etcd": 4}[provider])
			requireGone(t, pids, dir)
		})
	}
}

// Interrupted (Ctrl-C) in the middle, the demo stops every process it
// started, removes its folder and exits with status 130.
func TestClusterDemoInterrupted(t *testing.T) {
	exe := buildDemo(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &signalWriter{want: "\n3. ", seen: make(chan struct{})}
	errOut := &signalWriter{}
	go func() {
		<-out.seen
		cancel()
	}()
	var pids []int
	var dir string
	code := clusterDemo(ctx, clusterDemoOptions{exe: exe, started: func(p []int, d string) { pids, dir = p, d }}, out, errOut)
	require.Equal(t, exitInterrupted, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	require.Contains(t, out.String(), "Interrupted: stopping the nodes")
	requireGone(t, pids, dir)
}

// TestSummaryLinesWaitForEveryHolder: the summaries step waits until
// node-c's view shows the copy of every node that holds the value, not
// node-b's alone, so it never prints node-a's stale summary ("0.0 MiB
// used" for a node holding 16 MiB) when node-a has not published since
// it loaded the value.
func TestSummaryLinesWaitForEveryHolder(t *testing.T) {
	sum := func(node string, used int64) cluster.NodeSummary {
		return cluster.NodeSummary{Node: node, Locations: []cluster.LocationSummary{
			{Location: "pageable-host@" + node, BudgetBytes: 256 << 20},
			{Location: "cuda:0@" + node, UsedBytes: used, BudgetBytes: 64 << 20}}}
	}
	lines, settled := summaryLines([]cluster.NodeSummary{sum("node-a", 0), sum("node-b", demoBytes), sum("node-c", 0)}, "node-a", "node-b")
	assert.False(t, settled, "node-a's summary is stale")
	assert.Equal(t, "   node-a  cuda:0    0.0 MiB used of 64 MiB", lines[0])
	_, settled = summaryLines([]cluster.NodeSummary{sum("node-a", demoBytes), sum("node-b", demoBytes)}, "node-a", "node-b")
	assert.False(t, settled, "node-c's summary is missing")
	lines, settled = summaryLines([]cluster.NodeSummary{sum("node-a", demoBytes), sum("node-b", demoBytes), sum("node-c", 0)}, "node-a", "node-b")
	assert.True(t, settled)
	assert.Equal(t, []string{"   node-a  cuda:0   16.0 MiB used of 64 MiB", "   node-b  cuda:0   16.0 MiB used of 64 MiB", "   node-c  cuda:0    0.0 MiB used of 64 MiB"}, lines)
}
