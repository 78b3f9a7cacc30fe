package offload

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/testsys"
)

// zeros is an endless stream of zero bytes (--trace /dev/zero).
type zeros struct{ n int64 }

func (z *zeros) Read(b []byte) (int, error) {
	clear(b)
	z.n += int64(len(b))
	return len(b), nil
}

// TestReadTraceBounds: a trace with no line ending is refused after its
// first maxTraceLine bytes (never read whole: /dev/zero would grow without
// end), and token counts beyond maxRowTokens (a row of 10^12 tokens) are
// refused.
func TestReadTraceBounds(t *testing.T) {
	z := &zeros{}
	var err error
	n := testsys.Allocated(func() { _, err = ReadTrace(z, 0) })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "line 1: longer than 4096 bytes")
	assert.Less(t, z.n, int64(1<<20), "bytes read")
	assert.Less(t, n, uint64(1<<20), "bytes allocated")

	head := "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	_, err = ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.68,1,1\n"+strings.Repeat("9", 5000)+"\n"), 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "line 3: longer than")
	_, err = ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.68,1000000000000,1\n"), 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "line 2: token counts \"1000000000000\", \"1\" must be integers 0 to 2147483647")
	rows, err := ReadTrace(strings.NewReader("\xef\xbb\xbf"+head+"\"2023-11-16 18:15:46.68\",1000000000,\"7\"\r\n2023-11-16 18:15:47,1,1"), 0)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	assert.Equal(t, int64(1_000_000_000), rows[0].Context)
	assert.Equal(t, int64(7), rows[0].Gen)
	_, err = ReadTrace(strings.NewReader(head+"2023-11-16 18:15:46.68,1,1,1\n"), 0)
	assert.ErrorContains(t, err, "line 2: 4 fields, want 3")
	_, err = ReadTrace(strings.NewReader(""), 0)
	assert.ErrorContains(t, err, "the trace is empty")
}

// TestScaleDuration: a speed far from 1 saturates a duration
// instead of wrapping it around.
func TestScaleDuration(t *testing.T) {
	assert.Equal(t, time.Duration(math.MaxInt64), scaleDuration(time.Hour, 1e300))
	assert.Equal(t, time.Duration(math.MinInt64), scaleDuration(-time.Hour, 1e300))
	assert.Equal(t, time.Duration(math.MaxInt64), scaleDuration(time.Second, math.Inf(1)))
	assert.Equal(t, 2*time.Second, scaleDuration(time.Second, 2))
}
