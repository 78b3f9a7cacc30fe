package providers

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// closedPort returns a loopback address nothing listens on (it was free a
// moment ago).
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// An etcd provider pointed at a closed loopback port is refused within its
// dial timeout, with an error naming the endpoint and wrapping the
// deadline, instead of hanging (protoactor's provider alone waits forever
// there). No goroutine stays behind (TestMain's goleak).
func TestEtcdProviderUnreachable(t *testing.T) {
	addr := closedPort(t)
	done := make(chan error, 1)
	go func() {
		_, err := Etcd(EtcdOptions{Endpoints: []string{addr}, DialTimeout: 500 * time.Millisecond})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second): // generous: a hang never returns
		t.Fatal("EtcdProvider did not return for an unreachable etcd")
	}
	require.Error(t, err)
	require.Contains(t, err.Error(), addr)
	require.Contains(t, err.Error(), "cannot reach etcd")
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)

	_, err = Etcd(EtcdOptions{})
	require.ErrorContains(t, err, "no endpoints")
}

// The automanaged provider refuses addresses the peers could not use: no
// port, port 0 (the peers must know it), no host, malformed peers.
func TestAutomanagedProviderRefusals(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "127.0.0.1:0", ":6330", "127.0.0.1:x", "127.0.0.1:70000"} {
		_, err := Automanaged(AutomanagedOptions{Addr: addr})
		require.Error(t, err, addr)
		require.Contains(t, err.Error(), strconv.Quote(addr))
	}
	_, err := Automanaged(AutomanagedOptions{Addr: "127.0.0.1:6331", Peers: []string{"nohostport"}})
	require.ErrorContains(t, err, `peer "nohostport"`)
	p, err := Automanaged(AutomanagedOptions{Peers: []string{"127.0.0.1:6331"}})
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:6330", p.(*automanagedProvider).addr, "loopback by default")
}
