package system

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkWaitVsPollDrain: N goroutines contend for one GPU whose budget
// holds 4 of their reservations at a time; each admits 8 times, holding
// each admission for a short stretch of work. One drain with waiting
// admission (Admit with WaitForRoom) and one with what callers do without
// it (Admit, and on a refusal back off 50µs doubling to 5ms, then retry)
// run side by side in every iteration. Reported: wall time and process
// CPU time per drain of each, and their ratios poll/wait.
func BenchmarkWaitVsPollDrain(b *testing.B) {
	for _, n := range []int{16, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", n), func(b *testing.B) {
			s, err := startSoft(b, context.Background(), Options{Locations: []LocationConfig{Limit(gpu, 100)}, MaxWaiters: n})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			var waitWall, pollWall, waitCPU, pollCPU time.Duration
			b.ResetTimer()
			for i := range b.N {
				w, c := drain(b, s, n, i, true)
				waitWall, waitCPU = waitWall+w, waitCPU+c
				w, c = drain(b, s, n, i, false)
				pollWall, pollCPU = pollWall+w, pollCPU+c
			}
			per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) / 1000 }
			b.ReportMetric(per(waitWall), "wait-ms/drain")
			b.ReportMetric(per(pollWall), "poll-ms/drain")
			b.ReportMetric(per(waitCPU), "wait-cpu-ms/drain")
			b.ReportMetric(per(pollCPU), "poll-cpu-ms/drain")
			b.ReportMetric(float64(pollWall)/float64(waitWall), "poll/wait-wall")
			b.ReportMetric(float64(pollCPU)/float64(waitCPU), "poll/wait-cpu")
		})
	}
}

const (
	benchRounds = 8
	benchWork   = 200 * time.Microsecond
)

// drain runs one drain and returns its wall and CPU time.
func drain(b *testing.B, s *System, n, iter int, wait bool) (wall, cpu time.Duration) {
	ctx := context.Background()
	cpu0 := processCPU()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range benchRounds {
				req := resv(fmt.Sprintf("b%d-%d-%d-%t", iter, g, r, wait), 25)
				sc, err := admitBench(ctx, s, req, wait)
				if err != nil {
					b.Error(err)
					return
				}
				time.Sleep(benchWork) // the work done under the admission
				if err := sc.Exit(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), processCPU() - cpu0
}

func admitBench(ctx context.Context, s *System, req Request, wait bool) (*Scope, error) {
	if wait {
		sc, _, err := s.Admit(ctx, req, WaitForRoom())
		return sc, err
	}
	backoff := 50 * time.Microsecond
	for {
		sc, _, err := s.Admit(ctx, req)
		var pe *PlanError
		if err == nil || !(errors.As(err, &pe) || errors.Is(err, ErrBusy)) {
			return sc, err
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 5*time.Millisecond)
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
