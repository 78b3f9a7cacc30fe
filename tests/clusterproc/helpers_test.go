// Package clusterproc_test runs residency nodes as separate processes
// (`demo node`, built from cmd/demo) on loopback, with etcd (Debian's
// etcd-server, started on a free port with a temporary data folder) or the
// automanaged provider, and kills them with SIGKILL. The test process
// joins each cluster as one more member, the driver, and uses the Node API
// against the node processes; the node processes take commands on their
// standard input (internal/nodeproc). `make test` runs it without -race
// (protoactor's cluster code itself races).
package clusterproc_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/system/cluster/providers"
)

// converge bounds what a test waits for processes, membership and the
// directory: generous, so that a slow machine never fails a test; tests
// assert behaviour, and the one spec bound (membership within 10 s of a
// crash) is asserted with its own explanation.
const converge = 90 * time.Second

// demoBin is the demo binary TestMain builds.
var demoBin string

// leakOptions: protoactor's one-shot throttle timers end on their own
// after their window (up to 60 s), long after the node stopped (see
// tests/cluster); the automanaged provider's monitor sleeps one refresh
// interval before it sees the shutdown.
var leakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottleWithLogger.func1.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.NewGossipActor.NewThrottleWithLogger.func2.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.(*Gossiper).StartGossiping.NewThrottle.func3.1"),
	goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.newInformer.NewThrottle.func1.1"),
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "residency-clusterproc-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	demoBin = filepath.Join(dir, "demo")
	build := exec.Command("go", "build", "-o", demoBin, "github.com/residency-go/residency/cmd/demo")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building cmd/demo: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, append(leakOptions, goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))...)
}

// requireEtcd returns etcd's path, or skips the test (fails it with
// CI=true) when it is not installed.
func requireEtcd(t *testing.T) string {
	t.Helper()
	bin := nodeproc.EtcdBinary()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("etcd is not installed (make etcd installs Debian's etcd-server)")
		}
		t.Skip("etcd is not installed: run `make etcd` (Debian's etcd-server) to run this test")
	}
	return bin
}

// procCluster is node processes, optionally etcd, and the driver.
type procCluster struct {
	provider string
	etcd     *nodeproc.Etcd
	auto     map[string]string // node → automanaged health address
	procs    map[string]*nodeproc.Proc
	killed   map[string]bool
	driver   *cluster.Node
	logs     map[string]*lockedBuffer
}

// lockedBuffer collects a process's standard error.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// nodeLocations are every node's locations (the driver's too).
var nodeLocations = []string{"--location", "pageable-host=256MiB", "--location", "cuda:0=64MiB"}

