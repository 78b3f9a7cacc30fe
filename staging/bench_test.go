package staging_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// BenchmarkCommit measures committed bytes/s through the JOIN_NEXT_STEP
// path (stage a whole step → device→host copy into a pinned slot → copy
// queue → committer scatters rows of 16 KiB into the CPU block pool) on the
// soft backend. Each case reports x-copy: its bytes/s over those of a plain
// copy() of the same bytes, timed side by side in the same run (rounds of
// the case alternate with rounds of copy(), so that both see the same
// load; ns/op and MB/s are the case's alone). The pipeline cases also
// report x-ceiling: their bytes/s over those of the two-goroutines case,
// timed side by side the same way. plain-copy is that copy() on its own;
// two-goroutines the ceiling of any two-copy design on this machine
// (device→slot and slot→pool overlapped on two goroutines through 4
// slots, no bookkeeping).
//
//	go test -run '^$' -bench BenchmarkCommit -benchtime 1s -count 5 ./staging
func BenchmarkCommit(b *testing.B) {
	const row, regions = 16 << 10, 8
	for _, size := range []int64{64 << 10, 2 << 20, 16 << 20} {
		name := fmt.Sprintf("%dKiB", size>>10)
		b.Run(name+"/plain-copy", func(b *testing.B) {
			src := randBytes(rand.New(rand.NewPCG(1, 2)), int(size))
			dst := make([]byte, size)
			b.SetBytes(size)
			for b.Loop() {
				copy(dst, src)
			}
		})
		b.Run(name+"/two-goroutines", func(b *testing.B) {
			sideBySide(b, size, newTwoGoroutines(size, regions), nil)
		})
		for _, scattered := range []bool{false, true} {
			name := name + "/pipeline"
			if scattered {
				name += "-scattered"
			}
			b.Run(name, func(b *testing.B) {
				bp := newBenchPipeline(b, size, row, regions, scattered)
				sideBySide(b, size, bp.run, newTwoGoroutines(size, regions))
				bp.close(b)
			})
		}
	}
}

// sideBySide times run (which moves n steps of size bytes each and returns
// once they are done) against a plain copy() of the same bytes, and
// against ceiling (the same steps through the two-goroutines design) when
// it is not nil: b.N steps in rounds, each round a run of the case, then
// as many copy() calls, then ceiling's run. It reports x-copy, the ratio
// of the case's bytes/s to copy()'s, and x-ceiling, to ceiling's. Only the
// case's rounds are on b's timer. cpu-ns/op is the process's CPU time
// (user + system, every goroutine) during the case's rounds, per step.
func sideBySide(b *testing.B, size int64, run, ceiling func(n int)) {
	src := randBytes(rand.New(rand.NewPCG(3, 4)), int(size))
	dst := make([]byte, size)
	const rounds = 4
	var inCase, inCopy, inCeiling, cpu time.Duration
	b.SetBytes(size)
	b.ResetTimer()
	for r := range rounds {
		n := b.N / rounds
		if r == rounds-1 {
			n = b.N - n*(rounds-1)
		}
		if n == 0 {
			continue
		}
		b.StartTimer()
		start, cpu0 := time.Now(), processCPU()
		run(n)
		inCase += time.Since(start)
		cpu += processCPU() - cpu0
		b.StopTimer()
		start = time.Now()
		for range n {
			copy(dst, src)
		}
		inCopy += time.Since(start)
		if ceiling != nil {
			start = time.Now()
			ceiling(n)
			inCeiling += time.Since(start)
		}
	}
	if inCase > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		b.ReportMetric(float64(inCopy)/float64(inCase), "x-copy")
		if ceiling != nil {
			b.ReportMetric(float64(inCeiling)/float64(inCase), "x-ceiling")
		}
	}
}

