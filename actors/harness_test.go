package actors

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/testhooks"
	"github.com/residency-go/residency/messages"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Locations of the test engines: an unlimited host, two limited devices.
const (
	locHost = "pageable-host"
	locGPU0 = "cuda:0"
	locGPU1 = "cuda:1"

	gpuBudget = 1 << 20
)

// waitFor bounds every wait on a reply; a reply that does not come within
// it is a hang, reported as a failure.
const waitFor = 10 * time.Second

// ---- reply addresses ---------------------------------------------------------

// replyBox is a reply address: a protoactor Process registered in the
// engine's registry that keeps every message it receives, in order. The
// supervisor sends its replies synchronously (root.Send to a local Process
// calls SendUserMessage on the sender's goroutine), so the order in ch is
// the order in which the supervisor answered.
type replyBox struct {
	pid *actor.PID
	ch  chan any
}

func (b *replyBox) SendUserMessage(_ *actor.PID, m any) {
	select {
	case b.ch <- actor.UnwrapEnvelopeMessage(m):
	default:
		panic("replyBox: more replies than the test can hold")
	}
}
func (b *replyBox) SendSystemMessage(*actor.PID, any) {}
func (b *replyBox) Stop(*actor.PID)                   {}

// next waits for the box's next message.
func (b *replyBox) next(t *testing.T) any {
	t.Helper()
	select {
	case m := <-b.ch:
		return m
	case <-time.After(waitFor):
		t.Fatalf("no reply within %s", waitFor)
		return nil
	}
}

// ---- the harness -------------------------------------------------------------

type harness struct {
	t   *testing.T
	eng *Engine
	be  *faulty.Backend
}

type option func(*Config)

func withHooks(h Hooks) option                { return func(c *Config) { c.Knobs = h } }
func withAllocTimeout(d time.Duration) option { return func(c *Config) { c.AllocTimeout = d } }

// withBackend wraps the soft backend.
func withBackend(wrap func(cuda.Backend) cuda.Backend) option {
	return func(c *Config) { c.Backend = wrap(c.Backend) }
}

func ledgerConfig() budget.Config {
	return budget.Config{
		ManagerID: "actors-test",
		Locations: []budget.LocationConfig{
			{Name: locHost},
			{Name: locGPU0, HasBudget: true, BudgetBytes: gpuBudget},
			{Name: locGPU1, HasBudget: true, BudgetBytes: gpuBudget},
		},
		TraceCapacity: 256,
	}
}

// Hooks are the actors' test knobs (package internal/testhooks).
type Hooks = testhooks.Knobs

// newSoft returns the soft backend behind the fault-injecting decorator.
func newSoft(t *testing.T) *faulty.Backend {
	t.Helper()
	be, err := soft.New(soft.Config{Locations: []string{locHost, locGPU0, locGPU1}})
	require.NoError(t, err)
	return faulty.Wrap(be, soft.ErrorPrefix)
}

// start starts an engine over a fresh soft backend. Cleanup stops the
// engine (idempotent: a test may stop it itself) and closes the backend.
func startEngine(t *testing.T, opts ...option) *harness {
	t.Helper()
	be := newSoft(t)
	t.Cleanup(func() { _ = be.Close() })
	cfg := Config{Ledger: ledgerConfig(), Backend: be, Logger: zerolog.Nop()}
	for _, o := range opts {
		o(&cfg)
	}
	eng, err := Start(cfg)
	require.NoError(t, err)
	// No message may be lost on the way: a dead letter is a message sent
	// to an actor that is gone (for instance a second Stop to a value
	// actor already stopped).
	var deadMu sync.Mutex
	var dead []string
	eng.System.EventStream.Subscribe(func(e any) {
		if d, ok := e.(*actor.DeadLetterEvent); ok {
			deadMu.Lock()
			dead = append(dead, fmt.Sprintf("%T to %s", d.Message, d.PID))
			deadMu.Unlock()
		}
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		_ = eng.Stop(ctx)
		deadMu.Lock()
		defer deadMu.Unlock()
		assert.Empty(t, dead, "dead letters")
	})
	return &harness{t: t, eng: eng, be: be}
}

