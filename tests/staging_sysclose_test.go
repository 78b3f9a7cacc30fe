package tests

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// One call shuts everything down: a pipeline the application never closed
// is closed by System.Close first, with its context (its pending and
// in-flight tasks written, every buffer freed, every reservation
// released), and a pipeline closed by its application is not closed
// again. The runtime owns the backend here (Options.CloseBackend): the
// application closes one thing.
func TestSystemCloseClosesThePipelinesOpenedOnIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locs := []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}
	be, err := soft.New(soft.Config{Locations: locs})
	require.NoError(t, err)
	sys, err := system.Start(ctx, system.Options{Locations: fourLocations(0, 1<<20, 1<<20), Backend: be, CloseBackend: true})
	require.NoError(t, err)

	cfg := stagingConfig("open")
	cfg.Eager = true // the clone is copied within Append: the source may go at once
	open, err := staging.New(ctx, sys, cfg)
	require.NoError(t, err)
	closed, err := staging.New(ctx, sys, stagingConfig("closed"))
	require.NoError(t, err)
	require.NoError(t, closed.Close(ctx), "closed by its application")

	saveData := pattern(2*stRow, 9)
	saveBuf, err := be.Allocate(ctx, "cuda:0", int64(len(saveData)))
	require.NoError(t, err)
	require.NoError(t, be.Write(ctx, saveBuf, saveData))
	deferred, err := open.Open(ctx, staging.TaskSpec{ReqID: "c", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	require.NoError(t, deferred.Append(ctx, staging.Chunk{Device: saveBuf, Rows: []staging.Row{{Key: "v", Slot: 2, Offset: stRow}}}))
	require.NoError(t, be.Free(saveBuf)) // the pipeline copied it into its clone

	require.NoError(t, sys.Close(ctx), "the runtime closes the open pipeline first; nothing is left")
	assert.Equal(t, staging.Written, deferred.State(), "its deferred task was written")
	_, err = open.Open(ctx, staging.TaskSpec{ReqID: "late", WriteN: 1, Mode: staging.JoinOnFinish})
	assert.ErrorIs(t, err, staging.ErrClosed)
	require.NoError(t, open.Close(ctx), "closing it again returns the first result")
	for _, l := range locs {
		_, err := be.MemInfo(l)
		assert.Error(t, err, "%s: the runtime closed the backend it owns", l)
	}
}

// A pipeline whose step's freeze event never fires cannot free that
// step's slot: System.Close stops waiting for it about a second after
// its context ends, returns the pipeline's *staging.CloseIncompleteError
// (matching the context's error, naming what is left), and the rest of
// the pipeline's close runs once the event fires.
func TestSystemCloseCutsShortAPipelineWaitingForAFreezeEvent(t *testing.T) {
	locs := []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}
	be, err := soft.New(soft.Config{Locations: locs})
	require.NoError(t, err)
	defer func() { require.NoError(t, be.Close()) }()
	ctx := context.Background()
	sys, err := system.Start(ctx, system.Options{Locations: fourLocations(0, 1<<20, 1<<20), Backend: be})
	require.NoError(t, err)
	p, err := staging.New(ctx, sys, stagingConfig("kv"))
	require.NoError(t, err)
	stepData := pattern(8*stRow, 3)
	stepBuf, err := be.Allocate(ctx, "cuda:0", int64(len(stepData)))
	require.NoError(t, err)
	require.NoError(t, be.Write(ctx, stepBuf, stepData))
	defer func() { _ = be.Free(stepBuf) }()
	g := newStGate()
	st, err := p.Stage(ctx, stepBuf, g) // its copy waits for g
	require.NoError(t, err)
	_ = st

	cut, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	err = sys.Close(cut)
	took := time.Since(began)
	var inc *staging.CloseIncompleteError
	require.ErrorAs(t, err, &inc)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	var ce *system.CloseError
	require.ErrorAs(t, err, &ce, "named as a component of the runtime")
	assert.Contains(t, ce.Name, "kv")
	assert.Equal(t, 1, inc.Slots, "the staged step's slot waits for its freeze event")
	assert.Zero(t, inc.Tasks)
	assert.Less(t, took, 10*time.Second, "Close returned after its deadline and the pipeline's grace, not at the event")

	g.open()
	again, cancelAgain := context.WithTimeout(ctx, 20*time.Second)
	defer cancelAgain()
	err = p.Close(again)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "the rest of the close ran once the event fired; its result is the first context's error: %v", err)
	require.NoError(t, again.Err(), "it did not wait for its own deadline")
	mi, err := be.MemInfo("pinned-host")
	require.NoError(t, err)
	assert.Zero(t, mi.UsedBytes, "the slot buffers were freed")
}
