// Package offload runs the KV-cache offload of `demo offload`: requests of
// an LLM serving trace (TIMESTAMP, ContextTokens, GeneratedTokens), read
// with [ReadTrace], whose KV blocks [Run] saves through a staging pipeline
// on the soft backend (simulated devices in Go memory: every byte is
// real, no GPU is used), with arrivals replayed on a compressed clock.
// The [Report] says what was offloaded, the copy queue's depth over time,
// budget flushes, drops by reason, and the runtime's budgets checked on
// every sample.
package offload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

const (
	// RealBytesPerToken: the KV bytes of one token of a 7B model in fp16
	// (32 layers × 2 (K and V) × 4096 × 2 bytes), which the scaled-down
	// figure of a run stands for.
	RealBytesPerToken = 512 << 10
	BlockTokens       = 16                    // tokens per KV block (one pool row)
	decodePerToken    = 20 * time.Millisecond // trace time per generated token
	sampleEvery       = 10 * time.Second      // trace time between samples
)

// Config is a run's configuration.
type Config struct {
	// Trace names the trace in the report.
	Trace string
	// BytesPerToken is the KV bytes of one token here, 1 to
	// RealBytesPerToken; each stands for RealBytesPerToken / BytesPerToken
	// bytes of a 7B fp16 model, and the budgets are scaled alike.
	BytesPerToken int64
	// Speed is the time compression: trace seconds per second of the run
	// (finite, > 0). The run may wait at most MaxWait for the trace.
	Speed float64
	// Progress, when not nil, receives a line when the run starts (how
	// much trace time it replays, and about how long that takes) and one
	// every ProgressEvery while it runs (default 5 s).
	Progress      io.Writer
	ProgressEvery time.Duration
}

// check refuses a config out of range, or no rows.
func (cfg Config) check(rows []Row) error {
	switch {
	case cfg.BytesPerToken < 1 || cfg.BytesPerToken > RealBytesPerToken:
		return &system.InvalidInputError{Message: fmt.Sprintf("offload: bytes per token %d: want 1 to %d", cfg.BytesPerToken, RealBytesPerToken)}
	case !(cfg.Speed > 0) || math.IsInf(cfg.Speed, 0):
		return &system.InvalidInputError{Message: fmt.Sprintf("offload: speed %v: want a finite number > 0", cfg.Speed)}
	case len(rows) == 0:
		return &system.InvalidInputError{Message: "offload: no requests to run"}
	}
	return cfg.checkSpan(rows)
}

// runner is one run of the offload demo: the runtime and pipeline it
// drives, the trace clock, and the counters its request goroutines share.
type runner struct {
	ctx       context.Context
	cfg       Config
	sys       *system.System
	backend   cuda.Backend
	p         *staging.Pipeline
	rep       *Report
	rowBytes  int64
	poolSlots int
	start     time.Time

	wg   sync.WaitGroup // request goroutines
	bufs sync.WaitGroup // device buffers freed once their task is host-ready

	mu                      sync.Mutex // guards rep's samples and the fields below
	dropped, refusedAppends int64
	firstErr                error
}

