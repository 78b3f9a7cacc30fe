package actors

import (
	"context"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/messages"
)

func TestStartValidatesItsConfig(t *testing.T) {
	_, err := Start(Config{Ledger: ledgerConfig(), Logger: zerolog.Nop()})
	var inv *budget.InvalidInputError
	require.ErrorAs(t, err, &inv, "a backend is required")

	be := newSoft(t)
	defer be.Close()
	bad := ledgerConfig()
	bad.Locations = append(bad.Locations, budget.LocationConfig{Name: "not a location"})
	_, err = Start(Config{Ledger: bad, Backend: be, Logger: zerolog.Nop()})
	require.Error(t, err, "the ledger config is checked")

	// A ledger location the backend cannot serve: Start fails and leaves
	// nothing running (the streams made so far are closed; goleak checks
	// the goroutines at the end of the package).
	hostOnly, err := soft.New(soft.Config{Locations: []string{locHost}})
	require.NoError(t, err)
	defer hostOnly.Close()
	_, err = Start(Config{Ledger: ledgerConfig(), Backend: hostOnly, Logger: zerolog.Nop()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "stream for")
}

func TestStartDefaults(t *testing.T) {
	h := startEngine(t)
	assert.Equal(t, budget.DefaultStateLimit, h.eng.stateLimit)
	assert.Greater(t, h.eng.allocTimeout, 0*h.eng.allocTimeout)
	assert.Len(t, h.eng.locations, 3, "one location actor per location")
	assert.Same(t, h.be, h.eng.Backend())
	assert.Same(t, h.eng.System.Root, h.eng.Root())
}

func TestStopIsIdempotentAndLeavesNothingRunning(t *testing.T) {
	be := newSoft(t)
	eng, err := Start(Config{Ledger: ledgerConfig(), Backend: be, Logger: zerolog.Nop()})
	require.NoError(t, err)
	h := &harness{t: t, eng: eng, be: be}
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 100, Mode: budget.Replicable, At: locHost}, testPattern(1, 100))
	require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
	require.NoError(t, h.shutdown().Err)

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = eng.Stop(context.Background()) }()
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	assert.NoError(t, eng.Stop(context.Background()), "a later Stop is a no-op")
	assert.Zero(t, eng.Buffers.Len())
	for _, loc := range []string{locHost, locGPU0, locGPU1} {
		assert.Zero(t, h.used(loc))
	}
	require.NoError(t, be.Close())
	goleak.VerifyNone(t)
}

func TestShutdownReportsOutstandingThenStopFreesEverything(t *testing.T) {
	h := startEngine(t)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 100, Mode: budget.Replicable, At: locHost}, testPattern(1, 100))
	require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
	lease := h.acquire(hd, locGPU0)
	rep, _ := h.ask(func(to *actor.PID) any { return &messages.Hold{Handle: hd, Location: locHost, ReplyTo: to} })
	require.NoError(t, rep.(*messages.HoldReply).Err)
	rep, _ = h.ask(func(to *actor.PID) any {
		return &messages.Reserve{Location: locGPU1, Name: "ws", Bytes: 50, ReplyTo: to}
	})
	require.NoError(t, rep.(*messages.Reply).Err)
	k := nextTestKey()
	h.eng.StoreEvent(k, newTestEvent()) // never completes
	rep, _ = h.ask(func(to *actor.PID) any { return &messages.RecordEvent{Lease: lease, EventKey: k, ReplyTo: to} })
	event := rep.(*messages.EventReply).Event
	require.NotZero(t, event)
	reaped := h.box()
	h.send(&messages.AwaitReap{Event: event, ReplyTo: reaped.pid})

	sr := h.shutdown()
	require.NoError(t, sr.Err)
	require.Len(t, sr.Outstanding.Leases, 1)
	assert.Equal(t, budget.Endpoint{Handle: "w", Location: locGPU0, ID: uint64(lease)}, sr.Outstanding.Leases[0])
	assert.Len(t, sr.Outstanding.Holds, 1)
	assert.Len(t, sr.Outstanding.Events, 1)
	for _, r := range sr.Final.Locations {
		assert.Zero(t, r.UsedBytes, r.Location)
		assert.Zero(t, r.ReservedBytes, r.Location)
	}
	r := reaped.next(t).(*messages.Reply)
	assert.NoError(t, r.Err, "a reap waiter is released by the shutdown")

	h.drain(locHost, locGPU0, locGPU1)
	assert.Zero(t, h.eng.Buffers.Len(), "the shutdown's frees were carried out")
	h.stop() // returns although the event never completes
}

// A shutdown cancels the context of the loader in flight and waits for
// the transfer to settle before it answers.
func TestShutdownWaitsForTheTransferInFlight(t *testing.T) {
	h := startEngine(t)
	started, release := make(chan struct{}, 1), make(chan struct{})
	k := nextTestKey()
	h.eng.StoreLoader(k, gatedLoader(4, started, release))
	rep := h.register(budget.ValueSpec{Name: "s", Bytes: 100, Mode: budget.Replicable, Source: locHost}, nil, k)
	require.NoError(t, rep.Err)

	b := h.box()
	h.send(&messages.Transition{Kind: messages.Place, Handle: rep.Handle, To: locGPU0, ReplyTo: b.pid})
	<-started
	h.send(&messages.Shutdown{ReplyTo: b.pid})
	defer close(release)

	first := b.next(t)
	pr, ok := first.(*messages.RunReply)
	require.True(t, ok, "the transfer settles before the shutdown answers, got %T", first)
	require.ErrorIs(t, pr.Err, context.Canceled, "the shutdown canceled the loader's context")
	sr, ok := b.next(t).(*messages.ShutdownReply)
	require.True(t, ok)
	require.NoError(t, sr.Err)
	assert.True(t, sr.Outstanding.Empty())
	h.stop()
}

func TestStopWithoutShutdownFreesEveryBuffer(t *testing.T) {
	h := startEngine(t)
	hd := h.mustRegister(budget.ValueSpec{Name: "w", Bytes: 300, Mode: budget.Replicable, At: locHost}, testPattern(1, 300))
	require.NoError(t, h.transition(messages.Place, hd, "", locGPU0).Err)
	require.NoError(t, h.transition(messages.Place, hd, "", locGPU1).Err)
	require.Equal(t, 3, h.eng.Buffers.Len())
	h.stop()
}
