package system

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
)

// setRoomClock makes the room's clock read *now (read under the room's
// lock: change it with the lock held).
func setRoomClock(s *System, now *time.Time) {
	s.room.mu.Lock()
	defer s.room.mu.Unlock()
	s.room.now = func() time.Time { return *now }
}

// Waiters lists the queue in its order (higher classes first, then
// arrival), each waiter as queued, with its time, its turns and whether
// it is held up; it changes nothing, and a copy's slices are its own.
func TestWaitersSnapshotInQueueOrder(t *testing.T) {
	ctx := context.Background()
	s := startGPU(t, 100)
	w := watchRoom(s)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0
	setRoomClock(s, &now)
	holder := mustAdmit(t, s, "holder", 100)
	c := cacheFor(t, s)
	assert.Empty(t, s.Waiters())

	out := make(chan admitted, 3)
	admitAsync(ctx, s, "a", 10, out)
	w.queued(t, "a")
	w.r.mu.Lock()
	now = t0.Add(time.Second)
	w.r.mu.Unlock()
	admitAsync(ctx, s, "b", 20, out, WaitClass(3))
	w.queued(t, "b", "a")
	admitAsync(ctx, s, "c", 30, out, WaitAllowBypass())
	w.queued(t, "b", "a", "c")
	loadErr := make(chan error, 1)
	go func() {
		_, err := c.Load(ctx, "k", 10, WaitForRoom())
		loadErr <- err
	}()
	w.queued(t, "b", "a", "c", "k")
	w.settled(t)

	got := s.Waiters()
	require.Len(t, got, 4)
	w.r.mu.Lock()
	specs := w.r.q.Waiting()
	w.r.mu.Unlock()
	for i, x := range got {
		assert.Equal(t, specs[i].Name, x.Name, "queue order")
		assert.Equal(t, specs[i].Class, x.Class)
		assert.Equal(t, specs[i].AllowBypass, x.AllowBypass)
		assert.Equal(t, []string{gpu}, x.Locations, x.Name)
	}
	assert.Equal(t, []WaiterInfo{
		{Name: "b", Class: 3, Locations: []string{gpu}, Since: t0.Add(time.Second), Tries: 1, Eligible: true},
		{Name: "a", Locations: []string{gpu}, Since: t0, Tries: 1},
		{Name: "c", Locations: []string{gpu}, AllowBypass: true, Since: t0.Add(time.Second), Tries: 1},
		{Name: "k", Locations: []string{gpu}, Since: t0.Add(time.Second)},
	}, got, "a, b and c were tried when they came (c held up by a, under the room a holds); the cache's load k, held up, queued without a try; b, ahead at the same location, holds up the rest")

	got[0].Locations[0] = "elsewhere"
	assert.Equal(t, got[1:], s.Waiters()[1:], "a second look sees the same")
	assert.Equal(t, []string{gpu}, s.Waiters()[0].Locations, "the copy's slices are its own")
	w.r.mu.Lock()
	assert.Equal(t, specs, w.r.q.Waiting(), "looking changed nothing")
	w.r.mu.Unlock()

	require.NoError(t, s.Close(ctx))
	for range 3 {
		assert.ErrorIs(t, recv(t, out).err, ErrClosed)
	}
	assert.ErrorIs(t, <-loadErr, ErrClosed)
	assert.Empty(t, s.Waiters())
	_ = holder // released at close
}

// waitLog is a log sink safe for the runtime's goroutines.
type waitLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *waitLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *waitLog) events(t *testing.T, kind string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["event"] == kind {
			out = append(out, m)
		}
	}
	return out
}

func startWaitLogged(t *testing.T, budgetBytes int64, maxWaiters int) (*System, *waitLog) {
	t.Helper()
	l := &waitLog{}
	log := zerolog.New(l).Level(zerolog.InfoLevel)
	s := startGPU(t, budgetBytes, func(o *Options) {
		o.Logger, o.EventLevel, o.MaxWaiters = &log, zerolog.WarnLevel, maxWaiters
	})
	return s, l
}

