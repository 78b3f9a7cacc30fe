package soft_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
)

// Read bytes 6 to 11 of a device buffer without copying the rest, then ask
// for a range that passes its end.
func ExampleBackend_ReadAt() {
	ctx := context.Background()
	b, err := soft.New(soft.Config{Locations: []string{"cuda:0"}})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	buf, err := b.Allocate(ctx, "cuda:0", 14)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Write(ctx, buf, []byte("resident bytes")); err != nil {
		log.Fatal(err)
	}
	p := make([]byte, 5)
	if err := b.ReadAt(ctx, buf, 9, p); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q\n", p)
	var re *cuda.RangeError
	err = b.ReadAt(ctx, buf, 10, p)
	fmt.Println(errors.As(err, &re), errors.Is(err, cuda.ErrInvalid), re.Offset, re.Length, re.Size)
	// Output:
	// "bytes"
	// true true 10 5 14
}

// A buffer never written reads as zeros, in any range, and holds no real
// memory afterwards.
func TestReadAtOfUnwrittenBufferIsZeros(t *testing.T) {
	ctx := context.Background()
	b, err := soft.New(soft.Config{Locations: []string{"cuda:0"}})
	require.NoError(t, err)
	defer b.Close()
	buf, err := b.Allocate(ctx, "cuda:0", 1<<20)
	require.NoError(t, err)
	p := []byte{1, 2, 3, 4}
	require.NoError(t, b.ReadAt(ctx, buf, 1<<19, p))
	require.Equal(t, []byte{0, 0, 0, 0}, p)
	require.Zero(t, b.RealBytes())
}
