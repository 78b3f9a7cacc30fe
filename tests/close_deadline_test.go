package tests

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// closeLocations: a host source and a device with room for a few values.
func closeLocations() []system.LocationConfig {
	return []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("pinned-host", 1<<20), system.Limit("cuda:0", 1<<20)}
}

func startOwning(t *testing.T) (*system.System, *liveBackend) {
	t.Helper()
	locs := closeLocations()
	be := newLiveBackend(t, locs)
	sys, err := system.Start(context.Background(), system.Options{Locations: locs, Backend: be, CloseBackend: true,
		Spill: map[string]string{"cuda:0": "pinned-host"}})
	require.NoError(t, err)
	return sys, be
}

// A loader that ignores its context and blocks: Close returns once its
// own context ends, names the load and the bytes it still holds, has
// released every charge, and frees those bytes (then closes the owned
// backend) when the loader finally returns.
func TestCloseHonoursItsDeadlineWithALoaderThatBlocks(t *testing.T) {
	sys, be := startOwning(t)
	started, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(unblock) })
	h, err := sys.Register(context.Background(), system.Value{Name: "stuck", Bytes: 4096, Source: "pageable-host",
		Loader: func(_ context.Context, dst []byte) error {
			close(started)
			<-unblock // ignores its context
			dst[0] = 1
			return nil
		}})
	require.NoError(t, err)
	resident, err := sys.Register(context.Background(), system.Value{Name: "resident", Bytes: 1000, At: "cuda:0"})
	require.NoError(t, err)
	_ = resident

	placed := make(chan error, 1)
	go func() { placed <- sys.Place(context.Background(), h, "cuda:0") }()
	<-started

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = closeWithin(t, sys, ctx)
	sr := as[*system.StillRunningError](t, err, "close with a loader that blocks")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Len(t, sr.Running, 1, "%v", err)
	op := sr.Running[0]
	assert.Equal(t, "load", op.Kind)
	assert.Equal(t, "stuck", op.Value)
	assert.Equal(t, "cuda:0", op.Location)
	assert.Equal(t, sr.HeldBytes, be.liveBytes(), "what is still allocated is what the error names")
	assert.Positive(t, sr.HeldBytes["cuda:0"]+sr.HeldBytes["pageable-host"], "the loader's buffers are held")
	assert.Empty(t, finalCharges(t, sys), "nothing is charged after Close")

	perr := <-placed
	require.ErrorIs(t, perr, system.ErrAbandoned, "the Place waiting for the load is answered")

	select {
	case <-be.closed:
		t.Fatal("the owned backend was closed while the loader still wrote into its buffer")
	default:
	}
	once.Do(func() { close(unblock) })
	<-be.closed // the loader returned: its buffers are freed, then the backend closed
	assert.Empty(t, be.liveAtClose, "every buffer was freed before the backend was closed")
	assert.Equal(t, err, sys.Close(context.Background()), "Close is idempotent")
}

// A loader that honours its context is canceled by Close, which then
// returns without waiting for its deadline.
func TestCloseCancelsALoaderThatHonoursItsContext(t *testing.T) {
	sys, be := startOwning(t)
	started := make(chan struct{})
	h, err := sys.Register(context.Background(), system.Value{Name: "polite", Bytes: 4096, Source: "pageable-host",
		Loader: func(ctx context.Context, _ []byte) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		}})
	require.NoError(t, err)
	placed := make(chan error, 1)
	go func() { placed <- sys.Place(context.Background(), h, "cuda:0") }()
	<-started

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	require.NoError(t, closeWithin(t, sys, ctx), "the canceled loader returned: nothing is left running")
	require.NoError(t, ctx.Err(), "Close returned before its deadline")
	require.ErrorIs(t, <-placed, context.Canceled, "the load was canceled by Close")
	<-be.closed
	assert.Empty(t, be.liveAtClose)
	assert.Empty(t, finalCharges(t, sys))
}

