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
	"github.com/residency-go/residency/system/cluster"
)

// Sizes of the three values, not multiples of the 1 MiB chunk.
const (
	sizeA = 3<<20 + 11
	sizeB = 2<<20 + 5
	sizeC = 3<<20 + 17
	sizeP = 1<<20 + 7 // wp, wn, wq: the placement values
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

// A node killed under load, on three node processes and etcd: values on
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

	// Cluster requests placed by Node.Place, before the load.
	placeBeforeKill(ctx, t, c)

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
	// At once, before the member lists drop node-c: a placement whose
	// only holder is dead (wq lives on node-c alone) fails within its
	// deadline.
	deadPlaced := make(chan placeOutcome, 1)
	go func() { deadPlaced <- placeDead(ctx, d, "wq-at-kill", "cuda:0@*") }()

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

	// Placements whose only holder is dead: the one made at the kill, and
	// after the member lists dropped node-c, with "@*", naming node-c, and
	// from node-a through its place command.
	var at placeOutcome
	select {
	case at = <-deadPlaced:
	case <-time.After(converge):
		t.Fatal("the placement made at the kill did not return: it hangs")
	}
	// At the kill wq's directory grain may have lived on node-c: the
	// lookup fails at once (the member's port is closed) or within its
	// share of the deadline, and the placement goes on without it.
	requireDeadPlacement(t, at)
	for _, note := range at.pe.Directory {
		// Only node-c is gone: the lookup fails on its closed port, not
		// at its share of the deadline.
		require.Contains(t, note, "member node-c", "the placement at the kill: %v", at.err)
		require.NotContains(t, note, "did not answer", "the placement at the kill: %v", at.err)
	}
	after := placeDead(ctx, d, "wq-after", "cuda:0@*")
	requireDeadPlacement(t, after)
	named := placeDead(ctx, d, "wq-named", "cuda:0@node-c")
	requireDeadPlacement(t, named)
	require.Equal(t, []string{"node-c"}, attemptNodes(named.pe.Attempts), "only node-c is named")
	actx, acancel := context.WithTimeout(ctx, reqDeadline+2*time.Second)
	r = c.do(actx, t, "node-a", nodeproc.Command{Op: "place", Name: "wq-from-a", Value: "wq", Tiers: [][]string{{"cuda:0@*"}},
		TimeoutMS: reqDeadline.Milliseconds()})
	acancel()
	require.False(t, r.OK, "node-a placing wq after node-c died: %+v", r.Placement)
	require.Equal(t, "UnavailableError", r.ErrorType, r.Error)
	require.NotNil(t, r.Placement)
	require.NotEmpty(t, r.Placement.Attempts)
	for _, a := range r.Placement.Attempts {
		require.Equal(t, "UnavailableError", a.ErrorType, "%s: %s", a.Node, a.Error)
	}
	require.Less(t, r.ElapsedMS, float64((reqDeadline + 2*time.Second).Milliseconds()))
	t.Logf("%s: placements of wq (only on dead node-c) failed: at the kill in %s (%v; directory: %v); after the member lists dropped node-c in %s (%v); naming node-c in %s; from node-a in %.0f ms",
		provider, at.elapsed, at.err, at.pe.Directory, after.elapsed, after.err, named.elapsed, r.ElapsedMS)

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
func copyToDriver(ctx context.Context, d *cluster.Node, local, from, remote string, size int64) ([]byte, error) {
	sys := d.System()
	h, err := d.RegisterRemote(ctx, system.Value{Name: local, Bytes: size, Source: "pageable-host"},
		cluster.RemoteSource{Node: from, Handle: system.Handle{Name: remote}})
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
func waitWhereIs(ctx context.Context, t *testing.T, d *cluster.Node, value string, locs ...string) {
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

// placeBeforeKill places cluster requests with Node.Place while every
// node is up:
//   - wp is resident on node-c's cuda:0 only, and registered resident
//     nowhere (loadable) on the driver, node-a and node-b; the driver and
//     node-a have more free cuda:0 than node-c: a request for wp on any node's cuda:0, held, is
//     placed on node-c, ranked first because wp is already there, on the
//     first attempt; node-c's copy carries the placement's lease until
//     Release;
//   - wn is resident nowhere and loadable on every node: node-a places it
//     (its place command) on the node with the most free cuda:0, where it
//     is then resident;
//   - wq is registered on node-c only (for the placements after the kill).
func placeBeforeKill(ctx context.Context, t *testing.T, c *procCluster) {
	t.Helper()
	d := c.driver
	c.must(ctx, t, "node-c", nodeproc.Command{Op: "register", Name: "wp", Bytes: sizeP, At: "cuda:0", Seed: 4})
	c.must(ctx, t, "node-c", nodeproc.Command{Op: "register", Name: "wq", Bytes: sizeP, At: "cuda:0", Seed: 6})
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if n != "node-c" {
			c.must(ctx, t, n, nodeproc.Command{Op: "register", Name: "wp", Bytes: sizeP, Source: "pageable-host", Seed: 4})
		}
		c.must(ctx, t, n, nodeproc.Command{Op: "register", Name: "wn", Bytes: sizeP, Source: "pageable-host", Seed: 5})
	}
	for _, v := range []struct {
		name string
		seed int64
	}{{"wp", 4}, {"wn", 5}} {
		data := nodeproc.Pattern(v.seed, sizeP)
		_, err := d.System().Register(ctx, system.Value{Name: v.name, Bytes: sizeP, Source: "pageable-host",
			Loader: func(_ context.Context, dst []byte) error { copy(dst, data); return nil }})
		require.NoError(t, err)
	}
	waitWhereIs(ctx, t, d, "wp", "cuda:0@node-c")
	waitWhereIs(ctx, t, d, "wq", "cuda:0@node-c")
	// The summaries the ranking reads show what each node holds now.
	waitUsed(ctx, t, d, map[string]int64{"driver": 0, "node-a": sizeA, "node-b": sizeA + sizeC, "node-c": sizeC + 2*sizeP})

	// Already resident on node-c: placed there although other nodes,
	// which could load wp, have more room.
	pctx, pcancel := context.WithTimeout(ctx, reqDeadline)
	p, err := d.Place(pctx, cluster.PlacementRequest{Name: "serve-wp", Hold: true,
		Requirements: []cluster.PlacementRequirement{{Value: "wp", Tiers: [][]string{{"cuda:0@*"}}}}})
	pcancel()
	require.NoError(t, err)
	t.Logf("wp placed on %s: %s; candidates %+v", p.Node, p.Why, p.Candidates)
	require.Equal(t, "node-c", p.Node)
	require.Equal(t, []string{"node-c"}, attemptNodes(p.Attempts), "node-c admitted at the first attempt")
	require.NoError(t, p.Attempts[0].Err)
	require.Len(t, p.Candidates, 4, "every member has a cuda:0")
	top := p.Candidates[0]
	require.Equal(t, "node-c", top.Node)
	require.Equal(t, []string{"wp at cuda:0@node-c"}, top.Resident)
	var roomier []string
	for _, o := range p.Candidates[1:] {
		require.Empty(t, o.Resident, "%s", o.Node)
		if o.Fits && o.FreeBytes > top.FreeBytes {
			roomier = append(roomier, o.Node)
		}
	}
	slices.Sort(roomier)
	require.Equal(t, []string{"driver", "node-a"}, roomier, "the driver (empty cuda:0) and node-a (wa) have more free cuda:0 than node-c (wc, wp, wq): %+v", p.Candidates)
	require.Contains(t, p.Why, "already resident there: wp at cuda:0@node-c")
	require.Equal(t, "node-c", p.Decision.Node)
	require.Equal(t, []string{"wp at cuda:0"}, p.Decision.Enter)
	require.Empty(t, p.Decision.Evictions)
	// Held: node-c's copy is leased until Release.
	require.Equal(t, 1, useCount(ctx, t, c, "node-c", "wp", "cuda:0"), "the held placement's lease on node-c")
	require.NoError(t, p.Release(ctx))
	require.Equal(t, 0, useCount(ctx, t, c, "node-c", "wp", "cuda:0"), "released")
	require.NoError(t, p.Release(ctx), "releasing twice is a no-op")

	// Resident nowhere, placed by a node process: the node with the most
	// free cuda:0 per the summaries, where the loader then ran.
	waitUsedIn(ctx, t, "node-a", func(ctx context.Context) ([]cluster.NodeSummary, error) {
		return c.must(ctx, t, "node-a", nodeproc.Command{Op: "summaries"}).Summaries, nil
	}, map[string]int64{"driver": 0, "node-a": sizeA, "node-b": sizeA + sizeC, "node-c": sizeC + 2*sizeP})
	r := c.must(ctx, t, "node-a", nodeproc.Command{Op: "place", Name: "serve-wn", Value: "wn", Tiers: [][]string{{"cuda:0@*"}},
		TimeoutMS: reqDeadline.Milliseconds()})
	pl := r.Placement
	require.NotNil(t, pl)
	t.Logf("wn placed on %s by node-a: %s", pl.Node, pl.Why)
	require.Len(t, pl.Candidates, 4)
	require.Equal(t, pl.Node, pl.Candidates[0].Node)
	require.Equal(t, []nodeproc.Attempt{{Node: pl.Node}}, pl.Attempts)
	for _, o := range pl.Candidates {
		require.Empty(t, o.Resident, "%s", o.Node)
		require.True(t, o.Fits, "%s: %+v (node-a's candidates: %+v)", o.Node, o, pl.Candidates)
		require.LessOrEqual(t, o.FreeBytes, pl.Candidates[0].FreeBytes, "%s has more room than the chosen %s", o.Node, pl.Node)
	}
	require.Equal(t, "driver", pl.Node, "the driver's cuda:0 is empty: the most room")
	b, err := d.System().Read(ctx, mustLookup(ctx, t, d, "wn"), "cuda:0")
	require.NoError(t, err)
	require.True(t, bytes.Equal(nodeproc.Pattern(5, sizeP), b), "wn's bytes on the driver, loaded by its admission")
}

// placeOutcome is one placement of a value whose only holder is dead.
type placeOutcome struct {
	err     error
	pe      *cluster.PlacementError
	elapsed time.Duration
}

// placeDead places wq (resident on node-c alone) at loc from the driver,
// with a deadline of reqDeadline.
func placeDead(ctx context.Context, d *cluster.Node, name, loc string) placeOutcome {
	pctx, cancel := context.WithTimeout(ctx, reqDeadline)
	defer cancel()
	start := time.Now()
	p, err := d.Place(pctx, cluster.PlacementRequest{Name: name,
		Requirements: []cluster.PlacementRequirement{{Value: "wq", Tiers: [][]string{{loc}}}}})
	o := placeOutcome{err: err, elapsed: time.Since(start)}
	if err == nil {
		o.err = fmt.Errorf("placed on %s: %s", p.Node, p.Why)
	}
	errors.As(err, &o.pe)
	return o
}

// requireDeadPlacement: the placement failed with a PlacementError that
// errors.As finds an UnavailableError in, before its deadline (plus 2 s
// for scheduling).
func requireDeadPlacement(t *testing.T, o placeOutcome) {
	t.Helper()
	require.NotNil(t, o.pe, "want a PlacementError, got %T: %v", o.err, o.err)
	var u *system.UnavailableError
	require.True(t, errors.As(o.err, &u), "want an UnavailableError in %v", o.err)
	require.NotEmpty(t, o.pe.Attempts, "%v", o.err)
	require.Less(t, o.elapsed, reqDeadline+2*time.Second, "%v", o.err)
}

func attemptNodes(as []cluster.PlacementAttempt) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.Node
	}
	return out
}

