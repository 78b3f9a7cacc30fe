package main

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplayMemoryPerBuffer: a replay keeps at most replayBufferLimit of
// real memory per buffer, whatever the sizes in the script: values
// registered resident with "at" (never allocated and filled at full
// size), placed, copied and moved. The Go heap grows
// by far less than the values' sizes.
func TestReplayMemoryPerBuffer(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"op":"start","locations":{"pageable-host":null,"pinned-host":null,"cuda:0":null}}` + "\n")
	names := []string{}
	for i, size := range []string{"256MiB", "512MiB", "1GiB", "1GiB", "1GiB", "1GiB", "64GiB", "2MiB", "1MiB"} {
		name := "v" + string(rune('a'+i))
		names = append(names, name)
		b.WriteString(`{"op":"register","handle":"` + name + `","bytes":"` + size + `","replica":"replicable","at":"pageable-host","expect":"ok"}` + "\n")
	}
	for _, name := range names {
		b.WriteString(`{"op":"copy","handle":"` + name + `","from":"pageable-host","to":"pinned-host","expect":"ok"}` + "\n")
		b.WriteString(`{"op":"copy","handle":"` + name + `","from":"pinned-host","to":"cuda:0","expect":"ok"}` + "\n")
	}
	b.WriteString(`{"op":"register","handle":"src","bytes":"8GiB","source":"pageable-host","expect":"ok"}` + "\n")
	b.WriteString(`{"op":"place","handle":"src","location":"cuda:0","expect":"ok"}` + "\n")
	b.WriteString(`{"op":"snapshot"}` + "\n")

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	code, out, errs := replayScript(t, b.String(), true)
	runtime.ReadMemStats(&after)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `"bytes":68719476736`) // the 64 GiB value is accounted whole
	allocated := after.TotalAlloc - before.TotalAlloc
	// 9 values × 3 locations + a reconstruction: 28 buffers and a temporary
	// one of at most 1 MiB each, plus the runtime's own bookkeeping.
	assert.Less(t, allocated, uint64(96<<20), "the replay allocated %d MiB", allocated>>20)
}
