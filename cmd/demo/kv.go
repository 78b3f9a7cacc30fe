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
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/residency-go/residency/data"
	"github.com/residency-go/residency/internal/kvtrace"
)

// demo kv: a prefix-cache planner on KV-cache traces (package
// internal/kvtrace). Each block of the trace is a value sourced at
// pageable-host; each request is one Admit of all its blocks at cuda:0,
// with a spill tier below it, on the soft backend (a simulation). Per GPU
// capacity it prints the hits per tier, the misses, the bytes moved each
// way, the same for LRU (and an exclusive two-tier LRU of the same total
// size), and Belady's optimum as the bound. This file holds the flags
// and the printing.

const defaultKVTrace = data.MooncakeSyntheticTraceName + " (built in)"

const kvUsage = `usage: demo kv [--trace FILE] [--block-size SIZE] [--gpu N,N,...] [--spill LOC|none]
               [--spill-size N|Kx] [--limit N] [--json] [--plot FILE.svg]

Plays a KV-cache trace in the Mooncake JSON-lines format (one request a
line: hash_ids, input_length, output_length, timestamp) through the
runtime's Go API on the soft backend (a simulation: block bytes live in Go
memory, no GPU is used). Each hash id is one KV block, a value sourced at
pageable-host; each request is one Admit of all its blocks at cuda:0,
whose spill target is the spill tier; its scope is exited at once. For
each GPU capacity it prints hits per tier, misses and the bytes moved
host→device and device→host, then the same for LRU of the GPU's size and
for an exclusive two-tier LRU of the same total size, and the hit ratio of
Belady's optimal policy (farthest next use, exact) for the GPU alone and
for both tiers as one, as the bounds. A request with more blocks than the
GPU holds is skipped (its blocks count as misses). Capacities run side by
side, one runtime each, as many at once as there are CPUs. Progress is
drawn on standard error when it is a terminal.

Flags:
`

func kvMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kv", flag.ContinueOnError)
	trace := fs.String("trace", defaultKVTrace, "the trace: Mooncake JSON lines (hash_ids, input_length, output_length, timestamp)")
	blockSize := fs.String("block-size", "4KiB", "the simulated bytes of one KV block (a size: 4096, 4KiB, 1MiB; > 0)")
	gpu := fs.String("gpu", "1000,3000,10000", "GPU capacities in blocks, comma-separated: one run each")
	spill := fs.String("spill", "pinned-host", "cuda:0's spill tier: pinned-host, pageable-host (then also the sources' location) or none")
	spillSize := fs.String("spill-size", "2x", "the spill tier's capacity: N blocks, or Kx for K times each GPU capacity")
	limit := fs.Int("limit", 0, "read only the first N requests (0: all)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of the table")
	plot := fs.String("plot", "", "also write an SVG chart of hit ratio against GPU capacity to this file")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), kvUsage)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo kv: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	cfg, err := kvConfig(*blockSize, *gpu, *spill, *spillSize, *limit)
	if err != nil {
		fmt.Fprintf(stderr, "demo kv: %v\n", err)
		return 2
	}
	t, err := kvRead(*trace, *limit)
	if err != nil {
		fmt.Fprintf(stderr, "demo kv: %v\n", err)
		return 2
	}
	if os.Getenv("GOGC") == "" {
		// Every simulated copy allocates its block: collect less often.
		debug.SetGCPercent(400)
	}
	cfg.Parallel = runtime.GOMAXPROCS(0)
	bar := newProgress(stderr, len(t.Requests)*len(cfg.GPU), "demo kv")
	var mu sync.Mutex
	cfg.Progress = func(int, int) {
		mu.Lock()
		bar.step()
		mu.Unlock()
	}
	points, err := kvtrace.Sweep(ctx, t, cfg)
	bar.finish()
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "demo kv: interrupted")
			return exitInterrupted
		}
		fmt.Fprintf(stderr, "demo kv: %v\n", err)
		return 1
	}
	if *plot != "" {
		if err := kvPlot(*plot, *trace, cfg, points); err != nil {
			fmt.Fprintf(stderr, "demo kv: --plot: %v\n", err)
			return 1
		}
	}
	if *asJSON {
		return kvJSON(stdout, stderr, *trace, t, cfg, points)
	}
	kvTable(stdout, *trace, t, cfg, points)
	return 0
}