func mustLookup(ctx context.Context, t *testing.T, d *cluster.Node, name string) system.Handle {
	t.Helper()
	h, err := d.System().Lookup(ctx, name)
	require.NoError(t, err)
	return h
}

// useCount is the use count (leases) of value's copy at loc on a node
// process.
func useCount(ctx context.Context, t *testing.T, c *procCluster, node, value, loc string) int {
	t.Helper()
	r := c.must(ctx, t, node, nodeproc.Command{Op: "inspect", Name: value})
	for _, m := range r.Materializations {
		if m.Location == loc {
			return m.UseCount
		}
	}
	t.Fatalf("%s has no copy of %s at %s: %+v", node, value, loc, r.Materializations)
	return 0
}

// waitUsed waits until d's view of the summaries shows, for every node,
// used bytes at cuda:0 equal to want (the ranking reads these).
func waitUsed(ctx context.Context, t *testing.T, d *cluster.Node, want map[string]int64) {
	t.Helper()
	waitUsedIn(ctx, t, d.Name(), d.Summaries, want)
}

// waitUsedIn is waitUsed on the view of the member named viewer, read by
// summaries: each member's view follows gossip on its own, so a placement
// made by a node process waits for that process's view.
func waitUsedIn(ctx context.Context, t *testing.T, viewer string, summaries func(context.Context) ([]cluster.NodeSummary, error), want map[string]int64) {
	t.Helper()
	got := map[string]int64{}
	for {
		sums, err := summaries(ctx)
		require.NoError(t, err)
		clear(got)
		for _, s := range sums {
			for _, l := range s.Locations {
				if l.Location == "cuda:0@"+s.Node {
					got[s.Node] = l.UsedBytes
				}
			}
		}
		if len(got) == len(want) && fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("cuda:0 used per %s's summaries: %v, want %v", viewer, got, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