// box registers a new reply address (removed at cleanup).
func (h *harness) box() *replyBox {
	b := &replyBox{ch: make(chan any, 64)}
	reg := h.eng.System.ProcessRegistry
	pid, ok := reg.Add(b, "test-reply$"+reg.NextId())
	require.True(h.t, ok)
	b.pid = pid
	h.t.Cleanup(func() { reg.Remove(pid) })
	return b
}

// send sends a request to the supervisor without waiting.
func (h *harness) send(msg any) { h.eng.Root().Send(h.eng.Supervisor, msg) }

// ask sends the request that build makes for a fresh reply address, waits
// for its reply, and checks that it is the only one: a barrier request
// (StateVersion) sent afterwards to the same address must be answered next,
// with nothing behind it. It returns the reply and the state version the
// barrier reported (0 after a fatal stop).
func (h *harness) ask(build func(replyTo *actor.PID) any) (any, uint64) {
	h.t.Helper()
	b := h.box()
	h.send(build(b.pid))
	rep := b.next(h.t)
	h.send(&messages.StateVersion{ReplyTo: b.pid})
	var version uint64
	switch bar := b.next(h.t).(type) {
	case *messages.Reply:
		version = bar.Version
	case *messages.FatalReply:
	default:
		h.t.Fatalf("a second reply %T (%+v) came for one request", bar, bar)
	}
	require.Len(h.t, b.ch, 0, "a request was answered more than once")
	return rep, version
}

func (h *harness) version() uint64 {
	h.t.Helper()
	_, v := h.ask(func(to *actor.PID) any { return &messages.StateVersion{ReplyTo: to} })
	return v
}

func (h *harness) register(spec budget.ValueSpec, data []byte, loaderKey uint64) *messages.HandleReply {
	h.t.Helper()
	rep, _ := h.ask(func(to *actor.PID) any {
		return &messages.Register{Spec: spec, Data: data, LoaderKey: loaderKey, ReplyTo: to}
	})
	hr, ok := rep.(*messages.HandleReply)
	require.True(h.t, ok, "Register answered %T", rep)
	return hr
}

// mustRegister registers a value and fails the test on error.
func (h *harness) mustRegister(spec budget.ValueSpec, data []byte) budget.Handle {
	h.t.Helper()
	rep := h.register(spec, data, 0)
	require.NoError(h.t, rep.Err)
	return rep.Handle
}

func (h *harness) transition(kind messages.TransitionKind, hd budget.Handle, from, to string) *messages.RunReply {
	h.t.Helper()
	rep, _ := h.ask(func(r *actor.PID) any {
		return &messages.Transition{Kind: kind, Handle: hd, From: from, To: to, ReplyTo: r}
	})
	rr, ok := rep.(*messages.RunReply)
	require.True(h.t, ok, "Transition answered %T", rep)
	return rr
}

func (h *harness) snapshot() budget.Snapshot {
	h.t.Helper()
	rep, _ := h.ask(func(to *actor.PID) any { return &messages.Snapshot{ReplyTo: to} })
	sr, ok := rep.(*messages.SnapshotReply)
	require.True(h.t, ok, "Snapshot answered %T", rep)
	return sr.Frozen.Snapshot()
}

func (h *harness) acquire(hd budget.Handle, loc string) budget.LeaseID {
	h.t.Helper()
	rep, _ := h.ask(func(to *actor.PID) any { return &messages.Acquire{Handle: hd, Location: loc, ReplyTo: to} })
	lr, ok := rep.(*messages.LeaseReply)
	require.True(h.t, ok, "Acquire answered %T", rep)
	require.NoError(h.t, lr.Err)
	return lr.Lease
}

// drain waits until the location actor of loc has processed every message
// sent to it before (the frees a reply implies, in particular).
func (h *harness) drain(locs ...string) {
	h.t.Helper()
	for _, loc := range locs {
		_, err := h.eng.Root().RequestFuture(h.eng.locations[loc], &messages.Drain{}, waitFor).Result()
		require.NoError(h.t, err)
	}
}