// wait_started and wait_ended: a wait admitted after a release, with the
// time it waited on the room's clock and its turns; a canceled one, a
// closed one, one refused for good and one refused by a full queue.
func TestEventWaitStartedAndEnded(t *testing.T) {
	ctx := context.Background()
	s, l := startWaitLogged(t, 100, 2)
	w := watchRoom(s)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0
	setRoomClock(s, &now)
	holder := mustAdmit(t, s, "holder", 100)

	out := make(chan admitted, 1)
	admitAsync(ctx, s, "a", 60, out, WaitClass(2))
	w.queued(t, "a")
	w.settled(t)
	w.r.mu.Lock()
	now = t0.Add(1500 * time.Millisecond)
	w.r.mu.Unlock()
	require.NoError(t, holder.Exit(ctx))
	a := recv(t, out)
	require.NoError(t, a.err)

	cctx, cancel := context.WithCancel(ctx)
	admitAsync(cctx, s, "b", 60, out)
	w.queued(t, "b")
	admitAsync(ctx, s, "c", 60, out, WaitAllowBypass())
	w.queued(t, "b", "c")
	_, _, err := s.Admit(ctx, resv("full", 10), WaitForRoom())
	var qf *budget.QueueFullError
	require.ErrorAs(t, err, &qf)
	cancel()
	assert.ErrorIs(t, recv(t, out).err, context.Canceled)
	w.queued(t, "c")
	_, _, never := s.Admit(ctx, resv("never", 200), WaitForRoom())
	require.Error(t, never)
	require.NoError(t, s.Close(ctx))
	assert.ErrorIs(t, recv(t, out).err, ErrClosed)

	started := map[string]map[string]any{}
	for _, e := range l.events(t, EventWaitStarted) {
		started[e["name"].(string)] = e
	}
	require.Len(t, started, 3, "a, b, c; not the caller the full queue refused, nor never, refused for good at its first try")
	require.Len(t, l.events(t, EventWaitStarted), 3)
	st := started["a"]
	assert.Equal(t, "warn", st["level"])
	assert.Equal(t, "a", st["name"])
	assert.EqualValues(t, 2, st["wait_class"])
	assert.Equal(t, []any{gpu}, st["locations"])
	assert.Equal(t, false, st["bypass"])
	assert.EqualValues(t, 1, st["queue_length"])
	assert.Equal(t, true, started["c"]["bypass"])
	assert.EqualValues(t, 2, started["c"]["queue_length"], "queued behind b")

	ended := map[string]map[string]any{}
	for _, e := range l.events(t, EventWaitEnded) {
		ended[e["name"].(string)] = e
	}
	require.Len(t, ended, 4)
	require.Len(t, l.events(t, EventWaitEnded), 4)
	e := ended["a"]
	assert.Equal(t, WaitAdmitted, e["outcome"])
	assert.EqualValues(t, 1500, e["waited_ms"])
	assert.EqualValues(t, 2, e["tries"], "one try when it came, one after the exit")
	assert.EqualValues(t, 2, e["wait_class"])
	assert.Equal(t, []any{gpu}, e["locations"])
	assert.NotContains(t, e, "error")
	assert.NotContains(t, e, "class")

	assert.Equal(t, WaitCanceled, ended["b"]["outcome"])
	assert.Equal(t, context.Canceled.Error(), ended["b"]["error"])
	assert.EqualValues(t, 0, ended["b"]["waited_ms"], "the clock stood still")
	assert.Equal(t, WaitClosed, ended["c"]["outcome"])
	assert.Equal(t, ErrClosed.Error(), ended["c"]["error"])

	assert.NotContains(t, ended, "never", "refused for good at its first try: it never waited")
	kind, _ := ClassifiedError(never)
	assert.Equal(t, ErrorPlan, kind, "it can never fit")

	f := ended["full"]
	assert.Equal(t, WaitRefused, f["outcome"])
	assert.Equal(t, "queue_full", f["reason"])
	assert.EqualValues(t, 2, f["max_waiters"])
	assert.EqualValues(t, 0, f["tries"])
	assert.EqualValues(t, 2, f["queue_length"])
}

// The wait events share the rate bound: a storm of full-queue refusals
// writes the burst and no more.
func TestEventWaitStormIsBounded(t *testing.T) {
	ctx := context.Background()
	l := &waitLog{}
	log := zerolog.New(l)
	s := startGPU(t, 100, func(o *Options) {
		o.Logger, o.EventLevel, o.MaxWaiters, o.EventBurst, o.EventsPerSecond = &log, zerolog.InfoLevel, 1, 3, 1e-9
	})
	w := watchRoom(s)
	holder := mustAdmit(t, s, "holder", 100)
	out := make(chan admitted, 1)
	cctx, cancel := context.WithCancel(ctx)
	admitAsync(cctx, s, "a", 10, out)
	w.queued(t, "a")
	for range 100 {
		_, _, err := s.Admit(ctx, resv("x", 10), WaitForRoom())
		require.ErrorIs(t, err, ErrBusy)
	}
	cancel()
	assert.ErrorIs(t, recv(t, out).err, context.Canceled)
	assert.Len(t, l.events(t, EventWaitEnded), 3)
	assert.Len(t, l.events(t, EventWaitStarted), 1, "kinds are bound apart")
	require.NoError(t, holder.Exit(ctx))
}
