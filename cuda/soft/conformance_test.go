package soft_test

import (
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/conformance"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/stretchr/testify/require"
)

// The backend conformance suite, which the cu backend also runs on a GPU.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, capacity map[string]int64) cuda.Backend {
		b, err := soft.New(soft.Config{Locations: allLocations, Capacity: capacity})
		require.NoError(t, err)
		return b
	}, allLocations...)
}
