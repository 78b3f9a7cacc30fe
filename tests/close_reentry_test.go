package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// startOwned starts a runtime that owns its soft backend.
func startOwned(t *testing.T) *system.System {
	t.Helper()
	be, err := soft.New(soft.Config{Locations: []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}})
	require.NoError(t, err)
	sys, err := system.Start(context.Background(), system.Options{Locations: fourLocations(0, 1<<20, 1<<20), Backend: be, CloseBackend: true})
	require.NoError(t, err)
	return sys
}

// A component's close function (OnClose) that calls System.Close does not
// deadlock the runtime: with the context it was given the call is refused
// at once (it would wait for itself); with a context of its own it waits
// for the first Close until that context ends. The first Close returns
// by its deadline, and a later Close returns its result. Before, both
// calls blocked for ever on Close's mutex, whatever their contexts.
func TestCloseFromAComponentsCloseDoesNotDeadlock(t *testing.T) {
	sys := startOwned(t)
	var given, own error
	sys.OnClose("given", func(ctx context.Context) error {
		given = sys.Close(ctx)
		return nil
	})
	sys.OnClose("own", func(context.Context) error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		own = sys.Close(ctx)
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sys.Close(ctx) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close has not returned 10 s after it began")
	}
	require.ErrorIs(t, given, system.ErrInvalidInput)
	require.ErrorIs(t, own, context.DeadlineExceeded)
	require.NoError(t, sys.Close(context.Background()), "a later Close returns the first result")
}

// A Close made while another is under way waits for that one's result
// only until its own context ends: it returns while the first still waits
// for a stuck loader. Before, it waited for the first Close however short
// its own deadline (5.9 s for a 200 ms context).
func TestConcurrentCloseHonoursItsOwnContext(t *testing.T) {
	sys := startOwned(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	started, unblock := make(chan struct{}), make(chan struct{})
	h, err := sys.Register(ctx, system.Value{Name: "stuck", Bytes: 4096, Source: "pageable-host",
		Loader: func(context.Context, []byte) error { close(started); <-unblock; return nil }})
	require.NoError(t, err)
	go func() { _ = sys.Place(ctx, h, "cuda:0") }()
	<-started
	begun := make(chan struct{})
	sys.OnClose("signal", func(context.Context) error { close(begun); return nil })
	first := make(chan error, 1)
	go func() {
		c, cl := context.WithTimeout(context.Background(), 8*time.Second)
		defer cl()
		first <- sys.Close(c)
	}()
	<-begun // the first Close has begun
	c2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	err = sys.Close(c2)
	require.ErrorIs(t, err, context.DeadlineExceeded, "its own deadline")
	select {
	case e := <-first:
		t.Fatalf("the first Close returned before the stuck loader did (%v): the second one's return proves nothing", e)
	default: // still waiting for the loader: the second Close returned at its own deadline, not the first's
	}
	close(unblock)
	firstErr := <-first
	assert.Equal(t, firstErr, sys.Close(context.Background()), "a later Close returns the first result")
}

// A cache load whose context the cache's Close canceled does not keep its
// value, even when the loader ignores the cancellation and returns one:
// its caller gets ErrCacheClosed and the value is closed. Before, the
// caller got a lease on a value in a closed cache, which nothing closed
// (System.Close, whose context ended, had already dropped the cache).
func TestCacheLoadInterruptedByCloseIsNotKept(t *testing.T) {
	sys := startOwned(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "m"})
	require.NoError(t, err)
	started, unblock := make(chan struct{}), make(chan struct{})
	v := &closeFlag{closed: make(chan struct{})}
	out := make(chan error, 1)
	go func() {
		_, err := cache.Load(ctx, c, "k", 1000, nil, func(context.Context) (*closeFlag, int64, error) {
			close(started)
			<-unblock // ignores its context
			return v, 1000, nil
		})
		out <- err
	}()
	<-started
	cctx, ccancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer ccancel()
	_ = sys.Close(cctx) // cut short: the loader still runs
	close(unblock)
	require.ErrorIs(t, <-out, system.ErrCacheClosed)
	select {
	case <-v.closed:
	case <-ctx.Done():
		t.Fatal("the value the loader returned was never closed")
	}
}

type closeFlag struct{ closed chan struct{} }

func (f *closeFlag) Close() error {
	close(f.closed)
	return nil
}
