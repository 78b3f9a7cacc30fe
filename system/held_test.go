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

	"github.com/residency-go/residency/internal/testsys"
)

// No starvation by calls that do not wait (docs/semantics.md, "Waiting
// for room", the bound): while a waiter waits for room at cuda:0, a
// steady stream of smaller calls that would each fit in the free room —
// reserve, register at the location, place, a non-waiting Admit —
// is refused with a *WaitersAheadError (ErrBusy) and takes none of it;
// calls elsewhere, and calls that charge nothing at cuda:0 (a lease on a
// resident value), go ahead. The waiter is admitted at the first try
// after the room it waits for is released. Before this rule the stream
// took the 40 free bytes and the waiter, needing 80 of the 100, waited
// as long as the stream went on.
func TestCallsThatDoNotWaitTakeNoRoomAWaiterWaitsFor(t *testing.T) {
	ctx := context.Background()
	s := startGPU(t, 100, func(o *Options) { o.Locations = append(o.Locations, Limit("cuda:1", 100)) })
	w := watchRoom(s)
	holder := mustAdmit(t, s, "holder", 60)
	resident, err := s.Register(ctx, Value{Name: "resident", Bytes: 10, At: gpu, Data: make([]byte, 10), Mode: Replicable})
	require.NoError(t, err)
	out := make(chan admitted, 1)
	admitAsync(ctx, s, "big", 80, out)
	w.queued(t, "big")

	// A stream of small calls, each of which would fit in the 30 free
	// bytes, from several goroutines at once.
	var busy, other atomic.Int64
	var firstOther atomic.Value
	stream := func(i int) {
		name := fmt.Sprintf("s%d", i)
		v, err := s.Register(ctx, Value{Name: name, Bytes: 5, Source: "pageable-host", Loader: zeros(5), Mode: Replicable})
		require.NoError(t, err)
		calls := []func() error{
			func() error { return s.Reserve(ctx, gpu, name+"-r", 5) },
			func() error {
				_, err := s.Register(ctx, Value{Name: name + "-at", Bytes: 5, At: gpu, Data: make([]byte, 5), Mode: Replicable})
				return err
			},
			func() error { return s.Place(ctx, v, gpu) },
			func() error { // elsewhere: goes ahead
				if err := s.Place(ctx, v, "cuda:1"); err != nil {
					return err
				}
				return s.Evict(ctx, v, "cuda:1")
			},
			func() error {
				sc, _, err := s.Admit(ctx, resv(name+"-a", 5))
				if err == nil {
					return sc.Exit(ctx)
				}
				return err
			},
		}
		for round := range 20 {
			for j, call := range calls {
				err := call()
				switch {
				case j == 3:
					require.NoError(t, err, "a place at cuda:1 charges no held room")
				case errors.Is(err, ErrBusy):
					var wa *WaitersAheadError
					if assert.ErrorAs(t, err, &wa) {
						assert.Equal(t, gpu, wa.Location)
						assert.Equal(t, 1, wa.Waiters)
					}
					busy.Add(1)
				default:
					other.Add(1)
					firstOther.CompareAndSwap(nil, fmt.Sprintf("round %d call %d: %v", round, j, err))
				}
			}
			lease, err := s.Acquire(ctx, resident, gpu) // charges nothing
			require.NoError(t, err)
			require.NoError(t, lease.Release(ctx))
		}
	}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); stream(i) }()
	}
	wg.Wait()
	assert.Equal(t, int64(0), other.Load(), "every call at cuda:0 refused as busy; first other result: %v", firstOther.Load())
	assert.Equal(t, int64(3*20*4), busy.Load())
	snap, err := s.Snapshot(ctx)
	require.NoError(t, err)
	for _, l := range snap.Locations {
		if l.Location == gpu {
			assert.Equal(t, int64(70), l.UsedBytes+l.ReservedBytes, "the stream took none of the free room")
		}
	}
	w.queued(t, "big")

	require.NoError(t, holder.Exit(ctx))
	a := recv(t, out)
	require.NoError(t, a.err, "admitted at the first try after the holder's room was released")
	require.NoError(t, a.sc.Exit(ctx))
	// Nobody waits: calls take room as they find it again.
	require.NoError(t, s.Reserve(ctx, gpu, "after", 5))
}

