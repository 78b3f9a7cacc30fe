package clusterproc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	protocluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/system/cluster/providers"
	"github.com/residency-go/residency/tests/internal/faultproxy"
)

// faultDeadline is the deadline of every request a fault scenario expects
// to fail; faultMargin is what it may take beyond it (scheduling on a
// loaded machine, not the request).
const (
	faultDeadline = time.Second
	faultMargin   = 2 * time.Second
)

// proxiedCluster is nodes in this process, each behind a faultproxy: a
// node listens on its own port and advertises its proxy's, so every other
// member reaches it through the proxy (its own requests to the others go
// out directly, to their proxies). The provider's traffic (etcd, the
// automanaged health checks) does not go through the proxies: membership
// stays as it was while a proxy cuts a node off.
type proxiedCluster struct {
	provider string
	etcd     *nodeproc.Etcd
	auto     map[string]string
	nodes    map[string]*cluster.Node
	proxies  map[string]*faultproxy.Proxy
	pending  sync.WaitGroup // discards of copies still reconstructing
}

// startProxied starts one node per name (all at once) with the provider
// ("etcd": a fresh etcd process; "automanaged"), waits until every node
// sees every other, and stops everything when the test ends.
func startProxied(t *testing.T, provider string, names ...string) *proxiedCluster {
	t.Helper()
	c := &proxiedCluster{provider: provider, auto: map[string]string{}, nodes: map[string]*cluster.Node{}, proxies: map[string]*faultproxy.Proxy{}}
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	t.Cleanup(func() { c.stop(t) })
	if provider == "etcd" {
		bin := requireEtcd(t)
		e, err := nodeproc.StartEtcd(ctx, bin, filepath.Join(t.TempDir(), "etcd"), &lockedBuffer{})
		require.NoError(t, err)
		c.etcd = e
	} else {
		for _, n := range names {
			port, err := nodeproc.FreePort()
			require.NoError(t, err)
			c.auto[n] = "127.0.0.1:" + strconv.Itoa(port)
		}
	}
	opts := map[string]cluster.NodeOptions{}
	for _, n := range names {
		port, err := nodeproc.FreePort()
		require.NoError(t, err)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		px, err := faultproxy.New(addr)
		require.NoError(t, err)
		c.proxies[n] = px
		o := cluster.NodeOptions{Name: n, Addr: addr, AdvertisedAddr: px.Addr(),
			RefreshInterval: 100 * time.Millisecond, RequestTimeout: 5 * time.Second,
			Options: system.Options{Locations: []system.LocationConfig{system.Limit("pageable-host", 256<<20), system.Limit("cuda:0", 64<<20)}}}
		o.Backend = testsys.Soft(t, o.Locations)
		o.Provider = c.newProvider(t, n)
		opts[n] = o
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := map[string]error{}
	for _, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node, err := cluster.StartNode(ctx, opts[n])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[n] = err
				return
			}
			c.nodes[n] = node
		}()
	}
	wg.Wait()
	for n, err := range errs {
		require.NoError(t, err, "starting %s", n)
	}
	for _, n := range c.nodes {
		require.NoError(t, n.WaitMembers(ctx, names...))
	}
	return c
}

// newProvider makes node n's provider.
func (c *proxiedCluster) newProvider(t *testing.T, n string) protocluster.ClusterProvider {
	t.Helper()
	if c.provider == "etcd" {
		p, err := providers.Etcd(providers.EtcdOptions{Endpoints: []string{c.etcd.Endpoint}, DialTimeout: 5 * time.Second})
		require.NoError(t, err)
		return p
	}
	var peers []string
	for m, a := range c.auto {
		if m != n {
			peers = append(peers, a)
		}
	}
	p, err := providers.Automanaged(providers.AutomanagedOptions{Addr: c.auto[n], Peers: peers, RefreshInterval: 250 * time.Millisecond})
	require.NoError(t, err)
	return p
}

// stop heals every proxy, closes the nodes (at once), the proxies and etcd.
func (c *proxiedCluster) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	for _, p := range c.proxies {
		p.Set(faultproxy.Pass, 0)
	}
	c.pending.Wait()
	var wg sync.WaitGroup
	for name, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.Close(ctx); err != nil {
				t.Errorf("closing %s: %v", name, err)
			}
		}()
	}
	wg.Wait()
	for _, p := range c.proxies {
		require.NoError(t, p.Close())
	}
	if c.etcd != nil {
		c.etcd.Stop(10 * time.Second)
	}
}

// registerAt registers a value with pattern bytes on n and places it at loc.
func registerAt(ctx context.Context, t *testing.T, n *cluster.Node, name string, size, seed int64, loc string) {
	t.Helper()
	data := nodeproc.Pattern(seed, size)
	h, err := n.System().Register(ctx, system.Value{Name: name, Bytes: size, Source: "pageable-host",
		Loader: func(_ context.Context, dst []byte) error { copy(dst, data); return nil }})
	require.NoError(t, err)
	require.NoError(t, n.System().Place(ctx, h, loc))
}

