package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/tests/internal/faultproxy"
)

// echo serves a line echo on loopback until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line through c and reads it back within d.
func roundTrip(c net.Conn, d time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "ping\n" {
		err = errors.New("wrong echo " + line)
	}
	return err
}

// Each mode, switched on open and new connections, then healed.
func TestModes(t *testing.T) {
	p, err := faultproxy.New(echo(t))
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	open := dial()
	require.NoError(t, roundTrip(open, 5*time.Second), "pass")

	p.Set(faultproxy.Delay, 300*time.Millisecond)
	start := time.Now()
	require.NoError(t, roundTrip(open, 5*time.Second), "delay")
	// Both ways delayed: at least twice the delay.
	require.GreaterOrEqual(t, time.Since(start), 600*time.Millisecond)
	err = roundTrip(open, 200*time.Millisecond)
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "delayed past the reader's deadline: %v", err)

	p.Set(faultproxy.Blackhole, 0)
	bh := dial()
	for _, c := range []net.Conn{open, bh} {
		err := roundTrip(c, 300*time.Millisecond)
		require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "blackhole: %v", err)
	}

	p.Set(faultproxy.Pass, 0) // leaving Blackhole closes what it held
	for _, c := range []net.Conn{open, bh} {
		require.Error(t, roundTrip(c, 5*time.Second), "closed on heal")
	}
	healed := dial()
	require.NoError(t, roundTrip(healed, 5*time.Second), "healed")

	p.Set(faultproxy.Drop, 0)
	require.Error(t, roundTrip(healed, 5*time.Second), "drop closes open connections")
	require.Error(t, roundTrip(dial(), 5*time.Second), "drop closes new connections")
	p.Set(faultproxy.Pass, 0)
	require.NoError(t, roundTrip(dial(), 5*time.Second), "healed after drop")
	require.Equal(t, faultproxy.Pass, p.Mode())
	require.Equal(t, "blackhole", faultproxy.Blackhole.String())
}
