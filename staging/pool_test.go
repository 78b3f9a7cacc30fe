package staging_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// poolBytes is the size of baseConfig's CPU block pool.
func poolBytes() int64 {
	cfg := baseConfig()
	return int64(len(cfg.Keys)) * int64(cfg.PoolSlots) * cfg.RowBytes
}

// usedAt is the bytes of the live buffers of the backend at loc.
func usedAt(t *testing.T, be cuda.Backend, loc string) int64 {
	t.Helper()
	mi, err := be.MemInfo(loc)
	require.NoError(t, err)
	return mi.UsedBytes
}

// The CPU block pool is a buffer of the backend at the host location,
// allocated by New and freed by Close through the host location's actor.
// Its rows are read and written through its host view, in place, not
// through Backend.Load: a reconstruction fault armed at the host location
// fails no pool write or read, and stays armed.
func TestPoolIsAHostBufferOfTheHostLocationActor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lr := newRuntime(t, 0, soft.Config{})
	cb := &countingBackend{Backend: lr.be}
	p, err := staging.New(ctx, countingRuntime{ledgerRuntime: lr, be: cb}, baseConfig())
	require.NoError(t, err)
	require.Equal(t, poolBytes(), usedAt(t, lr.be, "pageable-host"), "the pool is a backend buffer")
	require.Equal(t, []allocEvent{{loc: "pageable-host", bytes: poolBytes(), inActor: true}}, cb.at("pageable-host"))

	lr.be.Faults().Arm(cuda.FaultReconstruct, "pageable-host")
	dev, err := lr.be.Allocate(ctx, "cuda:0", 2*rowBytes)
	require.NoError(t, err)
	defer func() { _ = lr.be.Free(dev) }()
	want := append(fill(3, rowBytes), fill(4, rowBytes)...)
	require.NoError(t, lr.be.Write(ctx, dev, want))
	for _, mode := range []staging.JoinMode{staging.JoinOnFinish, staging.JoinNextStep} {
		task, err := p.Open(ctx, staging.TaskSpec{ReqID: "r", Mode: mode})
		require.NoError(t, err)
		chunk := staging.Chunk{Device: dev, Rows: rowsAt("v", 5, 6)}
		var step *staging.Step
		if mode == staging.JoinNextStep {
			step, err = p.Stage(ctx, dev, nil)
			require.NoError(t, err)
			chunk = staging.Chunk{Step: step, Rows: rowsAt("v", 5, 6)}
		}
		require.NoError(t, task.Append(ctx, chunk))
		require.NoError(t, p.Submit(ctx, task))
		require.NoError(t, task.Wait(ctx), mode)
		if step != nil {
			require.NoError(t, step.Release())
		}
		row, err := task.ReadRow(ctx, "v", 6)
		require.NoError(t, err)
		assert.Equal(t, fill(4, rowBytes), row, mode)
		row, err = p.ReadPool("v", 5)
		require.NoError(t, err)
		assert.Equal(t, fill(3, rowBytes), row, mode)
	}
	assert.Equal(t, 1, lr.be.Faults().Armed(cuda.FaultReconstruct, "pageable-host"), "no pool write or read took the fault")

	require.NoError(t, p.Close(ctx))
	assert.Zero(t, usedAt(t, lr.be, "pageable-host"), "Close freed the pool")
	assert.Equal(t, poolEvents(), cb.at("pageable-host"), "allocated and freed once, each in the location actor")
	_, err = p.ReadPool("v", 5)
	assert.ErrorIs(t, err, staging.ErrClosed)
}

// opaqueHostBackend hands out its host buffers wrapped, without their
// host views: a backend whose host memory the CPU cannot address in place.
type opaqueHostBackend struct{ cuda.Backend }

type opaqueBuffer struct{ cuda.Buffer }

func (b opaqueHostBackend) Allocate(ctx context.Context, loc string, n int64) (cuda.Buffer, error) {
	buf, err := b.Backend.Allocate(ctx, loc, n)
	if err != nil || loc != "pageable-host" {
		return buf, err
	}
	return opaqueBuffer{buf}, nil
}

func (b opaqueHostBackend) Free(buf cuda.Buffer) error {
	if o, ok := buf.(opaqueBuffer); ok {
		buf = o.Buffer
	}
	return b.Backend.Free(buf)
}

// New refuses a pool it cannot have: an allocation the backend refuses
// (an injected allocation fault), a buffer without a host view (ErrConfig
// naming the location: the pool is never Go memory on the side), a host
// location that is a device. Each refusal leaves nothing reserved and
// nothing allocated; a pool buffer allocated before the refusal is freed
// through the location actor that allocated it.
func TestPoolRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clean := func(t *testing.T, lr *ledgerRuntime) {
		t.Helper()
		for _, loc := range []string{"pageable-host", "pinned-host", "cuda:0"} {
			assert.Zero(t, lr.reserved(loc), "reserved at %s", loc)
			assert.Zero(t, usedAt(t, lr.be, loc), "allocated at %s", loc)
		}
	}
	t.Run("allocation fault", func(t *testing.T) {
		lr := newRuntime(t, 0, soft.Config{})
		lr.be.Faults().Arm(cuda.FaultAlloc, "pageable-host")
		_, err := staging.New(ctx, lr, baseConfig())
		require.ErrorIs(t, err, cuda.ErrInjectedFault)
		assert.NotErrorIs(t, err, staging.ErrConfig)
		assert.Contains(t, err.Error(), "CPU block pool")
		clean(t, lr)
	})
	t.Run("no host view", func(t *testing.T) {
		lr := newRuntime(t, 0, soft.Config{})
		cb := &countingBackend{Backend: opaqueHostBackend{lr.be}}
		_, err := staging.New(ctx, countingRuntime{ledgerRuntime: lr, be: cb}, baseConfig())
		require.ErrorIs(t, err, staging.ErrConfig)
		require.ErrorIs(t, err, cuda.ErrNoHostMemory)
		assert.Contains(t, err.Error(), "pageable-host")
		assert.Equal(t, poolEvents(), cb.at("pageable-host"), "the buffer was freed through the location actor")
		clean(t, lr)
	})
	t.Run("device as host", func(t *testing.T) {
		lr := newRuntime(t, 0, soft.Config{})
		cfg := baseConfig()
		cfg.Host = "cuda:0"
		_, err := staging.New(ctx, lr, cfg)
		require.ErrorIs(t, err, staging.ErrConfig)
		assert.Contains(t, err.Error(), "cuda:0")
		clean(t, lr)
	})
}
