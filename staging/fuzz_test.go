package staging_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// FuzzAppendStage drives Stage and Append with arbitrary arguments (the
// step's size, each row's key, slot and offset, the join mode, a
// try-reserve): every call either succeeds or is refused with a
// configuration error, a drop or an append refusal; no argument fails the
// pipeline or panics it, and an accepted row reads back from the pool
// with the save's bytes after its task is written.
func FuzzAppendStage(f *testing.F) {
	f.Add(false, uint16(2*rowBytes), "k", int64(1), int64(rowBytes), false)
	f.Add(true, uint16(2*rowBytes), "v", int64(3), int64(0), true)
	f.Add(false, uint16(rowBytes), "k", int64(0), int64(9223372036854775807), false)
	f.Add(true, uint16(rowBytes), "k", int64(-1), int64(-9223372036854775808), false)
	f.Add(false, uint16(0), "x", int64(1<<40), int64(1<<62), false)
	f.Add(true, uint16(65535), "v", int64(31), int64(9223372036854775807-rowBytes+1), true)
	rt := newRuntime(f, 0, soft.Config{})
	f.Fuzz(func(t *testing.T, onFinish bool, size uint16, key string, slot, offset int64, noWait bool) {
		ctx := context.Background()
		p, err := staging.New(ctx, rt, baseConfig())
		require.NoError(t, err)
		defer func() { require.NoError(t, p.Close(ctx)) }()
		data := make([]byte, int(size)%(20*rowBytes))
		for i := range data {
			data[i] = byte(i*7 + 1)
		}
		var dev cuda.Buffer // nil: a leftover-only save
		if len(data) > 0 {
			dev, err = rt.be.Allocate(ctx, "cuda:0", int64(len(data)))
			require.NoError(t, err)
			defer func() { _ = rt.be.Free(dev) }()
			require.NoError(t, rt.be.Write(ctx, dev, data))
		}
		mode := staging.JoinNextStep
		if onFinish {
			mode = staging.JoinOnFinish
		}
		task, err := p.Open(ctx, staging.TaskSpec{ReqID: "r", Mode: mode})
		require.NoError(t, err)
		c := staging.Chunk{Rows: []staging.Row{{Key: key, Slot: int(slot), Offset: offset}}, NoWait: noWait}
		if onFinish {
			c.Device = dev
		} else {
			step, err := p.Stage(ctx, dev, nil)
			if err != nil {
				require.ErrorIs(t, err, staging.ErrConfig)
				return
			}
			defer func() { require.NoError(t, step.Release()) }()
			c.Step = step
		}
		err = task.Append(ctx, c)
		require.NoError(t, p.Submit(ctx, task))
		require.NoError(t, task.Wait(ctx))
		require.NoError(t, p.Err())
		if err != nil {
			var drop *staging.DropError
			require.True(t, errors.Is(err, staging.ErrConfig) || errors.As(err, &drop), "%v", err)
			return
		}
		row, err := p.ReadPool(key, int(slot))
		require.NoError(t, err)
		require.Equal(t, data[offset:offset+rowBytes], row)
	})
}
