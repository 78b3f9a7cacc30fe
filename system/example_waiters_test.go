package system_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/system"
)

// Waiters lists the callers waiting for room, in queue order: here one
// Admit waits for the GPU that batch-1 holds.
func ExampleSystem_Waiters() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	holder, _, err := sys.Admit(ctx, kvBlock("batch-1", 48<<10))
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error)
	go func() {
		sc, _, err := sys.Admit(ctx, kvBlock("batch-2", 32<<10), system.WaitClass(1))
		if err == nil {
			err = sc.Exit(ctx)
		}
		done <- err
	}()
	// Wait until batch-2 is queued: AwaitWaiters wakes at each change of
	// the queue, no polling.
	ws, err := sys.AwaitWaiters(ctx, func(ws []system.WaiterInfo) bool { return len(ws) > 0 })
	if err != nil {
		log.Fatal(err)
	}
	for _, w := range ws {
		fmt.Printf("%s waits in class %d for room at %v\n", w.Name, w.Class, w.Locations)
	}
	if err := holder.Exit(ctx); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting now:", len(sys.Waiters()))
	// Output:
	// batch-2 waits in class 1 for room at [cuda:0]
	// waiting now: 0
}