// A loader that calls runtime.Goexit (t.FailNow in a test's loader) is a
// loader failure: Place returns, nothing stays charged.
func TestLoaderGoexitIsALoaderFailure(t *testing.T) {
	sys, be := startOwning(t)
	h, err := sys.Register(context.Background(), system.Value{Name: "goexit", Bytes: 4096, Source: "pageable-host",
		Loader: func(context.Context, []byte) error {
			runtime.Goexit()
			return nil
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), hangBound)
	defer cancel()
	err = sys.Place(ctx, h, "cuda:0")
	require.NoError(t, ctx.Err(), "Place returned (a hang detector, not a timing)")
	lp := as[*cuda.LoaderPanicError](t, err, "a loader that called Goexit")
	assert.True(t, lp.Goexit)
	snap := snapshot(t, sys)
	for _, l := range snap.Locations {
		assert.Zero(t, l.UsedBytes+l.TemporaryBytes, l.Location)
	}
	// The value loads again with a loader that works.
	require.NoError(t, closeWithin(t, sys, ctx))
	<-be.closed
	assert.Empty(t, be.liveAtClose)
}

// A cache loader that calls runtime.Goexit settles its key as a failed
// load: the next Load of the key runs its own loader.
func TestCacheLoaderGoexitSettlesTheKey(t *testing.T) {
	sys, _ := startOwning(t)
	c, err := cache.New(context.Background(), sys, cache.Options{Location: "cuda:0"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), hangBound)
	defer cancel()
	_, err = cache.Load(ctx, c, "k", 100, nil, func(context.Context) (int, int64, error) {
		runtime.Goexit()
		return 0, 0, nil
	})
	require.NoError(t, ctx.Err(), "Load returned (a hang detector)")
	var le *system.CacheLoadError
	require.ErrorAs(t, err, &le)
	assert.NotNil(t, le.Panic)
	l, err := cache.Load(ctx, c, "k", 100, nil, func(context.Context) (int, int64, error) { return 7, 100, nil })
	require.NoError(t, err, "the key is not stranded")
	assert.Equal(t, 7, l.Value())
	require.NoError(t, l.Release())
	require.NoError(t, closeWithin(t, sys, ctx), "Close closes the cache first")
	_, err = cache.Load(ctx, c, "k2", 100, nil, func(context.Context) (int, int64, error) { return 1, 100, nil })
	require.Error(t, err, "the cache was closed with the runtime")
}

// Close closes the components registered with OnClose first, the latest
// first, while the runtime still serves them, and joins their errors.
func TestCloseClosesRegisteredComponentsFirst(t *testing.T) {
	sys, be := startOwning(t)
	var order []string
	failing := errors.New("component failed to close")
	_ = sys.OnClose("first", func(ctx context.Context) error {
		order = append(order, "first")
		_, err := sys.Snapshot(ctx)
		return err // the runtime still serves a component's close
	})
	_ = sys.OnClose("second", func(context.Context) error { order = append(order, "second"); return failing })
	unregister := sys.OnClose("gone", func(context.Context) error { order = append(order, "gone"); return nil })
	unregister()
	err := sys.Close(context.Background())
	assert.Equal(t, []string{"second", "first"}, order)
	ce := as[*system.CloseError](t, err, "a component's close error")
	assert.Equal(t, "second", ce.Name)
	require.ErrorIs(t, err, failing)
	<-be.closed
	_ = sys.OnClose("late", func(context.Context) error { t.Error("registered after Close"); return nil })
}

// spillRigForClose: a cache at cuda:0 with spill whose idle entry "a"
// (600 KiB of cuda:0's 1 MiB) an admission of 600 KiB demotes through
// demote.
func spillRigForClose(t *testing.T, demote func(context.Context, string, any) (any, error)) (*system.System, *liveBackend, *cache.Cache) {
	t.Helper()
	sys, be := startOwning(t)
	c, err := cache.New(context.Background(), sys, cache.Options{Location: "cuda:0", Name: "models", Spill: &cache.Spill{Demote: demote}})
	require.NoError(t, err)
	l, err := cache.Load(context.Background(), c, "a", 600<<10, nil, func(context.Context) (int, int64, error) { return 1, 600 << 10, nil })
	require.NoError(t, err)
	require.NoError(t, l.Release())
	return sys, be, c
}

func admitKV(sys *system.System) error {
	sc, _, err := sys.Admit(context.Background(), system.Request{Name: "kv", Reservations: []system.ReservationSpec{{Name: "kv", Location: "cuda:0", Bytes: 600 << 10}}})
	if err == nil {
		err = sc.Exit(context.Background())
	}
	return err
}

// A cache's Spill.Demote that ignores its context and blocks does not
// hang Close: the cache's close and the demotion are named, nothing stays
// charged.
func TestCloseHonoursItsDeadlineWithADemoteThatBlocks(t *testing.T) {
	started, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(unblock) })
	sys, be, _ := spillRigForClose(t, func(context.Context, string, any) (any, error) {
		close(started)
		<-unblock
		return 2, nil
	})
	admitted := make(chan error, 1)
	go func() { admitted <- admitKV(sys) }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := closeWithin(t, sys, ctx)
	as[*system.CloseError](t, err, "the cache's close waited for its Demote until the deadline")
	sr := as[*system.StillRunningError](t, err, "the demotion is still running")
	require.Len(t, sr.Running, 1, "%v", err)
	assert.Equal(t, "demote cache entry", sr.Running[0].Kind)
	assert.Empty(t, sr.HeldBytes, "a cache entry's demotion holds no buffer of the runtime")
	assert.Empty(t, finalCharges(t, sys))
	require.Error(t, <-admitted, "the admission waiting for the demotion is answered")
	once.Do(func() { close(unblock) })
	<-be.closed // the demotion returned: the owned backend closes
}

// A Spill.Demote that calls runtime.Goexit drops the entry, as an error
// would: the admission that demoted it goes through.
func TestCacheDemoteGoexitDropsTheEntry(t *testing.T) {
	sys, be, _ := spillRigForClose(t, func(context.Context, string, any) (any, error) {
		runtime.Goexit()
		return nil, nil
	})
	require.NoError(t, admitKV(sys))
	require.NoError(t, closeWithin(t, sys, context.Background()))
	<-be.closed
	assert.Empty(t, be.liveAtClose)
}
