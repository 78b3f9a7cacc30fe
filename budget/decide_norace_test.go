//go:build !race

package budget

// dtRaceEnabled reports whether the race detector is on (timing targets
// are not checked under its instrumentation).
const dtRaceEnabled = false
