package tests

// Waiting for room: a call with a wait option tries first and queues only
// after a refusal; a queued call is not starved by later ones; a caller
// can observe that it is queued and why.

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitRig is a runtime with cuda:0 and cuda:1 of 100 bytes each, its
// events logged, and a cache at each.
type waitRig struct {
	sys    *system.System
	c0, c1 *cache.Cache
	log    *lockedBuffer
}

func newWaitRig(t *testing.T, maxWaiters int) *waitRig {
	t.Helper()
	buf := &lockedBuffer{}
	logger := zerolog.New(buf)
	sys := start(t, system.Options{
		Locations:  []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 100), system.Limit("cuda:1", 100)},
		Logger:     &logger,
		EventLevel: zerolog.WarnLevel,
		MaxWaiters: maxWaiters,
	})
	r := &waitRig{sys: sys, log: buf}
	var err error
	r.c0, err = cache.New(context.Background(), sys, cache.Options{Location: "cuda:0", Name: "gpu0"})
	require.NoError(t, err)
	r.c1, err = cache.New(context.Background(), sys, cache.Options{Location: "cuda:1", Name: "gpu1"})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, r.c0.Close(context.Background()))
		require.NoError(t, r.c1.Close(context.Background()))
	})
	return r
}

type waitedLoad struct {
	l   cache.Lease[int]
	err error
}

// loadQueued starts a waiting load of key and returns once the load is
// queued (its first notification), with that notification and the
// channel of its outcome.
func loadQueued(t *testing.T, c *cache.Cache, key string, bytes int64, opts ...system.WaitOption) (system.WaitState, <-chan waitedLoad) {
	t.Helper()
	queued := make(chan system.WaitState, 16)
	out := make(chan waitedLoad, 1)
	opts = append(opts, system.WaitNotify(func(s system.WaitState) { queued <- s }))
	go func() {
		l, err := cache.Load(context.Background(), c, key, bytes, always[int], value(len(key), bytes), cache.Wait(opts...))
		out <- waitedLoad{l, err}
	}()
	select {
	case st := <-queued:
		return st, out
	case r := <-out:
		require.Failf(t, "not queued", "load of %q returned %v at once", key, r.err)
		return system.WaitState{}, out
	}
}

// A call with a wait option tries first: a load that fits never logs
// wait_started, and with the queue full a request that fits now (at
// another location, or in a higher class than the waiter) succeeds.
func TestCacheWaitTriesFirst(t *testing.T) {
	ctx := context.Background()
	r := newWaitRig(t, 1)
	notified := false
	l, err := cache.Load(ctx, r.c0, "fits", 60, always[int], value(1, 60), cache.Wait(system.WaitNotify(func(system.WaitState) { notified = true })))
	require.NoError(t, err)
	assert.False(t, notified)
	assert.NotContains(t, r.log.String(), "wait_started", "a load that fits at once never queues")

	_, out := loadQueued(t, r.c0, "big", 80) // 60 + 80 > 100: the one waiter
	other, err := cache.Load(ctx, r.c1, "other", 50, always[int], value(2, 50), cache.Wait(system.WaitForRoom()))
	require.NoError(t, err, "the queue is full, but this fits at once elsewhere")
	higher, err := cache.Load(ctx, r.c0, "urgent", 30, always[int], value(3, 30), cache.Wait(system.WaitClass(1)))
	require.NoError(t, err, "the queue is full, but this fits at once and no waiter of its class waits")
	_, err = cache.Load(ctx, r.c0, "later", 30, always[int], value(4, 30), cache.Wait(system.WaitForRoom()))
	var qf *system.QueueFullError
	require.ErrorAs(t, err, &qf, "held up by the waiter of its class: it would queue, and the queue is full")

	for _, x := range []cache.Lease[int]{l, other, higher} {
		require.NoError(t, x.Release())
	}
	big := <-out
	require.NoError(t, big.err)
	require.NoError(t, big.l.Release())
}

// No starvation: while a load waits for room at cuda:0, later loads there
// of its class or lower — waiting or not — do not take the room it waits
// for, though each would fit; it is admitted as soon as the holder ahead
// of it lets go, and the later waiter after it.
func TestCacheWaitNoStarvation(t *testing.T) {
	ctx := context.Background()
	r := newWaitRig(t, 0)
	holder, err := cache.Load(ctx, r.c0, "holder", 60, always[int], value(1, 60))
	require.NoError(t, err)
	st, bigOut := loadQueued(t, r.c0, "big", 80)
	assert.Equal(t, system.WaitState{Name: "big", Locations: []string{"cuda:0"}, Location: "cuda:0", Shortfall: 40, Refusal: st.Refusal}, st)
	require.ErrorIs(t, st.Refusal, system.ErrBusy)

	// A stream of small calls that would each fit (60 + 30 ≤ 100).
	for range 3 {
		_, err := cache.Load(ctx, r.c0, "small", 30, always[int], value(2, 30))
		var busy *system.CacheBusyError
		require.ErrorAs(t, err, &busy, "a call that does not wait is refused rather than pass the waiter")
		assert.Equal(t, 1, busy.Waiters)
	}
	st2, smallOut := loadQueued(t, r.c0, "small", 30)
	assert.Equal(t, 1, st2.Position)
	assert.Equal(t, 1, st2.Ahead, "queued behind big without a try")
	assert.NoError(t, st2.Refusal)
	ws, err := r.sys.AwaitWaiters(ctx, func(ws []system.WaiterInfo) bool { return len(ws) == 2 })
	require.NoError(t, err)
	assert.Equal(t, "big", ws[0].Name)

	require.NoError(t, holder.Release()) // big evicts the idle holder
	big := <-bigOut
	require.NoError(t, big.err, "admitted first")
	select {
	case s := <-smallOut:
		require.Failf(t, "passed", "small returned %v while big holds 80 of 100", s.err)
	default:
	}
	require.NoError(t, big.l.Release()) // small evicts big
	small := <-smallOut
	require.NoError(t, small.err)
	require.NoError(t, small.l.Release())
	_, err = r.sys.AwaitWaiters(ctx, func(ws []system.WaiterInfo) bool { return len(ws) == 0 })
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(r.log.String(), `"wait_started"`), "big and the waiting small")
}

// Admit with a wait option tries first too: with the queue full (one
// cache load waiting at cuda:0), an Admit that fits at once at cuda:1
// succeeds and never logs wait_started; one at cuda:0 of the waiter's
// class would queue behind it, and the full queue refuses it.
func TestAdmitWaitTriesFirst(t *testing.T) {
	ctx := context.Background()
	r := newWaitRig(t, 1)
	holder, err := cache.Load(ctx, r.c0, "holder", 60, always[int], value(1, 60))
	require.NoError(t, err)
	_, out := loadQueued(t, r.c0, "big", 80)
	req := func(name, loc string) system.Request {
		return system.Request{Name: name, Reservations: []system.ReservationSpec{{Name: name, Location: loc, Bytes: 30}}}
	}
	sc, _, err := r.sys.Admit(ctx, req("elsewhere", "cuda:1"), system.WaitForRoom())
	require.NoError(t, err, "fits at once at cuda:1, though the queue is full")
	require.NoError(t, sc.Exit(ctx))
	assert.Equal(t, 1, strings.Count(r.log.String(), `"wait_started"`), "only big waited")
	_, _, err = r.sys.Admit(ctx, req("behind", "cuda:0"), system.WaitForRoom())
	var qf *system.QueueFullError
	require.ErrorAs(t, err, &qf)
	require.NoError(t, holder.Release())
	big := <-out
	require.NoError(t, big.err)
	require.NoError(t, big.l.Release())
}