// A waiting call of a higher class is not held up by waiters of lower
// classes, and a non-waiting call is not held up by waiters of a lower
// (negative) class or by waiters that allow bypass.
func TestHeldRoomFollowsClassesAndBypass(t *testing.T) {
	ctx := context.Background()
	s := startGPU(t, 100)
	w := watchRoom(s)
	holder := mustAdmit(t, s, "holder", 90)
	out := make(chan admitted, 2)
	admitAsync(ctx, s, "low", 50, out, WaitClass(-1))
	admitAsync(ctx, s, "bypass", 50, out, WaitAllowBypass())
	w.queued(t, "bypass", "low")
	require.NoError(t, s.Reserve(ctx, gpu, "r", 5), "neither waiter holds room from a class-0 call that does not wait")
	require.NoError(t, s.Unreserve(ctx, "r"))
	require.NoError(t, holder.Exit(ctx))
	for range 2 {
		a := recv(t, out)
		require.NoError(t, a.err)
		require.NoError(t, a.sc.Exit(ctx))
	}
}

// zeros is a loader of n zero bytes.
func zeros(n int) Loader {
	return func(_ context.Context, dst []byte) error {
		clear(dst[:n])
		return nil
	}
}

// Decide and Explain answer as the calls they predict would be answered
// (Admit without a wait option, Execute): while a waiter waits for room at
// cuda:0, a decision or a plan that would add bytes there is refused for
// the waiters ahead, as the call itself would be, though the bytes fit in
// the free room. Before, both answered "feasible" and the call they
// predicted was then refused with a *WaitersAheadError.
func TestDecideAndExplainSeeTheRoomWaitersHold(t *testing.T) {
	ctx := context.Background()
	s := startGPU(t, 100)
	w := watchRoom(s)
	holder := mustAdmit(t, s, "holder", 60)
	out := make(chan admitted, 1)
	admitAsync(ctx, s, "big", 80, out)
	w.queued(t, "big")

	_, err := s.Decide(ctx, resv("small", 5))
	var wa *WaitersAheadError
	require.ErrorAs(t, err, &wa, "Decide answers as Admit without a wait option")
	assert.Equal(t, gpu, wa.Location)
	assert.Equal(t, 1, wa.Waiters)
	_, _, err = s.Admit(ctx, resv("small", 5))
	require.ErrorAs(t, err, &wa, "the call Decide predicted")

	plan := Plan{Reservations: []ReservationSpec{{Name: "small", Location: gpu, Bytes: 5}}}
	ex, err := s.Explain(ctx, plan)
	require.NoError(t, err)
	assert.False(t, ex.Feasible, "Explain answers as Execute")
	assert.Contains(t, ex.Reason, "wait for room at "+gpu)
	_, err = s.Execute(ctx, plan)
	require.ErrorIs(t, err, ErrBusy, "the call Explain predicted")
	require.ErrorAs(t, err, &wa)
	assert.Equal(t, "reservation 0 (small: 5 bytes at "+gpu+")", wa.Detail, "the step, without the refusal's words again")

	require.NoError(t, holder.Exit(ctx))
	a := recv(t, out)
	require.NoError(t, a.err)
	// Nobody waits: both answer from the budget alone again.
	_, err = s.Decide(ctx, resv("small", 5))
	require.NoError(t, err)
	ex, err = s.Explain(ctx, plan)
	require.NoError(t, err)
	assert.True(t, ex.Feasible, ex.Reason)
	require.NoError(t, a.sc.Exit(ctx))
}

// A waiting call held up by an earlier waiter is still checked before it
// queues (docs/semantics.md, "Order of checks", "Never fits"): invalid
// input, an unconfigured location and a request that can never fit are
// refused at once, also with the queue full; a request that would fit
// where nobody waits is admitted there at once. Its try takes no room
// the waiters ahead hold. Before, such a call was queued without a try:
// the three bad requests waited until their deadline (or, with the queue
// full, got a *QueueFullError), and the tiered one waited for cuda:0.
func TestHeldUpWaitingCallIsCheckedBeforeItQueues(t *testing.T) {
	ctx := context.Background()
	s := startGPU(t, 100, func(o *Options) {
		o.Locations = append(o.Locations, Limit("cuda:1", 100))
		o.MaxWaiters = 1
	})
	w := watchRoom(s)
	holder := mustAdmit(t, s, "holder", 60)
	out := make(chan admitted, 1)
	admitAsync(ctx, s, "big", 80, out)
	w.queued(t, "big")

	for _, tc := range []struct {
		req  Request
		want any
	}{
		{resv("huge", 101), new(*PlanError)},
		{Request{Name: "neg", Reservations: []ReservationSpec{{Name: "neg", Location: gpu, Bytes: -5}}}, new(*InvalidInputError)},
		{Request{Name: "absent", Reservations: []ReservationSpec{{Name: "a", Location: gpu, Bytes: 1}, {Name: "b", Location: "cuda:7", Bytes: 1}}}, new(*UnavailableError)},
	} {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _, err := s.Admit(wctx, tc.req, WaitForRoom())
		cancel()
		require.ErrorAs(t, err, tc.want, tc.req.Name)
	}
	w.queued(t, "big")

	v, err := s.Register(ctx, Value{Name: "v", Bytes: 10, Source: "pageable-host", Loader: zeros(10), Mode: Replicable})
	require.NoError(t, err)
	sc, d, err := s.Admit(ctx, Request{Name: "tiered", Requirements: []Requirement{{Handle: v, Tiers: [][]string{{gpu}, {"cuda:1"}}}}}, WaitForRoom())
	require.NoError(t, err, "admitted where nobody waits, without queueing")
	assert.Equal(t, "cuda:1", d.Plan.Enter[0].Location, "not in the room big waits for")
	require.NoError(t, sc.Exit(ctx))

	require.NoError(t, holder.Exit(ctx))
	a := recv(t, out)
	require.NoError(t, a.err)
	require.NoError(t, a.sc.Exit(ctx))
}

