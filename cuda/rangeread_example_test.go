package cuda_test

import (
	"context"
	"fmt"
	"log"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
)

// Read a range of a buffer through whatever backend is at hand: its own
// ranged read when it has one (the soft backend has), otherwise a whole
// Read and a copy of the range.
func ExampleReadAt() {
	ctx := context.Background()
	var b cuda.Backend
	b, err := soft.New(soft.Config{Locations: []string{"pinned-host"}})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	buf, err := b.Allocate(ctx, "pinned-host", 14)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Write(ctx, buf, []byte("resident bytes")); err != nil {
		log.Fatal(err)
	}
	p := make([]byte, 8)
	if err := cuda.ReadAt(ctx, b, buf, 0, p); err != nil {
		log.Fatal(err)
	}
	_, ranged := b.(cuda.RangeReader)
	fmt.Printf("%q %v\n", p, ranged)
	fmt.Println(cuda.ReadAt(ctx, b, buf, 8, p))
	// Output:
	// "resident" true
	// soft backend: cuda: range of 8 bytes at offset 8 is not inside a 14-byte buffer
}
