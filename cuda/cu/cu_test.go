//go:build cuda && gpu

// These tests link the CUDA driver and need a GPU to start at all (see the
// package doc). `go test -tags cuda ./...` runs them only through
// cuda/conformance's TestCUBackendOnGPU, which probes for a device first
// and skips cleanly without one; `go test -tags cuda,gpu ./cuda/cu` runs
// them directly on a GPU machine, and make gpu-check builds them into a
// binary for one.

package cu_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/conformance"
	"github.com/residency-go/residency/cuda/cu"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gcu "gorgonia.org/cu"
)

var ctx = context.Background()

// locations returns the host locations and up to two devices (all of them
// with RESIDENCY_CU_ALL_DEVICES=1).
func locations(t *testing.T) []string {
	n, err := gcu.NumDevices()
	require.NoError(t, err)
	require.Positive(t, n)
	if os.Getenv("RESIDENCY_CU_ALL_DEVICES") == "" {
		n = min(n, 2)
	}
	locs := []string{"pageable-host", "pinned-host"}
	for i := range n {
		locs = append(locs, fmt.Sprintf("cuda:%d", i))
	}
	return locs
}

func newBackend(t *testing.T, capacity map[string]int64) *cu.Backend {
	t.Helper()
	b, err := cu.New(cu.Config{Locations: locations(t), Capacity: capacity})
	require.NoError(t, err)
	return b
}

func TestConformance(t *testing.T) {
	locs := locations(t)
	t.Logf("locations: %s", strings.Join(locs, ", "))
	conformance.Run(t, func(t *testing.T, capacity map[string]int64) cuda.Backend {
		return newBackend(t, capacity)
	}, locs...)
}

func TestIdentity(t *testing.T) {
	b := newBackend(t, nil)
	defer func() { require.NoError(t, b.Close()) }()
	assert.False(t, cuda.IsSimulated(b))
	assert.Equal(t, cu.BackendName, b.Name())
	name, err := b.DeviceName("cuda:0")
	require.NoError(t, err)
	uuid, err := b.DeviceUUID("cuda:0")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(uuid, "GPU-"), uuid)
	t.Logf("cuda:0 is %s (%s), driver %d", name, uuid, gcu.Version())
	_, err = b.DeviceName("pinned-host")
	assert.ErrorIs(t, err, cuda.ErrInvalid)

	_, err = cu.New(cu.Config{Locations: []string{"cuda:999999"}})
	assert.ErrorIs(t, err, cuda.ErrUnknownLocation)
	_, err = cu.New(cu.Config{})
	assert.ErrorIs(t, err, cuda.ErrInvalid)
}

// A request the device cannot hold is refused by the driver and reported
// as an *OutOfMemoryError that also carries CUDA's error name.
func TestDriverOutOfMemory(t *testing.T) {
	b := newBackend(t, nil)
	defer func() { require.NoError(t, b.Close()) }()
	mi, err := b.MemInfo("cuda:0")
	require.NoError(t, err)
	_, err = b.Allocate(ctx, "cuda:0", mi.TotalBytes+1<<30)
	var oom *cuda.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	var ce *cu.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ce.Name)
	assert.Contains(t, err.Error(), "CUDA_ERROR_OUT_OF_MEMORY")
	t.Logf("%v", err)

	_, err = b.Allocate(ctx, "pinned-host", math.MaxInt64/2)
	require.ErrorIs(t, err, cuda.ErrOutOfMemory, "pinned host allocation of 4 EiB")
	_, err = b.Allocate(ctx, "pageable-host", math.MaxInt64/2)
	require.ErrorIs(t, err, cuda.ErrOutOfMemory, "pageable host allocation of 4 EiB")
}

