package actors

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/messages"
)

// The supervisor carries out a cache's requests on the ledger: owned
// reservations at the cache's location, their resize and release, and the
// owner's figures; each mutation is one state version.
func TestSupervisorCarriesOutCacheRequests(t *testing.T) {
	back, err := soft.New(soft.Config{Locations: []string{"cuda:0"}})
	require.NoError(t, err)
	eng, err := Start(Config{
		Ledger:  budget.Config{ManagerID: "m", Locations: []budget.LocationConfig{{Name: "cuda:0", HasBudget: true, BudgetBytes: 100}}},
		Backend: back,
		Logger:  zerolog.Nop(),
	})
	require.NoError(t, err)
	defer func() {
		require.NoError(t, eng.Stop(context.Background()))
		require.NoError(t, back.Close())
	}()
	ask := func(build func(*actor.PID) any) any {
		f := actor.NewFuture(eng.System, 5*time.Second)
		eng.Root().Send(eng.Supervisor, build(f.PID()))
		r, err := f.Result()
		require.NoError(t, err)
		return r
	}
	rep := ask(func(p *actor.PID) any {
		return &messages.OwnedReserve{Location: "cuda:0", Name: "c/a#1", Owner: "c", Bytes: 60, ReplyTo: p}
	}).(*messages.Reply)
	require.NoError(t, rep.Err)
	assert.Equal(t, uint64(1), rep.Version)

	rep = ask(func(p *actor.PID) any {
		return &messages.OwnedResize{Name: "c/a#1", Owner: "c", Bytes: 50, ReplyTo: p}
	}).(*messages.Reply)
	require.NoError(t, rep.Err)
	assert.Equal(t, uint64(2), rep.Version)

	rep = ask(func(p *actor.PID) any {
		return &messages.OwnedResize{Name: "c/a#1", Owner: "c", Bytes: 101, ReplyTo: p}
	}).(*messages.Reply)
	var be *budget.BudgetError
	require.ErrorAs(t, rep.Err, &be)
	assert.Equal(t, int64(51), be.RequestedBytes)
	assert.Equal(t, uint64(2), rep.Version)

	// A plain Unreserve refuses a cache's charge.
	rep = ask(func(p *actor.PID) any { return &messages.Unreserve{Name: "c/a#1", ReplyTo: p} }).(*messages.Reply)
	assert.ErrorIs(t, rep.Err, budget.ErrInvalidInput)

	ch := ask(func(p *actor.PID) any {
		return &messages.OwnerChargesRequest{Location: "cuda:0", Owner: "c", ReplyTo: p}
	}).(*messages.OwnerChargesReply)
	require.NoError(t, ch.Err)
	assert.Equal(t, budget.OwnerCharges{Location: "cuda:0", HasBudget: true, BudgetBytes: 100, ReservedBytes: 50, OwnedBytes: 50, OwnedReservations: 1}, ch.Charges)

	rep = ask(func(p *actor.PID) any { return &messages.OwnedUnreserve{Name: "c/a#1", Owner: "c", ReplyTo: p} }).(*messages.Reply)
	require.NoError(t, rep.Err)
	assert.Equal(t, uint64(3), rep.Version)
}
