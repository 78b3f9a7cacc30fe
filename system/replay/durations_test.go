package replay

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClaimTimeoutRange: claim_timeout_ms takes 0 to one day in
// milliseconds; a negative value, or one whose duration would overflow
// (2^63−1 would become -1ms, "no wait"; 9.3e12 a negative duration), is
// refused naming the field and the line.
func TestClaimTimeoutRange(t *testing.T) {
	script := func(v string) string {
		return `{"op":"start","locations":{"pageable-host":null,"pinned-host":null,"cuda:0":"64KiB"}}` + "\n" +
			fmt.Sprintf(`{"op":"staging_start","name":"p","device":"cuda:0","slots":1,"slot_bytes":512,"claim_timeout_ms":%s,"keys":["k"],"pool_slots":1,"row_bytes":512}`, v) + "\n"
	}
	for v, want := range map[string]time.Duration{"0": 0, "1": time.Millisecond, "86400000": 24 * time.Hour, "1e3": time.Second} {
		ops, err := Parse(strings.NewReader(script(v)))
		require.NoError(t, err, v)
		require.Len(t, ops, 2)
		assert.Equal(t, want, ops[1].staging.claimTimeout, v)
	}
	for _, v := range []string{"-1", "86400001", "9223372036854775807", "9.3e12", "-9223372036854775808"} {
		_, err := Parse(strings.NewReader(script(v)))
		require.Error(t, err, v)
		assert.Contains(t, err.Error(), "line 2", v)
		assert.Contains(t, err.Error(), `field "claim_timeout_ms": `, v)
		assert.Contains(t, err.Error(), "is outside 0 (no wait) to 86400000 (one day), in milliseconds", v)
	}
}
