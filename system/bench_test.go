package system

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/residency-go/residency/budget"
)

// The lease hot path: acquire + release pairs through the runtime, side by
// side with a baseline that guards the same ledger with a sync.Mutex (what
// an application would do without actors). Both do the same ledger work;
// the ratio is the cost of the actor runtime.

const benchValues = 256

func startBench(b *testing.B) (*System, []Handle) {
	b.Helper()
	ctx := context.Background()
	s, err := startSoft(b, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}})
	if err != nil {
		b.Fatal(err)
	}
	hs := make([]Handle, benchValues)
	for i := range hs {
		h, err := s.Register(ctx, Value{Name: fmt.Sprintf("v%d", i), Bytes: 64, At: "cuda:0"})
		if err != nil {
			b.Fatal(err)
		}
		hs[i] = h
	}
	return s, hs
}

func mutexLedger(b *testing.B) (*budget.Ledger, []budget.Handle) {
	b.Helper()
	l, err := budget.New(budget.Config{ManagerID: "bench", TraceCapacity: budget.DefaultTraceCapacity, Locations: []budget.LocationConfig{{Name: "pageable-host"}, {Name: "cuda:0"}}})
	if err != nil {
		b.Fatal(err)
	}
	hs := make([]budget.Handle, benchValues)
	for i := range hs {
		h, adm, err := l.Register(budget.ValueSpec{Name: fmt.Sprintf("v%d", i), Bytes: 64, At: "cuda:0"})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := l.Complete(adm.ID); err != nil {
			b.Fatal(err)
		}
		hs[i] = h
	}
	return l, hs
}

type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, d...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B) {
	if len(l.all) == 0 {
		return
	}
	sort.Slice(l.all, func(i, j int) bool { return l.all[i] < l.all[j] })
	p := func(q float64) float64 { return float64(l.all[int(q*float64(len(l.all)-1))].Nanoseconds()) / 1000 }
	b.ReportMetric(p(0.50), "p50-acquire-µs")
	b.ReportMetric(p(0.99), "p99-acquire-µs")
	b.ReportMetric(p(0.9999), "p99.99-acquire-µs")
	b.ReportMetric(p(1), "max-acquire-µs")
}

func runPairs(b *testing.B, callers int, pair func(i int) time.Duration) {
	var lat latencies
	var wg sync.WaitGroup
	per := b.N / callers
	if per == 0 {
		per = 1
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			local := make([]time.Duration, 0, per)
			for i := 0; i < per; i++ {
				local = append(local, pair(c*per+i))
			}
			lat.add(local)
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(per*callers)/elapsed.Seconds(), "pairs/s")
	lat.report(b)
}

// leasePair is one op of the runtime's lease benchmarks: an Acquire of
// hs[i%benchValues] at cuda:0, timed, and its Release.
func leasePair(b *testing.B, s *System, hs []Handle) func(i int) time.Duration {
	ctx := context.Background()
	return func(i int) time.Duration {
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
	}
}

func BenchmarkLeasePairs(b *testing.B) {
	for _, callers := range []int{1, 8} {
		b.Run(fmt.Sprintf("runtime/callers=%d", callers), func(b *testing.B) {
			s, hs := startBench(b)
			defer s.Close(context.Background())
			runPairs(b, callers, leasePair(b, s, hs))
		})
		b.Run(fmt.Sprintf("mutex-ledger/callers=%d", callers), func(b *testing.B) {
			l, hs := mutexLedger(b)
			var mu sync.Mutex
			runPairs(b, callers, func(i int) time.Duration {
				t0 := time.Now()
				mu.Lock()
				id, err := l.Acquire(hs[i%benchValues], "cuda:0")
				mu.Unlock()
				d := time.Since(t0)
				if err != nil {
					b.Error(err)
					return d
				}
				mu.Lock()
				err = l.Release(id)
				mu.Unlock()
				if err != nil {
					b.Error(err)
				}
				return d
			})
		})
	}
}

// BenchmarkLeaseRatio measures the runtime's lease path against the
// mutex-guarded ledger in one run, interleaved: each round runs a chunk of
// pairs through the runtime, then the same number through the baseline,
// both with the same callers, so that a change in the machine's load
// affects both alike. Neither side times single calls (see
// BenchmarkLeasePairs for latencies). It reports both throughputs and
// their ratio (runtime ÷ baseline); b.N is the number of pairs each side
// runs.
func BenchmarkLeaseRatio(b *testing.B) {
	const callers, chunk = 8, 20_000
	s, hs := startBench(b)
	defer s.Close(context.Background())
	ctx := context.Background()
	runtimePair := func(i int) time.Duration {
		ls, err := s.Acquire(ctx, hs[i%benchValues], "cuda:0")
		if err != nil {
			b.Error(err)
			return 0
		}
		if err := ls.Release(ctx); err != nil {
			b.Error(err)
		}
		return 0
	}
	l, lhs := mutexLedger(b)
	var mu sync.Mutex
	mutexPair := func(i int) time.Duration {
		mu.Lock()
		id, err := l.Acquire(lhs[i%benchValues], "cuda:0")
		mu.Unlock()
		if err != nil {
			b.Error(err)
			return 0
		}
		mu.Lock()
		err = l.Release(id)
		mu.Unlock()
		if err != nil {
			b.Error(err)
		}
		return 0
	}
	var tRuntime, tMutex time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		n := min(chunk, b.N-done)
		tRuntime += timePairs(callers, n, runtimePair)
		tMutex += timePairs(callers, n, mutexPair)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/tRuntime.Seconds(), "runtime-pairs/s")
	b.ReportMetric(float64(b.N)/tMutex.Seconds(), "mutex-pairs/s")
	b.ReportMetric(tMutex.Seconds()/tRuntime.Seconds(), "ratio")
}

// timePairs runs n pairs split among callers goroutines and returns the
// wall time they took.
func timePairs(callers, n int, pair func(i int) time.Duration) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for c := range callers {
		lo, hi := c*n/callers, (c+1)*n/callers
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				pair(i)
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// BenchmarkValueMemory measures the heap cost of one registered value (its
// ledger record and its actor) at 100k registered values.
func BenchmarkValueMemory(b *testing.B) {
	const n = 100_000
	for i := 0; i < b.N; i++ {
		ctx := context.Background()
		s, err := startSoft(b, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), NoLimit("cuda:0")}, DisableTrace: true})
		if err != nil {
			b.Fatal(err)
		}
		loader := func(context.Context, []byte) error { return nil }
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for j := 0; j < n; j++ {
			if _, err := s.Register(ctx, Value{Name: fmt.Sprintf("value-%06d", j), Bytes: 1 << 20, Source: "pageable-host", Loader: loader}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/value")
		_ = s.Close(ctx)
	}
}
