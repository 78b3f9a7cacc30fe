package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/stagingscript"
)

// runStaging runs script once and returns its JSON output. A run that does
// not end within a minute fails the test (a replay must always finish).
func runStaging(t *testing.T, script string) string {
	t.Helper()
	return runStagingWithin(t, script, time.Minute)
}

func runStagingWithin(t *testing.T, script string, d time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out bytes.Buffer
	_, err := Run(ctx, strings.NewReader(script), &out, Options{})
	require.NoError(t, ctx.Err(), "the replay did not finish within %s; script:\n%s", d, script)
	require.NoError(t, err, "script:\n%s", script)
	return out.String()
}

// requireSameRuns runs script runs times and requires byte-identical
// output; it returns the output.
func requireSameRuns(t *testing.T, name, script string, runs int) string {
	t.Helper()
	first := runStaging(t, script)
	for run := 1; run < runs; run++ {
		out := runStaging(t, script)
		if out == first {
			continue
		}
		a, b := strings.Split(first, "\n"), strings.Split(out, "\n")
		for i := 0; i < len(a) && i < len(b); i++ {
			if a[i] != b[i] {
				t.Fatalf("%s: run %d differs from run 0 at result %d:\n%s\n%s\nscript:\n%s", name, run, i+1, a[i], b[i], script)
			}
		}
		t.Fatalf("%s: run %d differs from run 0 in length; script:\n%s", name, run, script)
	}
	return first
}

// freezeReleasesThree: three JOIN_ON_FINISH tasks on the copy queue, the
// first one's clone held by freeze event f; the freeze lets all three copy
// stages go at once. Landing buffers of 512, 256 and 768 bytes are charged
// at pinned-host beside the 1 KiB of slots.
const freezeReleasesThree = `{"op":"start","locations":{"pageable-host":null,"pinned-host":null,"cuda:0":"64KiB"}}
{"op":"staging_start","name":"p","device":"cuda:0","slots":1,"slot_bytes":"1KiB","keys":["k"],"pool_slots":4,"row_bytes":256,"clone_budget":"4KiB"}
{"op":"task_open","pipeline":"p","task":"t1","req":"r","mode":"on_finish"}
{"op":"append","task":"t1","device_bytes":512,"freeze":"f","rows":[{"key":"k","slot":0}]}
{"op":"task_open","pipeline":"p","task":"t2","req":"r","mode":"on_finish"}
{"op":"append","task":"t2","device_bytes":256,"rows":[{"key":"k","slot":1}]}
{"op":"task_open","pipeline":"p","task":"t3","req":"r","mode":"on_finish"}
{"op":"append","task":"t3","device_bytes":768,"rows":[{"key":"k","slot":2}]}
{"op":"submit","tasks":["t1","t2","t3"]}
{"op":"freeze","event":"f"}
{"op":"snapshot"}
{"op":"trace"}
`

// TestFreezeReleasingSeveralCopyStagesIsDeterministic: when one freeze
// releases several copy stages, each task's landing buffer is released
// before the next task's is reserved, on every run: the pinned-host peak
// is the slots and the largest landing buffer, and the trace is the same.
func TestFreezeReleasingSeveralCopyStagesIsDeterministic(t *testing.T) {
	runs := 20
	if raceEnabled {
		runs = 10
	}
	out := requireSameRuns(t, "three copy stages", freezeReleasesThree, runs)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 12)

	var snap struct {
		Snapshot struct {
			Locations []struct {
				Location string `json:"location"`
				Peak     int64  `json:"peak_bytes"`
				Reserved int64  `json:"reserved_bytes"`
			} `json:"locations"`
		} `json:"snapshot"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[10]), &snap))
	var pinned []int64
	for _, l := range snap.Snapshot.Locations {
		if l.Location == "pinned-host" {
			pinned = []int64{l.Reserved, l.Peak}
		}
	}
	assert.Equal(t, []int64{1024, 1024 + 768}, pinned, "pinned-host reserved and peak: the slots, and the slots with the largest landing buffer")

	var trace struct {
		Trace []struct {
			Kind   string `json:"kind"`
			Detail string `json:"detail"`
		} `json:"trace"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[11]), &trace))
	var landings []string
	for _, e := range trace.Trace {
		if strings.HasPrefix(e.Detail, "p/host/") || strings.HasPrefix(e.Detail, "p/clone/") {
			landings = append(landings, e.Kind+" "+e.Detail)
		}
	}
	assert.Equal(t, []string{
		"reserve p/clone/1", "reserve p/clone/2", "reserve p/clone/3",
		"reserve p/host/1", // t1's copy stage, claimed before the freeze
		"unreserve p/clone/1", "unreserve p/host/1",
		"reserve p/host/2", "unreserve p/clone/2", "unreserve p/host/2",
		"reserve p/host/3", "unreserve p/clone/3", "unreserve p/host/3",
	}, landings, "one task at a time: its clone released at HOST_READY, its landing buffer at WRITTEN, then the next task's")
}

