package liveview_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
	"github.com/residency-go/residency/system/diagnose"
	"github.com/residency-go/residency/system/liveview"
)

// startSoft starts a runtime on the soft backend (testsys.Soft) with an
// unlimited pageable host and a 1 MiB cuda:0, closed when the test ends.
func startSoft(t *testing.T) *system.System {
	t.Helper()
	return startLocs(t, system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<20))
}

// startLocs starts a runtime on the soft backend at locs, closed when the
// test ends.
func startLocs(t *testing.T, locs ...system.LocationConfig) *system.System {
	t.Helper()
	sys, err := system.Start(context.Background(), system.Options{Locations: locs, Backend: testsys.Soft(t, locs)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	return sys
}

// fakeClock is a cache clock that stands still: its timers never fire.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }
func (c *fakeClock) AfterFunc(time.Duration, func()) cache.ClockTimer {
	return stoppedTimer{}
}

type stoppedTimer struct{}

func (stoppedTimer) Stop() bool { return true }

// t0 is the fake clock's time.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// kept is what the application keeps of its last failure, for
// liveview.WithEvidence.
type kept struct {
	mu sync.Mutex
	ev *diagnose.Evidence
}

func (k *kept) set(ev diagnose.Evidence) { k.mu.Lock(); k.ev = &ev; k.mu.Unlock() }

func (k *kept) last() (diagnose.Evidence, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ev == nil {
		return diagnose.Evidence{}, false
	}
	return *k.ev, true
}

const row = 256 // the fixture pipeline's pool row size

// fixture is a runtime with something in every feed of the view: a value
// on cuda:0 and a refused admission (populate); a loader cache "models"
// with an entry of two leases and a pin marked to leave when idle, an idle one with
// an expiry and one still loading; an Admit waiting for room; a staging pipeline with a deferred task
// holding a device clone, a dropped try-reserve and two staged steps holding both slots; and
// the evidence of the refused admission.
type fixture struct {
	sys      *system.System
	cache    *cache.Cache
	pipeline *staging.Pipeline
	evidence *kept
	failure  diagnose.Evidence
}

func (f *fixture) options() []liveview.Option {
	return []liveview.Option{liveview.WithCache(f.cache), liveview.WithPipeline(f.pipeline), liveview.WithEvidence(f.evidence.last)}
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{evidence: &kept{}}
	f.sys = startLocs(t, system.NoLimit("pageable-host"), system.NoLimit("pinned-host"), system.Limit("cuda:0", 1<<20))
	populate(t, f.sys)
	f.cacheEntries(t)
	f.stagingPipeline(t)
	f.waiter(t)

	_, err := f.sys.Register(ctx, system.Value{Name: "too-big", Bytes: 2 << 20, At: "cuda:0"})
	require.Error(t, err)
	f.failure, err = diagnose.Capture(ctx, f.sys, err, diagnose.Operation{Kind: "register", Handle: system.Handle{Name: "too-big"}, Location: "cuda:0"})
	require.NoError(t, err)
	f.evidence.set(f.failure)
	return f
}

// waiter leaves an Admit waiting for room at cuda:0 in class 2 until the
// test ends: its 600 KiB cannot fit beside the 512 KiB reservation kv,
// so each of its tries is refused and changes nothing.
func (f *fixture) waiter(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := f.sys.Admit(ctx, system.Request{Name: "batch-7",
			Reservations: []system.ReservationSpec{{Name: "batch-7", Location: "cuda:0", Bytes: 600 << 10}}}, system.WaitClass(2))
		done <- err
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, func() bool { // queued and tried
		ws := f.sys.Waiters()
		return len(ws) == 1 && ws[0].Tries > 0
	})
}

func (f *fixture) cacheEntries(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	keep := 30 * time.Second
	c, err := cache.New(ctx, f.sys, cache.Options{Location: "cuda:0", Name: "models", KeepAlive: &keep, Clock: &fakeClock{now: t0}})
	require.NoError(t, err)
	f.cache = c
	t.Cleanup(func() { _ = c.Close(ctx) })
	load := func(key string, bytes int64) cache.Lease[string] {
		l, err := cache.Load(ctx, c, key, bytes, nil, func(context.Context) (string, int64, error) { return key, bytes, nil })
		require.NoError(t, err)
		return l
	}
	held := load("encoder", 32<<10)
	again, pin := held.Clone(), held.Pin()
	t.Cleanup(func() { _ = pin.Release(); _ = again.Release(); _ = held.Release() })
	_, found, err := c.EvictWhenIdle(ctx, "encoder")
	require.NoError(t, err)
	require.True(t, found)
	require.NoError(t, load("decoder", 16<<10).Release())

	// A load that waits for the test: listed as loading until it ends.
	started, finish, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		l, err := cache.Load(ctx, c, "tokenizer", 8<<10, nil, func(context.Context) (string, int64, error) {
			close(started)
			<-finish
			return "", 0, errors.New("the test is over")
		})
		if err == nil {
			err = l.Release()
		}
		done <- err
	}()
	<-started
	t.Cleanup(func() { close(finish); <-done })
}

func (f *fixture) stagingPipeline(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	p, err := staging.New(ctx, f.sys, staging.Config{
		Name: "kv", Device: "cuda:0", Slots: 2, SlotBytes: 4 * row,
		Keys: []string{"k"}, PoolSlots: 8, RowBytes: row, CloneBudgetBytes: 4 * row,
	})
	require.NoError(t, err)
	f.pipeline = p
	t.Cleanup(func() { _ = p.Close(ctx) })

	deferred, err := p.Open(ctx, staging.TaskSpec{ReqID: "deferred", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	rows := []staging.Row{{Key: "k", Slot: 0}, {Key: "k", Slot: 1, Offset: row}}
	require.NoError(t, deferred.Append(ctx, staging.Chunk{Device: devBuf(t, f.sys, 2*row), Rows: rows}))
	_, err = deferred.ReadRow(ctx, "k", 0) // waits for the clone to land
	require.NoError(t, err)

	dropped, err := p.Open(ctx, staging.TaskSpec{ReqID: "dropped", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	err = dropped.Append(ctx, staging.Chunk{Device: devBuf(t, f.sys, 4*row), Rows: []staging.Row{{Key: "k", Slot: 2}}, NoWait: true})
	var drop *staging.DropError
	require.ErrorAs(t, err, &drop)
	require.Equal(t, staging.DropBudget, drop.Reason)

	for range 2 { // every slot held
		step, err := p.Stage(ctx, devBuf(t, f.sys, 4*row), nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = step.Release() })
	}
}

// devBuf allocates n bytes at cuda:0, freed when the test ends (before
// the runtime closes).
func devBuf(t *testing.T, sys *system.System, n int) cuda.Buffer {
	t.Helper()
	ctx := context.Background()
	be := sys.Backend()
	b, err := be.Allocate(ctx, "cuda:0", int64(n))
	require.NoError(t, err)
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i / row)
	}
	require.NoError(t, be.Write(ctx, b, data))
	t.Cleanup(func() { _ = be.Free(b) })
	return b
}
