package budget

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReportHoldsNoSpareCapacity: a report's transitions are made in one
// slice of exactly their number. A report lives as long as whoever keeps
// it (an entered scope keeps its entry's), and at 128 bytes a transition
// a slice grown by appending would keep up to half of it unused (three
// transitions in the room of four).
func TestReportHoldsNoSpareCapacity(t *testing.T) {
	c := newChecked(t, stdConfig())
	w := c.reg("w", 10, Replicable, "cuda:0")
	for n := 1; n <= 5; n++ {
		rep := c.L.Recording(func() {
			for range n {
				_, err := c.Acquire(w, "cuda:0")
				require.NoError(t, err)
			}
		})
		require.Len(t, rep.Transitions, n)
		require.Equal(t, n, cap(rep.Transitions), "capacity of a report of %d transitions", n)
	}
}
