package testsys

import "runtime"

// Allocated returns the bytes f allocated: the growth of the Go heap's
// TotalAlloc while it ran, for tests that bound what reading an input
// costs. Other goroutines (a fuzzing engine's, say) allocate a little on
// the side, so a bound wants some slack.
func Allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}
