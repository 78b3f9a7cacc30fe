package system

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestSlots(t *testing.T) *slotPool {
	t.Helper()
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	return &slotPool{reg: sys.ProcessRegistry}
}

func registered(p *slotPool, s *replySlot) bool {
	_, ok := p.reg.Get(s.pid)
	return ok
}

// A reply already there is taken at once; a caller that waits is woken by
// the reply; either way the slot is reused.
func TestReplySlotDeliversOnceAndIsReused(t *testing.T) {
	p := newTestSlots(t)
	ctx := context.Background()
	s := p.get()
	s.SendUserMessage(s.pid, "early")
	m, err := p.await(ctx, s, nil, false)
	require.NoError(t, err)
	assert.Equal(t, "early", m)
	assert.Same(t, s, p.get(), "the slot went back to the pool")

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan any, 1)
	go func() {
		m, err := p.await(cctx, s, nil, false)
		assert.NoError(t, err)
		got <- m
	}()
	for s.state.Load() != slotParked {
		runtime.Gosched() // the caller parks (a few instructions)
	}
	s.SendUserMessage(s.pid, "late")
	s.SendUserMessage(s.pid, "second") // a second reply is dropped
	assert.Equal(t, "late", <-got)
	assert.True(t, registered(p, s))
}

// A caller whose context ends abandons the slot: the reply, whether it
// came before the caller gave up or after, goes to onLate exactly once.
func TestReplySlotAbandonedHandsTheReplyToOnLate(t *testing.T) {
	p := newTestSlots(t)
	var mu sync.Mutex
	var late []any
	onLate := func(m any) { mu.Lock(); late = append(late, m); mu.Unlock() }
	done, cancel := context.WithCancel(context.Background())
	cancel()

	// Given up before the reply: the slot leaves the registry when the
	// late reply arrives.
	s := p.get()
	_, err := p.await(done, s, onLate, false)
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, late)
	assert.True(t, registered(p, s))
	s.SendUserMessage(s.pid, "after")
	assert.Equal(t, []any{"after"}, late)
	assert.False(t, registered(p, s), "an abandoned slot is never reused")

	// The reply was there, but the context is done: the context wins and
	// the reply is handed back at once.
	s2 := p.get()
	require.NotSame(t, s, s2)
	s2.SendUserMessage(s2.pid, "before")
	_, err = p.await(done, s2, onLate, false)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []any{"after", "before"}, late)

	// Parked, then the context ends while the reply races it: exactly one
	// of the two hands it over.
	for range 200 {
		cctx, cancel := context.WithCancel(context.Background())
		s := p.get()
		res := make(chan error, 1)
		go func() { _, err := p.await(cctx, s, onLate, false); res <- err }()
		go cancel()
		s.SendUserMessage(s.pid, "raced")
		if err := <-res; err == nil {
			continue // the reply won: the caller took it
		}
		mu.Lock()
		n := len(late)
		mu.Unlock()
		require.Equal(t, "raced", late[n-1])
		late = late[:n-1]
	}
	assert.Equal(t, []any{"after", "before"}, late)
}
