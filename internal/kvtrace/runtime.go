package kvtrace

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
)

// Config is one run of a trace through the runtime.
type Config struct {
	// BlockBytes is the size of a block's value (> 0).
	BlockBytes int64
	// GPU is the capacity of cuda:0 in blocks (> 0).
	GPU int
	// Spill is the spill tier of cuda:0 ("" for none; pinned-host or
	// pageable-host), and SpillBlocks its capacity in blocks (> 0 with a
	// spill tier).
	Spill       string
	SpillBlocks int
	// Progress, when set, is called after every request with the number
	// of requests done (from the goroutine that called Run).
	Progress func(done int)
}

// GPULocation is where a run places each request's blocks.
const GPULocation = "cuda:0"

// SourceLocation holds every block's source: a block missing from both
// tiers is loaded there and copied up.
const SourceLocation = "pageable-host"

// Run plays t through the residency runtime on the soft backend (a
// simulation: every block's bytes live in Go memory): each block is a
// value sourced at pageable-host, registered on its first use; each
// request is one [system.System.Admit] requiring all its blocks at
// cuda:0 (cfg.GPU blocks), with cfg.Spill (cfg.SpillBlocks blocks) as
// cuda:0's spill target; its scope is exited at once. A block resident
// at cuda:0 before its request is a GPU hit, one resident at the spill
// tier a warm hit, any other a miss. Requests with more blocks than
// cuda:0 holds are skipped ([Counts]). Errors: a bad configuration, a
// refused admission, ctx ended.
func Run(ctx context.Context, t *Trace, cfg Config) (Counts, error) {
	if cfg.BlockBytes <= 0 || cfg.GPU <= 0 || (cfg.Spill != "" && cfg.SpillBlocks <= 0) {
		return Counts{}, errors.New("kvtrace: block bytes, GPU blocks and spill blocks (with a spill tier) must be > 0")
	}
	sys, err := start(ctx, cfg)
	if err != nil {
		return Counts{}, err
	}
	p := newPlayer(sys, cfg, t)
	c, err := p.play(ctx, t)
	return c, errors.Join(err, stop(sys))
}

// stop closes the runtime, then its backend.
func stop(sys *system.System) error {
	err := sys.Close(context.Background())
	return errors.Join(err, sys.Backend().Close())
}

func newPlayer(sys *system.System, cfg Config, t *Trace) *player {
	return &player{sys: sys, cfg: cfg, handles: make([]system.Handle, t.Blocks()), where: make([]uint8, t.Blocks())}
}

// start starts the runtime of a run: pageable-host (the sources), cuda:0
// and the spill tier, on the soft backend.
func start(ctx context.Context, cfg Config) (*system.System, error) {
	if cfg.Spill != "" && cfg.Spill != "pinned-host" && cfg.Spill != SourceLocation {
		return nil, fmt.Errorf("kvtrace: spill tier %q: want pinned-host or pageable-host", cfg.Spill)
	}
	locs := []system.LocationConfig{system.NoLimit(SourceLocation), system.Limit(GPULocation, cfg.BlockBytes*int64(cfg.GPU))}
	opts := system.Options{DisableTrace: true}
	switch cfg.Spill {
	case "pinned-host":
		locs = append(locs, system.Limit("pinned-host", cfg.BlockBytes*int64(cfg.SpillBlocks)))
	case SourceLocation:
		locs[0] = system.Limit(SourceLocation, cfg.BlockBytes*int64(cfg.SpillBlocks))
	}
	if cfg.Spill != "" {
		opts.Spill = map[string]string{GPULocation: cfg.Spill}
	}
	opts.Locations = locs
	b, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		return nil, err
	}
	opts.Backend = b
	sys, err := system.Start(ctx, opts)
	if err != nil {
		return nil, errors.Join(err, b.Close())
	}
	return sys, nil
}

// Where a block is, as the player tracks it from the decisions.
const (
	atNone uint8 = iota
	atGPU
	atWarm
)

type player struct {
	sys     *system.System
	cfg     Config
	handles []system.Handle
	where   []uint8
	reqs    []system.Requirement
}

// loader fills a block's buffer: the simulated bytes stay zero.
func loader(context.Context, []byte) error { return nil }

func (p *player) play(ctx context.Context, t *Trace) (Counts, error) {
	var c Counts
	for i, r := range t.Requests {
		if err := ctx.Err(); err != nil {
			return c, err
		}
		if len(r.Blocks) > p.cfg.GPU {
			c.skip(len(r.Blocks))
		} else if err := p.request(ctx, i, r, &c); err != nil {
			return c, err
		}
		if p.cfg.Progress != nil {
			p.cfg.Progress(i + 1)
		}
	}
	return c, nil
}

// request admits one request's blocks at cuda:0 and exits its scope,
// counting hits from where the blocks were and moves from the decision.
func (p *player) request(ctx context.Context, i int, r Request, c *Counts) error {
	p.reqs = p.reqs[:0]
	for _, b := range r.Blocks {
		h := p.handles[b]
		if h == (system.Handle{}) {
			var err error
			h, err = p.sys.Register(ctx, system.Value{Name: "b" + strconv.Itoa(int(b)), Bytes: p.cfg.BlockBytes, Source: SourceLocation, Loader: loader})
			if err != nil {
				return fmt.Errorf("request %d: registering block %d: %w", i, b, err)
			}
			p.handles[b] = h
		}
		p.reqs = append(p.reqs, system.Requirement{Handle: h, Tiers: [][]string{{GPULocation}}})
	}
	sc, d, err := p.sys.Admit(ctx, system.Request{Name: "r" + strconv.Itoa(i), Requirements: p.reqs})
	if err != nil {
		return fmt.Errorf("request %d (%d blocks): %w", i, len(r.Blocks), err)
	}
	c.Uses += int64(len(r.Blocks))
	for _, b := range r.Blocks {
		switch p.where[b] {
		case atGPU:
			c.GPUHits++
		case atWarm:
			c.WarmHits++
			c.ToDevice++
		default:
			c.Misses++
			c.ToDevice++
		}
	}
	for _, e := range d.Evictions {
		b, err := strconv.Atoi(e.Handle.Name[1:])
		if err != nil {
			return fmt.Errorf("request %d: eviction of %q: not a block", i, e.Handle.Name)
		}
		switch {
		case e.Location == GPULocation && e.To != "":
			p.where[b] = atWarm
			c.ToHost++
		case e.To != "" && e.To != SourceLocation:
			return fmt.Errorf("request %d: block %d demoted to %s", i, b, e.To)
		default:
			p.where[b] = atNone
		}
	}
	for _, b := range r.Blocks {
		p.where[b] = atGPU
	}
	return sc.Exit(ctx)
}
