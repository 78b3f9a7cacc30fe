package staging_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// BenchmarkCommit measures committed bytes/s through the JOIN_NEXT_STEP
// path (stage a whole step → device→host copy into a pinned slot → copy
// queue → committer scatters rows of 16 KiB into the CPU block pool) on the
// soft backend, side by side with a plain copy() of the same bytes, the
// physical limit of this machine. b.SetBytes makes `go test -bench` print
// MB/s for both.
//
//	go test -run '^$' -bench BenchmarkCommit -benchtime 2s -count 2 ./staging
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
		b.Run(name+"/two-copies", func(b *testing.B) {
			// What the pipeline's bytes must go through at least, on one
			// goroutine: device→slot, then slot rows → pool rows.
			src := randBytes(rand.New(rand.NewPCG(1, 2)), int(size))
			slot := make([]byte, size)
			pool := make([]byte, regions*size)
			b.SetBytes(size)
			i := 0
			for b.Loop() {
				copy(slot, src)
				base := int64(i%regions) * size
				for off := int64(0); off < size; off += row {
					copy(pool[base+off:base+off+row], slot[off:off+row])
				}
				i++
			}
		})
		b.Run(name+"/two-goroutines", func(b *testing.B) {
			// The ceiling of a two-copy design on this machine: the same two
			// copies overlapped on two goroutines (as the copy stream and
			// the committer are), through 4 slots, the second copy done as
			// the committer does contiguous rows (one copy()), no
			// bookkeeping at all.
			src := randBytes(rand.New(rand.NewPCG(1, 2)), int(size))
			slots := make([][]byte, 4)
			for i := range slots {
				slots[i] = make([]byte, size)
			}
			pool := make([]byte, regions*size)
			free, full := make(chan int, 4), make(chan int, 4)
			for i := range slots {
				free <- i
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				n := 0
				for i := range full {
					base := int64(n%regions) * size
					copy(pool[base:base+size], slots[i])
					free <- i
					n++
				}
			}()
			b.SetBytes(size)
			for b.Loop() {
				i := <-free
				copy(slots[i], src)
				full <- i
			}
			close(full)
			<-done
		})
		for _, scattered := range []bool{false, true} {
			name := name + "/pipeline"
			if scattered {
				name += "-scattered"
			}
			b.Run(name, func(b *testing.B) { benchPipeline(b, size, row, regions, scattered) })
		}
	}
}

// benchPipeline drives the JOIN_NEXT_STEP path: one producer stages whole
// steps into 4 slots, one task per step takes every row of it. Rows land on
// consecutive pool rows (the committer writes them as one run), or, with
// scattered, on pool rows in reverse order (one copy() per row).
func benchPipeline(b *testing.B, size, row int64, regions int, scattered bool) {
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
	var tasks []*staging.Task
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		step, err := p.Stage(ctx, dev, nil)
		if err != nil {
			b.Fatal(err)
		}
		task, err := p.Open(ctx, staging.TaskSpec{ReqID: "bench", Mode: staging.JoinNextStep})
		if err != nil {
			b.Fatal(err)
		}
		if err := task.Append(ctx, staging.Chunk{Step: step, Rows: rows[len(tasks)%regions]}); err != nil {
			b.Fatal(err)
		}
		if err := p.Submit(ctx, task); err != nil {
			b.Fatal(err)
		}
		_ = step.Release() // the slot frees once the task is written
		tasks = append(tasks, task)
	}
	for _, t := range tasks {
		if err := t.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if got := p.Stats().CommittedBytes; got != int64(len(tasks))*size {
		b.Fatalf("committed %d bytes, want %d", got, int64(len(tasks))*size)
	}
	_ = p.Close(ctx)
	_ = rt.be.Free(dev)
}
