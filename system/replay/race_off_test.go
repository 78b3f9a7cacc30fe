//go:build !race

package replay

// raceEnabled: the race detector instruments every memory access, so
// timings of tight loops mean nothing under it.
const raceEnabled = false
