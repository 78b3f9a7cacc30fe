package budget

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// dtBenchLedger builds a ledger with n resident values (source
// pageable-host, sizes 1–100 bytes), 40% on each GPU and 20% on
// pinned-host, with 0–3 leases taken and released on each (so priorities
// vary), and every budgeted location exactly full: any new placement
// there needs evictions. It also registers four values that are resident
// nowhere (req0…req3, 50–80 bytes) for the request.
func dtBenchLedger(tb testing.TB, n int) (*Ledger, Request) {
	tb.Helper()
	r := rand.New(rand.NewPCG(uint64(n), 42))
	type placed struct {
		name  string
		bytes int64
		loc   string
		bumps int
	}
	locs := []string{"cuda:0", "cuda:1", "pinned-host"}
	var vals []placed
	sums := map[string]int64{}
	for i := range n {
		loc := locs[0]
		switch x := r.IntN(10); {
		case x >= 8:
			loc = locs[2]
		case x >= 4:
			loc = locs[1]
		}
		p := placed{fmt.Sprintf("v%d", i), int64(1 + r.IntN(100)), loc, r.IntN(4)}
		vals = append(vals, p)
		sums[loc] += p.bytes
	}
	cfg := Config{ManagerID: "bench", Locations: []LocationConfig{{Name: "pageable-host"}}}
	for _, loc := range locs {
		cfg.Locations = append(cfg.Locations, LocationConfig{Name: loc, HasBudget: true, BudgetBytes: sums[loc]})
	}
	l, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	must := func(err error) {
		if err != nil {
			tb.Fatal(err)
		}
	}
	for _, p := range vals {
		h, _, err := l.Register(ValueSpec{Name: p.name, Bytes: p.bytes, Mode: Replicable, Source: "pageable-host"})
		must(err)
		adm, err := l.Place(h, p.loc)
		must(err)
		_, err = l.Complete(adm.ID)
		must(err)
		for range p.bumps {
			id, err := l.Acquire(h, p.loc)
			must(err)
			must(l.Release(id))
		}
	}
	req := Request{Name: "bench"}
	for i := range 4 {
		h, _, err := l.Register(ValueSpec{Name: fmt.Sprintf("req%d", i), Bytes: int64(50 + 10*i), Mode: Replicable, Source: "pageable-host"})
		must(err)
		req.Requirements = append(req.Requirements, Requirement{Handle: h, Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}, {"pageable-host"}}})
	}
	must(l.CheckInvariants())
	return l, req
}

// BenchmarkDecide decides a 4-requirement, 3-tier request on a ledger with
// 100, 1k and 10k resident values. Besides ns/op it reports p50 and p99 of
// the per-call latencies (each Decide timed on its own) and the explored
// states and evictions of the decision.
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(dtBenchName(n), func(b *testing.B) {
			l, req := dtBenchLedger(b, n)
			d, err := l.Decide(req, 0)
			if err != nil {
				b.Fatal(err)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				if _, err := l.Decide(req, 0); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			b.ReportMetric(float64(d.ExploredStates), "explored")
			b.ReportMetric(float64(len(d.Evictions)), "evictions")
		})
	}
}

func dtBenchName(n int) string {
	if n >= 1000 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// BenchmarkDecideScale is BenchmarkDecide's state and request scaled up to
// 1k, 10k, 100k and 1M resident values (issue 10: KV-block scale). Each
// ledger is built once per size (building the 1M one takes seconds) and
// reused by every run of its sub-benchmark: Decide changes nothing.
//
//	go test ./budget -run '^$' -bench BenchmarkDecideScale -benchtime 2s
func BenchmarkDecideScale(b *testing.B) {
	var built struct {
		n   int
		l   *Ledger
		req Request
	}
	for _, n := range []int{1000, 10000, 100000, 1000000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			if built.n != n {
				built.l, built.n = nil, 0 // let the previous size go first
				built.l, built.req = dtBenchLedger(b, n)
				built.n = n
			}
			l, req := built.l, built.req
			d, err := l.Decide(req, 0)
			if err != nil {
				b.Fatal(err)
			}
			lat := make([]time.Duration, 0, 1024)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				if _, err := l.Decide(req, 0); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			b.ReportMetric(float64(d.ExploredStates), "explored")
			b.ReportMetric(float64(len(d.Evictions)), "evictions")
		})
	}
}
