package replay

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
)

// A replay's backend is the soft backend and says so, through its
// truncation and the fault injector.
func TestReplayBackendIsSimulated(t *testing.T) {
	b, err := newBackend([]string{"pageable-host", "cuda:0"})
	require.NoError(t, err)
	defer b.Close()
	require.True(t, cuda.IsSimulated(b), "%s: not simulated", b.Name())
	require.Contains(t, b.Name(), "soft")
}
