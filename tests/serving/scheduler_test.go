package serving

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// A second request for a model already loaded gets the same weights
// without loading them again; the model is held twice.
func TestSecondRequestReusesTheLoadedModel(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	first, err := reg.request(ctx, c, "llama", 60)
	require.NoError(t, err)
	second, err := reg.request(ctx, c, "llama", 60)
	require.NoError(t, err)
	assert.Same(t, first.Value(), second.Value())
	assert.EqualValues(t, 1, reg.loads.Load())

	es := c.Entries()
	require.Len(t, es, 1)
	assert.Equal(t, 2, es[0].Leases)
	assert.EqualValues(t, 60, srv.charged(t, "cuda:0"))
	require.NoError(t, first.Release())
	require.NoError(t, second.Release())
}

// Requests that arrive while a model loads share that one load.
func TestConcurrentRequestsShareOneLoad(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	reg.gate = make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	reg.before = func(string) { once.Do(func() { close(started) }) }

	ctx := context.Background()
	const n = 8
	answers := make([]<-chan result, n)
	answers[0] = background(func() (cache.Lease[*model], error) { return reg.request(ctx, c, "llama", 60) })
	<-started // the load is in flight: everyone after joins it
	for i := 1; i < n; i++ {
		answers[i] = background(func() (cache.Lease[*model], error) { return reg.request(ctx, c, "llama", 60) })
	}
	close(reg.gate)
	var m *model
	for _, a := range answers {
		got := answer(t, a)
		require.NoError(t, got.err)
		if m == nil {
			m = got.lease.Value()
		}
		assert.Same(t, m, got.lease.Value())
		require.NoError(t, got.lease.Release())
	}
	assert.EqualValues(t, 1, reg.loads.Load())
}

// A load that fails reaches its caller as a typed error, leaves no entry
// and charges nothing; the next request loads again.
func TestFailedLoadChargesNothingAndIsRetried(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	ctx := context.Background()
	broken := errors.New("weights file truncated")

	_, err := cache.Load(ctx, c, "llama", 60, nil, func(context.Context) (*model, int64, error) { return nil, 0, broken })
	var le *system.CacheLoadError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, broken)
	assert.Empty(t, c.Entries())
	assert.Zero(t, srv.charged(t, "cuda:0"))

	reg := newRegistry()
	l, err := reg.request(ctx, c, "llama", 60)
	require.NoError(t, err)
	assert.EqualValues(t, 1, reg.loads.Load())
	require.NoError(t, l.Release())
}

// Models load side by side while the GPU has room; once it is full, a new
// model's request waits, and takes the place of an idle one as soon as a
// request releases it.
func TestNewModelWaitsForRoomThenReplacesAnIdleModel(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	a, err := reg.request(ctx, c, "a", 50)
	require.NoError(t, err)
	b, err := reg.request(ctx, c, "b", 50)
	require.NoError(t, err)
	assert.EqualValues(t, 100, srv.charged(t, "cuda:0"))

	third := background(func() (cache.Lease[*model], error) {
		return reg.request(ctx, c, "c", 50, cache.Wait(system.WaitForRoom()))
	})
	srv.events.await(t, system.EventWaitStarted, 1)
	pending(t, third, "the third model's request")

	require.NoError(t, b.Release()) // b is idle now: the waiter evicts it
	got := answer(t, third)
	require.NoError(t, got.err)
	unloaded(t, reg.last(t, "b"))
	assert.True(t, isLoaded(reg.last(t, "a")), "a is still in use")
	assert.EqualValues(t, 100, srv.charged(t, "cuda:0"))
	require.NoError(t, a.Release())
	require.NoError(t, got.lease.Release())
}

// Without waiting, a request for a model that does not fit while every
// loaded model is busy is answered busy at once, and nothing changes.
func TestNoRoomWithoutWaitingAnswersBusy(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	a, err := reg.request(ctx, c, "a", 80)
	require.NoError(t, err)
	_, err = reg.request(ctx, c, "b", 80)
	require.ErrorIs(t, err, system.ErrBusy)
	assert.EqualValues(t, 80, srv.charged(t, "cuda:0"))
	assert.Len(t, c.Entries(), 1)
	require.NoError(t, a.Release())
}

