package actors

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// How the runtime stops when something it started does not end.
//
// Every operation that runs user or backend code on a goroutine of the
// runtime is tracked while it runs (opTracker): a value actor's transfer
// (a load through the value's loader, a copy, an initialization, a
// demotion's copy) and an owner's DropCharge or DemoteCharge. A shutdown
// first cancels their context (the Shutdown message cancels Engine.ops)
// and waits for them to settle. When the caller stops waiting, it sends
// [ForceShutdown]: the supervisor fails in the ledger every transfer and
// charge drop still pending with [ErrAbandoned], so every caller is
// answered and the ledger shuts down to zero, and marks the tracker
// abandoned. From then on a buffer that a running operation holds is
// quarantined: no location actor and no Stop frees it, because the
// operation may still write into it; the operation frees it itself when it
// returns. [Engine.StillRunning] lists what is still running and what
// it holds.

// ErrAbandoned is the cause of a transfer or charge drop that was still
// running when the runtime stopped waiting for it at Close.
var ErrAbandoned = errors.New("abandoned at close: still running when the runtime stopped waiting for it")

// RunningOp is an operation the runtime started that had not returned
// when Close stopped waiting for it.
type RunningOp struct {
	// Kind names the operation: "load", "copy", "initialize",
	// "demotion copy", "drop cache entry" or "demote cache entry".
	Kind string
	// Value is the value's name, or the charge of a cache entry.
	Value string
	// Location is where it writes (the destination).
	Location string
	// HeldBytes are the bytes of the buffers it holds, by location: still
	// allocated, freed when it returns (quarantined: it may still write
	// into them).
	HeldBytes map[string]int64
}

func (o RunningOp) String() string {
	s := fmt.Sprintf("%s of %s at %s", o.Kind, o.Value, o.Location)
	if len(o.HeldBytes) > 0 {
		s += " holding " + BytesByLocation(o.HeldBytes)
	}
	return s
}

// BytesByLocation formats a map of bytes by location, sorted by location:
// "1024 B at cuda:0, 6144 B at pinned-host".
func BytesByLocation(m map[string]int64) string {
	locs := make([]string, 0, len(m))
	for l := range m {
		locs = append(locs, l)
	}
	sort.Strings(locs)
	parts := make([]string, len(locs))
	for i, l := range locs {
		parts[i] = fmt.Sprintf("%d B at %s", m[l], l)
	}
	return strings.Join(parts, ", ")
}

// opTracker tracks the operations running on the runtime's goroutines.
type opTracker struct {
	mu        sync.Mutex
	seq       uint64
	ops       map[uint64]*trackedOp
	abandoned bool
	flag      atomic.Bool // abandoned, read without mu
	freeing   int         // ended operations still freeing their buffers
	// onIdle runs once, when the tracker is abandoned and its last
	// operation has ended (or at once if none runs).
	onIdle func()
}

type trackedOp struct {
	RunningOp
	keys   []messages.BufferKey // the buffers it may write or read
	pooled bool                 // on a value actor's goroutine (else a watcher)
}

// begin records an operation; end(id) must follow.
func (t *opTracker) begin(op RunningOp, pooled bool, keys ...messages.BufferKey) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ops == nil {
		t.ops = map[uint64]*trackedOp{}
	}
	t.seq++
	t.ops[t.seq] = &trackedOp{RunningOp: op, keys: keys, pooled: pooled}
	return t.seq
}

// end removes operation id. When the tracker was abandoned meanwhile it
// returns the keys of the buffers the operation held and true: the caller
// frees them, then calls freed.
func (t *opTracker) end(id uint64) (keys []messages.BufferKey, abandoned bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	op := t.ops[id]
	delete(t.ops, id)
	if !t.abandoned || op == nil {
		return nil, false
	}
	t.freeing++
	return op.keys, true
}

// freed counts the buffers of an ended operation freed, and returns the
// idle callback when it was the last operation.
func (t *opTracker) freed() (idle func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.freeing--; len(t.ops) == 0 && t.freeing == 0 {
		idle, t.onIdle = t.onIdle, nil
	}
	return idle
}

// abandon marks the tracker abandoned: buffers held by running operations
// are quarantined from now on.
func (t *opTracker) abandon() {
	t.mu.Lock()
	t.abandoned = true
	t.flag.Store(true)
	t.mu.Unlock()
}

// isAbandoned says whether ForceShutdown abandoned what was running.
func (t *opTracker) isAbandoned() bool { return t.flag.Load() }

// holds says whether key is quarantined: the tracker is abandoned and a
// running operation holds it.
func (t *opTracker) holds(key messages.BufferKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.abandoned {
		return false
	}
	for _, op := range t.ops {
		for _, k := range op.keys {
			if k == key {
				return true
			}
		}
	}
	return false
}

// stuck counts the abandoned operations still running on value actors'
// goroutines (pooled) or on watchers' (0 while not abandoned).
func (t *opTracker) stuck(pooled bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.abandoned {
		return 0
	}
	n := 0
	for _, op := range t.ops {
		if op.pooled == pooled {
			n++
		}
	}
	return n
}

// whenIdle arranges for fn to run once the last abandoned operation has
// ended: at once (true returned, fn not run) when none is running.
func (t *opTracker) whenIdle(fn func()) (idleNow bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ops) == 0 && t.freeing == 0 {
		return true
	}
	t.onIdle = fn
	return false
}

