package actors

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// directStep runs body as a direct call would: holding the run right
// (taken by lock), after the messages queued before it.
func directStep(m *callerRunsMailbox, inv *recordingInvoker, body func()) {
	served := m.runBefore()
	inv.enter()
	if body != nil {
		body()
	}
	inv.leave()
	m.release(served + 1)
}

// assertRunRightAtRest checks that nobody holds or waits for the run right.
func assertRunRightAtRest(t *testing.T, m *callerRunsMailbox) {
	t.Helper()
	assert.False(t, m.running.Load(), "run right still held")
	assert.Zero(t, m.nwait.Load(), "waiters still counted")
	assert.Empty(t, m.waiters, "waiters still listed")
	assert.False(t, m.woken.Load(), "a woken waiter still pending")
	assert.False(t, m.starving.Load(), "starvation mode left on")
	assert.Zero(t, m.UserMessageCount())
}

// runRightStress drives one mailbox with callers direct callers making
// calls calls each (one in four with a deadline of 0–20 µs) and posters
// posting posts messages each (the first also posting a suspension and a
// resumption every 50 when suspend is set), once per starveAfter given
// (0: every woken waiter counts as starving, so releases hand the run
// right over). No two steps may overlap (the step's counter is not
// synchronized: the race detector checks exclusion too), every call
// either runs once or gives up, every message is processed, each
// poster's in order, and nobody is left waiting: a lost wake-up hangs
// the callers and fails the test.
func runRightStress(t *testing.T, callers, calls, posters, posts int, suspend bool, starves ...time.Duration) {
	for _, starve := range starves {
		t.Run("starveAfter="+starve.String(), func(t *testing.T) {
			defer func(d time.Duration) { starveAfter = d }(starveAfter)
			starveAfter = starve
			inv := &recordingInvoker{}
			m := newTestMailbox(inv)
			type msg struct{ poster, seq int }
			var steps int
			var gaveUp atomic.Int32
			var wg sync.WaitGroup
			for c := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(c), 1))
					for range calls {
						ctx, cancel := context.Background(), context.CancelFunc(func() {})
						if rng.IntN(4) == 0 {
							ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(20))*time.Microsecond)
						}
						if err := m.lock(ctx); err != nil {
							assert.ErrorIs(t, err, context.DeadlineExceeded)
							gaveUp.Add(1)
						} else {
							directStep(m, inv, func() { steps++ })
						}
						cancel()
					}
				}()
			}
			for p := range posters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range posts {
						m.PostUserMessage(msg{p, i})
						if suspend && p == 0 && i%50 == 0 {
							m.PostSystemMessage(&actor.SuspendMailbox{})
							m.PostSystemMessage(&actor.ResumeMailbox{})
						}
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(waitFor):
				t.Fatalf("callers still waiting after %s: a lost wake-up (nwait %d, running %v, woken %v, starving %v)",
					waitFor, m.nwait.Load(), m.running.Load(), m.woken.Load(), m.starving.Load())
			}
			require.False(t, inv.overlap, "two steps overlapped")
			assert.Equal(t, callers*calls, steps+int(gaveUp.Load()), "every call either ran once or gave up")
			require.Len(t, inv.user, posters*posts)
			next := make([]int, posters)
			for _, x := range inv.user {
				mm := x.(msg)
				require.Equal(t, next[mm.poster], mm.seq, "poster %d out of order", mm.poster)
				next[mm.poster]++
			}
			assertRunRightAtRest(t, m)
			t.Logf("%d steps, %d calls gave up waiting", steps, gaveUp.Load())
		})
	}
}

// Direct callers and message senders, many at once, some giving up on a
// short deadline (see runRightStress).
func TestRunRightDirectCallersAndMessages(t *testing.T) {
	runRightStress(t, 8, 3000, 2, 3000, false, time.Millisecond, 0)
}

// More callers than processors by far, with suspensions and resumptions
// among the messages (see runRightStress).
func TestRunRightStressWithSuspensions(t *testing.T) {
	runRightStress(t, 24, 600, 3, 1000, true, time.Millisecond, 0, 20*time.Microsecond)
}

// A direct caller that finds the run right taken waits for it on its
// context: it gives up at its deadline having run nothing, and the run
// right is taken at once by the next caller once given back.
func TestRunRightWaiterGivesUpOnItsContext(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	require.NoError(t, m.lock(context.Background()))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.lock(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), waitFor, "the wait ends at the deadline")
	assert.Zero(t, m.nwait.Load(), "the caller that gave up is no longer listed")

	got := make(chan error, 1)
	go func() { got <- m.lock(context.Background()) }()
	m.release(1)
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("the run right was given back but the waiting caller never got it")
	}
	m.release(1)
	assertRunRightAtRest(t, m)
}

