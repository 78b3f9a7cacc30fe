package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/residency-go/residency/data"
	"github.com/residency-go/residency/internal/offload"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// demo offload: a KV-cache offload driven by a real LLM serving trace
// (TIMESTAMP, ContextTokens, GeneratedTokens per request), run by package
// internal/offload: each request's KV blocks are saved through a staging
// pipeline on the soft backend (a simulation in Go memory: every byte is
// real, no GPU is used), with arrivals replayed on a compressed clock.
// This file holds the flags and the printing of the report: what was
// offloaded, the copy queue's depth over time, budget flushes, drops by
// reason, and the runtime's budgets checked on every sample.

// defaultTrace names the trace built into the command (package data),
// which runs when --trace is not given, from any working directory.
const defaultTrace = data.AzureConvTraceName + " (built in)"

func offloadMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("offload", flag.ContinueOnError)
	var cfg offload.Config
	var limit int
	var asJSON bool
	fs.StringVar(&cfg.Trace, "trace", "", "the trace: a CSV `file` of TIMESTAMP, ContextTokens, GeneratedTokens (default: "+defaultTrace+")")
	fs.Int64Var(&cfg.BytesPerToken, "bytes-per-token", 64, "KV bytes per token here (each stands for 512 KiB of a 7B fp16 model)")
	fs.Float64Var(&cfg.Speed, "speed", 600, "time compression: trace seconds per second of the run (finite, > 0; the run may wait at most 24 h)")
	fs.IntVar(&limit, "limit", 0, "replay only the first N requests (0: all)")
	fs.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: demo offload [--trace FILE] [--bytes-per-token N] [--speed X] [--limit N] [--json]\n\nProgress goes to standard error while the trace is replayed. Flags:")
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
	case cfg.BytesPerToken < 1 || cfg.BytesPerToken > offload.RealBytesPerToken:
		fmt.Fprintf(stderr, "demo offload: --bytes-per-token must be 1 to %d\n", offload.RealBytesPerToken)
		return 2
	case !(cfg.Speed > 0) || math.IsInf(cfg.Speed, 0):
		fmt.Fprintf(stderr, "demo offload: --speed %v: want a finite number > 0\n", cfg.Speed)
		return 2
	case limit < 0:
		fmt.Fprintf(stderr, "demo offload: --limit %d: want a number of requests ≥ 0 (0: all)\n", limit)
		return 2
	}
	rows, err := readOffloadTrace(&cfg, limit)
	if err != nil {
		fmt.Fprintf(stderr, "demo offload: %s\n", escapeText(err.Error()))
		return 2
	}
	cfg.Progress = stderr
	rep, err := offload.Run(ctx, cfg, rows)
	var inv *system.InvalidInputError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "demo offload: interrupted")
		return exitInterrupted
	case errors.As(err, &inv):
		fmt.Fprintf(stderr, "demo %s (%s)\n", escapeText(inv.Message), escapeText(cfg.Trace))
		return 2
	default:
		fmt.Fprintf(stderr, "demo offload: %v\n", err)
		return 1
	}
	if asJSON {
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

// readOffloadTrace reads the first limit rows (0: all) of cfg.Trace, or
// of the built-in trace when it is "" (cfg.Trace then names it). Its
// errors name the file.
func readOffloadTrace(cfg *offload.Config, limit int) ([]offload.Row, error) {
	var r io.Reader
	if cfg.Trace == "" {
		cfg.Trace = defaultTrace
		r = bytes.NewReader(data.AzureConvTrace)
	} else {
		f, err := os.Open(cfg.Trace)
		if err != nil {
			return nil, err // a *PathError: it names the file
		}
		defer f.Close()
		r = f
	}
	rows, err := offload.ReadTrace(r, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Trace, err)
	}
	return rows, nil
}

func printOffload(w io.Writer, r *offload.Report) {
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
		formatBytes(r.BytesPerToken), formatBytes(r.StandsForPerTok), r.Scale, offload.BlockTokens)
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
