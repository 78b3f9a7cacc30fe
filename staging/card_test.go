package staging_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

var _ staging.LocationAllocator = (*system.System)(nil)

// countingBackend counts the allocations and frees made on a backend,
// and those made from outside a location actor's Receive (the pipeline's
// own, or the runtime's).
type countingBackend struct {
	cuda.Backend
	mu            sync.Mutex
	allocs, frees int
	outside       []string // the callers of those made outside a location actor
	byOwnActors   int      // those made by the pipeline's own location actors
	events        []allocEvent
}

// allocEvent is one allocation or free a countingBackend saw.
type allocEvent struct {
	free    bool
	loc     string
	bytes   int64
	inActor bool // made in a location actor's Receive
}

// at returns the events at loc.
func (c *countingBackend) at(loc string) []allocEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []allocEvent
	for _, e := range c.events {
		if e.loc == loc {
			out = append(out, e)
		}
	}
	return out
}

func (c *countingBackend) note(free bool, loc string, bytes int64) {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	var stack strings.Builder
	inActor, own := false, false
	for {
		f, more := frames.Next()
		stack.WriteString(f.Function + "\n")
		if strings.HasSuffix(f.Function, "/actors.(*locationActor).Receive") {
			inActor = true // the runtime's
		}
		if strings.HasSuffix(f.Function, "/actors.(*allocActor).Receive") {
			inActor, own = true, true // the pipeline's own (actors.Allocators)
		}
		if !more {
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if free {
		c.frees++
	} else {
		c.allocs++
	}
	if own {
		c.byOwnActors++
	}
	c.events = append(c.events, allocEvent{free: free, loc: loc, bytes: bytes, inActor: inActor})
	if !inActor && strings.Contains(stack.String(), "residency/staging.") {
		c.outside = append(c.outside, stack.String())
	}
}

func (c *countingBackend) Allocate(ctx context.Context, loc string, n int64) (cuda.Buffer, error) {
	c.note(false, loc, n)
	return c.Backend.Allocate(ctx, loc, n)
}

func (c *countingBackend) Free(buf cuda.Buffer) error {
	c.note(true, buf.Location(), buf.Size())
	return c.Backend.Free(buf)
}

// countingRuntime is a ledgerRuntime whose backend counts.
type countingRuntime struct {
	*ledgerRuntime
	be *countingBackend
}

func (r countingRuntime) Backend() cuda.Backend { return r.be }

// exerciseAllocations runs a JOIN_NEXT_STEP task, a JOIN_ON_FINISH task
// (clone, landing buffer), a step of another size (the slot's buffer is
// reallocated) and Close (every buffer freed) on the pipeline of rt.
func exerciseAllocations(t *testing.T, be cuda.Backend, rt staging.Runtime, eager bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := baseConfig()
	cfg.Eager = eager
	p, err := staging.New(ctx, rt, cfg)
	require.NoError(t, err)
	dev := func(n int) cuda.Buffer {
		b, err := be.Allocate(ctx, "cuda:0", int64(n))
		require.NoError(t, err)
		t.Cleanup(func() { _ = be.Free(b) })
		require.NoError(t, be.Write(ctx, b, fill(9, n)))
		return b
	}
	for _, size := range []int{2 * rowBytes, 4 * rowBytes} {
		step, err := p.Stage(ctx, dev(size), nil)
		require.NoError(t, err)
		next, err := p.Open(ctx, staging.TaskSpec{ReqID: "r", Mode: staging.JoinNextStep})
		require.NoError(t, err)
		require.NoError(t, next.Append(ctx, staging.Chunk{Step: step, Rows: rowsAt("k", 0, 1)}))
		fin, err := p.Open(ctx, staging.TaskSpec{ReqID: "r", Mode: staging.JoinOnFinish})
		require.NoError(t, err)
		require.NoError(t, fin.Append(ctx, staging.Chunk{Device: dev(size), Rows: rowsAt("v", 0, 1)}))
		require.NoError(t, p.Submit(ctx, next, fin))
		require.NoError(t, next.Wait(ctx))
		require.NoError(t, fin.Wait(ctx))
		require.NoError(t, step.Release())
	}
	require.NoError(t, p.Close(ctx))
}

// poolEvents are what a counting backend sees at the pool's location
// (pageable-host, where nothing else of the pipeline is allocated) over
// exerciseAllocations: one allocation of the CPU block pool of
// baseConfig, and one free of it, both in a location actor.
func poolEvents() []allocEvent {
	cfg := baseConfig()
	n := int64(len(cfg.Keys)) * int64(cfg.PoolSlots) * cfg.RowBytes
	return []allocEvent{
		{loc: "pageable-host", bytes: n, inActor: true},
		{free: true, loc: "pageable-host", bytes: n, inActor: true},
	}
}

// Every buffer the pipeline allocates or frees on the backend goes
// through a location actor: the pipeline's own on a runtime without
// location actors, the runtime's on *system.System. The CPU block pool
// is one of them: a buffer at the host location, allocated by New and
// freed by Close, once each.
func TestCardNoAllocationOutsideALocationActor(t *testing.T) {
	for _, eager := range []bool{false, true} {
		name := "queued"
		if eager {
			name = "eager"
		}
		t.Run(name+"/own-location-actors", func(t *testing.T) {
			lr := newRuntime(t, 0, soft.Config{})
			cb := &countingBackend{Backend: lr.be}
			exerciseAllocations(t, cb, countingRuntime{ledgerRuntime: lr, be: cb}, eager)
			assert.Equal(t, poolEvents(), cb.at("pageable-host"), "the pool")
			cb.mu.Lock()
			defer cb.mu.Unlock()
			assert.Empty(t, cb.outside)
			assert.GreaterOrEqual(t, cb.allocs, 6, "slots, clones and landing buffers were allocated")
		})
		t.Run(name+"/runtime-location-actors", func(t *testing.T) {
			ctx := context.Background()
			locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.NoLimit("pinned-host"), system.Limit("cuda:0", 1<<20)}
			be, err := system.SoftBackend(locs, soft.Config{})
			require.NoError(t, err)
			cb := &countingBackend{Backend: be}
			sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: cb})
			require.NoError(t, err)
			defer func() { require.NoError(t, sys.Close(ctx)) }()
			exerciseAllocations(t, cb, sys, eager)
			assert.Equal(t, poolEvents(), cb.at("pageable-host"), "the pool")
			cb.mu.Lock()
			defer cb.mu.Unlock()
			assert.Empty(t, cb.outside)
			assert.GreaterOrEqual(t, cb.allocs, 6)
			assert.Zero(t, cb.byOwnActors, "the runtime's location actors, not the pipeline's")
		})
	}
}
