package clusterproc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// restartValues is how many values only the killed node holds: their
// directory grains are spread over the members by hash, so some live on
// a survivor and keep the dead incarnation's entries.
const restartValues = 6

// A node killed with SIGKILL and started again under the same name at
// once (etcd: before its old registration's lease expired); see
// runRestart.
func TestRestartNodeEtcd(t *testing.T) { runRestart(t, "etcd") }

// The same restart with the automanaged provider (the new process serves
// the same health address).
func TestRestartNodeAutomanaged(t *testing.T) { runRestart(t, "automanaged") }

// runRestart: node-a and node-b processes and the driver; w on node-a and
// node-b, z0…z5 on node-b only, the driver holding a remote lease on
// node-b's z0. node-b is killed and started again under the same name.
// While it is gone or new, requests for what only it held fail typed
// before their deadline and w stays available from node-a. The new node-b
// remembers nothing: once it is a member (timed), every member list names
// node-b once, the directory lists w on node-a only and no z (timed), the
// summaries show node-b's new, empty memory (timed), the driver's lease
// on the old node-b is gone (its release answers, and the new node-b
// holds no lease), and what node-b registers again is found and copied.
func runRestart(t *testing.T, provider string) {
	c := startCluster(t, provider, "node-a", "node-b")
	d := c.driver
	ctx, cancel := context.WithTimeout(context.Background(), 3*converge)
	defer cancel()

	c.must(ctx, t, "node-a", nodeproc.Command{Op: "register", Name: "w", Bytes: sizeW, At: "cuda:0", Seed: 1})
	c.must(ctx, t, "node-b", nodeproc.Command{Op: "copy", Name: "w", From: "node-a", Bytes: sizeW, At: "cuda:0"})
	var zs []string
	for i := range restartValues {
		z := fmt.Sprintf("z%d", i)
		zs = append(zs, z)
		c.must(ctx, t, "node-b", nodeproc.Command{Op: "register", Name: z, Bytes: 64 << 10, At: "cuda:0", Seed: int64(10 + i)})
	}
	waitWhereIs(ctx, t, d, "w", "cuda:0@node-a", "cuda:0@node-b")
	for _, z := range zs {
		waitWhereIs(ctx, t, d, z, "cuda:0@node-b")
	}
	lease, err := d.AcquireRemote(ctx, "node-b", system.Handle{Name: "z0"}, "cuda:0")
	require.NoError(t, err)
	require.Equal(t, 1, useCount(ctx, t, c, "node-b", "z0", "cuda:0"))

	killAt := time.Now()
	c.procs["node-b"].Kill()
	<-c.procs["node-b"].Done()
	c.restart(ctx, t, "node-b")
	startedAt := time.Now()

	// While node-b is new: what only it held is unavailable, typed and
	// bounded; w is served by node-a.
	slow := allFail(ctx, t, call{what: "the driver copying z1 from the restarted node-b", deadlineOK: true, do: func(ctx context.Context) error {
		_, err := copyToDriver(ctx, d, "z1-copy", "node-b", "z1", 64<<10)
		return err
	}})
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = copyToDriver(rctx, d, "w-copy", "node-a", "w", sizeW)
	rcancel()
	require.NoError(t, err, "w from node-a while node-b restarts")

	// Membership: node-b once in every list, and reachable (a request it
	// answers).
	all := []string{"driver", "node-a", "node-b"}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	member := until(wctx, t, killAt, "node-b back", func(ctx context.Context) error {
		if m := d.Members(); !slices.Equal(m, all) {
			return fmt.Errorf("driver's members %v", m)
		}
		if m := c.must(ctx, t, "node-a", nodeproc.Command{Op: "members"}).Members; !slices.Equal(m, all) {
			return fmt.Errorf("node-a's members %v", m)
		}
		_, err := d.AcquireRemote(ctx, "node-b", system.Handle{Name: "nothing"}, "")
		var u *system.UnavailableError
		if errors.As(err, &u) && strings.Contains(err.Error(), `has no value "nothing"`) {
			return nil // the new node-b answered
		}
		return fmt.Errorf("node-b does not answer yet: %v", err)
	})
	// The directory forgets the old incarnation's copies.
	dir := until(wctx, t, killAt, "the directory without the old node-b", func(ctx context.Context) error {
		if err := whereIsExactly(d, "w", "cuda:0@node-a")(ctx); err != nil {
			return err
		}
		for _, z := range zs {
			if err := whereIsExactly(d, z)(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	sums := until(wctx, t, killAt, "summaries of the new node-b", func(ctx context.Context) error {
		s, err := d.Summaries(ctx)
		if err != nil {
			return err
		}
		var bs []cluster.NodeSummary
		for _, ns := range s {
			if ns.Node == "node-b" {
				bs = append(bs, ns)
			}
		}
		if len(bs) != 1 {
			return fmt.Errorf("%d summaries of node-b", len(bs))
		}
		return usedIs(d, map[string]int64{"node-a": sizeW, "node-b": 0})(ctx)
	})
	t.Logf("%s: after kill+restart (started %s after the kill): requests for node-b's values failed within %s; node-b a member again after %s, directory without the old incarnation after %s, summaries after %s",
		provider, startedAt.Sub(killAt), slow, member, dir, sums)

	// The lease on the old incarnation is gone with it.
	// Releasing it reaches the new node-b, which holds nothing under
	// that id: no error, nothing released.
	require.NoError(t, lease.Release(ctx))

	// node-b learns values again; the directory and copies follow.
	c.must(ctx, t, "node-b", nodeproc.Command{Op: "register", Name: "z0", Bytes: 64 << 10, At: "cuda:0", Seed: 10})
	require.Equal(t, 0, useCount(ctx, t, c, "node-b", "z0", "cuda:0"), "the new node-b holds no lease")
	waitWhereIs(ctx, t, d, "z0", "cuda:0@node-b")
	b, err := copyToDriver(ctx, d, "z0-copy", "node-b", "z0", 64<<10)
	require.NoError(t, err)
	require.Equal(t, sum(nodeproc.Pattern(10, 64<<10)), sum(b))
}

// restart starts node name again with the arguments it was started with
// (a fresh address; the same health address with automanaged) and waits
// for its ready line.
func (c *procCluster) restart(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	args := append([]string{"node", "--name", name, "--provider", c.provider, "--refresh", "100ms", "--request-timeout", "5s"}, nodeLocations...)
	if c.provider == "etcd" {
		args = append(args, "--etcd", c.etcd.Endpoint)
	} else {
		args = append(args, "--automanaged-addr", c.auto[name], "--peers", strings.Join(c.peersOf(name), ","), "--automanaged-refresh", "250ms")
	}
	p, err := nodeproc.Start(ctx, demoBin, args, c.logs[name])
	require.NoError(t, err, "restarting %s", name)
	c.procs[name] = p
	c.killed[name] = false
}