// A waiting call's try takes no room that a waiter ahead of it holds,
// even outside the locations it names: here a later waiter whose value
// is reconstructed into cuda:0 through a temporary at pageable-host,
// where an earlier waiter waits. It waits behind, and the earlier waiter
// is admitted when the holder leaves. Before, its try ran without that
// rule: it took 30 bytes at pageable-host for its temporary and the
// earlier waiter, refused, waited for its load.
func TestWaitingTryTakesNoHeldRoomForATemporary(t *testing.T) {
	ctx, s, w, v, holder := startTemporaryCase(t)
	first := admitWaiting(ctx, s, resvAt("w1", "pageable-host", 80))
	w.queued(t, "w1")

	later := reconstructed("w2", v)
	_, _, err := s.Admit(ctx, later)
	var wa *WaitersAheadError
	require.ErrorAs(t, err, &wa, "without waiting: refused for the held room of its temporary")
	second := admitWaiting(ctx, s, later)
	w.queued(t, "w1", "w2")
	snap, err := s.Snapshot(ctx)
	require.NoError(t, err)
	for _, l := range snap.Locations {
		if l.Location == "pageable-host" {
			assert.Equal(t, int64(60), l.UsedBytes+l.ReservedBytes+l.TemporaryBytes, "w2's try took no room at pageable-host")
		}
	}

	require.NoError(t, holder.Exit(ctx))
	a := recv(t, first)
	require.NoError(t, a.err, "w1 is admitted first")
	require.NoError(t, a.sc.Exit(ctx))
	b := recv(t, second)
	require.NoError(t, b.err)
	require.NoError(t, b.sc.Exit(ctx))
}

// WaitNotify tells a waiting Admit where its last try was short and by
// how much, from the controller's refusal (a *PlanError's Location and
// Shortfall): at a location's budget, and at a shared budget's figure
// (named by the member the request adds bytes at). Before, both were
// empty for an Admit: only a cache's refusals carried figures.
func TestWaitNotifyTellsAnAdmitsShortfall(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		opts  func(*Options)
		at    string
		short int64
	}{
		{"location budget", nil, gpu, 40},
		{"shared budget", func(o *Options) {
			o.Locations = []LocationConfig{NoLimit("pageable-host"), Limit(gpu, 200)}
			o.SharedBudgets = []SharedBudget{{Name: "igpu", Locations: []string{"pageable-host", gpu}, Bytes: 100}}
		}, gpu, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []func(*Options)
			if tc.opts != nil {
				opts = append(opts, tc.opts)
			}
			s := startGPU(t, 100, opts...)
			holder := mustAdmit(t, s, "holder", 60)
			states := make(chan WaitState, 4)
			out := make(chan admitted, 1)
			admitAsync(ctx, s, "big", 80, out, WaitNotify(func(st WaitState) { states <- st }))
			st := <-states
			assert.Equal(t, tc.at, st.Location)
			assert.Equal(t, tc.short, st.Shortfall)
			var pe *PlanError
			require.ErrorAs(t, st.Refusal, &pe)
			require.NoError(t, holder.Exit(ctx))
			a := recv(t, out)
			require.NoError(t, a.err)
			require.NoError(t, a.sc.Exit(ctx))
		})
	}
}

