package kvtrace

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The player's view of where each block is, read from the decisions,
// is the runtime's own: after every request the snapshot has exactly the
// blocks the player counts at cuda:0 and at the spill tier, and the
// hits add up.
func TestRunTracksTheRuntime(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 3))
		tr := randomTrace(r, 120, 40, 6)
		cfg := Config{BlockBytes: 64, GPU: 8, Spill: "pinned-host", SpillBlocks: 5 + r.IntN(6)}
		if seed == 3 {
			cfg.Spill, cfg.SpillBlocks = "", 0
		}
		sys, err := start(ctx, cfg)
		require.NoError(t, err)
		p := newPlayer(sys, cfg, tr)
		var c Counts
		for i, req := range tr.Requests {
			require.NoError(t, p.request(ctx, i, req, &c))
			s, err := sys.Snapshot(ctx)
			require.NoError(t, err)
			want := map[string]uint8{}
			for _, v := range s.Values {
				for _, m := range v.Materializations {
					switch m.Location {
					case GPULocation:
						want[v.Handle.Name] = atGPU
					case cfg.Spill:
						want[v.Handle.Name] = atWarm
					}
				}
			}
			got := map[string]uint8{}
			for b, w := range p.where {
				if w != atNone {
					got["b"+strconv.Itoa(b)] = w
				}
			}
			require.Equal(t, want, got, "seed %d, after request %d", seed, i)
		}
		require.NoError(t, stop(sys))
		require.Equal(t, tr.Uses, c.Uses)
		require.Equal(t, c.Uses, c.GPUHits+c.WarmHits+c.Misses)
		require.Equal(t, c.WarmHits+c.Misses, c.ToDevice)
		if cfg.Spill == "" {
			require.Zero(t, c.WarmHits+c.ToHost, "no spill tier")
		} else {
			require.Positive(t, c.WarmHits, "seed %d: the spill tier never served a hit", seed)
		}
		again, err := Run(ctx, tr, cfg)
		require.NoError(t, err)
		require.Equal(t, c, again, "seed %d: a run is deterministic", seed)
	}
}

// The target figures on the synthetic trace, at its largest capacity
// (the quickest run; demo kv sweeps the others): with a spill tier of
// twice the GPU, residency's hits at both tiers are at least an exclusive
// two-tier LRU's of the same sizes, and its GPU hits at least LRU's.
func TestRunBeatsLRUOnTheSyntheticTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("plays the whole synthetic trace")
	}
	tr := syntheticTrace(t)
	const gpu = 10000
	c, err := Run(context.Background(), tr, Config{BlockBytes: 4096, GPU: gpu, Spill: "pinned-host", SpillBlocks: 2 * gpu})
	require.NoError(t, err)
	two, one := TwoTierLRU(tr, gpu, 2*gpu), LRU(tr, gpu)
	t.Logf("GPU %d: residency %.3f (GPU+warm %.3f), LRU %.3f, two-tier LRU %.3f", gpu, c.GPURatio(), c.TotalRatio(), one.GPURatio(), two.TotalRatio())
	require.GreaterOrEqual(t, c.GPUHits+c.WarmHits, two.GPUHits+two.WarmHits, "GPU+warm")
	require.GreaterOrEqual(t, c.GPUHits, one.GPUHits, "GPU")
}

func TestRunRefusesABadConfig(t *testing.T) {
	tr := trace([]int32{0})
	for _, cfg := range []Config{{GPU: 1}, {BlockBytes: 1}, {BlockBytes: 1, GPU: 1, Spill: "pinned-host"}, {BlockBytes: 1, GPU: 1, Spill: "cuda:1", SpillBlocks: 1}} {
		_, err := Run(context.Background(), tr, cfg)
		require.Error(t, err, "%+v", cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, tr, Config{BlockBytes: 1, GPU: 1})
	require.ErrorIs(t, err, context.Canceled)
}

// BenchmarkRunSyntheticTrace plays the synthetic trace through the
// runtime at C = 3,000 with a 2C spill tier (demo kv's path): one
// iteration is the whole trace (3,993 requests).
func BenchmarkRunSyntheticTrace(b *testing.B) {
	tr := syntheticTrace(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(context.Background(), tr, Config{BlockBytes: 4096, GPU: 3000, Spill: "pinned-host", SpillBlocks: 6000}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(tr.Requests)), "ns/request")
}
