// Package serving holds the scenarios a model-serving scheduler meets,
// written the way a serving application would write them on the public
// API: one loader cache per GPU holding model weights, requests that wait
// for room, keep-alive on a clock the test moves, busy models unloaded once
// their requests finish. The scenarios are those that Ollama's scheduler
// tests exercise, re-stated in our terms; no test sleeps or polls for a
// state: it waits on a channel that the state change closes, or on an event
// the runtime logs.
package serving

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/residency-go/residency/internal/testclock"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server is one runtime with two GPUs of gpuBytes each and a host, and the
// events it logs.
type server struct {
	sys    *system.System
	events *eventTap
}

func newServer(t *testing.T, gpuBytes int64, opts ...func(*system.Options)) *server {
	t.Helper()
	tap := newEventTap()
	logger := zerolog.New(tap)
	o := system.Options{
		Locations: []system.LocationConfig{
			system.NoLimit("pageable-host"),
			system.Limit("pinned-host", 4*gpuBytes),
			system.Limit("cuda:0", gpuBytes),
			system.Limit("cuda:1", gpuBytes),
		},
		Logger:          &logger,
		EventLevel:      zerolog.InfoLevel,
		EventsPerSecond: 1e6,
		EventBurst:      1e6,
	}
	for _, f := range opts {
		f(&o)
	}
	o.Backend = testsys.Soft(t, o.Locations)
	sys, err := system.Start(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	return &server{sys: sys, events: tap}
}

// gpuCache is the loader cache of model weights on loc.
func (s *server) gpuCache(t *testing.T, loc string, opts ...func(*cache.Options)) *cache.Cache {
	t.Helper()
	o := cache.Options{Location: loc, Name: "models"}
	for _, f := range opts {
		f(&o)
	}
	c, err := cache.New(context.Background(), s.sys, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// charged is what loc's budget carries now (used + reserved).
func (s *server) charged(t *testing.T, loc string) int64 {
	t.Helper()
	snap, err := s.sys.Snapshot(context.Background())
	require.NoError(t, err)
	for _, r := range snap.Locations {
		if r.Location == loc {
			return r.UsedBytes + r.ReservedBytes
		}
	}
	t.Fatalf("no location %s in the snapshot", loc)
	return 0
}

// model is a loaded model: its weights are bytes on a GPU as far as the
// runtime is concerned; unloaded closes it.
type model struct {
	name     string
	unloaded chan struct{}
	once     sync.Once
}

func (m *model) Close() error {
	m.once.Do(func() { close(m.unloaded) })
	return nil
}

// registry loads models by name and counts loads; every model it loaded
// stays reachable so a test can wait for its unload.
type registry struct {
	mu     sync.Mutex
	models map[string][]*model
	loads  atomic.Int32
	// gate, when set, is what a load waits for before it finishes.
	gate chan struct{}
	// before, when set, runs at the start of every load.
	before func(name string)
}

func newRegistry() *registry { return &registry{models: map[string][]*model{}} }

// loader loads name with size bytes of weights.
func (r *registry) loader(name string, size int64) func(context.Context) (*model, int64, error) {
	return func(ctx context.Context) (*model, int64, error) {
		if r.before != nil {
			r.before(name)
		}
		if r.gate != nil {
			select {
			case <-r.gate:
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
		}
		m := &model{name: name, unloaded: make(chan struct{})}
		r.mu.Lock()
		r.models[name] = append(r.models[name], m)
		r.mu.Unlock()
		r.loads.Add(1)
		return m, size, nil
	}
}

// last is the latest instance of name loaded.
func (r *registry) last(t *testing.T, name string) *model {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	ms := r.models[name]
	require.NotEmpty(t, ms, "model %s was never loaded", name)
	return ms[len(ms)-1]
}

// request loads (or reuses) name on c: a request's hold on its model.
func (r *registry) request(ctx context.Context, c *cache.Cache, name string, size int64, opts ...cache.LoadOption) (cache.Lease[*model], error) {
	return cache.Load(ctx, c, name, size, nil, r.loader(name, size), opts...)
}

// result is what a request started in the background got.
type result struct {
	lease cache.Lease[*model]
	err   error
}

// background runs f on its own goroutine and returns where its answer
// arrives.
func background(f func() (cache.Lease[*model], error)) <-chan result {
	out := make(chan result, 1)
	go func() {
		l, err := f()
		out <- result{l, err}
	}()
	return out
}

// pending fails the test if r has answered already.
func pending(t *testing.T, r <-chan result, what string) {
	t.Helper()
	select {
	case got := <-r:
		t.Fatalf("%s answered early: %v", what, got.err)
	default:
	}
}

// answer waits for r's answer (bounded by the test's deadline).
func answer(t *testing.T, r <-chan result) result {
	t.Helper()
	select {
	case got := <-r:
		return got
	case <-time.After(time.Minute):
		t.Fatal("no answer within a minute")
		return result{}
	}
}

// unloaded waits until m is unloaded.
func unloaded(t *testing.T, m *model) {
	t.Helper()
	select {
	case <-m.unloaded:
	case <-time.After(time.Minute):
		t.Fatalf("model %s was not unloaded within a minute", m.name)
	}
}

func isLoaded(m *model) bool {
	select {
	case <-m.unloaded:
		return false
	default:
		return true
	}
}

// ---- the runtime's events, as a test waits on them ----------------------------

// eventTap is the runtime's log: it keeps each structured event and lets a
// test wait for the n-th of a kind.
type eventTap struct {
	mu     sync.Mutex
	counts map[string]int
	lines  []map[string]any
	change chan struct{} // closed and replaced on every event
}

func newEventTap() *eventTap {
	return &eventTap{counts: map[string]int{}, change: make(chan struct{})}
}

func (e *eventTap) Write(p []byte) (int, error) {
	var m map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(p), &m); err != nil {
		return len(p), nil // not an event line
	}
	kind, _ := m["event"].(string)
	if kind == "" {
		return len(p), nil
	}
	e.mu.Lock()
	e.counts[kind]++
	e.lines = append(e.lines, m)
	close(e.change)
	e.change = make(chan struct{})
	e.mu.Unlock()
	return len(p), nil
}

// await waits until n events of kind have been logged.
func (e *eventTap) await(t *testing.T, kind string, n int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		e.mu.Lock()
		got, ch := e.counts[kind], e.change
		e.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%d %s events after a minute, want %d", got, kind, n)
		}
	}
}

// ---- a clock the test moves ------------------------------------------------------

// newClock is a cache.Clock that moves only when the test advances it.
func newClock() *testclock.Clock {
	return testclock.New(time.Date(2031, 3, 1, 12, 0, 0, 0, time.UTC))
}
