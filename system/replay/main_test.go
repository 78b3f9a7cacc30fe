package replay

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test here starts runtimes (actors, stream goroutines); none may
// leave a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
