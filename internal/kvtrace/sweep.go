package kvtrace

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Point is every policy at one GPU capacity (in blocks), with the spill
// tier of SpillBlocks blocks (0: none).
type Point struct {
	GPUBlocks   int `json:"gpu_blocks"`
	SpillBlocks int `json:"spill_blocks"`
	// Residency: the runtime (Run), hits per tier.
	Residency Counts `json:"residency"`
	// LRU: one tier of GPUBlocks; TwoTierLRU: the exclusive two-tier LRU
	// of GPUBlocks + SpillBlocks (only with a spill tier).
	LRU        Counts  `json:"lru"`
	TwoTierLRU *Counts `json:"two_tier_lru,omitempty"`
	// OptimalGPU: Belady's optimum for GPUBlocks; OptimalTotal for
	// GPUBlocks + SpillBlocks as one tier, skipping the same requests
	// (only with a spill tier): the bounds of the GPU and of the GPU+warm
	// hit ratios.
	OptimalGPU   Counts  `json:"optimal_gpu"`
	OptimalTotal *Counts `json:"optimal_total,omitempty"`
	// Seconds is the wall time of the runtime's run.
	Seconds float64 `json:"runtime_seconds"`
}

// SweepConfig is a sweep over GPU capacities.
type SweepConfig struct {
	BlockBytes int64
	GPU        []int // capacities in blocks
	// Spill is the spill tier ("" none); its capacity is SpillBlocks, or
	// SpillFactor × the GPU capacity when SpillBlocks is 0.
	Spill       string
	SpillBlocks int
	SpillFactor float64
	// Parallel is how many capacities run at once (0 or 1: one at a
	// time).
	Parallel int
	// Progress, when set, is called with the capacity being run and the
	// requests done there (from the goroutine running that capacity).
	Progress func(gpu, done int)
}

// Sweep runs the trace at each capacity: through the runtime, and
// against the reference policies. Up to Parallel capacities run at once
// (each on its own runtime; 0 or 1: one at a time), so Progress may be
// called from several goroutines. The points are in the order of
// cfg.GPU. Errors: the first of [Run]'s.
func Sweep(ctx context.Context, t *Trace, cfg SweepConfig) ([]Point, error) {
	out := make([]Point, len(cfg.GPU))
	errs := make([]error, len(cfg.GPU))
	sem := make(chan struct{}, max(1, cfg.Parallel))
	var wg sync.WaitGroup
	for i, gpu := range cfg.GPU {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = point(ctx, t, cfg, gpu)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// point runs the trace at one capacity.
func point(ctx context.Context, t *Trace, cfg SweepConfig, gpu int) (Point, error) {
	p := Point{GPUBlocks: gpu}
	if cfg.Spill != "" {
		p.SpillBlocks = cfg.SpillBlocks
		if p.SpillBlocks == 0 {
			p.SpillBlocks = max(1, int(cfg.SpillFactor*float64(gpu)))
		}
	}
	run := Config{BlockBytes: cfg.BlockBytes, GPU: gpu, Spill: cfg.Spill, SpillBlocks: p.SpillBlocks}
	if cfg.Progress != nil {
		run.Progress = func(done int) { cfg.Progress(gpu, done) }
	}
	began := time.Now()
	c, err := Run(ctx, t, run)
	if err != nil {
		return p, fmt.Errorf("GPU %d blocks: %w", gpu, err)
	}
	p.Seconds = time.Since(began).Seconds()
	p.Residency = c
	p.LRU = LRU(t, gpu)
	p.OptimalGPU = Belady(t, gpu)
	if cfg.Spill != "" {
		two := TwoTierLRU(t, gpu, p.SpillBlocks)
		p.TwoTierLRU = &two
		opt := BeladyTotal(t, gpu, gpu+p.SpillBlocks)
		p.OptimalTotal = &opt
	}
	return p, nil
}
