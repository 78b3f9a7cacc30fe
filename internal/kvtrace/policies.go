package kvtrace

import (
	"container/heap"
	"math"
)

// Counts is what one policy did with a trace at one capacity, in blocks.
// A request with more blocks than the GPU tier holds cannot run: its
// blocks count in Uses and Skipped (as misses), and nothing else
// happens.
type Counts struct {
	Uses     int64 `json:"uses"`
	GPUHits  int64 `json:"gpu_hits"`  // resident at the GPU tier already
	WarmHits int64 `json:"warm_hits"` // resident at the spill tier: copied up
	Misses   int64 `json:"misses"`    // loaded from the source
	// Skipped: the uses of requests larger than the GPU tier (also in
	// Misses).
	Skipped int64 `json:"skipped"`
	// ToDevice and ToHost count blocks moved host→device (warm hits and
	// misses) and device→host (demotions to the spill tier).
	ToDevice int64 `json:"to_device_blocks"`
	ToHost   int64 `json:"to_host_blocks"`
}

// GPURatio is the GPU hit ratio: GPU hits / uses (0 for no use).
func (c Counts) GPURatio() float64 { return ratio(c.GPUHits, c.Uses) }

// TotalRatio is the hit ratio of both tiers: (GPU + warm hits) / uses.
func (c Counts) TotalRatio() float64 { return ratio(c.GPUHits+c.WarmHits, c.Uses) }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// skip counts a request larger than the GPU tier.
func (c *Counts) skip(n int) {
	c.Uses += int64(n)
	c.Misses += int64(n)
	c.Skipped += int64(n)
}

// LRU plays the trace against one tier of gpu blocks evicting the least
// recently used block (a request's blocks are used in their order, all
// at once, so a request never evicts its own blocks).
func LRU(t *Trace, gpu int) Counts {
	return TwoTierLRU(t, gpu, 0)
}

// TwoTierLRU plays the trace against an exclusive two-tier LRU: gpu
// blocks, and warm blocks below them. A block evicted from the GPU tier
// (its least recently used) goes to the warm tier as its most recently
// used; the warm tier drops its least recently used; a warm hit moves
// the block up. warm 0 is plain LRU.
func TwoTierLRU(t *Trace, gpu, warm int) Counts {
	var c Counts
	n := t.Blocks()
	g, w := newLRUList(n), newLRUList(n)
	for _, r := range t.Requests {
		if len(r.Blocks) > gpu {
			c.skip(len(r.Blocks))
			continue
		}
		c.Uses += int64(len(r.Blocks))
		for _, b := range r.Blocks {
			switch {
			case g.has(b):
				c.GPUHits++
				g.remove(b)
			case w.has(b):
				c.WarmHits++
				c.ToDevice++
				w.remove(b)
			default:
				c.Misses++
				c.ToDevice++
			}
			if g.len == gpu {
				v := g.oldest()
				g.remove(v)
				if warm > 0 {
					if w.len == warm {
						w.remove(w.oldest())
					}
					w.pushNewest(v)
					c.ToHost++
				}
			}
			g.pushNewest(b)
		}
	}
	return c
}

// lruList is a recency list over dense block numbers: an intrusive
// doubly linked list in two arrays (no allocation per use).
type lruList struct {
	prev, next []int32 // -2: not in the list
	head, tail int32   // newest, oldest; -1 when empty
	len        int
}

func newLRUList(n int) *lruList {
	l := &lruList{prev: make([]int32, n), next: make([]int32, n), head: -1, tail: -1}
	for i := range l.prev {
		l.prev[i] = -2
	}
	return l
}

func (l *lruList) has(b int32) bool { return l.prev[b] != -2 }

func (l *lruList) oldest() int32 { return l.tail }

func (l *lruList) pushNewest(b int32) {
	l.prev[b], l.next[b] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = b
	} else {
		l.tail = b
	}
	l.head = b
	l.len++
}

func (l *lruList) remove(b int32) {
	p, n := l.prev[b], l.next[b]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
	l.prev[b] = -2
	l.len--
}

// Belady plays the trace against one tier of capacity blocks with
// Belady's optimal policy: when a block must come in and the tier is
// full, it evicts the resident block whose next use is farthest in the
// future (never used again first), never one of the current request's
// blocks. Every block of a request must be resident for it, so a missing
// block always comes in; among such policies, evicting the farthest next
// use maximizes the hits. Exact: the next uses are computed from the
// whole trace.
func Belady(t *Trace, capacity int) Counts {
	return belady(t, capacity, capacity)
}

// BeladyTotal is [Belady] for one tier of total blocks that skips, as the
// two-tier policies do, the requests larger than gpu: the bound of the
// hits of both tiers of a GPU tier and a spill tier of total blocks in
// all.
func BeladyTotal(t *Trace, gpu, total int) Counts {
	return belady(t, total, min(gpu, total))
}

// belady is Belady at capacity, skipping the requests larger than fits
// (≤ capacity).
func belady(t *Trace, capacity, fits int) Counts {
	var c Counts
	next := nextUses(t)
	h := &useHeap{}
	stamp := make([]int32, t.Blocks())
	resident := make([]bool, t.Blocks())
	size := 0
	push := func(b int32, key int64) {
		stamp[b]++
		heap.Push(h, heapEntry{key: key, block: b, stamp: stamp[b]})
	}
	pos := 0 // index into next: the uses in trace order
	for _, r := range t.Requests {
		if len(r.Blocks) > fits {
			c.skip(len(r.Blocks))
			pos += len(r.Blocks)
			continue
		}
		c.Uses += int64(len(r.Blocks))
		// The current request's blocks are pinned: key −1 never wins.
		for _, b := range r.Blocks {
			if resident[b] {
				c.GPUHits++
				push(b, -1)
			}
		}
		for _, b := range r.Blocks {
			if resident[b] {
				continue
			}
			c.Misses++
			c.ToDevice++
			if size == capacity {
				for {
					e := heap.Pop(h).(heapEntry)
					if e.stamp == stamp[e.block] && resident[e.block] {
						resident[e.block] = false
						stamp[e.block]++
						size--
						break
					}
				}
			}
			resident[b] = true
			size++
			push(b, -1)
		}
		for i, b := range r.Blocks {
			push(b, next[pos+i])
		}
		pos += len(r.Blocks)
		if h.Len() > 4*size+4096 { // drop the stale entries
			live := (*h)[:0]
			for _, e := range *h {
				if e.stamp == stamp[e.block] && resident[e.block] {
					live = append(live, e)
				}
			}
			*h = live
			heap.Init(h)
		}
	}
	return c
}

// nextUses returns, for each block use in trace order, the index of the
// next request that uses the same block (math.MaxInt64 when none does).
func nextUses(t *Trace) []int64 {
	next := make([]int64, t.Uses)
	last := make([]int64, t.Blocks()) // the use index of the block's latest use, +1
	pos := int64(0)
	for i, r := range t.Requests {
		for _, b := range r.Blocks {
			if u := last[b]; u > 0 {
				next[u-1] = int64(i)
			}
			next[pos] = math.MaxInt64
			last[b] = pos + 1
			pos++
		}
	}
	return next
}

type heapEntry struct {
	key   int64
	block int32
	stamp int32
}

// useHeap is a max-heap on key, with stale entries left in place (a
// block's entry is current when its stamp is the block's).
type useHeap []heapEntry

func (h useHeap) Len() int           { return len(h) }
func (h useHeap) Less(i, j int) bool { return h[i].key > h[j].key }
func (h useHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *useHeap) Push(x any)        { *h = append(*h, x.(heapEntry)) }
func (h *useHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
