package soft_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"go.uber.org/goleak"
)

func TestBackendCloseIsIdempotentAndRefusesWork(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := newGate()
	b := newBackend(t, soft.Config{BandwidthBytesPerSec: 1, Sleep: g.sleep})
	ctx := context.Background()
	buf := mustAlloc(t, b, "cuda:0", 32)
	other := mustAlloc(t, b, "cuda:1", 32)
	var streams []cuda.Stream
	for _, loc := range allLocations {
		streams = append(streams, mustStream(t, b, loc))
	}
	s := streams[2]
	mustCopy(t, s, other, buf)
	pending := mustRecord(t, s)
	g.await(t) // a copy is in flight when Close begins

	var wg sync.WaitGroup
	for range 4 { // concurrent Closes all return once everything stopped
		wg.Go(func() {
			if err := b.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
			if !pending.Query() {
				t.Error("Close returned before the stream drained")
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatalf("another Close = %v, want nil", err)
	}
	if pending.Err() != nil {
		t.Fatalf("the drained copy failed: %v", pending.Err())
	}

	checks := map[string]error{}
	_, checks["Allocate"] = b.Allocate(ctx, "cuda:0", 1)
	checks["Free"] = b.Free(buf)
	_, checks["NewStream"] = b.NewStream("cuda:0")
	checks["Load"] = b.Load(ctx, buf, "", func(context.Context, []byte) error { return nil })
	_, checks["Read"] = b.Read(ctx, buf)
	checks["Write"] = b.Write(ctx, buf, make([]byte, 32))
	_, checks["MemInfo"] = b.MemInfo("cuda:0")
	checks["CopyAsync"] = s.CopyAsync(other, buf)
	_, checks["Record"] = s.Record()
	checks["WaitEvent"] = s.WaitEvent(pending)
	checks["Synchronize"] = s.Synchronize(ctx)
	for op, err := range checks {
		if !errors.Is(err, cuda.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", op, err)
		}
	}
	for _, s := range streams {
		if err := s.Close(); err != nil {
			t.Errorf("Stream.Close after Backend.Close = %v, want nil", err)
		}
	}
}

// Streams closed individually, before the backend, are not closed twice,
// and a backend with no streams closes cleanly.
func TestCloseAfterStreamsClosed(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newBackend(t, soft.Config{})
	for range 3 {
		mustClose(t, mustStream(t, b, "pinned-host"))
	}
	s := mustStream(t, b, "cuda:0")
	mustClose(t, b)
	if _, err := s.Record(); !errors.Is(err, cuda.ErrClosed) {
		t.Fatalf("Record on a stream of a closed backend = %v", err)
	}

	empty := newBackend(t, soft.Config{})
	mustClose(t, empty)
	mustClose(t, empty)
}