// Run replays rows (at least one, in the order of their arrival, as
// [ReadTrace] returns them) through a staging pipeline on the soft
// backend and returns the report. A request with more KV than one
// request may hold is refused, as a server would, and counted. A config
// out of range, no rows, or rows whose replay spans more than
// MaxTraceSpan of trace time or MaxWait of waiting at cfg.Speed is an
// *system.InvalidInputError (nothing runs); the run stops with ctx's
// error when ctx ends.
func Run(ctx context.Context, cfg Config, rows []Row) (*Report, error) {
	if err := cfg.check(rows); err != nil {
		return nil, err
	}
	o, err := start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer o.close()
	o.rep.Requests = len(rows)
	t0 := rows[0].At
	o.rep.TraceSeconds = rows[len(rows)-1].At.Sub(t0).Seconds()
	cpu0, cpuKnown := processCPU()
	o.start = time.Now()
	stopSampler := o.startSampler()
	prog := o.startProgress(len(rows), cfg.spanSeconds(rows))
	defer prog.end()
	var tokens, kvBytes int64
	nextSlot := 0
	for i, r := range rows {
		arrive := r.At.Sub(t0)
		if !o.sleepUntil(arrive) {
			break
		}
		prog.arrived.Add(1)
		ctxBlocks := int((r.Context + BlockTokens - 1) / BlockTokens)
		blocks, ok := admitted(r, o.rowBytes, o.rep.MaxRequestBytes)
		allBlocks := int(blocks)
		if !ok {
			// More KV than the GPU can hold for one request: a server
			// refuses it. Nothing of it is allocated.
			o.rep.RequestsRefused++
			o.rep.RefusedBytes += blocks * o.rowBytes
			continue
		}
		slot0 := nextSlot
		nextSlot = (nextSlot + allBlocks) % o.poolSlots
		tokens += r.Context + r.Gen
		kvBytes += int64(allBlocks) * o.rowBytes
		finish := arrive + time.Duration(r.Gen)*decodePerToken
		o.wg.Add(1)
		go o.request(fmt.Sprintf("req-%d", i+1), slot0, ctxBlocks, allBlocks, finish)
	}
	liveAtLast := 0
	for _, n := range o.p.Stats().Tasks {
		liveAtLast += n
	}
	o.wg.Wait()
	prog.end()
	stopSampler()
	if err := o.p.Close(context.WithoutCancel(ctx)); err != nil && o.firstErr == nil {
		o.firstErr = err
	}
	o.bufs.Wait()
	o.sample() // after Close: the pipeline's reservations are gone
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if o.firstErr != nil {
		return nil, o.firstErr
	}
	rep := o.rep
	rep.WallSeconds = time.Since(o.start).Seconds()
	rep.BehindSeconds = max(rep.WallSeconds-rep.TraceSeconds/cfg.Speed, 0)
	rep.LiveAtLastArrival = liveAtLast
	rep.CPUSeconds = -1
	if cpu1, ok := processCPU(); ok && cpuKnown {
		rep.CPUSeconds = (cpu1 - cpu0).Seconds()
	}
	rep.Tokens, rep.KVBytes, rep.DroppedBytes, rep.AppendsRefused = tokens, kvBytes, o.dropped, o.refusedAppends
	if err := o.finishReport(); err != nil {
		return nil, err
	}
	return rep, nil
}

// start starts the runtime and the pipeline of a run. Budgets are
// scaled like the KV bytes: an 80 GiB GPU with 14 GiB of weights and a
// 16 GiB clone budget, 64 GiB of pinned and 192 GiB of pageable host
// memory, a 128 GiB CPU block pool.
func start(ctx context.Context, cfg Config) (*runner, error) {
	scale := int64(RealBytesPerToken) / cfg.BytesPerToken
	rowBytes, maxRequestBytes := cfg.limits()
	gib := func(n int64) int64 { return n << 30 / scale }
	poolSlots := int(gib(128) / rowBytes)
	locs := []system.LocationConfig{
		system.Limit("pageable-host", gib(192)), system.Limit("pinned-host", gib(64)),
		system.Limit("cuda:0", gib(80)),
	}
	backend, err := openBackend(locs) // simulated devices, asked for by name
	if err != nil {
		return nil, err
	}
	sys, err := system.Start(ctx, system.Options{ManagerID: "offload", DisableTrace: true, Locations: locs, Backend: backend})
	if err != nil {
		backend.Close()
		return nil, err
	}
	o := &runner{ctx: ctx, cfg: cfg, sys: sys, backend: backend, rowBytes: rowBytes, poolSlots: poolSlots}
	if err := sys.Reserve(ctx, "cuda:0", "model-weights", gib(14)); err != nil {
		o.close()
		return nil, err
	}
	o.p, err = staging.New(ctx, sys, staging.Config{
		Name: "offload", Device: "cuda:0", Slots: 1, SlotBytes: rowBytes,
		Keys: []string{"kv"}, PoolSlots: poolSlots, RowBytes: rowBytes, CloneBudgetBytes: gib(16),
	})
	if err != nil {
		o.close()
		return nil, err
	}
	o.rep = &Report{
		Simulation: "soft backend: cuda:0 and pinned-host are simulated in Go memory (real bytes, goroutine streams); no GPU is used and the times say nothing about real hardware",
		Trace:      cfg.Trace, Speed: cfg.Speed,
		BytesPerToken: cfg.BytesPerToken, StandsForPerTok: RealBytesPerToken, Scale: scale,
		CloneBudgetBytes: gib(16), MaxRequestBytes: maxRequestBytes, MaxQueue: map[string]int{},
	}
	return o, nil
}