// A host buffer's view is its memory: written in place, a copy to the
// device and back and Read see it; a copy into the buffer lands in it.
// A device buffer has none, nor has a freed one.
func TestHostBytes(t *testing.T) {
	b := newBackend(t, nil)
	defer func() { require.NoError(t, b.Close()) }()
	const n = 1<<20 + 3
	s, err := b.NewStream("cuda:0")
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	dev, err := b.Allocate(ctx, "cuda:0", n)
	require.NoError(t, err)
	_, err = cuda.HostBytes(dev)
	require.ErrorIs(t, err, cuda.ErrNoHostMemory)
	for _, loc := range []string{"pageable-host", "pinned-host"} {
		src, err := b.Allocate(ctx, loc, n)
		require.NoError(t, err)
		dst, err := b.Allocate(ctx, loc, n)
		require.NoError(t, err)
		view, err := cuda.HostBytes(src)
		require.NoError(t, err)
		require.Len(t, view, n)
		for i := range view {
			view[i] = byte(i*7) | 1
		}
		require.NoError(t, s.CopyAsync(dev, src))
		require.NoError(t, s.CopyAsync(dst, dev))
		require.NoError(t, s.Synchronize(ctx))
		got, err := cuda.HostBytes(dst)
		require.NoError(t, err)
		require.Equal(t, view, got, loc)
		read, err := b.Read(ctx, src)
		require.NoError(t, err)
		require.Equal(t, view, read, loc)
		require.NoError(t, b.Free(src))
		require.NoError(t, b.Free(dst))
		_, err = cuda.HostBytes(src)
		require.ErrorIs(t, err, cuda.ErrFreed)
	}
	require.NoError(t, b.Free(dev))
}

// Every method works from goroutines that never set a context, many at
// once.
func TestAnyGoroutine(t *testing.T) {
	b := newBackend(t, nil)
	defer func() { require.NoError(t, b.Close()) }()
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			loc := []string{"cuda:0", "pinned-host", "pageable-host"}[i%3]
			buf, err := b.Allocate(ctx, loc, 4096)
			if !assert.NoError(t, err) {
				return
			}
			data := make([]byte, 4096)
			data[i] = byte(i)
			assert.NoError(t, b.Write(ctx, buf, data))
			got, err := b.Read(ctx, buf)
			assert.NoError(t, err)
			assert.Equal(t, data, got)
			_, err = b.MemInfo(loc)
			assert.NoError(t, err)
			assert.NoError(t, b.Free(buf))
		})
	}
	wg.Wait()
}

// A cu stream can wait for an event of another backend (here the soft
// one): later work is issued only once it completes.
func TestWaitEventOfAnotherBackend(t *testing.T) {
	b := newBackend(t, nil)
	defer func() { require.NoError(t, b.Close()) }()
	sb, err := soft.New(soft.Config{Locations: []string{"cuda:0"}})
	require.NoError(t, err)
	defer sb.Close()
	ss, err := sb.NewStream("cuda:0")
	require.NoError(t, err)
	softEv, err := ss.Record()
	require.NoError(t, err)

	s, err := b.NewStream("cuda:0")
	require.NoError(t, err)
	defer s.Close()
	src, _ := b.Allocate(ctx, "pinned-host", 1<<20)
	dst, _ := b.Allocate(ctx, "cuda:0", 1<<20)
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	require.NoError(t, b.Write(ctx, src, want))
	require.NoError(t, s.WaitEvent(softEv))
	require.NoError(t, s.CopyAsync(dst, src))
	ev, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, ev.Wait(ctx))
	got, err := b.Read(ctx, dst)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

// Freeing buffers while large copies on them are in flight on the GPU
// neither crashes nor corrupts: the memory is released after the copies,
// and the stream keeps working.
func TestFreeDuringIssuedCopies(t *testing.T) {
	b := newBackend(t, nil)
	defer func() { require.NoError(t, b.Close()) }()
	s, err := b.NewStream("cuda:0")
	require.NoError(t, err)
	const n = 256 << 20
	for round := range 4 {
		src, err := b.Allocate(ctx, "cuda:0", n)
		require.NoError(t, err)
		dst, err := b.Allocate(ctx, "pinned-host", n)
		require.NoError(t, err)
		for range 4 {
			require.NoError(t, s.CopyAsync(dst, src))
		}
		require.NoError(t, b.Free(src), "round %d", round)
		require.NoError(t, b.Free(dst))
		ev, err := s.Record()
		require.NoError(t, err)
		if err := ev.Wait(ctx); err != nil {
			// Copies not yet issued when their buffer was freed fail with
			// ErrFreed; nothing else may fail.
			require.ErrorIs(t, err, cuda.ErrFreed)
		}
	}
	require.NoError(t, s.Close())
}

func TestErrorNames(t *testing.T) {
	b := newBackend(t, nil)
	defer func() { require.NoError(t, b.Close()) }()
	_, err := b.Allocate(ctx, "cuda:0", 1<<62)
	var ce *cu.Error
	require.True(t, errors.As(err, &ce), "%v", err)
	assert.True(t, strings.HasPrefix(ce.Name, "CUDA_ERROR_"), ce.Name)
	assert.NotEmpty(t, ce.Op)
}
