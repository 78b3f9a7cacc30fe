package system_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/system"
)

func kvBlock(name string, bytes int64) system.Request {
	return system.Request{Name: name, Reservations: []system.ReservationSpec{{Name: name, Location: "cuda:0", Bytes: bytes}}}
}

// With WaitForRoom, an Admit that does not fit waits in the runtime's
// queue until room is made (here: the exit of the scope that holds the
// GPU), instead of failing.
func ExampleWaitForRoom() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	holder, _, err := sys.Admit(ctx, kvBlock("batch-1", 48<<10))
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error)
	go func() {
		sc, _, err := sys.Admit(ctx, kvBlock("batch-2", 32<<10), system.WaitForRoom())
		if err == nil {
			fmt.Println("batch-2 admitted")
			err = sc.Exit(ctx)
		}
		done <- err
	}()
	fmt.Println("batch-1 exits")
	if err := holder.Exit(ctx); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// batch-1 exits
	// batch-2 admitted
}

// WaitClass puts a waiter in a priority class (higher classes are tried
// first); WaitAllowBypass lets later waiters pass it while it does not
// fit. A call that fits at once is admitted without waiting.
func ExampleWaitClass() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	sc, _, err := sys.Admit(ctx, kvBlock("interactive", 16<<10), system.WaitClass(2), system.WaitAllowBypass())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("admitted:", sc.Name() != "")
	if err := sc.Exit(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// admitted: true
}

// WaitAllowBypass alone waits in class 0 and may be passed by later
// waiters that fit while it does not.
func ExampleWaitAllowBypass() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	sc, _, err := sys.Admit(ctx, kvBlock("bulk", 60<<10), system.WaitAllowBypass())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("admitted bulk")
	if err := sc.Exit(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// admitted bulk
}
