//go:build !unix

package offload

import "time"

// processCPU: not known on this platform.
func processCPU() (time.Duration, bool) { return 0, false }