// TestStagingScriptsAreDeterministic: random staging scripts print the
// same bytes on every run. Most are stagingscript.Freezes (freeze events
// that release several copy stages at once, batches of submits, faults,
// clone budget flushes), the rest stagingscript.Random; each ends with a
// snapshot (every location's peak) and the trace (the order of every
// charge and release). STAGING_DETERMINISM=N runs N scripts of each kind
// (default 24 and 8, a few seconds), STAGING_DETERMINISM_RUNS=K runs each K
// times (default 3), STAGING_DETERMINISM_SEED=S fixes the seed (default:
// the time; a failure names its seed and script).
func TestStagingScriptsAreDeterministic(t *testing.T) {
	freezes, random, runs := 24, 8, 3
	if testing.Short() {
		freezes, random = 8, 4
	}
	if s := os.Getenv("STAGING_DETERMINISM"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		freezes, random = n, n
	}
	if s := os.Getenv("STAGING_DETERMINISM_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		runs = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("STAGING_DETERMINISM_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d: %d Freezes and %d Random scripts, %d runs each", seed, freezes, random, runs)
	for _, kind := range []struct {
		name string
		n    int
		gen  func(*rand.Rand) string
	}{{"Freezes", freezes, stagingscript.Freezes}, {"Random", random, stagingscript.Random}} {
		for i := range kind.n {
			script := kind.gen(rand.New(rand.NewPCG(seed, uint64(i))))
			requireSameRuns(t, fmt.Sprintf("seed %d, %s script %d", seed, kind.name, i), script, runs)
		}
	}
}

// TestLandingRefusalWithGatedCloneFinishes: a copy stage refused its
// second landing buffer (the pinned budget has room for one beside the
// slots) while its first clone waits for a freeze event fails its task at
// the submit and leaves only the two clones waiting for their copies; the
// replay settles and goes on (it waited for ever for a landing buffer
// whose copy waited for the freeze). The freeze frees the clones.
func TestLandingRefusalWithGatedCloneFinishes(t *testing.T) {
	script := `{"op":"start","locations":{"pageable-host":null,"pinned-host":"3KiB","cuda:0":"10KiB"}}
{"op":"staging_start","name":"p","device":"cuda:0","slots":2,"slot_bytes":"1KiB","keys":["k","v"],"pool_slots":4,"row_bytes":256,"clone_budget":"3KiB"}
{"op":"task_open","pipeline":"p","task":"t1","req":"r","mode":"on_finish"}
{"op":"append","task":"t1","device_bytes":512,"freeze":"f","rows":[{"key":"k","slot":1}]}
{"op":"append","task":"t1","device_bytes":768,"rows":[{"key":"v","slot":1}]}
{"op":"submit","tasks":["t1"]}
{"op":"snapshot"}
{"op":"freeze","event":"f"}
{"op":"snapshot"}
`
	out := runStagingWithin(t, script, 20*time.Second)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 9)
	assert.Contains(t, lines[5], `"from":"COPYING","to":"FAILED","cause":"landing buffer for a 768-byte clone: residency budget exceeded at pinned-host`)
	reserved := func(line string) map[string]int64 {
		var snap struct {
			Snapshot struct {
				Locations []struct {
					Location string `json:"location"`
					Reserved int64  `json:"reserved_bytes"`
				} `json:"locations"`
			} `json:"snapshot"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &snap))
		m := map[string]int64{}
		for _, l := range snap.Snapshot.Locations {
			m[l.Location] = l.Reserved
		}
		return m
	}
	assert.Equal(t, map[string]int64{"pageable-host": 2048, "pinned-host": 2048, "cuda:0": 512 + 768}, reserved(lines[6]), "the slots; the clones wait for their copies")
	assert.Equal(t, map[string]int64{"pageable-host": 2048, "pinned-host": 2048, "cuda:0": 0}, reserved(lines[8]))
}