// kvConfig checks the flags' values and makes the sweep's configuration.
func kvConfig(blockSize, gpu, spill, spillSize string, limit int) (kvtrace.SweepConfig, error) {
	var cfg kvtrace.SweepConfig
	b, err := parseByteString(blockSize)
	if err != nil || b <= 0 {
		return cfg, fmt.Errorf("--block-size %q: want a size > 0 (4096, 4KiB, 1MiB)", blockSize)
	}
	cfg.BlockBytes = b
	for _, f := range strings.Split(gpu, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || (len(cfg.GPU) > 0 && n <= cfg.GPU[len(cfg.GPU)-1]) {
			return cfg, fmt.Errorf("--gpu %q: want block counts > 0, ascending, comma-separated (1000,3000,10000)", gpu)
		}
		if b > math.MaxInt64/int64(n)/4 {
			return cfg, fmt.Errorf("--gpu %d blocks of %d bytes: too many bytes", n, b)
		}
		cfg.GPU = append(cfg.GPU, n)
	}
	switch spill {
	case "none":
	case "pinned-host", "pageable-host":
		cfg.Spill = spill
	default:
		return cfg, fmt.Errorf("--spill %q: want pinned-host, pageable-host or none", spill)
	}
	if limit < 0 {
		return cfg, fmt.Errorf("--limit %d: want a number of requests ≥ 0 (0: all)", limit)
	}
	if k, ok := strings.CutSuffix(spillSize, "x"); ok {
		f, err := strconv.ParseFloat(k, 64)
		if err != nil || !(f > 0) || f > 1000 {
			return cfg, fmt.Errorf("--spill-size %q: want N blocks or Kx with 0 < K ≤ 1000", spillSize)
		}
		cfg.SpillFactor = f
		return cfg, nil
	}
	n, err := strconv.Atoi(spillSize)
	if err != nil || n <= 0 || b > math.MaxInt64/int64(n)/4 {
		return cfg, fmt.Errorf("--spill-size %q: want N blocks (> 0) or Kx", spillSize)
	}
	cfg.SpillBlocks = n
	return cfg, nil
}

// kvRead reads the trace file (at most limit requests; 0: all).
// The default names the trace built into the binary (package data), so
// the command runs from any directory.
func kvRead(path string, limit int) (*kvtrace.Trace, error) {
	var r io.Reader
	if path == defaultKVTrace {
		r = bytes.NewReader(data.MooncakeSyntheticTrace)
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	t, err := kvtrace.Read(r, kvtrace.Limits{MaxRequests: limit})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", escapeText(path), err)
	}
	return t, nil
}

func kvHeader(w io.Writer, path string, t *kvtrace.Trace, cfg kvtrace.SweepConfig) {
	fmt.Fprintf(w, "trace %s: %d requests, %d block uses, %d distinct blocks\n", escapeText(path), len(t.Requests), t.Uses, t.Blocks())
	fmt.Fprintf(w, "blocks of %s, on the soft backend (a simulation: no GPU is used)\n", formatBytes(cfg.BlockBytes))
	switch {
	case cfg.Spill == "":
		fmt.Fprintln(w, "no spill tier")
	case cfg.SpillBlocks > 0:
		fmt.Fprintf(w, "spill tier %s: %d blocks\n", cfg.Spill, cfg.SpillBlocks)
	default:
		fmt.Fprintf(w, "spill tier %s: %g× each GPU capacity\n", cfg.Spill, cfg.SpillFactor)
	}
}

// kvTable prints the report as a table: per capacity one line per
// policy.
func kvTable(w io.Writer, path string, t *kvtrace.Trace, cfg kvtrace.SweepConfig, points []kvtrace.Point) {
	kvHeader(w, path, t, cfg)
	fmt.Fprintln(w)
	rows := [][]string{{"GPU blocks", "policy", "GPU hits", "warm hits", "misses", "GPU ratio", "GPU+warm", "host→device", "device→host"}}
	row := func(gpu, name string, c kvtrace.Counts) {
		rows = append(rows, []string{gpu, name, strconv.FormatInt(c.GPUHits, 10), strconv.FormatInt(c.WarmHits, 10), strconv.FormatInt(c.Misses, 10),
			fmt.Sprintf("%.3f", c.GPURatio()), fmt.Sprintf("%.3f", c.TotalRatio()), formatBytes(c.ToDevice * cfg.BlockBytes), formatBytes(c.ToHost * cfg.BlockBytes)})
	}
	for _, p := range points {
		total := p.GPUBlocks + p.SpillBlocks
		row(strconv.Itoa(p.GPUBlocks), fmt.Sprintf("residency (%.1fs)", p.Seconds), p.Residency)
		row("", fmt.Sprintf("LRU %d", p.GPUBlocks), p.LRU)
		if p.TwoTierLRU != nil {
			row("", fmt.Sprintf("two-tier LRU %d+%d", p.GPUBlocks, p.SpillBlocks), *p.TwoTierLRU)
		}
		row("", fmt.Sprintf("optimal %d", p.GPUBlocks), p.OptimalGPU)
		if p.OptimalTotal != nil {
			row("", fmt.Sprintf("optimal %d", total), *p.OptimalTotal)
		}
	}
	kvColumns(w, rows)
	fmt.Fprintln(w)
	for _, p := range points {
		if p.Residency.Skipped > 0 {
			fmt.Fprintf(w, "GPU %d: %d block uses skipped (requests larger than the GPU; counted as misses)\n", p.GPUBlocks, p.Residency.Skipped)
		}
		fmt.Fprintf(w, "GPU %d: residency GPU hits %s LRU (%.3f vs %.3f)", p.GPUBlocks, kvCompare(p.Residency.GPURatio(), p.LRU.GPURatio()), p.Residency.GPURatio(), p.LRU.GPURatio())
		if p.TwoTierLRU != nil {
			fmt.Fprintf(w, "; GPU+warm %s two-tier LRU (%.3f vs %.3f)", kvCompare(p.Residency.TotalRatio(), p.TwoTierLRU.TotalRatio()), p.Residency.TotalRatio(), p.TwoTierLRU.TotalRatio())
		}
		fmt.Fprintf(w, "; %.3f below the optimum of the GPU alone\n", p.OptimalGPU.GPURatio()-p.Residency.GPURatio())
	}
}