// A bounded queue of waiting requests answers the next one "busy" at
// once, while the queued one keeps its place and is served later.
func TestFullQueueAnswersBusyAtOnce(t *testing.T) {
	srv := newServer(t, 100, func(o *system.Options) { o.MaxWaiters = 1 })
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	a, err := reg.request(ctx, c, "a", 80)
	require.NoError(t, err)
	queued := background(func() (cache.Lease[*model], error) {
		return reg.request(ctx, c, "b", 80, cache.Wait(system.WaitForRoom()))
	})
	srv.events.await(t, system.EventWaitStarted, 1)

	_, err = reg.request(ctx, c, "c", 80, cache.Wait(system.WaitForRoom()))
	var qf *budget.QueueFullError
	require.ErrorAs(t, err, &qf)
	assert.ErrorIs(t, err, system.ErrBusy)
	assert.Equal(t, 1, qf.MaxWaiters)
	pending(t, queued, "the queued request")

	require.NoError(t, a.Release())
	got := answer(t, queued)
	require.NoError(t, got.err)
	require.NoError(t, got.lease.Release())
}

// The scheduler may pick a busy model as the victim: it is unloaded as
// soon as its request finishes, and the waiting model loads then (never
// while the busy one still runs).
func TestBusyVictimUnloadsWhenItsRequestFinishes(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	busy, err := reg.request(ctx, c, "old", 70)
	require.NoError(t, err)
	old := reg.last(t, "old")
	reg.before = func(name string) {
		if name == "new" {
			assert.False(t, isLoaded(old), "the new model loads only after the old one is unloaded")
		}
	}
	done, found, err := c.EvictWhenIdle(ctx, "old")
	require.NoError(t, err)
	require.True(t, found)
	next := background(func() (cache.Lease[*model], error) {
		return reg.request(ctx, c, "new", 70, cache.Wait(system.WaitForRoom()))
	})
	srv.events.await(t, system.EventWaitStarted, 1)
	assert.True(t, isLoaded(old), "busy: still loaded")
	pending(t, next, "the new model's request")

	require.NoError(t, busy.Release())
	<-done
	got := answer(t, next)
	require.NoError(t, got.err)
	assert.False(t, isLoaded(old))
	require.NoError(t, got.lease.Release())
}

// A request that needs the model with other settings (another key) waits
// for the old instance to finish its requests, then reloads.
func TestReloadWithOtherSettingsWaitsForTheOldInstance(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	running, err := reg.request(ctx, c, "llama/ctx=2048", 60)
	require.NoError(t, err)
	old := reg.last(t, "llama/ctx=2048")
	_, _, err = c.EvictWhenIdle(ctx, "llama/ctx=2048")
	require.NoError(t, err)
	reload := background(func() (cache.Lease[*model], error) {
		return reg.request(ctx, c, "llama/ctx=8192", 60, cache.Wait(system.WaitForRoom()))
	})
	srv.events.await(t, system.EventWaitStarted, 1)
	require.NoError(t, running.Release())
	got := answer(t, reload)
	require.NoError(t, got.err)
	unloaded(t, old)
	assert.EqualValues(t, 60, srv.charged(t, "cuda:0"))
	require.NoError(t, got.lease.Release())
}

// An idle model stays for its keep-alive, then unloads on its own.
func TestIdleModelUnloadsWhenKeepAliveExpires(t *testing.T) {
	srv := newServer(t, 100)
	clk := newClock()
	keep := 5 * time.Minute
	c := srv.gpuCache(t, "cuda:0", func(o *cache.Options) { o.KeepAlive, o.Clock = &keep, clk })
	reg := newRegistry()
	ctx := context.Background()

	l, err := reg.request(ctx, c, "llama", 60)
	require.NoError(t, err)
	require.NoError(t, l.Release())
	m := reg.last(t, "llama")
	es := c.Entries()
	require.Len(t, es, 1)
	assert.Equal(t, clk.Now().Add(keep), es[0].Expiry)

	clk.Advance(keep - time.Second)
	assert.True(t, isLoaded(m))
	clk.Advance(time.Second)
	unloaded(t, m)
	assert.Empty(t, c.Entries())
}

