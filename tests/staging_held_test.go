package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// A caller waiting for room at pinned-host (docs/semantics.md, "Waiting
// for room") does not fail the write pipeline whose landing buffers are
// charged there: a landing buffer is the pipeline's own transient charge,
// returned by its pool write, and the pipeline's writes go on.
func TestPipelineWritesWhileAWaiterWaitsAtPinnedHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locs := []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}
	be, err := soft.New(soft.Config{Locations: locs})
	require.NoError(t, err)
	sys, err := system.Start(ctx, system.Options{Locations: fourLocations(0, 1<<20, 1<<20), Backend: be, CloseBackend: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, sys.Close(ctx)) }()
	p := newPipeline(t, sys, stagingConfig("kv"))

	require.NoError(t, sys.Reserve(ctx, "pinned-host", "holder", 512<<10))
	waited := make(chan error, 1)
	go func() {
		sc, _, err := sys.Admit(ctx, system.Request{Name: "big", Reservations: []system.ReservationSpec{{Name: "big", Location: "pinned-host", Bytes: 600 << 10}}}, system.WaitForRoom())
		if err == nil {
			err = sc.Exit(ctx)
		}
		waited <- err
	}()
	_, err = sys.AwaitWaiters(ctx, func(ws []system.WaiterInfo) bool { return len(ws) == 1 })
	require.NoError(t, err)

	data := pattern(2*stRow, 5)
	buf, err := be.Allocate(ctx, "cuda:0", int64(len(data)))
	require.NoError(t, err)
	require.NoError(t, be.Write(ctx, buf, data))
	defer func() { _ = be.Free(buf) }()
	task, err := p.Open(ctx, staging.TaskSpec{ReqID: "r", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	require.NoError(t, task.Append(ctx, staging.Chunk{Device: buf, Rows: []staging.Row{{Key: "v", Slot: 1, Offset: 0}, {Key: "k", Slot: 1, Offset: stRow}}}))
	require.NoError(t, p.Submit(ctx, task))
	require.NoError(t, task.Wait(ctx), "the landing buffer is not refused for the waiter")
	require.NoError(t, p.Err())
	assert.Equal(t, staging.Written, task.State())

	require.NoError(t, sys.Unreserve(ctx, "holder"))
	require.NoError(t, <-waited)
}