// kvColumns prints rows as columns two spaces apart: the policy (column
// 1) aligned left, every other column right.
func kvColumns(w io.Writer, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i == 1 {
				b.WriteString("  " + c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, b.String())
	}
}

func kvCompare(a, b float64) string {
	if a >= b {
		return "≥"
	}
	return "<"
}

// kvReport is the --json output.
type kvReport struct {
	Trace      string          `json:"trace"`
	Requests   int             `json:"requests"`
	Uses       int64           `json:"block_uses"`
	Blocks     int             `json:"distinct_blocks"`
	BlockBytes int64           `json:"block_bytes"`
	Backend    string          `json:"backend"`
	Spill      string          `json:"spill,omitempty"`
	Points     []kvtrace.Point `json:"capacities"`
}

func kvJSON(stdout, stderr io.Writer, path string, t *kvtrace.Trace, cfg kvtrace.SweepConfig, points []kvtrace.Point) int {
	rep := kvReport{Trace: path, Requests: len(t.Requests), Uses: t.Uses, Blocks: t.Blocks(), BlockBytes: cfg.BlockBytes,
		Backend: "soft (a simulation)", Spill: cfg.Spill, Points: points}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		fmt.Fprintf(stderr, "demo kv: %v\n", err)
		return 1
	}
	return 0
}

// kvPlot writes the SVG chart: GPU hit ratios of residency, LRU and the
// optimum, and with a spill tier the GPU+warm ratios of residency, the
// two-tier LRU and the optimum of both tiers.
func kvPlot(file, path string, cfg kvtrace.SweepConfig, points []kvtrace.Point) error {
	xs := make([]float64, len(points))
	get := func(f func(p kvtrace.Point) float64) []float64 {
		ys := make([]float64, len(points))
		for i, p := range points {
			ys[i] = f(p)
		}
		return ys
	}
	for i, p := range points {
		xs[i] = float64(p.GPUBlocks)
	}
	series := []kvtrace.Series{
		{Name: "residency, GPU", Color: "#1f77b4", Y: get(func(p kvtrace.Point) float64 { return p.Residency.GPURatio() })},
		{Name: "LRU, GPU", Color: "#ff7f0e", Y: get(func(p kvtrace.Point) float64 { return p.LRU.GPURatio() })},
		{Name: "optimal, GPU", Color: "#2ca02c", Y: get(func(p kvtrace.Point) float64 { return p.OptimalGPU.GPURatio() })},
	}
	if cfg.Spill != "" && len(points) > 0 && points[0].TwoTierLRU != nil {
		series = append(series,
			kvtrace.Series{Name: "residency, GPU+warm", Color: "#1f77b4", Dash: "6 4", Y: get(func(p kvtrace.Point) float64 { return p.Residency.TotalRatio() })},
			kvtrace.Series{Name: "two-tier LRU", Color: "#ff7f0e", Dash: "6 4", Y: get(func(p kvtrace.Point) float64 { return p.TwoTierLRU.TotalRatio() })},
			kvtrace.Series{Name: "optimal, both tiers", Color: "#2ca02c", Dash: "6 4", Y: get(func(p kvtrace.Point) float64 { return p.OptimalTotal.GPURatio() })})
	}
	title := "KV block hit ratio: " + filepath.Base(path)
	if cfg.Spill != "" {
		title += ", spill tier " + cfg.Spill
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	err = kvtrace.Plot(f, title, "GPU capacity (blocks)", xs, series)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errors.Join(err, os.Remove(file))
	}
	return nil
}
