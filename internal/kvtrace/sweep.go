package kvtrace

import (
	"context"
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
	// GPUBlocks + SpillBlocks as one tier (only with a spill tier): the
	// bounds of the GPU and of the GPU+warm hit ratios.
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
	// Progress, when set, is called with the capacity being run and the
	// requests done.
	Progress func(gpu, done int)
}

// Sweep runs the trace at each capacity: through the runtime, and
// against the reference policies. Errors: those of [Run].
func Sweep(ctx context.Context, t *Trace, cfg SweepConfig) ([]Point, error) {
	var out []Point
	for _, gpu := range cfg.GPU {
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
			return out, err
		}
		p.Seconds = time.Since(began).Seconds()
		p.Residency = c
		p.LRU = LRU(t, gpu)
		p.OptimalGPU = Belady(t, gpu)
		if cfg.Spill != "" {
			two := TwoTierLRU(t, gpu, p.SpillBlocks)
			p.TwoTierLRU = &two
			opt := Belady(t, gpu+p.SpillBlocks)
			p.OptimalTotal = &opt
		}
		out = append(out, p)
	}
	return out, nil
}
