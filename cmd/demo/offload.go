package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// demo offload: a KV-cache offload driven by a real LLM serving trace
// (TIMESTAMP, ContextTokens, GeneratedTokens per request). Each request's
// KV blocks are saved through a staging pipeline on the soft backend (a
// simulation in Go memory: every byte is real, no GPU is used), with
// arrivals replayed on a compressed clock, and the run reports what was
// offloaded, the copy queue's depth over time, budget flushes, drops by
// reason, and the runtime's budgets checked on every sample.

const (
	defaultTrace = "data/AzureLLMInferenceTrace_conv.csv"
	// realBytesPerToken: the KV bytes of one token of a 7B model in fp16
	// (32 layers × 2 (K and V) × 4096 × 2 bytes), which the scaled-down
	// figure of a run stands for.
	realBytesPerToken = 512 << 10
	blockTokens       = 16                    // tokens per KV block (one pool row)
	decodePerToken    = 20 * time.Millisecond // trace time per generated token
	sampleEvery       = 10 * time.Second      // trace time between samples
)

// offloadConfig is a run's configuration (flags).
type offloadConfig struct {
	trace         string
	bytesPerToken int64
	speed         float64
	limit         int
	asJSON        bool
}

type traceRow struct {
	at           time.Time
	context, gen int64
}

// Bounds of a trace's input.
const (
	// maxTraceLine bounds one line of a trace; a row is about 40 bytes.
	maxTraceLine = 4 << 10
	// maxRowTokens bounds ContextTokens and GeneratedTokens of one row
	// (far above any model's context; it keeps every sum of a row and
	// its bytes in range).
	maxRowTokens = 1<<31 - 1
)

// readServingTrace reads a trace of the Azure LLM inference format: a
// header, then TIMESTAMP, ContextTokens, GeneratedTokens per line, comma
// separated (a field may be in double quotes; none holds a comma, a quote
// or a line break). limit > 0: the first limit rows. A line longer than
// maxTraceLine, a row of another shape, a bad timestamp, a token count
// that is not an integer 0 to maxRowTokens, or a timestamp that goes back
// in time is an error naming the line. Memory: one line at a time plus
// the rows kept (40 bytes each, and the slice's spare room).
func readServingTrace(r io.Reader, limit int) ([]traceRow, error) {
	br := bufio.NewReaderSize(r, maxTraceLine+2)
	var fields [3][]byte
	lineNo := 0
	// next returns the fields of the next line; ok false at the end.
	next := func() (ok bool, err error) {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			return false, fmt.Errorf("line %d: longer than %d bytes: not a trace of TIMESTAMP,ContextTokens,GeneratedTokens", lineNo+1, maxTraceLine)
		}
		if err != nil && err != io.EOF {
			return false, err
		}
		if err == io.EOF && len(line) == 0 {
			return false, nil
		}
		lineNo++
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if lineNo == 1 {
			line = bytes.TrimPrefix(line, []byte(utf8BOM))
		}
		n := 0
		for rest := line; ; {
			f, tail, more := bytes.Cut(rest, []byte(","))
			if n < len(fields) {
				if len(f) >= 2 && f[0] == '"' && f[len(f)-1] == '"' {
					f = f[1 : len(f)-1]
				}
				fields[n] = f
			}
			n++
			if !more {
				break
			}
			rest = tail
		}
		if n != len(fields) {
			return false, fmt.Errorf("line %d: %d fields, want 3 (TIMESTAMP,ContextTokens,GeneratedTokens)", lineNo, n)
		}
		return true, nil
	}
	ok, err := next()
	if err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	if !ok {
		return nil, errors.New("reading the header: the trace is empty")
	}
	if string(fields[0]) != "TIMESTAMP" || string(fields[1]) != "ContextTokens" || string(fields[2]) != "GeneratedTokens" {
		return nil, fmt.Errorf("the header is %q, want TIMESTAMP,ContextTokens,GeneratedTokens", bytes.Join(fields[:], []byte(",")))
	}
	var rows []traceRow
	for limit <= 0 || len(rows) < limit {
		ok, err := next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		at, err := time.Parse("2006-01-02 15:04:05.9999999", string(fields[0]))
		if err != nil {
			return nil, fmt.Errorf("line %d: timestamp %q: want YYYY-MM-DD hh:mm:ss.fffffff", lineNo, fields[0])
		}
		c, err1 := strconv.ParseInt(string(fields[1]), 10, 64)
		g, err2 := strconv.ParseInt(string(fields[2]), 10, 64)
		if err1 != nil || err2 != nil || c < 0 || g < 0 || c > maxRowTokens || g > maxRowTokens {
			return nil, fmt.Errorf("line %d: token counts %q, %q must be integers 0 to %d", lineNo,
				fields[1], fields[2], int64(maxRowTokens))
		}
		if len(rows) > 0 && at.Before(rows[len(rows)-1].at) {
			return nil, fmt.Errorf("line %d: timestamps go back in time", lineNo)
		}
		rows = append(rows, traceRow{at: at, context: c, gen: g})
	}
	if len(rows) == 0 {
		return nil, errors.New("the trace has no requests")
	}
	return rows, nil
}

