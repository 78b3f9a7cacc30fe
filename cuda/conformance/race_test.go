//go:build cuda && race

package conformance_test

const raceEnabled = true
