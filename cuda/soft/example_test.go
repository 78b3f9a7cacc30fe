package soft_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/cuda/soft"
)

// Allocate a pinned host buffer and a (simulated) device buffer, write the
// host one, copy it to the device on a stream, record an event, wait for
// it, and read the device buffer back.
func Example() {
	ctx := context.Background()
	b, err := soft.New(soft.Config{
		Locations: []string{"pinned-host", "cuda:0"},
		Capacity:  map[string]int64{"cuda:0": 1 << 20},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	msg := []byte("resident bytes")
	host, err := b.Allocate(ctx, "pinned-host", int64(len(msg)))
	if err != nil {
		log.Fatal(err)
	}
	dev, err := b.Allocate(ctx, "cuda:0", int64(len(msg)))
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Write(ctx, host, msg); err != nil {
		log.Fatal(err)
	}

	s, err := b.NewStream("cuda:0")
	if err != nil {
		log.Fatal(err)
	}
	if err := s.CopyAsync(dev, host); err != nil { // returns at once
		log.Fatal(err)
	}
	ev, err := s.Record()
	if err != nil {
		log.Fatal(err)
	}
	if err := ev.Wait(ctx); err != nil { // the copy's own outcome
		log.Fatal(err)
	}

	got, err := b.Read(ctx, dev)
	if err != nil {
		log.Fatal(err)
	}
	mi, _ := b.MemInfo("cuda:0")
	fmt.Println(b.Name())
	fmt.Printf("%s: %q\n", dev.Location(), got)
	fmt.Printf("cuda:0 used %d of %d bytes\n", mi.UsedBytes, mi.TotalBytes)
	// Output:
	// soft (simulated devices)
	// cuda:0: "resident bytes"
	// cuda:0 used 14 of 1048576 bytes
}
