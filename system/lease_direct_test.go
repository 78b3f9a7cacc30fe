package system

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/testhooks"
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
	s, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}, knobs: testhooks.Knobs{
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

// A fatal stop in the middle of concurrent lease calls (the AfterLedger
// hook panics on the 3000th lease step, as a broken ledger invariant
// would), with messages alongside: every caller returns, each ends on the
// FatalError, and Close returns it.
func TestFatalStopDuringConcurrentLeaseCalls(t *testing.T) {
	ctx := context.Background()
	var n atomic.Int64
	s, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}, knobs: testhooks.Knobs{
		AfterLedger: func(kind string) {
			if (kind == "Acquire" || kind == "Release") && n.Add(1) == 3000 {
				panic("invariant broken")
			}
		},
	}})
	require.NoError(t, err)
	h, err := s.Register(ctx, Value{Name: "v", Bytes: 64, At: "cuda:0"})
	require.NoError(t, err)
	var wg sync.WaitGroup
	var fatals atomic.Int64
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				c, cancel := context.WithTimeout(ctx, time.Duration(g%4)*50*time.Microsecond+time.Second)
				l, err := s.Acquire(c, h, "cuda:0")
				if err == nil {
					err = l.Release(c)
				}
				cancel()
				var fe *FatalError
				if errors.As(err, &fe) {
					fatals.Add(1)
					return
				}
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("unexpected: %v", err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // message traffic
		defer wg.Done()
		for i := 0; i < 300; i++ {
			if _, err := s.Snapshot(ctx); err != nil {
				return
			}
			if _, err := s.Register(ctx, Value{Name: fmt.Sprint("w", i), Bytes: 64, At: "pageable-host"}); err != nil {
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("callers hang after the fatal stop")
	}
	assert.Equal(t, int64(16), fatals.Load(), "every caller saw the fatal error")
	err = s.Close(ctx)
	var fe *FatalError
	assert.True(t, errors.As(err, &fe), "Close: %v", err)
}

// Close while many goroutines take and release leases: every call ends,
// with ErrClosed once Close has begun, and Close returns (reporting a
// lease whose release came too late as outstanding); nothing hangs.
func TestCloseDuringConcurrentLeaseCalls(t *testing.T) {
	for round := range 10 {
		ctx := context.Background()
		s, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}})
		require.NoError(t, err)
		h, err := s.Register(ctx, Value{Name: "v", Bytes: 64, At: "cuda:0"})
		require.NoError(t, err)
		var wg sync.WaitGroup
		var leaked atomic.Int64
		for range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					l, err := s.Acquire(ctx, h, "cuda:0")
					if err != nil {
						if !errors.Is(err, ErrClosed) {
							t.Errorf("acquire: %v", err)
						}
						return
					}
					if err := l.Release(ctx); err != nil {
						if !errors.Is(err, ErrClosed) {
							t.Errorf("release: %v", err)
						}
						leaked.Add(1)
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		cerr := make(chan error, 1)
		go func() { cerr <- s.Close(ctx) }()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("callers hang across Close")
		}
		select {
		case err := <-cerr:
			var oe *OutstandingError
			if err != nil && !errors.As(err, &oe) {
				t.Errorf("close: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Close hangs")
		}
	}
}
