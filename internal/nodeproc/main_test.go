package nodeproc

import (
	"testing"

	"go.uber.org/goleak"
)

// A server runs each command in its own goroutine and the register tests
// start runtimes: none may leave a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
