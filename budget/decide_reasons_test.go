package budget

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The reasons built with strconv read exactly as their fmt forms,
// request names that need quoting included.
func TestVictimReasonsAsFormatted(t *testing.T) {
	for _, req := range []string{"r1", `say "hi"`, "naïve\tname\x00", ""} {
		got := victimReason(-3, 17, "cuda:0", "demoted to pinned-host", 4096, 12288, req)
		want := fmt.Sprintf("priority H=%d (last use v%d) among the lowest at %s; %s to free %d bytes of the %d-byte shortfall for request %q",
			int64(-3), uint64(17), "cuda:0", "demoted to pinned-host", int64(4096), int64(12288), req)
		require.Equal(t, want, got)
	}
	require.Equal(t, fmt.Sprintf(", at %s to make room for the demotion of %s from %s (reclaim %d)", "pinned-host", "b12", "cuda:0", 4),
		roomForReason("pinned-host", "b12", "cuda:0", 4))
}
