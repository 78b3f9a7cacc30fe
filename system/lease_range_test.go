package system_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

// Read a slice of a leased value without copying the rest of it.
func ExampleLease_ReadAt() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	h, err := sys.Register(ctx, system.Value{Name: "w", Bytes: 14, At: "cuda:0", Data: []byte("resident bytes")})
	if err != nil {
		log.Fatal(err)
	}
	lease, err := sys.Acquire(ctx, h, "cuda:0")
	if err != nil {
		log.Fatal(err)
	}
	p := make([]byte, 5)
	if err := lease.ReadAt(ctx, 9, p); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q\n", p)
	var bad *system.InvalidInputError
	fmt.Println("past the end:", errors.As(lease.ReadAt(ctx, 10, p), &bad))
	_ = lease.Release(ctx)
	fmt.Println("released:", errors.As(lease.ReadAt(ctx, 0, p), &bad))
	// Output:
	// "bytes"
	// past the end: true
	// released: true
}

// Every range inside the value reads its bytes, at a host and a device
// location; a range outside it, or a released lease, is an
// InvalidInputError that leaves p as it was.
func TestLeaseReadAtReadsRangesInsideTheValueOnly(t *testing.T) {
	ctx := context.Background()
	s, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.NoLimit("cuda:0")}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close(context.Background())) })
	const n = 4096
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	h, err := s.Register(ctx, system.Value{Name: "v", Bytes: n, Mode: system.Replicable, At: "pageable-host", Data: data})
	require.NoError(t, err)
	require.NoError(t, s.Copy(ctx, h, "pageable-host", "cuda:0"))
	for _, loc := range []string{"pageable-host", "cuda:0"} {
		l, err := s.Acquire(ctx, h, loc)
		require.NoError(t, err)
		for _, r := range [][2]int64{{0, n}, {0, 0}, {n, 0}, {100, 1000}, {n - 1, 1}} {
			p := make([]byte, r[1])
			require.NoError(t, l.ReadAt(ctx, r[0], p), "%s %v", loc, r)
			require.Equal(t, data[r[0]:r[0]+r[1]], p)
		}
		for _, r := range [][2]int64{{-1, 1}, {n + 1, 0}, {n, 1}, {n - 10, 11}} {
			p := bytes.Repeat([]byte{0xee}, int(r[1]))
			var bad *system.InvalidInputError
			require.ErrorAs(t, l.ReadAt(ctx, r[0], p), &bad, "%s %v", loc, r)
			require.Equal(t, bytes.Repeat([]byte{0xee}, int(r[1])), p)
		}
		require.NoError(t, l.Release(ctx))
		p := bytes.Repeat([]byte{0xee}, 8)
		var bad *system.InvalidInputError
		require.ErrorAs(t, l.ReadAt(ctx, 0, p), &bad, "a released lease")
		require.Equal(t, bytes.Repeat([]byte{0xee}, 8), p)
	}
}
