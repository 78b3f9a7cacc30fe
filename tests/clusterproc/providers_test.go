package clusterproc_test

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
	"github.com/residency-go/residency/system/cluster/providers"
)

// A node process pointed at an etcd that does not listen (a closed
// loopback port) exits with status 1 after its dial timeout, its log
// naming the endpoint; it does not hang. The bound asserted is generous
// (a hang never ends); the figure is logged.
func TestNodeEtcdUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, demoBin, "node", "--name", "lonely", "--provider", "etcd", "--etcd", addr, "--etcd-dial-timeout", "1s")
	cmd.Stderr = &stderr
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	require.NoError(t, ctx.Err(), "the node did not exit: it hangs")
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "%v", err)
	require.Equal(t, 1, exit.ExitCode())
	require.Contains(t, stderr.String(), "cannot reach etcd at "+addr)
	t.Logf("the node gave up after %s (dial timeout 1s)", took)
}

// The automanaged provider listens on its configured address only when
// the node joins: an address in use fails StartNode with an error that
// names it, and nothing is left running.
func TestAutomanagedAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	p, err := providers.Automanaged(providers.AutomanagedOptions{Addr: l.Addr().String()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	n, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: "busy", Provider: p,
		Options: system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host")}, Backend: testsys.Soft(t, nil)}})
	if n != nil {
		_ = n.Close(ctx)
	}
	var inv *system.InvalidInputError
	require.True(t, errors.As(err, &inv), "%T %v", err, err)
	require.Contains(t, err.Error(), "cannot listen at "+l.Addr().String())
}

// A node whose own address is in use fails StartNode (protoactor's remote
// cannot listen) with an InvalidInputError naming it, and leaves nothing
// running.
func TestNodeAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	health, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	haddr := health.Addr().String()
	require.NoError(t, health.Close())
	p, err := providers.Automanaged(providers.AutomanagedOptions{Addr: haddr})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	n, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: "busy", Provider: p, Addr: l.Addr().String(),
		Options: system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host")}, Backend: testsys.Soft(t, nil)}})
	if n != nil {
		_ = n.Close(ctx)
	}
	var inv *system.InvalidInputError
	require.True(t, errors.As(err, &inv), "%T %v", err, err)
	require.Contains(t, err.Error(), l.Addr().String())
}
