package clusterproc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/system"
)

// Sizes of the three values, not multiples of the 1 MiB chunk.
const (
	sizeA = 3<<20 + 11
	sizeB = 2<<20 + 5
	sizeC = 3<<20 + 17
)

// reqDeadline is the context deadline of every request in the load.
const reqDeadline = 4 * time.Second

// membershipBound is the spec's bound for the member lists to drop a
// crashed node. What drives it is the provider's timers, not CPU work:
// etcd drops the member's key when its lease (TTL 3 s, protoactor's fixed
// value) expires — etcd checks expiry every 500 ms — and the watch tells
// every member; the automanaged provider drops it at the next round of
// health checks (250 ms here), whose connection to the dead port is
// refused at once. About 3.5 s and 0.5 s at worst on an idle machine: 10 s
// leaves room for a loaded one, and a provider that never converges still
// fails.
const membershipBound = 10 * time.Second

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// The scenario of issue 13 on three node processes and etcd: values on
// every node; a copy between two processes whose bytes read back
// identical; a copy onto the driver compared byte for byte; then, while
// the driver and node-a keep copying from node-b and node-c, node-c is
// killed with SIGKILL. The survivors keep serving (every copy from node-b
// succeeds, before and after), every request addressed to node-c after
// the kill fails with an UnavailableError within its deadline (none
// hangs), every member list drops node-c within 10 s, and the value node-c
// owned, which had a copy on node-b, stays available: the directory lists
// node-b's copy only, and new copies from node-b carry the same bytes.
func TestKillNodeEtcd(t *testing.T) { runKillScenario(t, "etcd") }

// The same scenario with the automanaged provider (no etcd).
func TestKillNodeAutomanaged(t *testing.T) { runKillScenario(t, "automanaged") }

// outcome is one request of the load.
type outcome struct {
	via, target      string // who asked, whom
	start, end       time.Time
	err              error  // driver requests
	ok               bool   // node requests: reply.OK
	errType, errText string // node requests
}

