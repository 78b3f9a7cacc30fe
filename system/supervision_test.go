package system

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/testhooks"
)

// A location actor that crashes while allocating must fail the transfer
// cleanly (the ledger commits the failure), be restarted, and serve the
// next allocation.
func TestLocationActorCrashFailsTransferAndRestarts(t *testing.T) {
	ctx := context.Background()
	var armed atomic.Bool
	armed.Store(true)
	knobs := testhooks.Knobs{PanicOnAllocate: func(k BufferKey) bool {
		return k.Location == "cuda:0" && armed.CompareAndSwap(true, false)
	}}
	s, err := startSoft(t, ctx, Options{
		Locations: []LocationConfig{NoLimit("pageable-host"), Limit("cuda:0", 1<<20)},
		knobs:     knobs,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	data := bytes.Repeat([]byte{1, 2, 3, 4}, 64)
	h, err := s.Register(ctx, Value{Name: "w", Bytes: int64(len(data)), At: "pageable-host", Data: data})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Place(ctx, h, "cuda:0")
	var pe *PlanExecutionError
	if !errors.As(err, &pe) || pe.Phase != PhaseExecute {
		t.Fatalf("want a PlanExecutionError in phase execute, got %v", err)
	}
	var crash *ActorCrashError
	if !errors.As(err, &crash) {
		t.Fatalf("cause should be the actor crash, got %v", pe.Cause)
	}
	snap, _ := s.Snapshot(ctx)
	if r, _ := snap.Location("cuda:0"); r.UsedBytes != 0 {
		t.Fatalf("failed transfer left %d bytes charged at cuda:0", r.UsedBytes)
	}
	if err := s.Place(ctx, h, "cuda:0"); err != nil {
		t.Fatalf("restarted location actor should allocate: %v", err)
	}
	got, err := s.Read(ctx, h, "cuda:0")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("bytes after restart: %v", err)
	}
}

// testhooks.With sets the unexported knobs of a copy of the options and
// keeps every other option.
func TestTesthooksWithSetsKnobs(t *testing.T) {
	opts := testhooks.With(Options{ManagerID: "m"}, testhooks.Knobs{AfterLedger: func(string) {}})
	require.Equal(t, "m", opts.ManagerID)
	require.NotNil(t, opts.knobs.AfterLedger)
}
