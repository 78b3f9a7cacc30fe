//go:build race

package jsonline

// raceEnabled: the race detector instruments every memory access, so
// timings of tight loops mean nothing under it.
const raceEnabled = true