// startCluster starts etcd (provider "etcd"), one process per name and
// the driver member, all at once, and waits until every member sees every
// other. Cleanup stops the driver, then the processes (SIGTERM: each must
// leave and exit 0, unless the test killed it), then etcd.
func startCluster(t *testing.T, provider string, names ...string) *procCluster {
	t.Helper()
	c := &procCluster{provider: provider, procs: map[string]*nodeproc.Proc{}, killed: map[string]bool{},
		logs: map[string]*lockedBuffer{}, auto: map[string]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	t.Cleanup(func() { c.stop(t) })
	var dprov cluster.NodeOptions
	switch provider {
	case "etcd":
		bin := requireEtcd(t)
		elog := &lockedBuffer{}
		c.logs["etcd"] = elog
		e, err := nodeproc.StartEtcd(ctx, bin, filepath.Join(t.TempDir(), "etcd"), elog)
		require.NoError(t, err)
		c.etcd = e
		p, err := providers.Etcd(providers.EtcdOptions{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second})
		require.NoError(t, err)
		dprov.Provider = p
	case "automanaged":
		for _, n := range append([]string{"driver"}, names...) {
			port, err := nodeproc.FreePort()
			require.NoError(t, err)
			c.auto[n] = "127.0.0.1:" + strconv.Itoa(port)
		}
		p, err := providers.Automanaged(providers.AutomanagedOptions{Addr: c.auto["driver"], Peers: c.peersOf("driver"), RefreshInterval: 250 * time.Millisecond})
		require.NoError(t, err)
		dprov.Provider = p
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := map[string]error{}
	for _, name := range names {
		args := append([]string{"node", "--name", name, "--provider", provider, "--refresh", "100ms", "--request-timeout", "5s"}, nodeLocations...)
		if provider == "etcd" {
			args = append(args, "--etcd", c.etcd.Endpoint)
		} else {
			args = append(args, "--automanaged-addr", c.auto[name], "--peers", strings.Join(c.peersOf(name), ","), "--automanaged-refresh", "250ms")
		}
		log := &lockedBuffer{}
		c.logs[name] = log
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := nodeproc.Start(ctx, demoBin, args, log)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[name] = err
				return
			}
			c.procs[name] = p
		}()
	}
	dprov.Name = "driver"
	dprov.RefreshInterval = 100 * time.Millisecond
	dprov.RequestTimeout = 5 * time.Second
	dprov.Options = system.Options{Locations: []system.LocationConfig{system.Limit("pageable-host", 256<<20), system.Limit("cuda:0", 64<<20)}}
	dprov.Backend = testsys.Soft(t, dprov.Locations)
	d, derr := cluster.StartNode(ctx, dprov)
	wg.Wait()
	require.NoError(t, derr)
	c.driver = d
	for n, err := range errs {
		require.NoError(t, err, "starting %s", n)
	}
	all := append([]string{"driver"}, names...)
	require.NoError(t, d.WaitMembers(ctx, all...))
	for _, n := range names {
		c.waitMembers(ctx, t, n, all)
	}
	return c
}

// peersOf lists the automanaged health addresses of every member but n.
func (c *procCluster) peersOf(n string) []string {
	var out []string
	for m, a := range c.auto {
		if m != n {
			out = append(out, a)
		}
	}
	return out
}

// do runs one command on a node process and fails the test when the
// process does not answer.
func (c *procCluster) do(ctx context.Context, t *testing.T, node string, cmd nodeproc.Command) nodeproc.Reply {
	t.Helper()
	r, err := c.procs[node].Do(ctx, cmd)
	require.NoError(t, err, "node %s, %s", node, cmd.Op)
	return r
}

// must runs a command that must succeed.
func (c *procCluster) must(ctx context.Context, t *testing.T, node string, cmd nodeproc.Command) nodeproc.Reply {
	t.Helper()
	r := c.do(ctx, t, node, cmd)
	require.True(t, r.OK, "node %s, %s %s: %s (%s)", node, cmd.Op, cmd.Name, r.Error, r.ErrorType)
	return r
}

// waitMembers waits until node's member list is exactly want.
func (c *procCluster) waitMembers(ctx context.Context, t *testing.T, node string, want []string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	for {
		r := c.must(ctx, t, node, nodeproc.Command{Op: "members"})
		if slices.Equal(r.Members, want) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node %s: members %v, want %v: %v", node, r.Members, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop closes the driver, stops the processes and etcd; on failure it
// prints the end of every process's log.
func (c *procCluster) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	if c.driver != nil {
		require.NoError(t, c.driver.Close(ctx))
	}
	var wg sync.WaitGroup
	for name, p := range c.procs {
		if c.killed[name] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Stop(30 * time.Second); err != nil {
				t.Errorf("node %s did not stop cleanly on SIGTERM: %v", name, err)
			}
		}()
	}
	wg.Wait()
	if c.etcd != nil {
		c.etcd.Stop(10 * time.Second)
	}
	if t.Failed() {
		for name, l := range c.logs {
			s := l.String()
			if len(s) > 40000 {
				s = "…" + s[len(s)-40000:]
			}
			t.Logf("--- log of %s ---\n%s", name, s)
		}
	}
}
