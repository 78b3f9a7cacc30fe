package staging_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// compute simulates a kernel producing a step: it copies src into a fresh
// device buffer on a compute stream and returns that buffer with the
// freeze event recorded after the copy. Until the event completes the
// buffer may still hold zeros.
func (f *fixture) compute(st cuda.Stream, data []byte) (cuda.Buffer, cuda.Event) {
	f.t.Helper()
	src := f.device(data)
	dst, err := f.rt.be.Allocate(f.ctx, "cuda:0", int64(len(data)))
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = f.rt.be.Free(dst) })
	require.NoError(f.t, st.CopyAsync(dst, src))
	ev, err := st.Record()
	require.NoError(f.t, err)
	return dst, ev
}

type rk struct {
	key  string
	slot int
}

// TestBytesExactBothModes writes random rows through both join modes, with
// reassigned rows, slots written twice by one task, deferred tasks flushed
// by budget pressure and refused appends, and checks that the CPU block
// pool holds exactly the bytes of the newest write of every row.
func TestBytesExactBothModes(t *testing.T) {
	for _, eager := range []bool{false, true} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			cfg := baseConfig()
			cfg.Eager = eager
			cfg.Slots = 3
			cfg.ClaimTimeout = 10 * time.Second
			cfg.CloneBudgetBytes = 24 * rowBytes // small: budget pressure flushes
			f := newFixture(t, cfg, nil)
			st, err := f.rt.be.NewStream("cuda:0")
			require.NoError(t, err)
			defer st.Close()
			r := rand.New(rand.NewPCG(1, uint64(len(cfg.Keys))))
			want := map[rk][]byte{}
			var all []*staging.Task
			var open []*staging.Task // deferred tasks still pending
			for i := range 300 {
				n := 1 + r.IntN(8)
				data := randBytes(r, n*rowBytes)
				rows := make([]staging.Row, n)
				for j := range rows {
					rows[j] = staging.Row{Key: cfg.Keys[r.IntN(len(cfg.Keys))], Slot: r.IntN(cfg.PoolSlots), Offset: int64(j) * rowBytes}
				}
				dev, freeze := f.compute(st, data)
				if r.IntN(2) == 0 {
					step, err := f.p.Stage(f.ctx, dev, freeze)
					require.NoError(t, err)
					task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: fmt.Sprint("r", i), Mode: staging.JoinNextStep})
					require.NoError(t, err)
					require.NoError(t, task.Append(f.ctx, staging.Chunk{Step: step, Rows: rows}))
					require.NoError(t, f.p.Submit(f.ctx, task))
					require.NoError(t, step.Release())
					all = append(all, task)
				} else {
					var task *staging.Task
					if len(open) > 0 && r.IntN(3) > 0 {
						task = open[r.IntN(len(open))]
					}
					chunk := staging.Chunk{Device: dev, Freeze: freeze, Rows: rows}
					err := errors.New("no task")
					if task != nil {
						err = task.Append(f.ctx, chunk)
					}
					var refused *staging.AppendRefusedError
					if err != nil {
						if task != nil {
							require.ErrorAs(t, err, &refused)
						}
						task, err = f.p.Open(f.ctx, staging.TaskSpec{ReqID: fmt.Sprint("r", i), Mode: staging.JoinOnFinish})
						require.NoError(t, err)
						require.NoError(t, task.Append(f.ctx, chunk))
						open = append(open, task)
						all = append(all, task)
					}
					if r.IntN(4) == 0 {
						require.NoError(t, f.p.Submit(f.ctx, task))
					}
				}
				for j, row := range rows {
					want[rk{row.Key, row.Slot}] = data[j*rowBytes : (j+1)*rowBytes]
				}
			}
			require.NoError(t, f.p.Submit(f.ctx, open...))
			for _, task := range all {
				require.NoError(t, task.Wait(f.ctx), "task %d", task.ID())
			}
			for _, key := range cfg.Keys {
				for s := range cfg.PoolSlots {
					got, err := f.p.ReadPool(key, s)
					require.NoError(t, err)
					exp, ok := want[rk{key, s}]
					if !ok {
						exp = make([]byte, rowBytes)
					}
					require.True(t, bytes.Equal(exp, got), "row (%s, %d) differs", key, s)
				}
			}
			require.Equal(t, int64(0), f.p.Stats().Failed)
			// A written task's clone is released once the clone's own copy
			// event has completed, which may be just after the task is
			// written (dropClone): check the clone bytes after Close, which
			// waits for those releases.
			require.NoError(t, f.p.Close(context.Background()))
			require.Zero(t, f.p.Stats().CloneBytes)
			require.Zero(t, f.rt.reserved("cuda:0"))
			require.Zero(t, f.rt.reserved("pinned-host"))
			require.Zero(t, f.rt.reserved("pageable-host"))
		})
	}
}

// TestFreezeOrderingIsLoadBearing shows that the device→host copy must wait
// for the step's freeze event: with the wait, the pool gets the step's
// bytes even though the kernel that produces them is still running when
// the save is made; without it (a test-only switch) the copy reads the
// buffer before the kernel wrote it and the pool gets different bytes.
func TestFreezeOrderingIsLoadBearing(t *testing.T) {
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprintf("skip-wait=%v", skip), func(t *testing.T) {
			// The first simulated transfer (the kernel's copy) is held until
			// the test releases it; every later one passes at once.
			entered, release := make(chan struct{}), make(chan struct{})
			first := true
			var mu = make(chan struct{}, 1)
			mu <- struct{}{}
			sleep := func(ctx context.Context, _ time.Duration) {
				<-mu
				hold := first
				first = false
				mu <- struct{}{}
				if hold {
					close(entered)
					select {
					case <-release:
					case <-ctx.Done():
					}
				}
			}
			rt := newRuntime(t, 0, soft.Config{BandwidthBytesPerSec: 1, Sleep: sleep})
			cfg := baseConfig()
			if skip {
				staging.SkipFreezeWait(&cfg)
			}
			f := newFixture(t, cfg, rt)
			st, err := rt.be.NewStream("cuda:0")
			require.NoError(t, err)
			defer st.Close()
			data := randBytes(rand.New(rand.NewPCG(7, 7)), 4*rowBytes)
			dev, freeze := f.compute(st, data)
			<-entered // the kernel is running: dev still holds zeros

			step, err := f.p.Stage(f.ctx, dev, freeze)
			require.NoError(t, err)
			task, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "r", Mode: staging.JoinNextStep})
			require.NoError(t, err)
			rows := rowsAt("k", 0, 1, 2, 3)
			require.NoError(t, task.Append(f.ctx, staging.Chunk{Step: step, Rows: rows}))
			require.NoError(t, f.p.Submit(f.ctx, task))
			if skip {
				require.NoError(t, task.Wait(f.ctx)) // written from the unfinished buffer
				close(release)
			} else {
				close(release)
				require.NoError(t, task.Wait(f.ctx))
			}
			require.NoError(t, step.Release())
			var got []byte
			for s := range 4 {
				row, err := f.p.ReadPool("k", s)
				require.NoError(t, err)
				got = append(got, row...)
			}
			if skip {
				require.False(t, bytes.Equal(data, got), "without the freeze wait the pool must not get the step's bytes")
				require.Equal(t, make([]byte, len(data)), got)
			} else {
				require.Equal(t, data, got)
			}
		})
	}
}