// A keep-alive of zero unloads a model as soon as its last request ends.
func TestZeroKeepAliveUnloadsWhenTheLastRequestEnds(t *testing.T) {
	srv := newServer(t, 100)
	zero := time.Duration(0)
	c := srv.gpuCache(t, "cuda:0", func(o *cache.Options) { o.KeepAlive, o.Clock = &zero, newClock() })
	reg := newRegistry()
	ctx := context.Background()

	a, err := reg.request(ctx, c, "llama", 60)
	require.NoError(t, err)
	b, err := reg.request(ctx, c, "llama", 60)
	require.NoError(t, err)
	m := reg.last(t, "llama")
	require.NoError(t, a.Release())
	assert.True(t, isLoaded(m), "one request still runs")
	require.NoError(t, b.Release())
	unloaded(t, m)
}

// A request's keep-alive replaces the model's, longer or shorter than the
// cache's (as Ollama adopts each request's keep_alive), and it counts
// from the request's end.
func TestRequestKeepAliveReplacesTheModels(t *testing.T) {
	srv := newServer(t, 100)
	clk := newClock()
	keep := time.Minute
	c := srv.gpuCache(t, "cuda:0", func(o *cache.Options) { o.KeepAlive, o.Clock = &keep, clk })
	reg := newRegistry()
	ctx := context.Background()

	l, err := reg.request(ctx, c, "llama", 60, cache.WithKeepAlive(time.Hour))
	require.NoError(t, err)
	clk.Advance(2 * time.Hour) // held: no expiry runs
	m := reg.last(t, "llama")
	assert.True(t, isLoaded(m))
	require.NoError(t, l.Release())

	clk.Advance(59 * time.Minute)
	assert.True(t, isLoaded(m))
	// A later request with a shorter keep-alive shortens it.
	l, err = reg.request(ctx, c, "llama", 60, cache.WithKeepAlive(time.Second))
	require.NoError(t, err)
	require.NoError(t, l.Release())
	assert.True(t, isLoaded(m))
	clk.Advance(time.Second)
	unloaded(t, m)
	assert.EqualValues(t, 1, reg.loads.Load())
}

// A cap on loaded models unloads the least recently used idle one to load
// a new one, and answers busy when every loaded model is in use.
func TestCapOnLoadedModels(t *testing.T) {
	srv := newServer(t, 1000)
	c := srv.gpuCache(t, "cuda:0", func(o *cache.Options) { o.MaxEntries = 2 })
	reg := newRegistry()
	ctx := context.Background()

	for _, name := range []string{"a", "b", "a"} { // a is used last
		l, err := reg.request(ctx, c, name, 10)
		require.NoError(t, err)
		require.NoError(t, l.Release())
	}
	l, err := reg.request(ctx, c, "c", 10)
	require.NoError(t, err)
	unloaded(t, reg.last(t, "b"))
	assert.True(t, isLoaded(reg.last(t, "a")))

	held, err := reg.request(ctx, c, "a", 10)
	require.NoError(t, err)
	_, err = reg.request(ctx, c, "d", 10)
	var busy *system.CacheBusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, 2, busy.MaxEntries)
	require.NoError(t, held.Release())
	require.NoError(t, l.Release())
}

// Among GPUs that both fit, the scheduler can prefer the one with the
// most free memory instead of the first listed.
func TestPreferTheGPUWithTheMostFreeMemory(t *testing.T) {
	srv := newServer(t, 100)
	ctx := context.Background()
	// cuda:0 already holds a 40-byte KV cache; cuda:1 is empty.
	_, err := srv.sys.Register(ctx, system.Value{Name: "kv", Bytes: 40, At: "cuda:0"})
	require.NoError(t, err)
	w, err := srv.sys.Register(ctx, system.Value{Name: "weights", Bytes: 30, At: "pinned-host"})
	require.NoError(t, err)

	req := func(tie system.TieBreak) system.Request {
		return system.Request{
			Name:         "serve",
			Requirements: []system.Requirement{{Handle: w, Tiers: [][]string{{"cuda:0", "cuda:1"}}}},
			TieBreak:     tie,
		}
	}
	d, err := srv.sys.Decide(ctx, req(system.TieFirstListed))
	require.NoError(t, err)
	assert.Equal(t, "cuda:0", d.Plan.Enter[0].Location, "the default is deterministic: first listed")

	scope, d, err := srv.sys.Admit(ctx, req(system.TieMostFree))
	require.NoError(t, err)
	assert.Equal(t, "cuda:1", d.Plan.Enter[0].Location)
	require.NoError(t, scope.Exit(ctx))
}

