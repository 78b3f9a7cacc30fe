package nodeproc

import (
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FreePort's ports lie below the kernel's ephemeral range (so a listener
// on port 0 cannot take one before it is used), are never handed out
// twice by one process, and can be listened on.
func TestFreePortIsBelowTheEphemeralRangeAndNotRepeated(t *testing.T) {
	lo, ok := ephemeralLow()
	if !ok || lo <= freePortFloor+1000 {
		t.Skip("no ephemeral range to stay below on this machine")
	}
	seen := map[int]bool{}
	for range 50 {
		port, err := FreePort()
		require.NoError(t, err)
		assert.GreaterOrEqual(t, port, freePortFloor)
		assert.Less(t, port, lo)
		assert.False(t, seen[port], "port %d handed out twice", port)
		seen[port] = true
	}
	for port := range seen {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		require.NoError(t, err)
		require.NoError(t, l.Close())
		break
	}
}
