package system

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
)

// ---- helpers -------------------------------------------------------------

const gpu = "cuda:0"

// roomWatch waits on the wait room's state (no sleeping): the room calls
// onChange under its lock after every change.
type roomWatch struct {
	r  *waitRoom
	ch chan struct{}
}

func watchRoom(s *System) *roomWatch {
	w := &roomWatch{r: s.room, ch: make(chan struct{}, 1)}
	s.room.mu.Lock()
	s.room.onChange = func() {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
	s.room.mu.Unlock()
	return w
}

// until waits until cond (run under the room's lock) holds, or fails the
// test after a generous deadline.
func (w *roomWatch) until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		w.r.mu.Lock()
		ok := cond()
		w.r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-w.ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// queued waits until the named waiters are queued, in this order.
func (w *roomWatch) queued(t testing.TB, names ...string) {
	t.Helper()
	w.until(t, fmt.Sprintf("waiters %v", names), func() bool {
		got := w.r.q.Waiting()
		if len(got) != len(names) {
			return false
		}
		for i, s := range got {
			if s.Name != names[i] {
				return false
			}
		}
		return true
	})
}

// settled waits until every waiter has finished its turns and every
// eligible one has been tried since the last signal.
func (w *roomWatch) settled(t testing.TB) {
	t.Helper()
	w.until(t, "a settled room", func() bool {
		ep := w.r.epoch.Load()
		for _, id := range w.r.q.Eligible(nil) {
			x := w.r.ws[id]
			if x.trying || !x.tried || x.epoch < ep {
				return false
			}
		}
		for _, x := range w.r.ws {
			if x.trying {
				return false
			}
		}
		return true
	})
}

func resv(name string, bytes int64) Request { return resvAt(name, gpu, bytes) }

// resvAt is a request of one reservation of bytes at loc.
func resvAt(name, loc string, bytes int64) Request {
	return Request{Name: name, Reservations: []ReservationSpec{{Name: name, Location: loc, Bytes: bytes}}}
}

type admitted struct {
	name string
	sc   *Scope
	err  error
}

// admitAsync runs a waiting Admit of a reservation on its own goroutine.
func admitAsync(ctx context.Context, s *System, name string, bytes int64, out chan<- admitted, opts ...WaitOption) {
	go func() {
		sc, _, err := s.Admit(ctx, resv(name, bytes), append([]WaitOption{WaitForRoom()}, opts...)...)
		out <- admitted{name, sc, err}
	}()
}

func startGPU(t *testing.T, budgetBytes int64, opts ...func(*Options)) *System {
	t.Helper()
	o := Options{Locations: []LocationConfig{NoLimit("pageable-host"), Limit(gpu, budgetBytes)}}
	for _, f := range opts {
		f(&o)
	}
	s, err := startSoft(t, context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func mustAdmit(t *testing.T, s *System, name string, bytes int64) *Scope {
	t.Helper()
	sc, _, err := s.Admit(context.Background(), resv(name, bytes))
	require.NoError(t, err)
	return sc
}

func recv(t *testing.T, ch <-chan admitted) admitted {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting for an admission")
		return admitted{}
	}
}

// ---- wakes -----------------------------------------------------------------

// Each kind of release wakes a waiting Admit (exit, unreserve, lease
// release, unhold, discard) or a waiting cache load (cache lease
// release; an unprotected value no longer blocks a cache load, which
// evicts it itself: package system/cache tests that), and nothing else does: before the release the waiter is
// still queued after every signal has been handled.
func TestWaitingAdmitWakesOnEveryKindOfRelease(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// fill takes the whole budget and returns the release.
		fill func(t *testing.T, s *System, c TestCache) func()
		// cache: the waiter is a cache load instead of an Admit.
		cache bool
	}{
		{name: "exit", fill: func(t *testing.T, s *System, c TestCache) func() {
			sc := mustAdmit(t, s, "holder", 100)
			return func() { require.NoError(t, sc.Exit(ctx)) }
		}},
		{name: "unreserve", fill: func(t *testing.T, s *System, c TestCache) func() {
			require.NoError(t, s.Reserve(ctx, gpu, "holder", 100))
			return func() { require.NoError(t, s.Unreserve(ctx, "holder")) }
		}},
		{name: "lease release", fill: func(t *testing.T, s *System, c TestCache) func() {
			h := replicaOnGPU(t, s)
			l, err := s.Acquire(ctx, h, gpu)
			require.NoError(t, err)
			return func() { require.NoError(t, l.Release(ctx)) }
		}},
		{name: "unhold", fill: func(t *testing.T, s *System, c TestCache) func() {
			h := replicaOnGPU(t, s)
			hd, err := s.Hold(ctx, h, gpu)
			require.NoError(t, err)
			return func() { require.NoError(t, hd.Release(ctx)) }
		}},
		{name: "discard", fill: func(t *testing.T, s *System, c TestCache) func() {
			h, err := s.Register(ctx, Value{Name: "last-copy", Bytes: 100, Mode: Exclusive, At: gpu})
			require.NoError(t, err)
			return func() { require.NoError(t, s.Discard(ctx, h)) }
		}},
		{name: "cache lease release", cache: true, fill: func(t *testing.T, s *System, c TestCache) func() {
			release, err := c.Load(ctx, "held", 100)
			require.NoError(t, err)
			return func() { require.NoError(t, release()) }
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startGPU(t, 100)
			w := watchRoom(s)
			c := cacheFor(t, s)
			release := tc.fill(t, s, c)
			done := make(chan error, 1)
			if tc.cache {
				go func() {
					release, err := c.Load(ctx, "waiter", 60, WaitForRoom())
					if err == nil {
						err = release()
					}
					done <- err
				}()
			} else {
				go func() {
					sc, _, err := s.Admit(ctx, resv("waiter", 60), WaitForRoom())
					if err == nil {
						err = sc.Exit(ctx)
					}
					done <- err
				}()
			}
			w.queued(t, "waiter")
			w.settled(t)
			select {
			case err := <-done:
				t.Fatalf("admitted before the release: %v", err)
			default:
			}
			release()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("the release did not wake the waiter")
			}
			w.until(t, "an empty queue", func() bool { return w.r.q.Len() == 0 })
		})
	}
}