func runKillScenario(t *testing.T, provider string) {
	c := startCluster(t, provider, "node-a", "node-b", "node-c")
	d := c.driver
	ctx, cancel := context.WithTimeout(context.Background(), 3*converge)
	defer cancel()

	// Values placed across nodes.
	vals := []struct {
		node, name, at string
		size, seed     int64
	}{
		{"node-a", "wa", "cuda:0", sizeA, 1},
		{"node-b", "wb", "pageable-host", sizeB, 2},
		{"node-c", "wc", "cuda:0", sizeC, 3},
	}
	want := map[string][]byte{}
	for _, v := range vals {
		want[v.name] = nodeproc.Pattern(v.seed, v.size)
		r := c.must(ctx, t, v.node, nodeproc.Command{Op: "register", Name: v.name, Bytes: v.size, At: v.at, Seed: v.seed})
		require.Equal(t, sum(want[v.name]), r.SHA256)
	}

	// A copy between two node processes: node-b streams wa from node-a
	// into its cuda:0; the bytes read back there are node-a's.
	r := c.must(ctx, t, "node-b", nodeproc.Command{Op: "copy", Name: "wa", From: "node-a", Bytes: sizeA, At: "cuda:0"})
	require.Equal(t, sum(want["wa"]), r.SHA256)
	r = c.must(ctx, t, "node-b", nodeproc.Command{Op: "read", Name: "wa", At: "cuda:0"})
	require.Equal(t, sum(want["wa"]), r.SHA256)
	require.EqualValues(t, sizeA, r.Bytes)
	// Onto the driver, compared byte for byte.
	got, err := copyToDriver(ctx, d, "wc-first", "node-c", "wc", sizeC)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want["wc"], got), "bytes of wc on the driver")
	// node-c's value gets a copy on node-b: it must survive node-c.
	r = c.must(ctx, t, "node-b", nodeproc.Command{Op: "copy", Name: "wc", From: "node-c", Bytes: sizeC, At: "cuda:0"})
	require.Equal(t, sum(want["wc"]), r.SHA256)
	waitWhereIs(ctx, t, d, "wc", "cuda:0@node-b", "cuda:0@node-c")
	waitWhereIs(ctx, t, d, "wa", "cuda:0@node-a", "cuda:0@node-b")

	// The load: the driver and node-a copy from node-b and from node-c in
	// loops, each request with a deadline of reqDeadline.
	var mu sync.Mutex
	var outs []outcome
	record := func(o outcome) {
		mu.Lock()
		outs = append(outs, o)
		mu.Unlock()
	}
	count := func(match func(outcome) bool) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, o := range outs {
			if match(o) {
				n++
			}
		}
		return n
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, target := range []string{"node-b", "node-c"} {
		name, size := "wb", int64(sizeB)
		if target == "node-c" {
			name, size = "wc", sizeC
		}
		wg.Add(2)
		go func() { // the driver, through the Node API
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				rctx, rcancel := context.WithTimeout(ctx, reqDeadline)
				o := outcome{via: "driver", target: target, start: time.Now()}
				b, err := copyToDriver(rctx, d, fmt.Sprintf("%s-d-%d", name, i), target, name, size)
				o.end = time.Now()
				rcancel()
				if err == nil && !bytes.Equal(b, want[name]) {
					err = fmt.Errorf("bytes of %s copied from %s differ", name, target)
				}
				o.err = err
				record(o)
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
		go func() { // node-a, through its commands
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				local := fmt.Sprintf("%s-a-%d", name, i)
				o := outcome{via: "node-a", target: target, start: time.Now()}
				r, err := c.procs["node-a"].Do(ctx, nodeproc.Command{Op: "copy", Name: local, Remote: name, From: target,
					Bytes: size, At: "cuda:0", TimeoutMS: reqDeadline.Milliseconds()})
				o.end = time.Now()
				if err != nil {
					o.errType, o.errText = "no reply", err.Error()
					record(o)
					return
				}
				o.ok, o.errType, o.errText = r.OK, r.ErrorType, r.Error
				if r.OK && r.SHA256 != sum(want[name]) {
					o.ok, o.errType, o.errText = false, "digest", "bytes of "+name+" differ on node-a"
				}
				record(o)
				if r.OK {
					if dr, err := c.procs["node-a"].Do(ctx, nodeproc.Command{Op: "discard", Name: local}); err != nil || !dr.OK {
						o.ok, o.errType, o.errText = false, "discard", fmt.Sprint(err, dr.Error)
						record(o)
					}
				} else {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	succeeded := func(via, target string, after time.Time) func(outcome) bool {
		return func(o outcome) bool {
			return o.via == via && o.target == target && o.start.After(after) && o.err == nil && (via == "driver" || o.ok)
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				close(stop)
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	var zero time.Time
	for _, via := range []string{"driver", "node-a"} {
		for _, target := range []string{"node-b", "node-c"} {
			waitFor(via+" copying from "+target, func() bool { return count(succeeded(via, target, zero)) >= 2 })
		}
	}

	// kill -9 node-c under load.
	killAt := time.Now()
	c.procs["node-c"].Kill()
	c.killed["node-c"] = true

	// Every member list drops node-c.
	survivors := []string{"driver", "node-a", "node-b"}
	conv := map[string]time.Duration{}
	var cmu sync.Mutex
	var cwg sync.WaitGroup
	for _, obs := range survivors {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			wctx, wcancel := context.WithTimeout(ctx, converge)
			defer wcancel()
			members := func() []string {
				if obs == "driver" {
					return d.Members()
				}
				r, err := c.procs[obs].Do(wctx, nodeproc.Command{Op: "members"})
				if err != nil {
					return []string{err.Error()}
				}
				return r.Members
			}
			for m := members(); !slices.Equal(m, survivors); m = members() {
				if wctx.Err() != nil {
					t.Errorf("%s: members %v, want %v", obs, m, survivors)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			cmu.Lock()
			conv[obs] = time.Since(killAt)
			cmu.Unlock()
		}()
	}
	cwg.Wait()
	convergedAt := time.Now()
	t.Logf("%s: member lists without node-c after the kill: %v", provider, conv)
	for obs, el := range conv {
		require.LessOrEqual(t, el, membershipBound, "%s saw node-c leave after %s", obs, el)
	}

	// The survivors keep serving after the membership settled, and
	// requests to node-c keep failing.
	for _, via := range []string{"driver", "node-a"} {
		waitFor(via+" copying from node-b after the kill", func() bool { return count(succeeded(via, "node-b", convergedAt)) >= 3 })
		waitFor(via+" asking node-c after the kill", func() bool {
			return count(func(o outcome) bool { return o.via == via && o.target == "node-c" && o.start.After(convergedAt) }) >= 3
		})
	}
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(converge):
		t.Fatal("a request of the load did not return: it hangs")
	}

	mu.Lock()
	all := append([]outcome(nil), outs...)
	mu.Unlock()
	var toB, toCAfter int
	var slow time.Duration
	for _, o := range all {
		el := o.end.Sub(o.start)
		failed := o.err != nil || (o.via == "node-a" && !o.ok)
		switch {
		case o.target == "node-b":
			toB++
			require.False(t, failed, "%s copying from node-b (a survivor) at %s: %v %s %s", o.via, o.start.Sub(killAt), o.err, o.errType, o.errText)
		case o.end.Before(killAt):
			require.False(t, failed, "%s copying from node-c before the kill: %v %s %s", o.via, o.err, o.errType, o.errText)
		default:
			// During or after the kill: a copy that began before it may
			// have finished; anything else is an UnavailableError, within
			// the request's deadline.
			if !failed {
				require.True(t, o.start.Before(killAt), "%s: a copy from node-c that began %s after the kill succeeded", o.via, o.start.Sub(killAt))
				continue
			}
			toCAfter++
			if o.via == "driver" {
				var u *system.UnavailableError
				require.True(t, errors.As(o.err, &u), "driver copying from dead node-c: want an UnavailableError, got %T: %v", o.err, o.err)
			} else {
				require.Equal(t, "UnavailableError", o.errType, "node-a copying from dead node-c: %s", o.errText)
			}
			// Within the deadline: the runtime answers at its deadline at
			// the latest; the margin is for scheduling, not the request.
			require.Less(t, el, reqDeadline+2*time.Second, "%s asking dead node-c took %s (deadline %s)", o.via, el, reqDeadline)
			slow = max(slow, el)
		}
	}
	t.Logf("%s: %d copies from node-b (all succeeded), %d requests to dead node-c (all UnavailableError), slowest %s", provider, toB, toCAfter, slow)

	// The value that had a copy on a survivor stays available.
	waitWhereIs(ctx, t, d, "wc", "cuda:0@node-b")
	got, err = copyToDriver(ctx, d, "wc-after", "node-b", "wc", sizeC)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want["wc"], got), "bytes of wc from node-b after node-c died")
	r = c.must(ctx, t, "node-a", nodeproc.Command{Op: "copy", Name: "wc", From: "node-b", Bytes: sizeC, At: "cuda:0"})
	require.Equal(t, sum(want["wc"]), r.SHA256)
	waitWhereIs(ctx, t, d, "wc", "cuda:0@node-a", "cuda:0@node-b")
}

// copyToDriver copies remote's bytes from node from onto the driver's
// cuda:0 under the local name, reads them and discards the copy.
func copyToDriver(ctx context.Context, d *system.Node, local, from, remote string, size int64) ([]byte, error) {
	sys := d.System()
	h, err := d.RegisterRemote(ctx, system.Value{Name: local, Bytes: size, Source: "pageable-host"},
		system.RemoteSource{Node: from, Handle: system.Handle{Name: remote}})
	if err != nil {
		return nil, err
	}
	defer func() { _ = sys.Discard(context.WithoutCancel(ctx), h) }()
	if err := sys.Place(ctx, h, "cuda:0"); err != nil {
		return nil, err
	}
	return sys.Read(ctx, h, "cuda:0")
}

// waitWhereIs waits until the directory lists exactly the given resident
// locations of value.
func waitWhereIs(ctx context.Context, t *testing.T, d *system.Node, value string, locs ...string) {
	t.Helper()
	want := slices.Sorted(slices.Values(locs))
	var last []string
	var lastErr error
	for {
		rctx, cancel := context.WithTimeout(ctx, reqDeadline)
		res, err := d.WhereIs(rctx, value)
		cancel()
		last, lastErr = nil, err
		for _, r := range res {
			if r.State == "resident" {
				last = append(last, r.Location)
			}
		}
		slices.Sort(last)
		if err == nil && slices.Equal(last, want) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("where is %s: %v (err %v), want %v", value, last, lastErr, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