// allocate asks the location actor of key.Location for a buffer directly.
func (h *harness) allocate(key messages.BufferKey, bytes int64) error {
	h.t.Helper()
	res, err := h.eng.Root().RequestFuture(h.eng.locations[key.Location], &messages.Allocate{Key: key, Bytes: bytes}, waitFor).Result()
	require.NoError(h.t, err)
	a, ok := res.(*messages.Allocated)
	require.True(h.t, ok, "Allocate answered %T", res)
	require.Equal(h.t, key, a.Key)
	return a.Err
}

// used is the backend's used bytes at loc.
func (h *harness) used(loc string) int64 {
	h.t.Helper()
	mi, err := h.be.MemInfo(loc)
	require.NoError(h.t, err)
	return mi.UsedBytes
}

// read returns the bytes of the buffer of (value, loc).
func (h *harness) read(hd budget.Handle, loc string) []byte {
	h.t.Helper()
	buf, ok := h.eng.Buffers.Get(messages.BufferKey{Value: hd.ID, Location: loc})
	require.True(h.t, ok, "no buffer for %s at %s", hd.Name, loc)
	got, err := h.be.Read(context.Background(), buf)
	require.NoError(h.t, err)
	return got
}

// shutdown asks the supervisor to shut down and returns its reply.
func (h *harness) shutdown() *messages.ShutdownReply {
	h.t.Helper()
	b := h.box()
	h.send(&messages.Shutdown{ReplyTo: b.pid})
	rep, ok := b.next(h.t).(*messages.ShutdownReply)
	require.True(h.t, ok)
	return rep
}

// stop stops the engine and checks that no device memory is left.
func (h *harness) stop() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	require.NoError(h.t, h.eng.Stop(ctx))
	require.Equal(h.t, 0, h.eng.Buffers.Len(), "buffers left in the table after Stop")
	for _, loc := range []string{locHost, locGPU0, locGPU1} {
		require.Zero(h.t, h.used(loc), "device bytes left at %s after Stop", loc)
	}
}

// ---- helpers for values, loaders and events ----------------------------------

// pattern returns n deterministic bytes derived from seed.
func testPattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*31+i/251)
	}
	return b
}

// patternLoader fills dst with testPattern(seed) and counts its calls.
func patternLoader(seed byte, calls *atomic.Int32) cuda.Loader {
	return func(_ context.Context, dst []byte) error {
		if calls != nil {
			calls.Add(1)
		}
		copy(dst, testPattern(seed, len(dst)))
		return nil
	}
}

// gatedLoader signals started when it runs, then waits for release (or
// its context) before filling dst with testPattern(seed).
func gatedLoader(seed byte, started chan<- struct{}, release <-chan struct{}) cuda.Loader {
	return func(ctx context.Context, dst []byte) error {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		copy(dst, testPattern(seed, len(dst)))
		return nil
	}
}

// stubbornLoader is gatedLoader for a load that ignores its context: it
// returns only once release is closed.
func stubbornLoader(seed byte, started chan<- struct{}, release <-chan struct{}) cuda.Loader {
	return func(_ context.Context, dst []byte) error {
		started <- struct{}{}
		<-release
		copy(dst, testPattern(seed, len(dst)))
		return nil
	}
}

// testEvent is a consumer event the test completes.
type testEvent struct {
	done chan struct{}
	once sync.Once
}

func newTestEvent() *testEvent { return &testEvent{done: make(chan struct{})} }

func (e *testEvent) complete()             { e.once.Do(func() { close(e.done) }) }
func (e *testEvent) Done() <-chan struct{} { return e.done }
func (e *testEvent) Err() error            { return nil }
func (e *testEvent) Query() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}
func (e *testEvent) Wait(ctx context.Context) error {
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var _ cuda.Event = (*testEvent)(nil)

// testKeys hands out unique hand-over testKeys (loaders, events).
var testKeys atomic.Uint64

func nextTestKey() uint64 { return testKeys.Add(1) }

// locRecord returns the ledger's record of loc.
func (h *harness) locRecord(loc string) budget.LocationRecord {
	h.t.Helper()
	snap := h.snapshot()
	r, ok := snap.Location(loc)
	require.True(h.t, ok)
	return r
}