// offloadReport is what a run found (the JSON of --json).
type offloadReport struct {
	Simulation       string              `json:"simulation"`
	Trace            string              `json:"trace"`
	Requests         int                 `json:"requests"`
	TraceSeconds     float64             `json:"trace_seconds"`
	Speed            float64             `json:"speed"`
	WallSeconds      float64             `json:"wall_seconds"`
	BytesPerToken    int64               `json:"bytes_per_token"`
	StandsForPerTok  int64               `json:"stands_for_bytes_per_token"`
	Scale            int64               `json:"scale"`
	Tokens           int64               `json:"tokens"`
	KVBytes          int64               `json:"kv_bytes"`
	OffloadedBytes   int64               `json:"offloaded_bytes"`
	DroppedBytes     int64               `json:"dropped_bytes"`
	TasksOpened      int64               `json:"tasks_opened"`
	TasksWritten     int64               `json:"tasks_written"`
	TasksFailed      int64               `json:"tasks_failed"`
	AppendsRefused   int64               `json:"appends_refused"`
	Flushes          int64               `json:"budget_flushes"`
	Drops            map[string]int64    `json:"drops"`
	PeakCloneBytes   int64               `json:"peak_clone_bytes"`
	CloneBudgetBytes int64               `json:"clone_budget_bytes"`
	Budgets          []offloadBudgetJSON `json:"budgets"`
	Samples          int                 `json:"samples"`
	BudgetViolations int                 `json:"budget_violations"`
	MaxQueue         map[string]int      `json:"max_queue"`
	Queue            []queueSample       `json:"queue"`

	// BehindSeconds: how much longer than the trace's span on the run's
	// clock (TraceSeconds / Speed) the run took: the backlog drained after
	// the last arrival. LiveAtLastArrival: the tasks not yet written when
	// the last request arrived. CPUSeconds: the process's CPU time (user +
	// system) over the run, -1 if unknown; far below WallSeconds on a run
	// that is behind, the run waited (for a CPU on a busy machine, or for
	// the copy path's round trips), it did not compute.
	BehindSeconds     float64 `json:"behind_seconds"`
	LiveAtLastArrival int     `json:"live_tasks_at_last_arrival"`
	CPUSeconds        float64 `json:"cpu_seconds"`

	// RequestsRefused: requests whose KV is larger than MaxRequestBytes
	// (the clone budget: the most KV of one request the pipeline can hold
	// on the GPU); a server refuses them, so the run does not start them
	// and counts them here, with their KV in RefusedBytes. Tokens and
	// KVBytes are those of the requests served.
	RequestsRefused int   `json:"requests_refused"`
	RefusedBytes    int64 `json:"refused_kv_bytes"`
	MaxRequestBytes int64 `json:"max_request_kv_bytes"`
}

type offloadBudgetJSON struct {
	Location  string `json:"location"`
	Budget    int64  `json:"budget_bytes"`
	PeakBytes int64  `json:"peak_bytes"`
}

