package staging_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/staging"
)

// A row offset so large that offset+RowBytes wraps around 64 bits is
// refused like a negative one, in both join modes, and the pipeline goes
// on writing.
func TestAppendRefusesAnOffsetThatOverflows(t *testing.T) {
	for _, mode := range []staging.JoinMode{staging.JoinNextStep, staging.JoinOnFinish} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, baseConfig(), nil)
			dev := f.device(fill(7, 2*rowBytes))
			task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "r", Mode: mode})
			require.NoError(t, err)
			c := staging.Chunk{Rows: []staging.Row{{Key: "k", Slot: 1, Offset: math.MaxInt64}}}
			if mode == staging.JoinNextStep {
				step, err := f.p.Stage(f.ctx, dev, nil)
				require.NoError(t, err)
				t.Cleanup(func() { _ = step.Release() })
				c.Step = step
			} else {
				c.Device = dev
			}
			require.ErrorIs(t, task.Append(f.ctx, c), staging.ErrConfig)
			c.Rows = []staging.Row{{Key: "k", Slot: 1, Offset: rowBytes}}
			require.NoError(t, task.Append(f.ctx, c))
			require.NoError(t, f.p.Submit(f.ctx, task))
			require.NoError(t, task.Wait(f.ctx))
			row, err := f.p.ReadPool("k", 1)
			require.NoError(t, err)
			require.Equal(t, fill(7, 2*rowBytes)[rowBytes:], row)
			require.NoError(t, f.p.Err())
		})
	}
}
