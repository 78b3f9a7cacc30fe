package liveview_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// startSoft starts a runtime on the soft backend (testsys.Soft) with an
// unlimited pageable host and a 1 MiB cuda:0, closed when the test ends.
func startSoft(t *testing.T) *system.System {
	t.Helper()
	locs := []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<20)}
	sys, err := system.Start(context.Background(), system.Options{Locations: locs, Backend: testsys.Soft(t, locs)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	return sys
}
