package staging_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// A step computed on cuda:0 is staged (one device→host copy into a pinned
// slot), one write task takes two of its rows, the committer writes them
// into the CPU block pool.
func Example() {
	ctx := context.Background()
	sys, _ := system.Start(ctx, simulated(system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"), system.NoLimit("pinned-host"), system.Limit("cuda:0", 1<<20),
	}}))
	defer sys.Close(ctx)
	p, err := staging.New(ctx, sys, staging.Config{
		Device: "cuda:0", Slots: 2, SlotBytes: 4096,
		Keys: []string{"k", "v"}, PoolSlots: 16, RowBytes: 1024,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close(ctx)

	// The step's rows on the device (here written directly; a kernel and
	// its freeze event in real use).
	be := sys.Backend()
	dev, _ := be.Allocate(ctx, "cuda:0", 2048)
	defer be.Free(dev)
	data := make([]byte, 2048)
	for i := range data {
		data[i] = byte(i / 1024 * 7)
	}
	_ = be.Write(ctx, dev, data)

	step, _ := p.Stage(ctx, dev, nil)
	task, _ := p.Open(ctx, staging.TaskSpec{ReqID: "req-1", WriteN: 1, Mode: staging.JoinNextStep})
	_ = task.Append(ctx, staging.Chunk{Step: step, Rows: []staging.Row{
		{Key: "k", Slot: 3, Offset: 0},
		{Key: "v", Slot: 3, Offset: 1024},
	}})
	_ = p.Submit(ctx, task)
	_ = step.Release() // the step is consumed; the slot frees after the pool write
	fmt.Println(task.Wait(ctx), task.State())
	row, _ := p.ReadPool("v", 3)
	fmt.Println(row[0], p.Stats().CommittedBytes)
	// Output:
	// <nil> WRITTEN
	// 7 2048
}

// A JOIN_ON_FINISH write keeps a device clone, charged as a reservation on
// cuda:0, until the request finishes.
func Example_joinOnFinish() {
	ctx := context.Background()
	sys, _ := system.Start(ctx, simulated(system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"), system.NoLimit("pinned-host"), system.Limit("cuda:0", 1<<20),
	}}))
	defer sys.Close(ctx)
	p, _ := staging.New(ctx, sys, staging.Config{
		Device: "cuda:0", Slots: 1, SlotBytes: 1024,
		Keys: []string{"kv"}, PoolSlots: 4, RowBytes: 512, CloneBudgetBytes: 4096,
	})
	defer p.Close(ctx)
	be := sys.Backend()
	dev, _ := be.Allocate(ctx, "cuda:0", 512)
	defer be.Free(dev)
	_ = be.Write(ctx, dev, make([]byte, 512))

	task, _ := p.Open(ctx, staging.TaskSpec{ReqID: "req-2", Mode: staging.JoinOnFinish})
	_ = task.Append(ctx, staging.Chunk{Device: dev, Rows: []staging.Row{{Key: "kv", Slot: 1}}})
	snap, _ := sys.Snapshot(ctx)
	for _, l := range snap.Locations {
		if l.Location == "cuda:0" {
			fmt.Println(task.State(), "clone reserved on cuda:0:", l.ReservedBytes)
		}
	}
	_ = p.Submit(ctx, task) // the request finished
	fmt.Println(task.Wait(ctx), p.Stats().CloneBytes)
	// Output:
	// PENDING clone reserved on cuda:0: 512
	// <nil> 0
}

// Prioritize moves a task to the front of the copy queue.
func ExamplePipeline_Prioritize() {
	ctx := context.Background()
	sys, _ := system.Start(ctx, simulated(system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"), system.NoLimit("pinned-host"), system.NoLimit("cuda:0"),
	}}))
	defer sys.Close(ctx)
	p, _ := staging.New(ctx, sys, staging.Config{
		Device: "cuda:0", Slots: 1, SlotBytes: 1024,
		Keys: []string{"kv"}, PoolSlots: 4, RowBytes: 512, CloneBudgetBytes: 4096,
	})
	defer p.Close(ctx)
	be := sys.Backend()
	dev, _ := be.Allocate(ctx, "cuda:0", 512)
	defer be.Free(dev)
	task, _ := p.Open(ctx, staging.TaskSpec{ReqID: "urgent", Mode: staging.JoinOnFinish})
	_ = task.Append(ctx, staging.Chunk{Device: dev, Rows: []staging.Row{{Key: "kv", Slot: 0}}})
	_ = p.Prioritize(ctx, task.ID()) // pending → queued at the front
	fmt.Println(task.Wait(ctx), task.State())
	// Output:
	// <nil> WRITTEN
}

// A task opened with a name is named by it in the pipeline's messages, and
// its errors carry the name as a field.
func ExampleTaskSpec_name() {
	ctx := context.Background()
	sys, _ := system.Start(ctx, simulated(system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"), system.NoLimit("pinned-host"), system.NoLimit("cuda:0"),
	}}))
	defer sys.Close(ctx)
	p, _ := staging.New(ctx, sys, staging.Config{
		Device: "cuda:0", Slots: 1, SlotBytes: 1024,
		Keys: []string{"kv"}, PoolSlots: 4, RowBytes: 512, CloneBudgetBytes: 4096,
	})
	defer p.Close(ctx)
	be := sys.Backend()
	dev, _ := be.Allocate(ctx, "cuda:0", 512)
	defer be.Free(dev)
	chunk := staging.Chunk{Device: dev, Rows: []staging.Row{{Key: "kv", Slot: 0}}}

	task, _ := p.Open(ctx, staging.TaskSpec{ReqID: "req-3", Mode: staging.JoinOnFinish, Name: "decode-7"})
	_ = task.Append(ctx, chunk)
	_ = p.Submit(ctx, task)
	_ = task.Wait(ctx)
	err := task.Append(ctx, chunk) // the task is written: open a fresh one
	var refused *staging.AppendRefusedError
	if errors.As(err, &refused) {
		fmt.Println(refused.TaskName)
	}
	fmt.Println(err)

	_, err = p.Open(ctx, staging.TaskSpec{ReqID: "req-3", Mode: staging.JoinOnFinish, Name: "bad\xff"})
	fmt.Println(errors.Is(err, staging.ErrConfig), err)
	// Output:
	// decode-7
	// staging: task "decode-7": append refused: the task is WRITTEN; open a fresh task
	// true staging: task name "bad\xff" is not valid UTF-8 (configuration error)
}
