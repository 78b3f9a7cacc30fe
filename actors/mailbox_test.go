package actors

import (
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordingInvoker records what the mailbox invokes. It checks that no two
// invocations overlap (the mailbox serializes them) and lets a test act
// from inside an invocation.
type recordingInvoker struct {
	mu       sync.Mutex
	inside   bool
	overlap  bool
	user     []any
	system   []any
	failures []any
	onUser   func(msg any)
	onFail   func()
}

func (r *recordingInvoker) enter() {
	r.mu.Lock()
	if r.inside {
		r.overlap = true
	}
	r.inside = true
	r.mu.Unlock()
}

func (r *recordingInvoker) leave() {
	r.mu.Lock()
	r.inside = false
	r.mu.Unlock()
}

func (r *recordingInvoker) InvokeSystemMessage(msg any) {
	r.enter()
	defer r.leave()
	r.system = append(r.system, msg)
}

func (r *recordingInvoker) InvokeUserMessage(msg any) {
	r.enter()
	defer r.leave()
	r.mu.Lock()
	r.user = append(r.user, msg)
	r.mu.Unlock()
	if r.onUser != nil {
		r.onUser(msg)
	}
}

// userSnapshot copies the user messages invoked so far (safe while the
// mailbox runs on other goroutines).
func (r *recordingInvoker) userSnapshot() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]any(nil), r.user...)
}

func (r *recordingInvoker) EscalateFailure(reason any, msg any) {
	r.failures = append(r.failures, msg)
	if r.onFail != nil {
		r.onFail()
	}
}

func newTestMailbox(inv *recordingInvoker) *callerRunsMailbox {
	m := callerRunsMailboxProducer().(*callerRunsMailbox)
	m.RegisterHandlers(inv, actor.NewSynchronizedDispatcher(throughput))
	return m
}

// A message posted to an idle mailbox is processed before the post
// returns, on the poster's goroutine; one posted while it runs (here from
// inside an invocation) is processed in the same run, after the messages
// queued before it.
func TestCallerRunsMailboxRunsOnThePoster(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	inv.onUser = func(msg any) {
		if msg == 1 {
			m.PostUserMessage(2)
			m.PostUserMessage(3)
			assert.Equal(t, []any{1}, inv.user, "a post while running only queues")
		}
	}
	m.PostUserMessage(1)
	assert.Equal(t, []any{1, 2, 3}, inv.user)
	assert.Zero(t, m.UserMessageCount())
}

// System messages go first; a suspended mailbox processes only system
// messages and keeps its user messages, in order, until it is resumed.
func TestCallerRunsMailboxSuspendAndSystemFirst(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	inv.onUser = func(msg any) {
		if msg == "a" {
			m.PostUserMessage("b")
			m.PostSystemMessage(&actor.SuspendMailbox{})
			m.PostUserMessage("c")
		}
	}
	m.PostUserMessage("a")
	assert.Equal(t, []any{"a"}, inv.user, "suspended before b")
	m.PostSystemMessage("sys")
	assert.Equal(t, []any{"sys"}, inv.system, "system messages run while suspended")
	m.PostUserMessage("d")
	assert.Equal(t, []any{"a"}, inv.user)
	assert.Equal(t, 3, m.UserMessageCount())
	m.PostSystemMessage(&actor.ResumeMailbox{})
	assert.Equal(t, []any{"a", "b", "c", "d"}, inv.user, "resumed: the queued messages in order")
	assert.Zero(t, m.UserMessageCount())
}

// A panic escalates with the message that panicked (protoactor's
// escalation suspends the mailbox, as the invoker here does); the rest of
// its burst stays queued, in order, and runs once the mailbox resumes.
func TestCallerRunsMailboxPanicKeepsTheRest(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	inv.onFail = func() { m.PostSystemMessage(&actor.SuspendMailbox{}) }
	inv.onUser = func(msg any) {
		if msg == 1 {
			m.PostUserMessage(2)
			m.PostUserMessage(3)
			m.PostUserMessage(4)
		}
		if msg == 2 {
			panic("boom")
		}
	}
	m.PostUserMessage(1)
	require.Equal(t, []any{2}, inv.failures)
	assert.Equal(t, []any{1, 2}, inv.user)
	m.PostUserMessage(5)
	assert.Equal(t, []any{1, 2}, inv.user, "suspended")
	m.PostSystemMessage(&actor.ResumeMailbox{})
	assert.Equal(t, []any{1, 2, 3, 4, 5}, inv.user)
	assert.Zero(t, m.UserMessageCount())
}

// Many concurrent posters: every message is processed exactly once, one
// at a time, and each poster's messages in the order it posted them.
func TestCallerRunsMailboxConcurrentPosters(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	const posters, each = 8, 2000
	type msg struct{ poster, seq int }
	var wg sync.WaitGroup
	for p := range posters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				m.PostUserMessage(msg{p, i})
				if i%100 == 0 {
					m.PostSystemMessage(i)
				}
			}
		}()
	}
	wg.Wait()
	require.False(t, inv.overlap, "two invocations overlapped")
	require.Len(t, inv.user, posters*each)
	next := make([]int, posters)
	for _, x := range inv.user {
		mm := x.(msg)
		require.Equal(t, next[mm.poster], mm.seq, "poster %d out of order", mm.poster)
		next[mm.poster]++
	}
	assert.Len(t, inv.system, posters*each/100)
	assert.Zero(t, m.UserMessageCount())
}

// wakeRecorder is a ReplySink whose Wake records whether the
// mailbox was still running.
type wakeRecorder struct {
	m              *callerRunsMailbox
	woken          int
	wokenInRunning bool
}

func (w *wakeRecorder) Deliver(any) bool { return true }

func (w *wakeRecorder) Wake() {
	w.woken++
	if w.m.running.Load() {
		w.wokenInRunning = true
	}
}

// A caller answered while parked is woken once, after the burst that
// answered it, with the mailbox already free for the next sender; the
// wake list is reused.
func TestCallerRunsMailboxWakesAfterTheBurst(t *testing.T) {
	inv := &recordingInvoker{}
	m := newTestMailbox(inv)
	ws := []*wakeRecorder{{m: m}, {m: m}, {m: m}}
	inv.onUser = func(msg any) {
		w := msg.(*wakeRecorder)
		if w.Deliver(nil) {
			m.deferWake(w)
		}
		for _, o := range ws {
			assert.Zero(t, o.woken, "no caller is woken inside the burst")
		}
		if w == ws[0] {
			// Queued behind the first: the same burst answers them.
			m.PostUserMessage(ws[1])
			m.PostUserMessage(ws[2])
		}
	}
	m.PostUserMessage(ws[0])
	for i, w := range ws {
		assert.Equal(t, 1, w.woken, "caller %d", i)
		assert.False(t, w.wokenInRunning, "caller %d woken while the mailbox was still running", i)
	}
	assert.Len(t, inv.user, 3)
	assert.Empty(t, m.wakes)
	assert.NotNil(t, m.spare, "the emptied wake list is kept for the next burst")
	w := &wakeRecorder{m: m}
	inv.onUser = func(any) { m.deferWake(w) }
	inv.user = inv.user[:0:0]
	m.PostUserMessage(w) // warm-up: the runner's list and the spare both exist now
	allocs := testing.AllocsPerRun(100, func() {
		inv.user = inv.user[:0]
		m.PostUserMessage(w)
	})
	assert.Zero(t, allocs, "the two wake lists are reused, burst after burst")
	assert.Equal(t, 102, w.woken)
}
