package system

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// scaleValues registers n values with s: the first benchValues resident at
// cuda:0 (64 B, for leases), the rest with a source (no buffer).
func scaleValues(b *testing.B, s *System, n int) []Handle {
	b.Helper()
	ctx := context.Background()
	loader := func(context.Context, []byte) error { return nil }
	hs := make([]Handle, 0, benchValues)
	for i := range n {
		v := Value{Name: fmt.Sprintf("v%07d", i), Bytes: 64, Source: "pageable-host", Loader: loader}
		if i < benchValues {
			v = Value{Name: v.Name, Bytes: 64, At: "cuda:0"}
		}
		h, err := s.Register(ctx, v)
		if err != nil {
			b.Fatal(err)
		}
		if i < benchValues {
			hs = append(hs, h)
		}
	}
	return hs
}

// BenchmarkLeaseUnderSnapshots: the lease hot path of BenchmarkLeasePairs
// with 8 callers, in a runtime of 1M registered values, first alone (the
// control: snapshots=off), then while another goroutine takes a snapshot
// every second (snapshots=1s, rendered by that goroutine), in the same
// runtime. Reports the acquire p50/p99/p99.99/max, the snapshot calls' own
// latency, and what the Go runtime spent meanwhile: collections, their
// longest stop-the-world pause, and the CPU of garbage collection (all of
// it, and the assists drafted from allocating goroutines, lease callers
// included), so that a stall can be told apart from the collector's.
//
//	RESIDENCY_BENCH_1M=1 go test ./system -run '^$' -bench BenchmarkLeaseUnderSnapshots -benchtime 2000000x
func BenchmarkLeaseUnderSnapshots(b *testing.B) {
	skipUnless1M(b)
	const n = 1000000
	ctx := context.Background()
	s, err := startSoft(b, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(ctx)
	hs := scaleValues(b, s, n)
	for _, every := range []time.Duration{0, time.Second} {
		name := "snapshots=off"
		if every > 0 {
			name = "snapshots=" + every.String()
		}
		b.Run(name, func(b *testing.B) {
			runtime.GC()
			stop := make(chan struct{})
			var snaps []time.Duration
			var wg sync.WaitGroup
			if every > 0 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					t := time.NewTicker(every)
					defer t.Stop()
					for {
						select {
						case <-stop:
							return
						case <-t.C:
						}
						t0 := time.Now()
						snap, err := s.Snapshot(ctx)
						if err != nil || len(snap.Values) != n {
							b.Errorf("snapshot: %v, %d values", err, len(snap.Values))
							return
						}
						snaps = append(snaps, time.Since(t0))
					}
				}()
			}
			gc0 := readGC()
			runPairs(b, 8, leasePair(b, s, hs))
			gc := readGC().since(gc0)
			close(stop)
			wg.Wait()
			var worst time.Duration
			for _, d := range snaps {
				worst = max(worst, d)
			}
			b.ReportMetric(float64(len(snaps)), "snapshots")
			b.ReportMetric(float64(worst.Milliseconds()), "max-snapshot-ms")
			b.ReportMetric(float64(gc.cycles), "gc-cycles")
			b.ReportMetric(gc.maxPause.Seconds()*1000, "max-gc-pause-ms")
			b.ReportMetric(gc.cpu, "gc-cpu-s")
			b.ReportMetric(gc.assist, "gc-assist-cpu-s")
		})
	}
}

// gcFigures is what the Go runtime reports about garbage collection.
type gcFigures struct {
	cycles      uint32
	pauses      [256]uint64 // MemStats.PauseNs
	maxPause    time.Duration
	cpu, assist float64 // seconds of CPU: all GC, and mark assists
}

func readGC() gcFigures {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	samples := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/gc/mark/assist:cpu-seconds"}}
	metrics.Read(samples)
	return gcFigures{cycles: ms.NumGC, pauses: ms.PauseNs, cpu: samples[0].Value.Float64(), assist: samples[1].Value.Float64()}
}

// since returns the figures of the collections after g0 (the pauses of at
// most the last 256).
func (g gcFigures) since(g0 gcFigures) gcFigures {
	d := gcFigures{cycles: g.cycles - g0.cycles, cpu: g.cpu - g0.cpu, assist: g.assist - g0.assist}
	for c := g0.cycles + 1; c <= g.cycles && g.cycles-c < 256; c++ {
		d.maxPause = max(d.maxPause, time.Duration(g.pauses[(c+255)%256]))
	}
	return d
}

// BenchmarkResidentValueMemory: heap per resident value of a runtime of
// 1M values, each registered resident at cuda:0 (64 B, soft backend): the
// ledger's record, indexes and snapshot record, the buffer table entry
// and the soft buffer with its 64 bytes (an idle value has no actor).
//
//	RESIDENCY_BENCH_1M=1 go test ./system -run '^$' -bench BenchmarkResidentValueMemory -benchtime 1x
func BenchmarkResidentValueMemory(b *testing.B) {
	skipUnless1M(b)
	const n = 1000000
	for b.Loop() {
		ctx := context.Background()
		s, err := startSoft(b, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}, DisableTrace: true})
		if err != nil {
			b.Fatal(err)
		}
		warmRegistry(s)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for j := range n {
			if _, err := s.Register(ctx, Value{Name: fmt.Sprintf("v%07d", j), Bytes: 64, At: "cuda:0"}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := s.Snapshot(ctx); err != nil { // the snapshot records too
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/value")
		_ = s.Close(ctx)
	}
}

// skipUnless1M skips a benchmark that builds a runtime of a million
// values (1–2 minutes and a few GB here) unless RESIDENCY_BENCH_1M is set,
// so that `make bench` stays quick.
func skipUnless1M(b *testing.B) {
	if os.Getenv("RESIDENCY_BENCH_1M") == "" {
		b.Skip("set RESIDENCY_BENCH_1M=1 to run the 1M-value runtime benchmarks")
	}
}
