package tests

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
)

// liveBackend wraps a backend and counts the bytes of the buffers
// allocated through it and not freed yet, by location. Its Close records
// what was still live and closes closed (Options.CloseBackend makes the
// runtime close it last).
type liveBackend struct {
	cuda.Backend
	mu          sync.Mutex
	live        map[string]int64
	liveAtClose map[string]int64
	closeOnce   sync.Once
	closed      chan struct{}
}

func newLiveBackend(t *testing.T, locs []system.LocationConfig) *liveBackend {
	t.Helper()
	inner, err := system.SoftBackend(locs, soft.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = inner.Close() })
	return &liveBackend{Backend: inner, live: map[string]int64{}, closed: make(chan struct{})}
}

func (b *liveBackend) Allocate(ctx context.Context, loc string, n int64) (cuda.Buffer, error) {
	buf, err := b.Backend.Allocate(ctx, loc, n)
	if err == nil {
		b.mu.Lock()
		b.live[loc] += buf.Size()
		b.mu.Unlock()
	}
	return buf, err
}

func (b *liveBackend) Free(buf cuda.Buffer) error {
	err := b.Backend.Free(buf)
	if err == nil && buf != nil {
		b.mu.Lock()
		b.live[buf.Location()] -= buf.Size()
		b.mu.Unlock()
	}
	return err
}

func (b *liveBackend) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.liveAtClose = nonZero(b.live)
		b.mu.Unlock()
		close(b.closed)
	})
	return b.Backend.Close()
}

// liveBytes returns the live bytes by location (locations at zero left out).
func (b *liveBackend) liveBytes() map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return nonZero(b.live)
}

func nonZero(m map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// hangBound is the hang detector of the close tests: far above any
// deadline they give Close, never a measure of speed.
const hangBound = 2 * time.Minute

// closeWithin runs sys.Close(ctx) and fails the test if it has not
// returned within hangBound (a hang, not a slow machine).
func closeWithin(t *testing.T, sys *system.System, ctx context.Context) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- sys.Close(ctx) }()
	timer := time.NewTimer(hangBound)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		t.Fatalf("Close did not return within %v (its context: %v)", hangBound, ctx)
		return nil
	}
}

// finalCharges returns the bytes the final snapshot still charges, by
// location (used, reserved or temporary; zero left out).
func finalCharges(t *testing.T, sys *system.System) map[string]int64 {
	t.Helper()
	snap, err := sys.Snapshot(context.Background())
	require.NoError(t, err, "the final snapshot")
	out := map[string]int64{}
	for _, l := range snap.Locations {
		if n := l.UsedBytes + l.ReservedBytes + l.TemporaryBytes; n != 0 {
			out[l.Location] = n
		}
	}
	return out
}