// processCPU returns the CPU time (user + system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// newTwoGoroutines returns the ceiling of a two-copy design: the device→slot
// copy on the caller and the slot→pool copy (one copy() of the whole step,
// as the committer does for contiguous rows) on a second goroutine, through
// 4 slots, no bookkeeping at all.
func newTwoGoroutines(size int64, regions int) func(n int) {
	src := randBytes(rand.New(rand.NewPCG(1, 2)), int(size))
	slots := make([][]byte, 4)
	for i := range slots {
		slots[i] = make([]byte, size)
	}
	pool := make([]byte, int64(regions)*size)
	step := 0
	return func(n int) {
		free, full := make(chan int, 4), make(chan int, 4)
		for i := range slots {
			free <- i
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range full {
				base := int64(step%regions) * size
				copy(pool[base:base+size], slots[i])
				free <- i
				step++
			}
		}()
		for range n {
			i := <-free
			copy(slots[i], src)
			full <- i
		}
		close(full)
		<-done
	}
}

// benchPipeline drives the JOIN_NEXT_STEP path: one producer stages whole
// steps into 4 slots, one task per step takes every row of it. Rows land on
// consecutive pool rows (the committer writes them as one run), or, with
// scattered, on pool rows in reverse order (one copy() per row).
type benchPipeline struct {
	b     *testing.B
	rt    *ledgerRuntime
	p     *staging.Pipeline
	dev   cuda.Buffer
	rows  [][]staging.Row
	size  int64
	steps int
}

func newBenchPipeline(b *testing.B, size, row int64, regions int, scattered bool) *benchPipeline {
	rt := newRuntime(b, 0, soft.Config{})
	ctx := context.Background()
	cfg := staging.Config{
		Device: "cuda:0", Slots: 4, SlotBytes: size, ClaimTimeout: time.Minute,
		Keys: []string{"kv"}, PoolSlots: regions * int(size/row), RowBytes: row,
	}
	p, err := staging.New(ctx, rt, cfg)
	if err != nil {
		b.Fatal(err)
	}
	dev, err := rt.be.Allocate(ctx, "cuda:0", size)
	if err != nil {
		b.Fatal(err)
	}
	_ = rt.be.Write(ctx, dev, randBytes(rand.New(rand.NewPCG(1, 2)), int(size)))
	// Step i writes pool region i mod regions. With 4 slots at most 4
	// tasks are unwritten, so no row is ever taken from an unwritten
	// task (which would skip it: reassigned).
	rows := make([][]staging.Row, regions)
	for r := range rows {
		rows[r] = make([]staging.Row, size/row)
		for i := range rows[r] {
			slot := r*int(size/row) + i
			if scattered {
				slot = (r+1)*int(size/row) - 1 - i
			}
			rows[r][i] = staging.Row{Key: "kv", Slot: slot, Offset: int64(i) * row}
		}
	}
	return &benchPipeline{b: b, rt: rt, p: p, dev: dev, rows: rows, size: size}
}

// run stages n steps, one task each, and waits until every task is written.
func (bp *benchPipeline) run(n int) {
	ctx, b := context.Background(), bp.b
	tasks := make([]*staging.Task, 0, n)
	for range n {
		step, err := bp.p.Stage(ctx, bp.dev, nil)
		if err != nil {
			b.Fatal(err)
		}
		task, err := bp.p.Open(ctx, staging.TaskSpec{ReqID: "bench", Mode: staging.JoinNextStep})
		if err != nil {
			b.Fatal(err)
		}
		if err := task.Append(ctx, staging.Chunk{Step: step, Rows: bp.rows[bp.steps%len(bp.rows)]}); err != nil {
			b.Fatal(err)
		}
		if err := bp.p.Submit(ctx, task); err != nil {
			b.Fatal(err)
		}
		_ = step.Release() // the slot frees once the task is written
		tasks = append(tasks, task)
		bp.steps++
	}
	for _, t := range tasks {
		if err := t.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func (bp *benchPipeline) close(b *testing.B) {
	if got := bp.p.Stats().CommittedBytes; got != int64(bp.steps)*bp.size {
		b.Fatalf("committed %d bytes, want %d", got, int64(bp.steps)*bp.size)
	}
	_ = bp.p.Close(context.Background())
	_ = bp.rt.be.Free(bp.dev)
}
