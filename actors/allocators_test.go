package actors

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
)

// Allocators allocate and free through one actor per location, refuse a
// location they have no actor for with a *NoAllocatorError, and answer
// ErrAllocatorsStopped once stopped.
func TestAllocatorsAllocateAndFreeThroughTheirActors(t *testing.T) {
	be, err := soft.New(soft.Config{Locations: []string{"pageable-host", "cuda:0"}})
	require.NoError(t, err)
	defer func() { require.NoError(t, be.Close()) }()
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	a, err := StartAllocators(sys.Root, be, func() (actor.Dispatcher, func()) {
		return actor.NewDefaultDispatcher(300), func() {}
	}, "cuda:0", "cuda:0")
	require.NoError(t, err)
	ctx := context.Background()

	buf, err := a.AllocateAt(ctx, "cuda:0", 4096)
	require.NoError(t, err)
	mi, err := be.MemInfo("cuda:0")
	require.NoError(t, err)
	assert.Equal(t, int64(4096), mi.UsedBytes)

	_, err = a.AllocateAt(ctx, "pageable-host", 1)
	var na *NoAllocatorError
	require.ErrorAs(t, err, &na)
	assert.Equal(t, "pageable-host", na.Location)

	require.NoError(t, a.FreeAt(ctx, buf))
	mi, err = be.MemInfo("cuda:0")
	require.NoError(t, err)
	assert.Zero(t, mi.UsedBytes)

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = a.AllocateAt(canceled, "cuda:0", 1)
	require.ErrorIs(t, err, context.Canceled)

	a.Stop()
	a.Stop() // idempotent
	_, err = a.AllocateAt(ctx, "cuda:0", 1)
	require.ErrorIs(t, err, ErrAllocatorsStopped)
	mi, err = be.MemInfo("cuda:0")
	require.NoError(t, err)
	assert.Zero(t, mi.UsedBytes, "nothing allocated by a refused or late call")
}
