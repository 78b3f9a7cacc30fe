package system

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Acquire, a Release and a ReleaseByID that find the supervisor busy
// (here: inside the AfterLedger hook of a Hold, holding the run right)
// wait for it on their contexts: each returns its context's error at its
// deadline, having done nothing; once the supervisor is free they go
// through, and Close finds nothing outstanding. The direct steps report
// themselves to AfterLedger under their requests' names.
func TestLeaseCallsWaitForABusySupervisorOnTheirContexts(t *testing.T) {
	ctx := context.Background()
	entered, unblock := make(chan struct{}), make(chan struct{})
	var kindsMu sync.Mutex
	var kinds []string
	s, err := Start(ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}, Hooks: Hooks{
		AfterLedger: func(kind string) {
			kindsMu.Lock()
			kinds = append(kinds, kind)
			kindsMu.Unlock()
			if kind == "Hold" {
				close(entered)
				<-unblock
			}
		},
	}})
	require.NoError(t, err)
	h, err := s.Register(ctx, Value{Name: "v", Bytes: 64, At: "cuda:0"})
	require.NoError(t, err)
	held, err := s.Acquire(ctx, h, "cuda:0")
	require.NoError(t, err)

	holdDone := make(chan error, 1)
	go func() {
		hd, err := s.Hold(ctx, h, "cuda:0")
		if err == nil {
			err = hd.Release(ctx)
		}
		holdDone <- err
	}()
	<-entered // the supervisor is inside the Hold's hook

	for name, call := range map[string]func(context.Context) error{
		"Acquire": func(c context.Context) error {
			l, err := s.Acquire(c, h, "cuda:0")
			assert.Nil(t, l)
			return err
		},
		"Release":     held.Release,
		"ReleaseByID": func(c context.Context) error { return s.ReleaseByID(c, held.ID()) },
	} {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		start := time.Now()
		err := call(wctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, name)
		assert.Less(t, time.Since(start), 5*time.Second, "%s waits no longer than its deadline", name)
	}

	close(unblock)
	require.NoError(t, <-holdDone)
	snap, err := s.Snapshot(ctx)
	require.NoError(t, err)
	leases := 0
	for _, v := range snap.Values {
		for _, m := range v.Materializations {
			leases += m.UseCount
		}
	}
	assert.Equal(t, 1, leases, "only the lease taken before: the calls that gave up did nothing")
	require.NoError(t, held.Release(ctx), "the lease the timed-out Release left is still releasable")
	l, err := s.Acquire(ctx, h, "cuda:0")
	require.NoError(t, err)
	require.NoError(t, s.ReleaseByID(ctx, l.ID()))
	require.NoError(t, s.Close(ctx), "nothing outstanding at close")
	kindsMu.Lock()
	defer kindsMu.Unlock()
	assert.Equal(t, []string{"Register", "Acquire", "Hold", "Unhold", "Snapshot", "Release", "Acquire", "Release", "Shutdown"}, kinds)
}
