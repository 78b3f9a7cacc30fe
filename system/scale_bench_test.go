package system

import (
	"context"
	"fmt"
	"os"
	"runtime"
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
// with 8 callers, in a runtime of 1M registered values of which a
// snapshot is taken every second by another goroutine (rendered there).
// Reports the acquire p50/p99 and the snapshot calls' own latency.
//
//	RESIDENCY_BENCH_1M=1 go test ./system -run '^$' -bench BenchmarkLeaseUnderSnapshots -benchtime 2000000x
func BenchmarkLeaseUnderSnapshots(b *testing.B) {
	skipUnless1M(b)
	const n = 1000000
	ctx := context.Background()
	s, err := Start(ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(ctx)
	hs := scaleValues(b, s, n)
	stop := make(chan struct{})
	var snaps []time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
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
	runPairs(b, 8, func(i int) time.Duration {
		t0 := time.Now()
		l, err := s.Acquire(ctx, hs[i%benchValues], "cuda:0")
		d := time.Since(t0)
		if err != nil {
			b.Error(err)
			return d
		}
		if err := l.Release(ctx); err != nil {
			b.Error(err)
		}
		return d
	})
	close(stop)
	wg.Wait()
	var worst time.Duration
	for _, d := range snaps {
		worst = max(worst, d)
	}
	b.ReportMetric(float64(len(snaps)), "snapshots")
	b.ReportMetric(float64(worst.Milliseconds()), "max-snapshot-ms")
}

// BenchmarkResidentValueMemory: heap per resident value of a runtime of
// 1M values, each registered resident at cuda:0 (64 B, soft backend): the
// ledger's record, indexes and snapshot record, the value actor, the
// buffer table entry and the soft buffer with its 64 bytes.
//
//	RESIDENCY_BENCH_1M=1 go test ./system -run '^$' -bench BenchmarkResidentValueMemory -benchtime 1x
func BenchmarkResidentValueMemory(b *testing.B) {
	skipUnless1M(b)
	const n = 1000000
	for b.Loop() {
		ctx := context.Background()
		s, err := Start(ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}, DisableTrace: true})
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
	// Closing a million actors sends protoactor's dead-letter throttle a
	// burst; its goroutine ends after its period (goleak runs after us).
	time.Sleep(2 * time.Second)
}

// skipUnless1M skips a benchmark that builds a runtime of a million
// values (1–2 minutes and a few GB here) unless RESIDENCY_BENCH_1M is set,
// so that `make bench` stays quick.
func skipUnless1M(b *testing.B) {
	if os.Getenv("RESIDENCY_BENCH_1M") == "" {
		b.Skip("set RESIDENCY_BENCH_1M=1 to run the 1M-value runtime benchmarks")
	}
}