// Unloading every idle model leaves the ones in use.
func TestUnloadEveryIdleModel(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	for _, name := range []string{"a", "b"} {
		l, err := reg.request(ctx, c, name, 30)
		require.NoError(t, err)
		require.NoError(t, l.Release())
	}
	inUse, err := reg.request(ctx, c, "c", 30)
	require.NoError(t, err)

	n, err := c.EvictIdle(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.False(t, isLoaded(reg.last(t, "a")))
	assert.False(t, isLoaded(reg.last(t, "b")))
	assert.True(t, isLoaded(reg.last(t, "c")))
	assert.EqualValues(t, 30, srv.charged(t, "cuda:0"))
	require.NoError(t, inUse.Release())
}

// The loaded-model list (what `ps` shows): key, state, bytes, holders,
// expiry.
func TestLoadedModelList(t *testing.T) {
	srv := newServer(t, 100)
	clk := newClock()
	keep := 10 * time.Minute
	c := srv.gpuCache(t, "cuda:0", func(o *cache.Options) { o.KeepAlive, o.Clock = &keep, clk })
	reg := newRegistry()
	ctx := context.Background()

	idle, err := reg.request(ctx, c, "a", 20)
	require.NoError(t, err)
	require.NoError(t, idle.Release())
	held, err := reg.request(ctx, c, "b", 30)
	require.NoError(t, err)
	pin := held.Pin()

	es := c.Entries()
	require.Len(t, es, 2)
	assert.Equal(t, "a", es[0].Key)
	assert.Equal(t, cache.EntryReady, es[0].State)
	assert.EqualValues(t, 20, es[0].Bytes)
	assert.Zero(t, es[0].Leases)
	assert.Equal(t, clk.Now().Add(keep), es[0].Expiry)
	assert.Equal(t, "b", es[1].Key)
	assert.Equal(t, 1, es[1].Leases)
	assert.Equal(t, 1, es[1].Pins)
	assert.True(t, es[1].Expiry.IsZero(), "held: no expiry")
	require.NoError(t, held.Release())
	require.NoError(t, pin.Release())
}

// A request already cancelled changes nothing; one cancelled while it
// waits for room leaves nothing behind either.
func TestCancelledRequestsLeaveNothing(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := reg.request(gone, c, "a", 50)
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, c.Entries())
	assert.Zero(t, reg.loads.Load())

	ctx := context.Background()
	full, err := reg.request(ctx, c, "big", 90)
	require.NoError(t, err)
	wctx, wcancel := context.WithCancel(ctx)
	waiting := background(func() (cache.Lease[*model], error) {
		return reg.request(wctx, c, "b", 50, cache.Wait(system.WaitForRoom()))
	})
	srv.events.await(t, system.EventWaitStarted, 1)
	wcancel()
	got := answer(t, waiting)
	require.ErrorIs(t, got.err, context.Canceled)
	assert.Empty(t, srv.sys.Waiters())
	assert.Len(t, c.Entries(), 1)
	assert.EqualValues(t, 90, srv.charged(t, "cuda:0"))
	require.NoError(t, full.Release())
}

// Shutting the server down answers every waiting request with ErrClosed.
func TestShutdownAnswersEveryWaitingRequest(t *testing.T) {
	srv := newServer(t, 100)
	c := srv.gpuCache(t, "cuda:0")
	reg := newRegistry()
	ctx := context.Background()

	full, err := reg.request(ctx, c, "big", 90)
	require.NoError(t, err)
	const n = 4
	var waiting []<-chan result
	for i := range n {
		name := string(rune('a' + i))
		waiting = append(waiting, background(func() (cache.Lease[*model], error) {
			return reg.request(ctx, c, name, 50, cache.Wait(system.WaitForRoom()))
		}))
	}
	srv.events.await(t, system.EventWaitStarted, n)
	closed := make(chan error, 1)
	go func() { closed <- srv.sys.Close(ctx) }()
	for _, w := range waiting {
		got := answer(t, w)
		assert.ErrorIs(t, got.err, system.ErrClosed)
	}
	require.NoError(t, full.Release())
	require.NoError(t, <-closed)
	assert.EqualValues(t, 1, reg.loads.Load())
}
