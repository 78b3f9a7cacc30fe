package offload

import (
	"testing"

	"go.uber.org/goleak"
)

// A run starts a runtime, a pipeline and a goroutine per request: none
// may outlive it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
