package faulty_test

import (
	"context"
	"fmt"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
)

// A copy into cuda:0 fails once: the failure reaches the next event of the
// stream, and the destination is untouched.
func ExampleWrap() {
	ctx := context.Background()
	inner, err := soft.New(soft.Config{Locations: []string{"pinned-host", "cuda:0"}})
	if err != nil {
		panic(err)
	}
	b := faulty.Wrap(inner, soft.ErrorPrefix)
	defer b.Close() // closes inner too

	host, _ := b.Allocate(ctx, "pinned-host", 4)
	dev, _ := b.Allocate(ctx, "cuda:0", 4)
	_ = b.Write(ctx, host, []byte{1, 2, 3, 4})
	st, _ := b.NewStream("cuda:0")
	defer st.Close()

	b.Faults().Arm(cuda.FaultCopy, "cuda:0")
	fmt.Println("enqueue:", st.CopyAsync(dev, host))
	ev, _ := st.Record()
	fmt.Println("event:", ev.Wait(ctx))
	got, _ := b.Read(ctx, dev)
	fmt.Println("destination:", got)

	_ = st.CopyAsync(dev, host) // nothing armed now
	ev, _ = st.Record()
	fmt.Println("retry:", ev.Wait(ctx))
	// Output:
	// enqueue: <nil>
	// event: soft backend: injected copy fault at cuda:0
	// destination: [0 0 0 0]
	// retry: <nil>
}

// Of finds the injector of a backend that a runtime was given, for a test
// that holds only the runtime.
func ExampleOf() {
	inner, _ := soft.New(soft.Config{Locations: []string{"cuda:0"}})
	var b cuda.Backend = faulty.Wrap(inner, soft.ErrorPrefix)
	defer b.Close()
	fmt.Println(faulty.Of(b) != nil, faulty.Of(inner) != nil)
	// Output: true false
}