// close closes the runtime, then the backend it ran on.
func (o *runner) close() {
	o.sys.Close(context.WithoutCancel(o.ctx))
	o.backend.Close()
}

// traceNow is the trace time elapsed since the run started.
func (o *runner) traceNow() time.Duration {
	return scaleDuration(time.Since(o.start), o.cfg.Speed)
}

// sleepUntil waits for trace time at; false when the run's context ended.
func (o *runner) sleepUntil(at time.Duration) bool {
	d := scaleDuration(at-o.traceNow(), 1/o.cfg.Speed)
	if d <= 0 {
		return o.ctx.Err() == nil
	}
	select {
	case <-o.ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// sample records live tasks by state, and checks every location's used +
// reserved against its budget.
func (o *runner) sample() {
	st := o.p.Stats()
	q := QueueSample{TraceSeconds: o.traceNow().Seconds(), Pending: st.Tasks[staging.Pending], Queued: st.Tasks[staging.Queued],
		Copying: st.Tasks[staging.Copying], HostReady: st.Tasks[staging.HostReady], CloneBytes: st.CloneBytes}
	snap, err := o.sys.Snapshot(context.WithoutCancel(o.ctx))
	o.mu.Lock()
	defer o.mu.Unlock()
	rep := o.rep
	rep.Samples++
	rep.Queue = append(rep.Queue, q)
	for k, v := range map[string]int{"pending": q.Pending, "queued": q.Queued, "copying": q.Copying, "host_ready": q.HostReady} {
		rep.MaxQueue[k] = max(rep.MaxQueue[k], v)
	}
	if err != nil {
		rep.BudgetViolations++ // no snapshot: nothing checked, counted against the run
		return
	}
	for _, l := range snap.Locations {
		if l.HasBudget && l.UsedBytes+l.ReservedBytes > l.BudgetBytes {
			rep.BudgetViolations++
		}
	}
}

// startSampler samples on a ticker until the returned stop is called.
func (o *runner) startSampler() (stop func()) {
	stopCh := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(max(scaleDuration(sampleEvery, 1/o.cfg.Speed), time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-stopCh:
				return
			case <-tick.C:
				o.sample()
			}
		}
	}()
	return func() { close(stopCh); <-done }
}

func (o *runner) fail(err error) {
	o.mu.Lock()
	if o.firstErr == nil {
		o.firstErr = err
	}
	o.mu.Unlock()
}

// save appends blocks [slot0, slot0+n) of a request as one chunk of task
// t: a device buffer of just those rows, cloned on the device. The buffer
// is freed once the task's copy stage is over (the clone was copied from
// it by then).
func (o *runner) save(t *staging.Task, slot0, n int, noWait bool) error {
	if n == 0 {
		return nil
	}
	be := o.sys.Backend()
	dev, err := be.Allocate(o.ctx, "cuda:0", int64(n)*o.rowBytes)
	if err != nil {
		return err
	}
	rows := make([]staging.Row, n)
	for i := range rows {
		rows[i] = staging.Row{Key: "kv", Slot: (slot0 + i) % o.poolSlots, Offset: int64(i) * o.rowBytes}
	}
	if err := t.Append(o.ctx, staging.Chunk{Device: dev, Rows: rows, NoWait: noWait}); err != nil {
		_ = be.Free(dev) // nothing was cloned from it
		return err
	}
	o.bufs.Add(1)
	go func() {
		defer o.bufs.Done()
		_ = t.WaitHostReady(context.WithoutCancel(o.ctx))
		_ = be.Free(dev)
	}()
	return nil
}

// request runs one request of the trace: its prefill's KV is saved at
// once, its decode's when it finishes at trace time finish.
func (o *runner) request(req string, slot0, ctxBlocks, allBlocks int, finish time.Duration) {
	defer o.wg.Done()
	// The prefill's KV (the context's blocks) is saved at once and must be
	// kept: a full clone budget flushes the oldest deferred save and waits.
	// JOIN_ON_FINISH: the task is submitted when the request finishes.
	t, err := o.p.Open(o.ctx, staging.TaskSpec{ReqID: req, WriteN: 1, Mode: staging.JoinOnFinish})
	if err != nil {
		o.fail(err)
		return
	}
	if err := o.save(t, slot0, ctxBlocks, false); err != nil {
		o.fail(fmt.Errorf("%s: prefill save: %w", req, err))
		return
	}
	if !o.sleepUntil(finish) {
		return
	}
	// The decode's blocks are saved when the request finishes, as a
	// try-reserve: with no room they are dropped (recomputed later), the
	// model is not held up. A task already flushed refuses the chunk: a
	// second write of the request takes it.
	rest := allBlocks - ctxBlocks
	err = o.save(t, slot0+ctxBlocks, rest, true)
	var refusedErr *staging.AppendRefusedError
	tasks := []*staging.Task{t}
	if errors.As(err, &refusedErr) {
		o.mu.Lock()
		o.refusedAppends++
		o.mu.Unlock()
		t2, oerr := o.p.Open(o.ctx, staging.TaskSpec{ReqID: req, WriteN: 2, Mode: staging.JoinOnFinish})
		if oerr != nil {
			o.fail(oerr)
			return
		}
		err = o.save(t2, slot0+ctxBlocks, rest, true)
		tasks = append(tasks, t2)
	}
	var drop *staging.DropError
	switch {
	case errors.As(err, &drop):
		o.mu.Lock()
		o.dropped += int64(rest) * o.rowBytes
		o.mu.Unlock()
	case err != nil:
		o.fail(fmt.Errorf("%s: decode save: %w", req, err))
	}
	if err := o.p.Submit(o.ctx, tasks...); err != nil {
		o.fail(err)
	}
}

// finishReport fills the report's pipeline statistics and budget peaks.
func (o *runner) finishReport() error {
	rep := o.rep
	st := o.p.Stats()
	rep.OffloadedBytes = st.CommittedBytes
	rep.TasksOpened, rep.TasksWritten, rep.TasksFailed = st.Opened, st.Written, st.Failed
	rep.Flushes, rep.PeakCloneBytes = st.Flushes, st.PeakCloneBytes
	rep.Drops = map[string]int64{staging.DropBudget: st.Drops[staging.DropBudget], staging.DropLocation: st.Drops[staging.DropLocation]}
	snap, err := o.sys.Snapshot(o.ctx)
	if err != nil {
		return err
	}
	for _, l := range snap.Locations {
		rep.Budgets = append(rep.Budgets, BudgetPeak{Location: l.Location, Budget: l.BudgetBytes, PeakBytes: l.PeakBytes})
	}
	return nil
}

// scaleDuration is d×f, saturated to the range of a Duration (a speed
// far from 1 cannot wrap a time around).
func scaleDuration(d time.Duration, f float64) time.Duration {
	x := float64(d) * f
	switch {
	case x != x: // NaN
		return 0
	case x >= math.MaxInt64:
		return math.MaxInt64
	case x <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(x)
}

// openBackend opens the soft backend for locs (system.SoftBackend), behind
// the fault injector, as every runtime of the demo runs. The caller
// closes it after the runtime.
func openBackend(locs []system.LocationConfig) (*faulty.Backend, error) {
	b, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		return nil, err
	}
	return faulty.Wrap(b, soft.ErrorPrefix), nil
}