// endOp ends the tracked operation id; after an abandonment it frees the
// buffers the operation held (nothing else frees them) and runs the
// tracker's idle callback if it was the last.
func (e *Engine) endOp(id uint64) {
	keys, abandoned := e.ops.end(id)
	if !abandoned {
		return
	}
	for _, k := range keys {
		if buf, ok := e.Buffers.take(k); ok {
			if err := e.backend.Free(buf); err != nil {
				e.log.Warn().Err(err).Str("location", k.Location).Msg("freeing the buffer of an operation abandoned at close failed")
			}
		}
	}
	if idle := e.ops.freed(); idle != nil {
		idle()
	}
}

// StillRunning lists the operations still running after the runtime
// stopped waiting for them, each with the bytes of the buffers it holds.
// Empty after an orderly shutdown.
func (e *Engine) StillRunning() []RunningOp {
	e.ops.mu.Lock()
	defer e.ops.mu.Unlock()
	out := make([]RunningOp, 0, len(e.ops.ops))
	ids := make([]uint64, 0, len(e.ops.ops))
	for id := range e.ops.ops {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		op := e.ops.ops[id]
		r := op.RunningOp
		r.HeldBytes = nil
		for _, k := range op.keys {
			if buf, ok := e.Buffers.Get(k); ok {
				if r.HeldBytes == nil {
					r.HeldBytes = map[string]int64{}
				}
				r.HeldBytes[k.Location] += buf.Size()
			}
		}
		out = append(out, r)
	}
	return out
}

// WhenIdle runs fn once every operation listed by StillRunning has
// returned (and freed what it held): on the goroutine of the last one,
// or at once, on this one, when none is running.
func (e *Engine) WhenIdle(fn func()) {
	if e.ops.whenIdle(fn) {
		fn()
	}
}

// ForceShutdown asks the supervisor to stop waiting for what is in
// flight: every pending transfer and charge drop fails with
// [ErrAbandoned] (callers answered, charges released), the running
// operations' buffers are quarantined, and the shutdown completes (the
// [messages.ShutdownReply] goes to ReplyTo). Send it after Shutdown, when
// the caller's wait for the ShutdownReply ended.
type ForceShutdown struct{ ReplyTo *actor.PID }

// Replier returns the address of the reply.
func (m *ForceShutdown) Replier() *actor.PID { return m.ReplyTo }

// beginShutdown handles Shutdown: operations in flight are told (their
// context is canceled) and the shutdown completes once they settled.
func (s *supervisor) beginShutdown(m *messages.Shutdown) {
	s.shutting = true
	s.closing = m.ReplyTo
	s.eng.cancelOps()
	s.maybeFinishShutdown()
}

// forceShutdown handles ForceShutdown.
func (s *supervisor) forceShutdown(m *ForceShutdown) {
	s.shutting = true
	s.closing = m.ReplyTo // the first requester stopped waiting
	s.abandoning = true
	s.eng.cancelOps()
	s.eng.ops.abandon()
	// A failed step may let its run go on (a failed demotion drops the
	// value instead) and admit the next one: fail until none is pending.
	for len(s.pending) > 0 {
		ids := make([]budget.AdmissionID, 0, len(s.pending))
		for id := range s.pending {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for _, id := range ids {
			op, ok := s.pending[id]
			if !ok {
				continue // settled by an earlier one's failure
			}
			if op.effect.Kind == budget.EffectDropCharge {
				s.chargeDropped(&messages.ChargeDropped{Admission: id, Err: ErrAbandoned})
				continue
			}
			s.transferDone(id, ErrAbandoned)
		}
	}
	s.maybeFinishShutdown()
}

// awaitFuture waits for f's result until ctx ends.
func (e *Engine) awaitFuture(ctx context.Context, f *actor.Future) error {
	box := &signalBox{ch: make(chan struct{})}
	reg := e.System.ProcessRegistry
	pid, _ := reg.Add(box, "close-wait$"+reg.NextId())
	defer reg.Remove(pid)
	f.PipeTo(pid)
	select {
	case <-box.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// signalBox is a process that closes ch on its first message.
type signalBox struct {
	once sync.Once
	ch   chan struct{}
}

func (b *signalBox) SendUserMessage(*actor.PID, any)   { b.once.Do(func() { close(b.ch) }) }
func (b *signalBox) SendSystemMessage(*actor.PID, any) {}
func (b *signalBox) Stop(*actor.PID)                   {}

// goCount counts goroutines of the runtime that may run user or backend
// code; wait waits for them until only stuck ones remain.
type goCount struct {
	mu   sync.Mutex
	n    int
	wake chan struct{} // closed and replaced at every done
}

func (g *goCount) add() {
	g.mu.Lock()
	g.n++
	g.mu.Unlock()
}

func (g *goCount) done() {
	g.mu.Lock()
	g.n--
	if g.wake != nil {
		close(g.wake)
		g.wake = nil
	}
	g.mu.Unlock()
}

// wait returns once at most stuck() goroutines are left, or when ctx
// ends (its error).
func (g *goCount) wait(ctx context.Context, stuck func() int) error {
	for {
		g.mu.Lock()
		if g.n <= stuck() {
			g.mu.Unlock()
			return nil
		}
		if g.wake == nil {
			g.wake = make(chan struct{})
		}
		w := g.wake
		g.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
