package system_test

import (
	"container/list"
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"testing"

	"github.com/residency-go/residency/internal/kvtrace"
	"github.com/residency-go/residency/system"
)

// prefixCache is a prefix cache of KV blocks over the runtime: each block
// is a value sourced at pageable-host (its loader recomputes or reads
// it), and each request admits all of its blocks at cuda:0 at once, in a
// scope that lives as long as the request. With pinned-host as cuda:0's
// spill target, a block the controller evicts from cuda:0 is demoted
// there when it can be (making room there by pinned-host's own order),
// and a later request copies it back instead of recomputing it.
type prefixCache struct {
	sys    *system.System
	blocks map[int64]system.Handle
	where  map[int64]string // where each known block is: "cuda:0", "pinned-host" or ""
	reqs   []system.Requirement
	n      int
	// GPU, warm and miss count block uses by where the block was.
	GPU, Warm, Miss int
}

func newPrefixCache(sys *system.System) *prefixCache {
	return &prefixCache{sys: sys, blocks: map[int64]system.Handle{}, where: map[int64]string{}}
}

// recompute stands for the prefill that recomputes a block's KV entries.
func recompute(context.Context, []byte) error { return nil }

// request runs one request: all its blocks resident at cuda:0 for the
// request's life (here: until serve returns).
func (p *prefixCache) request(ctx context.Context, ids []int64, serve func(*system.Scope) error) error {
	p.n++
	p.reqs = p.reqs[:0]
	for _, id := range ids {
		h, ok := p.blocks[id]
		if !ok {
			var err error
			h, err = p.sys.Register(ctx, system.Value{Name: "kv" + strconv.FormatInt(id, 10), Bytes: 4 << 10, Source: "pageable-host", Loader: recompute})
			if err != nil {
				return err
			}
			p.blocks[id] = h
		}
		p.reqs = append(p.reqs, system.Requirement{Handle: h, Tiers: [][]string{{"cuda:0"}}})
	}
	sc, d, err := p.sys.Admit(ctx, system.Request{Name: "req" + strconv.Itoa(p.n), Requirements: p.reqs})
	if err != nil {
		return err
	}
	for _, id := range ids {
		switch p.where[id] {
		case "cuda:0":
			p.GPU++
		case "pinned-host":
			p.Warm++
		default:
			p.Miss++
		}
	}
	for _, e := range d.Evictions { // the victims: demoted (To set) or dropped
		id, _ := strconv.ParseInt(e.Handle.Name[2:], 10, 64)
		p.where[id] = e.To
	}
	for _, id := range ids {
		p.where[id] = "cuda:0"
	}
	serr := serve(sc)
	if err := sc.Exit(ctx); serr == nil {
		serr = err
	}
	return serr
}

// A prefix cache through the Go API: requests that share a prompt's first
// blocks find them resident at cuda:0 (4 blocks of 4 KiB); blocks evicted
// from cuda:0 are demoted to pinned-host (8 blocks), and copied back when
// a later request lists them again.
func ExampleSystem_Admit_kvPrefixCache() {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{
		Locations: []system.LocationConfig{
			system.NoLimit("pageable-host"),
			system.Limit("pinned-host", 8*4<<10),
			system.Limit("cuda:0", 4*4<<10),
		},
		Spill: map[string]string{"cuda:0": "pinned-host"},
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer closeExample(sys)
	cache := newPrefixCache(sys)
	requests := [][]int64{
		{1, 2, 3},    // a system prompt and a question
		{1, 2, 4},    // the same system prompt, another question
		{5, 6, 7, 8}, // another conversation: fills cuda:0
		{1, 2, 3},    // the first one again: back from pinned-host
	}
	for _, ids := range requests {
		err := cache.request(ctx, ids, func(sc *system.Scope) error {
			return nil // decode with the blocks resident at cuda:0
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%v: GPU hits %d, warm hits %d, misses %d\n", ids, cache.GPU, cache.Warm, cache.Miss)
	}
	// Output:
	// [1 2 3]: GPU hits 0, warm hits 0, misses 3
	// [1 2 4]: GPU hits 2, warm hits 0, misses 4
	// [5 6 7 8]: GPU hits 2, warm hits 0, misses 8
	// [1 2 3]: GPU hits 2, warm hits 3, misses 8
}

// BenchmarkKVBlockUses plays the synthetic Mooncake trace (data/) as a
// prefix cache, one request per iteration (cycling through the trace),
// and reports block uses per second: through the runtime (cuda:0 of 3,000
// blocks of 4 KiB, pinned-host of 6,000 as its spill target, on the soft
// backend), and through a plain map + container/list LRU of 3,000 blocks
// in the same run. The runtime does far more per block (a decision, a
// plan, its admissions, a scope, simulated copies), so their ratio is
// context, not a target.
func BenchmarkKVBlockUses(b *testing.B) {
	f, err := os.Open("../data/mooncake_synthetic_trace.jsonl")
	if err != nil {
		b.Fatal(err)
	}
	tr, err := kvtrace.Read(f, kvtrace.Limits{})
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([][]int64, len(tr.Requests))
	for i, r := range tr.Requests {
		for _, blk := range r.Blocks {
			reqs[i] = append(reqs[i], tr.IDs[blk])
		}
	}
	b.Run("runtime", func(b *testing.B) {
		ctx := context.Background()
		sys, err := system.Start(ctx, simulated(system.Options{
			Locations: []system.LocationConfig{
				system.NoLimit("pageable-host"),
				system.Limit("pinned-host", 6000*4<<10),
				system.Limit("cuda:0", 3000*4<<10),
			},
			Spill:        map[string]string{"cuda:0": "pinned-host"},
			DisableTrace: true,
		}))
		if err != nil {
			b.Fatal(err)
		}
		defer closeExample(sys)
		cache := newPrefixCache(sys)
		uses := 0
		none := func(*system.Scope) error { return nil }
		for i := 0; b.Loop(); i++ {
			ids := reqs[i%len(reqs)]
			if err := cache.request(ctx, ids, none); err != nil {
				b.Fatal(err)
			}
			uses += len(ids)
		}
		b.ReportMetric(float64(uses)/b.Elapsed().Seconds(), "block-uses/s")
	})
	b.Run("map-list-LRU", func(b *testing.B) {
		lru := newListLRU(3000)
		uses := 0
		for i := 0; b.Loop(); i++ {
			ids := reqs[i%len(reqs)]
			for _, id := range ids {
				lru.use(id)
			}
			uses += len(ids)
		}
		b.ReportMetric(float64(uses)/b.Elapsed().Seconds(), "block-uses/s")
	})
}

// listLRU is the plain LRU the benchmark compares with: a map to the
// elements of a recency list.
type listLRU struct {
	cap   int
	items map[int64]*list.Element
	order *list.List // front: most recent
	hits  int
}

func newListLRU(n int) *listLRU {
	return &listLRU{cap: n, items: map[int64]*list.Element{}, order: list.New()}
}

func (l *listLRU) use(id int64) {
	if e, ok := l.items[id]; ok {
		l.hits++
		l.order.MoveToFront(e)
		return
	}
	if l.order.Len() == l.cap {
		old := l.order.Back()
		l.order.Remove(old)
		delete(l.items, old.Value.(int64))
	}
	l.items[id] = l.order.PushFront(id)
}
