package soft_test

import (
	"os"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/conformance"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/stretchr/testify/require"
)

// The backend conformance suite, which the cu backend also runs on a GPU.
func TestConformance(t *testing.T) {
	newBackend := func(t *testing.T, capacity map[string]int64) cuda.Backend {
		b, err := soft.New(soft.Config{Locations: allLocations, Capacity: capacity})
		require.NoError(t, err)
		return b
	}
	conformance.Run(t, newBackend, allLocations...)
	conformance.RunZeroed(t, newBackend, allLocations...)
}

// The suite again on a backend whose every buffer keeps its bytes in
// chunks of one OS page (by default only buffers from 32 MiB up do, in
// chunks of 64 KiB), so that every check runs on chunked buffers too.
func TestConformanceChunked(t *testing.T) {
	page := int64(os.Getpagesize())
	newBackend := func(t *testing.T, capacity map[string]int64) cuda.Backend {
		b, err := soft.NewSparse(soft.Config{Locations: allLocations, Capacity: capacity}, 1, page)
		require.NoError(t, err)
		return b
	}
	conformance.Run(t, newBackend, allLocations...)
	conformance.RunZeroed(t, newBackend, allLocations...)
}
