package system

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The token bucket on an injected clock: a burst, then the refill rate;
// the first line after a gap carries the count it left out; kinds are
// bound apart.
func TestEventBucketSuppressedCount(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	l := newEventLog(log, Options{EventLevel: zerolog.WarnLevel, EventBurst: 3, EventsPerSecond: 2})
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for i := range 100 {
		l.stagingForTest(i)
	}
	l.Evicted(Transition{Handle: "x", Location: "cuda:0", Bytes: 1, Removal: RemovalEvict}, 0, false)
	now = now.Add(time.Second) // two tokens
	for i := range 10 {
		l.stagingForTest(100 + i)
	}
	var lines []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(s), &m))
		lines = append(lines, m)
	}
	require.Len(t, lines, 3+1+2)
	for _, m := range lines {
		assert.Equal(t, "warn", m["level"])
	}
	assert.NotContains(t, lines[2], "suppressed")
	assert.Equal(t, EventEvicted, lines[3]["event"])
	assert.NotContains(t, lines[3], "suppressed", "kinds are bound apart")
	assert.EqualValues(t, 97, lines[4]["suppressed"], "the lines left out in the storm")
	assert.EqualValues(t, 100, lines[4]["task"])
	assert.NotContains(t, lines[5], "suppressed")
}

// stagingForTest writes a staging event for task i.
func (l *eventLog) stagingForTest(i int) {
	if e := l.start(evStagingFailed); e != nil {
		e.Int("task", i).Msg("staging pipeline failed")
	}
}