// leases is the use count of value's copy at loc on n (the leases held
// on it, remote ones included).
func leases(ctx context.Context, t *testing.T, n *cluster.Node, value, loc string) int {
	t.Helper()
	snap, err := n.System().Snapshot(ctx)
	require.NoError(t, err)
	for _, v := range snap.Values {
		if v.Handle.Name != value {
			continue
		}
		for _, m := range v.Materializations {
			if m.Location == loc {
				return m.UseCount
			}
		}
	}
	t.Fatalf("%s has no copy of %s at %s", n.Name(), value, loc)
	return 0
}

// copyOK copies remote from node from onto n and compares the bytes.
func (c *proxiedCluster) copyOK(ctx context.Context, t *testing.T, n *cluster.Node, from, remote string, size, seed int64) {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := c.copyOnce(rctx, n, from, remote, size)
	require.NoError(t, err, "%s copying %s from %s", n.Name(), remote, from)
	require.True(t, bytes.Equal(nodeproc.Pattern(seed, size), b), "bytes of %s from %s", remote, from)
}

// until retries try (each bounded by the caller) until it returns nil or
// ctx ends; it returns the time it took from since.
func until(ctx context.Context, t *testing.T, since time.Time, what string, try func(context.Context) error) time.Duration {
	t.Helper()
	for {
		rctx, cancel := context.WithTimeout(ctx, faultDeadline)
		err := try(rctx)
		cancel()
		if err == nil {
			return time.Since(since)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v (last: %v)", what, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// whereIsExactly is nil when the directory, asked by n, lists exactly
// locs as resident copies of value.
func whereIsExactly(n *cluster.Node, value string, locs ...string) func(context.Context) error {
	want := slices.Sorted(slices.Values(locs))
	return func(ctx context.Context) error {
		res, err := n.WhereIs(ctx, value)
		if err != nil {
			return err
		}
		var got []string
		for _, r := range res {
			if r.State == "resident" {
				got = append(got, r.Location)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("where is %s: %v, want %v", value, got, want)
		}
		return nil
	}
}

// usedIs is nil when n's view of the summaries shows used bytes at
// cuda:0 of every node in want as given.
func usedIs(n *cluster.Node, want map[string]int64) func(context.Context) error {
	return func(ctx context.Context) error {
		sums, err := n.Summaries(ctx)
		if err != nil {
			return err
		}
		got := map[string]int64{}
		for _, s := range sums {
			for _, l := range s.Locations {
				if _, ok := want[s.Node]; ok && l.Location == "cuda:0@"+s.Node {
					got[s.Node] = l.UsedBytes
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("cuda:0 used per %s's summaries: %v, want %v", n.Name(), got, want)
		}
		return nil
	}
}

// copySeq makes the local names of copies unique.
var copySeq atomic.Int64

// copyOnce copies remote from node from onto n's cuda:0 under a fresh
// local name, reads it, and discards the copy. A copy whose place failed
// may still be reconstructing (the stream is bounded by the node's
// RequestTimeout, not ctx): its discard is retried, in the background
// (stop waits for it), until the reconstruction ended, so no copy is left
// behind to skew n's summary.
func (c *proxiedCluster) copyOnce(ctx context.Context, n *cluster.Node, from, remote string, size int64) ([]byte, error) {
	sys := n.System()
	local := fmt.Sprintf("%s-copy-%d", remote, copySeq.Add(1))
	h, err := n.RegisterRemote(ctx, system.Value{Name: local, Bytes: size, Source: "pageable-host"},
		cluster.RemoteSource{Node: from, Handle: system.Handle{Name: remote}})
	if err != nil {
		return nil, err
	}
	defer func() {
		if sys.Discard(context.WithoutCancel(ctx), h) == nil {
			return
		}
		c.pending.Add(1)
		go func() {
			defer c.pending.Done()
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), converge)
			defer cancel()
			for sys.Discard(dctx, h) != nil && dctx.Err() == nil {
				time.Sleep(20 * time.Millisecond) // polling the discard: it succeeds once the reconstruction ended
			}
		}()
	}()
	if err := sys.Place(ctx, h, "cuda:0"); err != nil {
		return nil, err
	}
	return sys.Read(ctx, h, "cuda:0")
}

// call is one request a scenario expects to fail: what, and whether the
// caller's context.DeadlineExceeded is a typed answer for it (a copy).
type call struct {
	what       string
	deadlineOK bool
	do         func(context.Context) error
}

// allFail runs the calls at once, each bounded by faultDeadline, and
// requires each to fail typed before its deadline plus faultMargin; it
// returns the slowest.
func allFail(ctx context.Context, t *testing.T, calls ...call) time.Duration {
	t.Helper()
	type result struct {
		err error
		el  time.Duration
	}
	res := make([]result, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, faultDeadline)
			defer cancel()
			start := time.Now()
			err := c.do(rctx)
			res[i] = result{err, time.Since(start)}
		}()
	}
	wg.Wait()
	var slow time.Duration
	for i, c := range calls {
		err, el := res[i].err, res[i].el
		var u *system.UnavailableError
		typed := errors.As(err, &u) || (c.deadlineOK && errors.Is(err, context.DeadlineExceeded))
		require.True(t, typed, "%s: want an UnavailableError, got %T: %v", c.what, err, err)
		require.Less(t, el, faultDeadline+faultMargin, "%s took %s (deadline %s): %v", c.what, el, faultDeadline, err)
		slow = max(slow, el)
	}
	return slow
}