// queueSample: the live tasks by state at one moment of trace time.
type queueSample struct {
	TraceSeconds float64 `json:"trace_seconds"`
	Pending      int     `json:"pending"`
	Queued       int     `json:"queued"`
	Copying      int     `json:"copying"`
	HostReady    int     `json:"host_ready"`
	CloneBytes   int64   `json:"clone_bytes"`
}

func offloadMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("offload", flag.ContinueOnError)
	cfg := offloadConfig{}
	fs.StringVar(&cfg.trace, "trace", defaultTrace, "the trace: a CSV of TIMESTAMP, ContextTokens, GeneratedTokens")
	fs.Int64Var(&cfg.bytesPerToken, "bytes-per-token", 64, "KV bytes per token here (each stands for 512 KiB of a 7B fp16 model)")
	fs.Float64Var(&cfg.speed, "speed", 600, "time compression: trace seconds per second of the run (finite, > 0)")
	fs.IntVar(&cfg.limit, "limit", 0, "replay only the first N requests (0: all)")
	fs.BoolVar(&cfg.asJSON, "json", false, "print the report as one JSON object")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: demo offload [--trace FILE] [--bytes-per-token N] [--speed X] [--limit N] [--json]")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo offload: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	switch {
	case cfg.bytesPerToken < 1 || cfg.bytesPerToken > realBytesPerToken:
		fmt.Fprintf(stderr, "demo offload: --bytes-per-token must be 1 to %d\n", realBytesPerToken)
		return 2
	case !(cfg.speed > 0) || math.IsInf(cfg.speed, 0):
		fmt.Fprintf(stderr, "demo offload: --speed %v: want a finite number > 0\n", cfg.speed)
		return 2
	case cfg.limit < 0:
		fmt.Fprintf(stderr, "demo offload: --limit %d: want a number of requests ≥ 0 (0: all)\n", cfg.limit)
		return 2
	}
	f, err := os.Open(cfg.trace)
	if err != nil {
		fmt.Fprintf(stderr, "demo offload: %v\n", err)
		return 2
	}
	rows, err := readServingTrace(f, cfg.limit)
	f.Close()
	if err != nil {
		fmt.Fprintf(stderr, "demo offload: %s: %v\n", cfg.trace, err)
		return 2
	}
	rep, err := runOffload(ctx, cfg, rows)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "demo offload: interrupted")
			return exitInterrupted
		}
		fmt.Fprintf(stderr, "demo offload: %v\n", err)
		return 1
	}
	if cfg.asJSON {
		b, _ := json.Marshal(rep)
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		printOffload(stdout, rep)
	}
	if rep.BudgetViolations > 0 || rep.TasksFailed > 0 {
		return 1
	}
	return 0
}

// runOffload replays rows through a pipeline and returns the report.
// offloadRun is one run of the offload demo: the runtime and pipeline it
// drives, the trace clock, and the counters its request goroutines share.
type offloadRun struct {
	ctx       context.Context
	cfg       offloadConfig
	sys       *system.System
	backend   cuda.Backend
	p         *staging.Pipeline
	rep       *offloadReport
	rowBytes  int64
	poolSlots int
	start     time.Time

	wg   sync.WaitGroup // request goroutines
	bufs sync.WaitGroup // device buffers freed once their task is host-ready

	mu                      sync.Mutex // guards rep's samples and the fields below
	dropped, refusedAppends int64
	firstErr                error
}