// replicaOnGPU registers a replicable value of 100 bytes resident on the
// host and on the GPU (the GPU copy is evictable unless protected).
func replicaOnGPU(t *testing.T, s *System) Handle {
	ctx := context.Background()
	h, err := s.Register(ctx, Value{Name: "replica", Bytes: 100, Mode: Replicable, At: "pageable-host"})
	require.NoError(t, err)
	require.NoError(t, s.Copy(ctx, h, "pageable-host", gpu))
	return h
}

// cacheFor is a loader cache at the GPU (package system/cache, through
// export_test.go).
func cacheFor(t *testing.T, s *System) TestCache { return NewTestCache(t, s, gpu) }

// ---- order -----------------------------------------------------------------

// Waiters are admitted first in first out within a class, higher classes
// first.
func TestWaitersFIFOWithinAClassHigherClassesFirst(t *testing.T) {
	ctx := context.Background()
	s := startGPU(t, 100)
	w := watchRoom(s)
	holder := mustAdmit(t, s, "holder", 100)
	out := make(chan admitted, 8)
	admitAsync(ctx, s, "a0", 100, out)
	w.queued(t, "a0")
	admitAsync(ctx, s, "b0", 100, out)
	w.queued(t, "a0", "b0")
	admitAsync(ctx, s, "c1", 100, out, WaitClass(1))
	w.queued(t, "c1", "a0", "b0")
	admitAsync(ctx, s, "d2", 100, out, WaitClass(2))
	w.queued(t, "d2", "c1", "a0", "b0")
	admitAsync(ctx, s, "e1", 100, out, WaitClass(1))
	w.queued(t, "d2", "c1", "e1", "a0", "b0")

	var order []string
	release := holder.Exit
	for range 5 {
		require.NoError(t, release(ctx))
		a := recv(t, out)
		require.NoError(t, a.err)
		order = append(order, a.name)
		release = a.sc.Exit
	}
	require.NoError(t, release(ctx))
	assert.Equal(t, []string{"d2", "c1", "e1", "a0", "b0"}, order)
}

