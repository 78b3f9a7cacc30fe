package staging_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// TestStressProducersWithCopyFailures: 8 producers × 1,000 saves (both join
// modes, budget pressure, try-reserves) with 2% injected copy failures. A
// failure poisons its pipeline, so the producers replace a failed pipeline
// with a fresh one, as an application would. At the end: every waiter has
// returned, no slot, budget byte, reservation or buffer is left, and no
// goroutine (goleak in TestMain).
func TestStressProducersWithCopyFailures(t *testing.T) {
	const producers, saves = 8, 1000
	rt := newRuntime(t, 0, soft.Config{})
	cfg := baseConfig()
	cfg.Slots = 8
	cfg.ClaimTimeout = 30 * time.Second
	cfg.PoolSlots = 64
	cfg.CloneBudgetBytes = 32 * rowBytes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var (
		mu        sync.Mutex
		cur       *staging.Pipeline
		gen       int
		pipelines []*staging.Pipeline
		listMu    sync.Mutex
	)
	open := func() {
		gen++
		c := cfg
		c.Name = fmt.Sprint("stress-", gen)
		p, err := staging.New(ctx, rt, c)
		require.NoError(t, err)
		cur = p
		listMu.Lock()
		pipelines = append(pipelines, p)
		listMu.Unlock()
	}
	open()
	stopDump := make(chan struct{})
	defer close(stopDump)
	go func() {
		select {
		case <-stopDump:
			return
		case <-time.After(20 * time.Second):
		}
		listMu.Lock()
		ps := append([]*staging.Pipeline(nil), pipelines...)
		listMu.Unlock()
		for i, p := range ps {
			st := p.Stats()
			t.Logf("still running after 20s; pipeline %d: tasks %v free %d holders %d clone %d failure %v", i, st.Tasks, st.FreeSlots, st.SlotHolders, st.CloneBytes, st.Failure)
		}
	}()
	current := func() *staging.Pipeline { mu.Lock(); defer mu.Unlock(); return cur }
	replace := func(p *staging.Pipeline) {
		mu.Lock()
		defer mu.Unlock()
		if cur == p {
			_ = p.Close(ctx)
			open()
		}
	}
	retire := func(err error) bool { // the pipeline failed or closed: use a new one
		var failed *staging.FailedError
		return errors.As(err, &failed) || errors.Is(err, staging.ErrClosed)
	}

	var injected, drops, waited atomic.Int64
	var allMu sync.Mutex
	var all []*staging.Task
	var wg sync.WaitGroup
	for w := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			data := randBytes(r, 4*rowBytes)
			dev, err := rt.be.Allocate(ctx, "cuda:0", int64(len(data)))
			if !assert.NoError(t, err) {
				return
			}
			defer rt.be.Free(dev)
			_ = rt.be.Write(ctx, dev, data)
			var deferred []*staging.Task
			var deferredOn *staging.Pipeline
			for i := 0; i < saves; i++ {
				if r.IntN(50) == 0 {
					rt.be.Faults().Arm(cuda.FaultCopy, "pinned-host")
					injected.Add(1)
				}
				p := current()
				if p != deferredOn {
					deferred, deferredOn = deferred[:0], p // the old pipeline's Close wrote them
				}
				base := (w * 8) % cfg.PoolSlots
				rows := []staging.Row{{Key: "k", Slot: base + r.IntN(8), Offset: 0}, {Key: "v", Slot: base + r.IntN(8), Offset: rowBytes}}
				var task *staging.Task
				err := func() error {
					if r.IntN(2) == 0 {
						step, err := p.Stage(ctx, dev, nil)
						if err != nil {
							return err
						}
						defer step.Release()
						if task, err = p.Open(ctx, staging.TaskSpec{ReqID: fmt.Sprint(w), WriteN: i, Mode: staging.JoinNextStep}); err != nil {
							return err
						}
						if err := task.Append(ctx, staging.Chunk{Step: step, Rows: rows}); err != nil {
							return err
						}
						return p.Submit(ctx, task)
					}
					var err error
					if task, err = p.Open(ctx, staging.TaskSpec{ReqID: fmt.Sprint(w), WriteN: i, Mode: staging.JoinOnFinish}); err != nil {
						return err
					}
					err = task.Append(ctx, staging.Chunk{Device: dev, Rows: rows, NoWait: r.IntN(5) == 0})
					if errors.Is(err, staging.ErrDropped) {
						drops.Add(1)
						return p.Submit(ctx, task) // an empty write
					}
					if err != nil {
						return err
					}
					deferred = append(deferred, task)
					if len(deferred) > 3 {
						err = p.Submit(ctx, deferred...)
						deferred = deferred[:0]
					}
					return err
				}()
				if task != nil {
					allMu.Lock()
					all = append(all, task)
					allMu.Unlock()
					if i%10 == 0 && task.State() != staging.Pending { // not a deferred task this producer submits later
						_ = task.Wait(ctx) // a waiter; it must return
						waited.Add(1)
					}
				}
				if err != nil {
					if retire(err) {
						deferred = deferred[:0]
						replace(p)
						continue
					}
					assert.NoError(t, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	require.NoError(t, cur.Close(ctx))
	mu.Unlock()

	var written, failed int64
	for _, p := range pipelines {
		st := p.Stats()
		written += st.Written
		failed += st.Failed
		assert.Equal(t, cfg.Slots, st.FreeSlots)
		assert.Zero(t, st.SlotHolders)
		assert.Zero(t, st.CloneBytes)
	}
	for _, task := range all {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		require.NotErrorIs(t, task.Wait(wctx), context.DeadlineExceeded, "task %d: every waiter returns", task.ID())
		cancel()
		assert.True(t, task.State().Terminal())
	}
	for _, loc := range []string{"cuda:0", "pinned-host", "pageable-host"} {
		assert.Zero(t, rt.reserved(loc), "reservations left at %s", loc)
		mi, err := rt.be.MemInfo(loc)
		require.NoError(t, err)
		assert.Zero(t, mi.UsedBytes, "buffers left at %s", loc)
	}
	require.Greater(t, failed, int64(0))
	t.Logf("%d producers × %d saves: %d tasks, %d written, %d failed, %d pipelines, %d faults armed, %d drops, %d waits",
		producers, saves, len(all), written, failed, len(pipelines), injected.Load(), drops.Load(), waited.Load())
}
