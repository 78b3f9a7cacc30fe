package kvtrace

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// trace builds a trace from requests of block numbers (dense already).
func trace(reqs ...[]int32) *Trace {
	t := &Trace{}
	n := int32(0)
	for _, r := range reqs {
		t.Requests = append(t.Requests, Request{Blocks: r})
		t.Uses += int64(len(r))
		for _, b := range r {
			n = max(n, b+1)
		}
	}
	t.IDs = make([]int64, n)
	return t
}

func randomTrace(r *rand.Rand, requests, blocks, perRequest int) *Trace {
	var reqs [][]int32
	for range requests {
		seen := map[int32]bool{}
		var req []int32
		for range 1 + r.IntN(perRequest) {
			b := int32(r.IntN(blocks))
			if !seen[b] {
				seen[b] = true
				req = append(req, b)
			}
		}
		reqs = append(reqs, req)
	}
	return trace(reqs...)
}

// By hand: capacity 2. [0 1] misses both; [2] evicts 0 (the least
// recently used); [1] hits; [0] misses, evicting 2; [1 0] hits both.
func TestLRUByHand(t *testing.T) {
	tr := trace([]int32{0, 1}, []int32{2}, []int32{1}, []int32{0}, []int32{1, 0}, []int32{3, 4, 5})
	require.Equal(t, Counts{Uses: 10, GPUHits: 3, Misses: 7, Skipped: 3, ToDevice: 4}, LRU(tr, 2))
	// With a warm tier of 1: [2] demotes 0; [1] hits; [0] is a warm hit,
	// demoting 2; [1 0] hits.
	require.Equal(t, Counts{Uses: 10, GPUHits: 3, WarmHits: 1, Misses: 6, Skipped: 3, ToDevice: 4, ToHost: 2}, TwoTierLRU(tr, 2, 1))
}

// By hand: capacity 2, [0 1] [2] [0] [1] [0]: at [2] Belady evicts 1
// (next used at request 4, after 0 at request 3); then [0] hits, [1]
// misses evicting 2 (never used again), [0] hits.
func TestBeladyByHand(t *testing.T) {
	tr := trace([]int32{0, 1}, []int32{2}, []int32{0}, []int32{1}, []int32{0})
	require.Equal(t, Counts{Uses: 6, GPUHits: 2, Misses: 4, ToDevice: 4}, Belady(tr, 2))
	require.Equal(t, int64(1), LRU(tr, 2).GPUHits)
	// Both tiers as one of 3 blocks, skipping what a GPU of 1 skips (the
	// first request): [2] [0] [1] [0] misses 2, 0, 1, then hits 0.
	require.Equal(t, Counts{Uses: 6, GPUHits: 1, Misses: 5, Skipped: 2, ToDevice: 3}, BeladyTotal(tr, 1, 3))
	require.Equal(t, Belady(tr, 3), BeladyTotal(tr, 3, 3))
}

// An exclusive two-tier LRU holds exactly the blocks one LRU of both
// sizes holds: its hits of both tiers are LRU(gpu+warm)'s hits.
func TestTwoTierLRUIsLRUOfBothSizes(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		tr := randomTrace(r, 60, 20, 4)
		g, w := 4+r.IntN(4), 1+r.IntN(6)
		two, one := TwoTierLRU(tr, g, w), LRU(tr, g+w)
		require.Equal(t, one.GPUHits, two.GPUHits+two.WarmHits, "seed %d", seed)
		require.Equal(t, LRU(tr, g).GPUHits, two.GPUHits, "seed %d", seed)
	}
}

// Belady is optimal: on small random traces it has as many hits as the
// best of every eviction choice (an exhaustive search), and never fewer
// than LRU.
func TestBeladyIsOptimal(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 11))
		tr := randomTrace(r, 8, 7, 3)
		c := 3 + r.IntN(2)
		best := bruteForce(tr, c)
		require.Equal(t, best, Belady(tr, c).GPUHits, "seed %d capacity %d", seed, c)
		require.GreaterOrEqual(t, best, LRU(tr, c).GPUHits, "seed %d", seed)
	}
}

// bruteForce is the most hits any policy gets that makes every request's
// blocks resident at once (capacity c), trying every choice of victims.
func bruteForce(t *Trace, c int) int64 {
	var walk func(i int, resident map[int32]bool) int64
	walk = func(i int, resident map[int32]bool) int64 {
		if i == len(t.Requests) {
			return 0
		}
		r := t.Requests[i].Blocks
		if len(r) > c {
			return walk(i+1, resident)
		}
		var hits int64
		need := map[int32]bool{}
		for _, b := range r {
			need[b] = true
			if resident[b] {
				hits++
			}
		}
		var others []int32
		for b := range resident {
			if !need[b] {
				others = append(others, b)
			}
		}
		// Keep any subset of the others that fits beside the request.
		keep := c - len(r)
		best := int64(-1)
		for mask := 0; mask < 1<<len(others); mask++ {
			next := map[int32]bool{}
			for _, b := range r {
				next[b] = true
			}
			n := 0
			for j, b := range others {
				if mask&(1<<j) != 0 {
					next[b] = true
					n++
				}
			}
			if n > keep {
				continue
			}
			best = max(best, walk(i+1, next))
		}
		return hits + best
	}
	return walk(0, map[int32]bool{})
}