// A big waiter at the head is not starved by later small ones that would
// fit, unless it allows bypass.
func TestBigWaiterIsNotBypassedUnlessItOptsIn(t *testing.T) {
	for _, bypass := range []bool{false, true} {
		t.Run(fmt.Sprint("bypass=", bypass), func(t *testing.T) {
			ctx := context.Background()
			s := startGPU(t, 100)
			w := watchRoom(s)
			h1, h2 := mustAdmit(t, s, "h1", 50), mustAdmit(t, s, "h2", 50)
			out := make(chan admitted, 2)
			var opts []WaitOption
			if bypass {
				opts = append(opts, WaitAllowBypass())
			}
			admitAsync(ctx, s, "big", 80, out, opts...)
			w.queued(t, "big")
			admitAsync(ctx, s, "small", 20, out)
			w.queued(t, "big", "small")
			require.NoError(t, h1.Exit(ctx)) // 50 free: small fits, big does not
			if bypass {
				a := recv(t, out)
				require.NoError(t, a.err)
				assert.Equal(t, "small", a.name)
				w.queued(t, "big")
				require.NoError(t, a.sc.Exit(ctx))
			} else {
				w.settled(t)
				w.queued(t, "big", "small")
			}
			require.NoError(t, h2.Exit(ctx))
			for range 2 - btoi(bypass) {
				a := recv(t, out)
				require.NoError(t, a.err)
				require.NoError(t, a.sc.Exit(ctx))
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ---- refusals, cancel, close ---------------------------------------------

// A full queue refuses a waiter at once with ErrBusy and changes nothing.
func TestFullWaitQueueAnswersBusyAtOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := startGPU(t, 100, func(o *Options) { o.MaxWaiters = 2 })
	w := watchRoom(s)
	holder := mustAdmit(t, s, "holder", 100)
	out := make(chan admitted, 2)
	admitAsync(ctx, s, "a", 10, out)
	w.queued(t, "a")
	admitAsync(ctx, s, "b", 10, out)
	w.queued(t, "a", "b")
	_, _, err := s.Admit(ctx, resv("c", 10), WaitForRoom())
	var qf *budget.QueueFullError
	require.ErrorAs(t, err, &qf)
	assert.ErrorIs(t, err, ErrBusy)
	c := cacheFor(t, s)
	_, err = c.Load(ctx, "k", 10, WaitForRoom())
	assert.ErrorAs(t, err, &qf, "a cache load shares the queue")
	w.queued(t, "a", "b")
	cancel()
	for range 2 {
		assert.ErrorIs(t, recv(t, out).err, context.Canceled)
	}
	require.NoError(t, holder.Exit(context.Background()))
	_, err = Start(context.Background(), Options{Locations: []LocationConfig{Limit(gpu, 1)}, Backend: s.Backend(), MaxWaiters: -1})
	var ie *InvalidInputError
	assert.ErrorAs(t, err, &ie)
}

// A waiter canceled while queued returns ctx's error and leaves nothing:
// not in the queue, no reservation, and a later release admits nobody.
func TestCanceledWaiterLeavesNothingBehind(t *testing.T) {
	s := startGPU(t, 100)
	w := watchRoom(s)
	holder := mustAdmit(t, s, "holder", 100)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan admitted, 1)
	admitAsync(ctx, s, "gone", 60, out)
	c := cacheFor(t, s)
	loadErr := make(chan error, 1)
	go func() {
		_, err := c.Load(ctx, "gone-key", 60, WaitForRoom())
		loadErr <- err
	}()
	w.until(t, "two waiters", func() bool { return w.r.q.Len() == 2 })
	cancel()
	assert.ErrorIs(t, recv(t, out).err, context.Canceled)
	assert.ErrorIs(t, <-loadErr, context.Canceled)
	w.until(t, "an empty queue", func() bool { return w.r.q.Len() == 0 && len(w.r.ws) == 0 && w.r.queued.Load() == 0 })
	require.NoError(t, holder.Exit(context.Background()))
	snap, err := s.Snapshot(context.Background())
	require.NoError(t, err)
	for _, l := range snap.Locations {
		assert.Zero(t, l.UsedBytes+l.ReservedBytes, "%s holds nothing", l.Location)
	}
	n, err := c.Resources(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n)
}

// Close wakes every waiter with ErrClosed.
func TestCloseWakesEveryWaiter(t *testing.T) {
	ctx := context.Background()
	s := startGPU(t, 100)
	w := watchRoom(s)
	_ = mustAdmit(t, s, "holder", 100)
	c := cacheFor(t, s)
	out := make(chan admitted, 3)
	admitAsync(ctx, s, "a", 10, out)
	admitAsync(ctx, s, "b", 20, out, WaitClass(3))
	admitAsync(ctx, s, "c", 30, out, WaitAllowBypass())
	loadErr := make(chan error, 1)
	go func() {
		_, err := c.Load(ctx, "k", 10, WaitForRoom())
		loadErr <- err
	}()
	w.until(t, "four waiters", func() bool { return w.r.q.Len() == 4 })
	require.NoError(t, s.Close(ctx))
	for range 3 {
		assert.ErrorIs(t, recv(t, out).err, ErrClosed)
	}
	assert.ErrorIs(t, <-loadErr, ErrClosed)
	_, _, err := s.Admit(ctx, resv("late", 1), WaitForRoom())
	assert.ErrorIs(t, err, ErrClosed)
}

// A refusal that room cannot lift returns at once, without queueing.
func TestWaitingAdmitReturnsFinalRefusalsAtOnce(t *testing.T) {
	ctx := context.Background()
	s := startGPU(t, 100)
	w := watchRoom(s)
	_, _, err := s.Admit(ctx, Request{Name: "x", Reservations: []ReservationSpec{{Name: "x", Location: "cuda:7", Bytes: 1}}}, WaitForRoom())
	var ue *UnavailableError
	require.ErrorAs(t, err, &ue)
	_, _, err = s.Admit(ctx, Request{Name: "y", Reservations: []ReservationSpec{{Name: "", Location: gpu, Bytes: 1}}}, WaitForRoom())
	var ie *InvalidInputError
	require.ErrorAs(t, err, &ie)
	// Larger than the whole budget: refused at once, not left waiting.
	_, _, err = s.Admit(ctx, resv("huge", 101), WaitForRoom())
	var pe *PlanError
	require.ErrorAs(t, err, &pe)
	h, err := s.Register(ctx, Value{Name: "too-big", Bytes: 200, Mode: Exclusive, At: "pageable-host"})
	require.NoError(t, err)
	_, _, err = s.Admit(ctx, Request{Name: "r", Requirements: []Requirement{{Handle: h, Tiers: [][]string{{gpu}}}}}, WaitForRoom())
	require.ErrorAs(t, err, &pe)
	w.until(t, "nobody queued", func() bool { return w.r.q.Len() == 0 })
	assert.False(t, roomWaitable(errors.New("other")))
}