// A waiter refused only for room a waiter ahead of it held is tried again
// when that waiter leaves the queue, though no room was made: here the
// earlier waiter gives up (its context ends). Before, it was tried again
// only after the next release of room, and here none came.
func TestWaiterHeldUpByAnotherIsTriedWhenItLeaves(t *testing.T) {
	ctx, s, w, v, holder := startTemporaryCase(t)
	w1ctx, giveUp := context.WithCancel(ctx)
	first := admitWaiting(w1ctx, s, resvAt("w1", "pageable-host", 80))
	w.queued(t, "w1")
	second := admitWaiting(ctx, s, reconstructed("w2", v))
	w.queued(t, "w1", "w2")
	w.settled(t)

	giveUp()
	require.ErrorIs(t, recv(t, first).err, context.Canceled)
	b := recv(t, second)
	require.NoError(t, b.err, "w2's temporary fits the 40 free bytes at pageable-host once w1 is gone")
	require.NoError(t, b.sc.Exit(ctx))
	require.NoError(t, holder.Exit(ctx))
}

// startTemporaryCase starts a runtime whose pageable-host (100) holds a
// 60-byte reservation, "holder", and the source of v (30 bytes, not
// resident): reconstructing v into cuda:0 charges a 30-byte temporary at
// pageable-host. The context ends with the test (20 s at most).
func startTemporaryCase(t *testing.T) (context.Context, *System, *roomWatch, Handle, *Scope) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	s := startGPU(t, 100, func(o *Options) {
		o.Locations = []LocationConfig{Limit("pageable-host", 100), Limit(gpu, 100)}
	})
	v, err := s.Register(ctx, Value{Name: "v", Bytes: 30, Mode: Replicable, Source: "pageable-host", Loader: zeros(30)})
	require.NoError(t, err)
	holder, _, err := s.Admit(ctx, resvAt("holder", "pageable-host", 60))
	require.NoError(t, err)
	return ctx, s, watchRoom(s), v, holder
}

// reconstructed is a request for v at cuda:0.
func reconstructed(name string, v Handle) Request {
	return Request{Name: name, Requirements: []Requirement{{Handle: v, Tiers: [][]string{{gpu}}}}}
}

// admitWaiting runs a waiting Admit of req on its own goroutine; its
// result arrives on the channel returned.
func admitWaiting(ctx context.Context, s *System, req Request) <-chan admitted {
	out := make(chan admitted, 1)
	go func() {
		sc, _, err := s.Admit(ctx, req, WaitForRoom())
		out <- admitted{req.Name, sc, err}
	}()
	return out
}

// While an Admit's demotion copies its victim, other calls run and may
// take the room the plan's drops freed: the entry then fails in its
// reserve phase. A waiting Admit is tried again rather than given that
// failure (before, it returned the *PlanExecutionError, found by an
// outside stress test).
func TestWaitingAdmitIsTriedAgainWhenItsRoomIsTakenDuringADemotion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	locs := []LocationConfig{NoLimit("pageable-host"), Limit("cuda:1", 100)}
	s, err := Start(ctx, Options{Locations: locs, Spill: map[string]string{"cuda:1": "pageable-host"},
		Backend: testsys.Soft(t, locs, testsys.Bandwidth(100))}) // a 40-byte copy takes about 0.4 s
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	v1, err := s.Register(ctx, Value{Name: "v1", Bytes: 30, At: "cuda:1", Data: make([]byte, 30), Mode: Replicable})
	require.NoError(t, err)
	require.NoError(t, s.Copy(ctx, v1, "cuda:1", "pageable-host")) // v1 is dropped as a victim
	v2, err := s.Register(ctx, Value{Name: "v2", Bytes: 40, Source: "pageable-host", Loader: zeros(40), Mode: Replicable})
	require.NoError(t, err)
	require.NoError(t, s.Place(ctx, v2, "cuda:1")) // v2 is demoted as a victim: a copy to pageable-host
	out := admitWaiting(ctx, s, resvAt("a", "cuda:1", 100))
	// Once v1's drop committed, 60 bytes are free while v2's copy runs.
	require.Eventually(t, func() bool {
		sn, err := s.Snapshot(ctx)
		require.NoError(t, err)
		for _, l := range sn.Locations {
			if l.Location == "cuda:1" {
				return l.UsedBytes+l.ReservedBytes == 40
			}
		}
		return false
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, s.Reserve(ctx, "cuda:1", "b", 60), "takes the room a's drop freed")
	select {
	case a := <-out:
		t.Fatalf("a returned while b holds the room: %v", a.err)
	case <-time.After(time.Second): // a's demotion ended long ago: it waits again
	}
	require.NoError(t, s.Unreserve(ctx, "b"))
	a := recv(t, out)
	require.NoError(t, a.err)
	require.NoError(t, a.sc.Exit(ctx))
}
