package soft

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestBufferSize: every simulated allocation costs one buffer record,
// kept in the 96-byte size class of the Go allocator (memory per resident
// value; see docs/devices.md).
func TestBufferSize(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(buffer{}), uintptr(96))
}