func runOffload(ctx context.Context, cfg offloadConfig, rows []traceRow) (*offloadReport, error) {
	o, err := startOffload(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer o.close()
	o.rep.Requests = len(rows)
	t0 := rows[0].at
	o.rep.TraceSeconds = rows[len(rows)-1].at.Sub(t0).Seconds()
	cpu0, cpuKnown := processCPU()
	o.start = time.Now()
	stopSampler := o.startSampler()
	var tokens, kvBytes int64
	nextSlot := 0
	for i, r := range rows {
		arrive := r.at.Sub(t0)
		if !o.sleepUntil(arrive) {
			break
		}
		ctxBlocks := int((r.context + blockTokens - 1) / blockTokens)
		allBlocks := int((r.context + r.gen + blockTokens - 1) / blockTokens)
		if kv := int64(allBlocks) * o.rowBytes; kv > o.rep.MaxRequestBytes {
			// More KV than the GPU can hold for one request: a server
			// refuses it. Nothing of it is allocated.
			o.rep.RequestsRefused++
			o.rep.RefusedBytes += kv
			continue
		}
		slot0 := nextSlot
		nextSlot = (nextSlot + allBlocks) % o.poolSlots
		tokens += r.context + r.gen
		kvBytes += int64(allBlocks) * o.rowBytes
		finish := arrive + time.Duration(r.gen)*decodePerToken
		o.wg.Add(1)
		go o.request(fmt.Sprintf("req-%d", i+1), slot0, ctxBlocks, allBlocks, finish)
	}
	liveAtLast := 0
	for _, n := range o.p.Stats().Tasks {
		liveAtLast += n
	}
	o.wg.Wait()
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
	rep.BehindSeconds = max(rep.WallSeconds-rep.TraceSeconds/cfg.speed, 0)
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

// startOffload starts the runtime and the pipeline of a run. Budgets are
// scaled like the KV bytes: an 80 GiB GPU with 14 GiB of weights and a
// 16 GiB clone budget, 64 GiB of pinned and 192 GiB of pageable host
// memory, a 128 GiB CPU block pool.
func startOffload(ctx context.Context, cfg offloadConfig) (*offloadRun, error) {
	scale := int64(realBytesPerToken) / cfg.bytesPerToken
	rowBytes := blockTokens * cfg.bytesPerToken
	gib := func(n int64) int64 { return n << 30 / scale }
	poolSlots := int(gib(128) / rowBytes)
	locs := []system.LocationConfig{
		system.Limit("pageable-host", gib(192)), system.Limit("pinned-host", gib(64)),
		system.Limit("cuda:0", gib(80)),
	}
	backend, err := newSoftBackend(locs) // simulated devices, asked for by name
	if err != nil {
		return nil, err
	}
	sys, err := system.Start(ctx, system.Options{ManagerID: "offload", DisableTrace: true, Locations: locs, Backend: backend})
	if err != nil {
		backend.Close()
		return nil, err
	}
	o := &offloadRun{ctx: ctx, cfg: cfg, sys: sys, backend: backend, rowBytes: rowBytes, poolSlots: poolSlots}
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
	o.rep = &offloadReport{
		Simulation: "soft backend: cuda:0 and pinned-host are simulated in Go memory (real bytes, goroutine streams); no GPU is used and the times say nothing about real hardware",
		Trace:      cfg.trace, Speed: cfg.speed,
		BytesPerToken: cfg.bytesPerToken, StandsForPerTok: realBytesPerToken, Scale: scale,
		CloneBudgetBytes: gib(16), MaxRequestBytes: gib(16), MaxQueue: map[string]int{},
	}
	return o, nil
}

// close closes the runtime, then the backend it ran on.
func (o *offloadRun) close() {
	o.sys.Close(context.WithoutCancel(o.ctx))
	o.backend.Close()
}

// traceNow is the trace time elapsed since the run started.
func (o *offloadRun) traceNow() time.Duration {
	return scaleDuration(time.Since(o.start), o.cfg.speed)
}

// sleepUntil waits for trace time at; false when the run's context ended.
func (o *offloadRun) sleepUntil(at time.Duration) bool {
	d := scaleDuration(at-o.traceNow(), 1/o.cfg.speed)
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
func (o *offloadRun) sample() {
	st := o.p.Stats()
	q := queueSample{TraceSeconds: o.traceNow().Seconds(), Pending: st.Tasks[staging.Pending], Queued: st.Tasks[staging.Queued],
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
func (o *offloadRun) startSampler() (stop func()) {
	stopCh := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(max(scaleDuration(sampleEvery, 1/o.cfg.speed), time.Millisecond))
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

func (o *offloadRun) fail(err error) {
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
func (o *offloadRun) save(t *staging.Task, slot0, n int, noWait bool) error {
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
func (o *offloadRun) request(req string, slot0, ctxBlocks, allBlocks int, finish time.Duration) {
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
func (o *offloadRun) finishReport() error {
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
		rep.Budgets = append(rep.Budgets, offloadBudgetJSON{Location: l.Location, Budget: l.BudgetBytes, PeakBytes: l.PeakBytes})
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

func printOffload(w io.Writer, r *offloadReport) {
	big := func(n int64) string { return bytesText(n) + ", standing for " + formatBytes(n*r.Scale) }
	fmt.Fprintf(w, "KV-cache offload of %d requests of %s (%.0f s of trace at %gx: %.1f s here)\n", r.Requests, r.Trace, r.TraceSeconds, r.Speed, r.WallSeconds)
	fmt.Fprintf(w, "simulation: %s\n", r.Simulation)
	cpu := "unknown"
	if r.CPUSeconds >= 0 {
		cpu = fmt.Sprintf("%.1f s", r.CPUSeconds)
	}
	fmt.Fprintf(w, "behind the trace clock at the end: %.1f s (%d tasks not yet written at the last arrival); process CPU time %s in %.1f s of wall time\n",
		r.BehindSeconds, r.LiveAtLastArrival, cpu, r.WallSeconds)
	fmt.Fprintf(w, "KV bytes: (ContextTokens + GeneratedTokens) × %s per token here, standing for %s per token of a 7B fp16 model (1:%d; budgets scaled alike); blocks of %d tokens\n",
		formatBytes(r.BytesPerToken), formatBytes(r.StandsForPerTok), r.Scale, blockTokens)
	fmt.Fprintf(w, "refused %d requests with more KV than one request may hold (the clone budget, %s), as a server would: not started; their KV, %s, is not counted below\n",
		r.RequestsRefused, big(r.MaxRequestBytes), big(r.RefusedBytes))
	fmt.Fprintf(w, "tokens %d, KV %s\n", r.Tokens, big(r.KVBytes))
	fmt.Fprintf(w, "offloaded %s to the CPU block pool; dropped %s; the rest (%s) were pool rows a later request took before they were written (the pool is a ring)\n",
		big(r.OffloadedBytes), big(r.DroppedBytes), bytesText(r.KVBytes-r.OffloadedBytes-r.DroppedBytes))
	fmt.Fprintf(w, "tasks: %d opened, %d written, %d failed; %d decode saves refused by a flushed task (a second write took them)\n", r.TasksOpened, r.TasksWritten, r.TasksFailed, r.AppendsRefused)
	fmt.Fprintf(w, "GPU-byte budget of clones %s, peak %s; %d budget flushes; drops: %d %s, %d %s\n",
		big(r.CloneBudgetBytes), big(r.PeakCloneBytes), r.Flushes, r.Drops[staging.DropBudget], staging.DropBudget, r.Drops[staging.DropLocation], staging.DropLocation)
	fmt.Fprintf(w, "queue depth (max over %d samples): pending %d, queued %d, copying %d, host-ready %d\n",
		r.Samples, r.MaxQueue["pending"], r.MaxQueue["queued"], r.MaxQueue["copying"], r.MaxQueue["host_ready"])
	step := max(len(r.Queue)/12, 1)
	for i := 0; i < len(r.Queue); i += step {
		q := r.Queue[i]
		fmt.Fprintf(w, "  t=%5.0fs  pending %4d  queued %3d  copying %d  host-ready %d  clones %s\n", q.TraceSeconds, q.Pending, q.Queued, q.Copying, q.HostReady, bytesText(q.CloneBytes))
	}
	for _, b := range r.Budgets {
		fmt.Fprintf(w, "%s: budget %s, peak %s\n", b.Location, big(b.Budget), big(b.PeakBytes))
	}
	fmt.Fprintf(w, "budget violations (used + reserved > budget, any location, any sample): %d\n", r.BudgetViolations)
}