// A starving waiter is handed the run right: it never goes back to being
// free in between, so no newly arrived caller can take it first; once
// nobody waits, starvation is over.
func TestRunRightIsHandedToAStarvingWaiter(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	require.NoError(t, m.lock(context.Background()))
	got, goOn := make(chan struct{}), make(chan struct{})
	go func() {
		if err := m.lock(context.Background()); err != nil {
			t.Error(err)
			return
		}
		close(got)
		<-goOn
		m.release(1)
	}()
	require.Eventually(t, func() bool { return m.nwait.Load() == 1 }, waitFor, time.Millisecond, "the second caller parks")
	m.starving.Store(true) // as a waiter that waited starveAfter would
	m.release(1)
	select {
	case <-got:
	case <-time.After(waitFor):
		t.Fatal("the starving waiter was not handed the run right")
	}
	assert.True(t, m.running.Load(), "handed over, never given back in between")
	assert.False(t, m.spinForRun(), "a newly arrived caller cannot take it while a waiter starves")
	close(goOn)
	require.Eventually(t, func() bool { return !m.running.Load() }, waitFor, time.Millisecond)
	assertRunRightAtRest(t, m)
}

// Messages posted while a direct caller holds the run right are run by
// that caller before it gives the run right back, in order, and a
// message queued before a direct call runs before the call's step.
func TestRunRightDirectCallRunsQueuedMessages(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	require.NoError(t, m.lock(context.Background()))
	m.PostUserMessage("queued before the step") // the run right is held: it queues
	var seenInStep []any
	directStep(m, inv, func() {
		seenInStep = append(seenInStep, inv.user...)
		m.PostUserMessage("posted during the step")
	})
	assert.Equal(t, []any{"queued before the step"}, seenInStep)
	assert.Equal(t, []any{"queued before the step", "posted during the step"}, inv.user)
	assertRunRightAtRest(t, m)
}

// A message of the burst queued before a direct call panics past the
// invoker (the rest of the burst goes back in the queue and protoactor's
// escalation posts a SuspendMailbox): the step then finds the mailbox
// suspended, with the rest still queued, rather than overtaking them (its
// caller would send its request as a message, behind them).
func TestRunRightStepWaitsBehindAnEscalation(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	inv.onFail = func() { m.PostSystemMessage(&actor.SuspendMailbox{}) } // as protoactor's EscalateFailure does
	inv.onUser = func(msg any) {
		if msg == 2 {
			panic("injected")
		}
	}
	require.NoError(t, m.lock(context.Background()))
	for i := 1; i <= 3; i++ {
		m.PostUserMessage(i) // queued: the run right is held
	}
	var suspended bool
	var pendingSystem int32
	directStep(m, inv, func() { suspended, pendingSystem = m.suspended.Load(), m.systemN.Load() })
	assert.True(t, suspended, "the step sees the suspension")
	assert.Zero(t, pendingSystem, "no suspension left pending behind the step")
	assert.Equal(t, []any{1, 2}, inv.user, "3 is still queued")
	m.PostSystemMessage(&actor.ResumeMailbox{})
	assert.Equal(t, []any{1, 2, 3}, inv.user, "resumed in order")
	assertRunRightAtRest(t, m)
}

// A direct caller parked for the run right goes next once the holder is
// done with its burst: later messages, here a chain in which each message
// posts the next, wait behind its step instead of keeping it waiting.
func TestRunRightParkedCallerGoesBeforeLaterMessages(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	const chain = 200
	inv.onUser = func(msg any) {
		if n := msg.(int); n+1 < chain {
			m.PostUserMessage(n + 1)
		}
	}
	require.NoError(t, m.lock(context.Background()))
	seen := make(chan []any, 1)
	go func() {
		if err := m.lock(context.Background()); err != nil {
			t.Error(err)
			return
		}
		directStep(m, inv, func() { seen <- inv.userSnapshot() })
	}()
	require.Eventually(t, func() bool { return m.nwait.Load() == 1 }, waitFor, time.Millisecond, "the caller parks")
	m.PostUserMessage(0) // queued before the caller's turn
	m.release(1)
	select {
	case got := <-seen:
		assert.Equal(t, []any{0}, got, "only the message queued before the caller's turn runs ahead of its step")
	case <-time.After(waitFor):
		t.Fatal("the parked caller never got the run right")
	}
	require.Eventually(t, func() bool { return len(inv.userSnapshot()) == chain }, waitFor, time.Millisecond, "the chain runs after the step")
	assertRunRightAtRest(t, m)
}
