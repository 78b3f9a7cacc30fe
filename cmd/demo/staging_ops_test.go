package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/residency-go/residency/internal/stagingscript"
	"github.com/residency-go/residency/system/replay"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stagingStart: a pipeline "p" on cuda:0 (line 2), two slots of 1 KiB, a
// pool of one key × 4 slots × 512 B, 1 KiB of clone budget.
const stagingStart = `{"op":"start","locations":{"pageable-host":null,"pinned-host":null,"cuda:0":"64KiB"}}
{"op":"staging_start","name":"p","device":"cuda:0","slots":2,"slot_bytes":"1KiB","keys":["k"],"pool_slots":4,"row_bytes":512,"clone_budget":"1KiB"}
`

// transitions returns a result's task transitions as "task FROM→TO".
func transitions(res map[string]any) []string {
	var out []string
	list, _ := res["task_transitions"].([]any)
	for _, x := range list {
		m := x.(map[string]any)
		from := "opened"
		if f, ok := m["from"].(string); ok {
			from = f
		}
		out = append(out, m["task"].(string)+" "+from+"→"+m["to"].(string))
	}
	return out
}

// TestStagingLifecycle: every transition of a task shows in the op that
// caused it, in chain order; a task held by a freeze event stays COPYING
// until the freeze op.
func TestStagingLifecycle(t *testing.T) {
	script := stagingStart +
		`{"op":"stage","pipeline":"p","step":"s","bytes":"1KiB","fill":3,"freeze":"f"}
{"op":"task_open","pipeline":"p","task":"t","req":"r","mode":"next_step"}
{"op":"append","task":"t","step":"s","rows":[{"key":"k","slot":1,"offset":512}]}
{"op":"submit","tasks":["t"]}
{"op":"wait","task":"t","until":"host_ready"}
{"op":"freeze","event":"f"}
{"op":"read_pool","pipeline":"p","key":"k","slot":1}
{"op":"freeze","event":"f"}
`
	results := checkResults(t, script, map[int]wantResult{
		3: {"ok", ""}, 4: {"ok", ""}, 6: {"ok", ""},
		7:  {"InvalidInput", `task "t" would wait forever: it is COPYING and its copy waits for freeze event "f"`},
		8:  {"ok", ""},
		10: {"InvalidInput", `freeze event "f" was already completed`},
	})
	assert.Equal(t, []string{"t opened→PENDING"}, transitions(results[4]))
	assert.Equal(t, []string{"t PENDING→QUEUED", "t QUEUED→COPYING"}, transitions(results[6]))
	assert.Equal(t, []string{"t COPYING→HOST_READY", "t HOST_READY→WRITTEN"}, transitions(results[8]))
	row := payload(t, payload(t, results[9], "staging"), "row")
	assert.Equal(t, float64(4), row["value"], "row 1 of a step filled with 3 holds 4")
	assert.Equal(t, float64(512), row["bytes"])
}

// TestStagingNames: names bind only on success; unknown and duplicate
// names are invalid input, checked in field order.
func TestStagingNames(t *testing.T) {
	script := stagingStart +
		`{"op":"staging_start","name":"p","device":"cuda:0","slots":1,"slot_bytes":1,"keys":["k"],"pool_slots":1,"row_bytes":1}
{"op":"staging_start","name":"q","device":"cuda:9","slots":1,"slot_bytes":1,"keys":["k"],"pool_slots":1,"row_bytes":1}
{"op":"stage","pipeline":"q","step":"s","bytes":0}
{"op":"stage","pipeline":"p","step":"s","bytes":"2KiB"}
{"op":"stage","pipeline":"p","step":"s","bytes":0}
{"op":"stage","pipeline":"p","step":"s","bytes":0}
{"op":"task_open","pipeline":"p","task":"t","req":"r","mode":"sideways"}
{"op":"task_open","pipeline":"p","task":"t","req":"r","mode":"next_step"}
{"op":"task_open","pipeline":"p","task":"t","req":"r","mode":"next_step"}
{"op":"append","task":"nobody","step":"s","rows":[]}
{"op":"append","task":"t","step":"nostep","rows":[]}
{"op":"submit","tasks":["t","nobody"]}
{"op":"wait","task":"t","until":"soon"}
{"op":"staging_stats","pipeline":"q"}
{"op":"staging_close","pipeline":"p"}
{"op":"staging_close","pipeline":"p"}
`
	checkResults(t, script, map[int]wantResult{
		3:  {"InvalidInput", `duplicate pipeline name "p"`},
		4:  {"ResidencyUnavailableError", "cuda:9"},
		5:  {"InvalidInput", `unknown pipeline "q"`},
		6:  {"StagingSlotOverflowError", "overflows"},
		7:  {"ok", ""},
		8:  {"InvalidInput", `duplicate step name "s"`},
		9:  {"InvalidInput", `unknown join mode "sideways"`},
		10: {"ok", ""},
		11: {"InvalidInput", `duplicate task name "t"`},
		12: {"InvalidInput", `unknown task "nobody"`},
		13: {"InvalidInput", `unknown step "nostep"`},
		14: {"InvalidInput", `unknown task "nobody"`},
		15: {"InvalidInput", `unknown wait "soon"`},
		16: {"InvalidInput", `unknown pipeline "q"`},
		17: {"ok", ""},
		18: {"InvalidInput", `pipeline "p" was already closed`},
	})
}

// TestStagingRealMemory: a replay holds at most 1 MiB of real memory per
// staging buffer; larger sizes are refused before anything is allocated.
func TestStagingRealMemory(t *testing.T) {
	script := stagingStart +
		`{"op":"staging_start","name":"big","device":"cuda:0","slots":1,"slot_bytes":"2MiB","keys":["k"],"pool_slots":1,"row_bytes":1}
{"op":"staging_start","name":"pool","device":"cuda:0","slots":1,"slot_bytes":1,"keys":["k","v"],"pool_slots":1024,"row_bytes":1024}
{"op":"task_open","pipeline":"p","task":"t","req":"r","mode":"on_finish"}
{"op":"append","task":"t","device_bytes":"2MiB","rows":[{"key":"k","slot":0}]}
`
	checkResults(t, script, map[int]wantResult{
		3: {"InvalidInput", "at most 1 MiB"},
		4: {"InvalidInput", "at most 1 MiB"},
		6: {"InvalidInput", "at most 1 MiB"},
	})
}

// TestStagingCloseWouldHang: closing a pipeline whose copy waits for a
// freeze event is refused; the end of the script completes the event and
// closes it (the replay exits 0).
func TestStagingCloseWouldHang(t *testing.T) {
	script := stagingStart +
		`{"op":"stage","pipeline":"p","step":"s","bytes":512,"freeze":"f"}
{"op":"task_open","pipeline":"p","task":"t","req":"r","mode":"next_step"}
{"op":"append","task":"t","step":"s","rows":[{"key":"k","slot":0}]}
{"op":"submit","tasks":["t"]}
{"op":"staging_close","pipeline":"p"}
{"op":"read_row","task":"t","key":"k","slot":0}
`
	checkResults(t, script, map[int]wantResult{
		7: {"InvalidInput", `closing pipeline "p" would wait forever: freeze event "f" is not complete`},
		8: {"InvalidInput", `reading task "t" would wait forever`},
	})
}

// TestStagingMalformed: a staging op with a missing, unknown or mistyped
// field makes the whole script malformed (exit 2, nothing runs).
func TestStagingMalformed(t *testing.T) {
	tests := []struct{ name, op, want string }{
		{"staging_start without keys", `{"op":"staging_start","name":"p","device":"cuda:0","slots":1,"slot_bytes":1,"pool_slots":1,"row_bytes":1}`, `needs field "keys"`},
		{"staging_start keys not strings", `{"op":"staging_start","name":"p","device":"cuda:0","slots":1,"slot_bytes":1,"keys":[1],"pool_slots":1,"row_bytes":1}`, `field "keys[0]": want a string`},
		{"staging_start eager not bool", `{"op":"staging_start","name":"p","device":"cuda:0","slots":1,"slot_bytes":1,"keys":["k"],"pool_slots":1,"row_bytes":1,"eager":"yes"}`, `field "eager": want true or false`},
		{"stage fractional slots", `{"op":"stage","pipeline":"p","step":"s","bytes":1.5}`, `not a whole number of bytes`},
		{"stage fill too large", `{"op":"stage","pipeline":"p","step":"s","bytes":1,"fill":256}`, `a byte value, 0 to 255`},
		{"append step and device", `{"op":"append","task":"t","step":"s","device_bytes":1,"rows":[]}`, `not both`},
		{"append neither", `{"op":"append","task":"t","rows":[]}`, `needs "step"`},
		{"append step with freeze", `{"op":"append","task":"t","step":"s","freeze":"f","rows":[]}`, `field "freeze" goes with "device_bytes"`},
		{"append row without slot", `{"op":"append","task":"t","step":"s","rows":[{"key":"k"}]}`, `missing field "rows[0].slot"`},
		{"append row unknown field", `{"op":"append","task":"t","step":"s","rows":[{"key":"k","slot":0,"size":1}]}`, `unknown field "rows[0].size"`},
		{"submit not a list", `{"op":"submit","tasks":"t"}`, `field "tasks": want an array of strings`},
		{"wait without until", `{"op":"wait","task":"t"}`, `needs field "until"`},
		{"read_row slot mistyped", `{"op":"read_row","task":"t","key":"k","slot":"0"}`, `field "slot": want an integer`},
		{"staging_close extra", `{"op":"staging_close","pipeline":"p","force":true}`, `unknown field "force"`},
		{"a staging error type misspelt", `{"op":"staging_stats","pipeline":"p","expect":"DropError"}`, `"DropError" is neither`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			script := stagingStart + tc.op + "\n" + `{"op":"snapshot"}` + "\n"
			code, out, errs := replayScript(t, script, true)
			assert.Equal(t, 2, code, "stderr: %s", errs)
			assert.Empty(t, out, "a malformed script ran")
			assert.Contains(t, errs, "line 3: ")
			assert.Contains(t, errs, tc.want)
		})
	}
}

// TestStagingTable: the table shows steps, rows, stats and transitions,
// and the transitions of a failed op after its error.
func TestStagingTable(t *testing.T) {
	code, out, errs := replayFile(t, "testdata/staging.jsonl", false)
	require.Equal(t, 0, code, errs)
	for _, want := range []string{
		`t1 PENDING→QUEUED, t1 QUEUED→COPYING`,
		`row ("v", 0): 512 B, every byte 11`,
		`drops 1 (gpu-budget) 1 (location-budget)`,
		`injected reconstruct fault at pinned-host; e PENDING→QUEUED`,
	} {
		assert.Contains(t, out, want)
	}
}

// TestOpsDocumented: every op of the format, its fields and every error
// type are in docs/replay.md and the package doc.
func TestOpsDocumented(t *testing.T) {
	for _, path := range []string{"../../docs/replay.md", "doc.go"} {
		b := readFile(t, path)
		for _, op := range replay.OpNames() {
			assert.True(t, strings.Contains(b, "`"+op+"`") || strings.Contains(b, op+" "), "%s does not mention %s", path, op)
			required, optional, _ := replay.OpFields(op)
			for _, f := range append(required, optional...) {
				assert.True(t, strings.Contains(b, f), "%s does not mention field %s of %s", path, f, op)
			}
		}
		for _, typ := range replay.ErrorTypes() {
			assert.True(t, strings.Contains(b, typ), "%s does not mention %s", path, typ)
		}
	}
}

// TestStagingReplayIsDeterministic: random staging scripts finish (no
// wait that never ends: the replay refuses it with a clear error) and
// print the same output on a second run.
func TestStagingReplayIsDeterministic(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	scripts := 40
	if testing.Short() {
		scripts = 10
	}
	first := 0
	if s := os.Getenv("STAGING_REPLAY_SEED"); s != "" { // "SEED" or "SEED/SCRIPT": replay a failure
		var err error
		seedText, scriptText, one := strings.Cut(s, "/")
		seed, err = strconv.ParseUint(seedText, 10, 64)
		require.NoError(t, err)
		if one {
			first, err = strconv.Atoi(scriptText)
			require.NoError(t, err)
			scripts = first + 1
		}
	}
	for i := first; i < scripts; i++ {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		script := stagingscript.Random(rng)
		path := filepath.Join(t.TempDir(), fmt.Sprint("random-", i, ".jsonl"))
		require.NoError(t, os.WriteFile(path, []byte(script), 0o644))
		var outs [2]string
		for run := range outs {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			var out, errb bytes.Buffer
			code := runReplayCtx(ctx, path, &out, &errb)
			hung := ctx.Err() != nil
			cancel()
			if hung {
				t.Fatalf("seed %d script %d: the replay did not finish within 30s (exit %d, stderr %s); script:\n%s", seed, i, code, errb.String(), script)
			}
			if strings.Contains(errb.String(), "goroutine ") || strings.Contains(errb.String(), "panic") {
				t.Fatalf("seed %d script %d: a Go stack trace:\n%s\nscript:\n%s", seed, i, errb.String(), script)
			}
			outs[run] = out.String()
		}
		if outs[0] != outs[1] {
			a, b := strings.Split(outs[0], "\n"), strings.Split(outs[1], "\n")
			for j := 0; j < len(a) && j < len(b); j++ {
				if a[j] != b[j] {
					t.Fatalf("seed %d script %d: two runs differ at result %d:\n%s\n%s\nscript:\n%s", seed, i, j+1, a[j], b[j], script)
				}
			}
			t.Fatalf("seed %d script %d: two runs differ in length; script:\n%s", seed, i, script)
		}
	}
}

func runReplayCtx(ctx context.Context, path string, out, errb *bytes.Buffer) int {
	return run(ctx, []string{"replay", "--json", path}, strings.NewReader(""), out, errb)
}

// checkResultsWithin is checkResults with a deadline: a replay that hangs
// fails the test instead (it is interrupted: exit status 130).
func checkResultsWithin(t *testing.T, script string, d time.Duration, want map[int]wantResult) map[int]map[string]any {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(script), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out, errb bytes.Buffer
	code := runReplayCtx(ctx, path, &out, &errb)
	require.NoError(t, ctx.Err(), "the replay did not finish within %s: %s", d, errb.String())
	require.Equal(t, 0, code, errb.String())
	results := map[int]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "output line %q", line)
		results[int(m["line"].(float64))] = m
	}
	for line, w := range want {
		res := results[line]
		require.NotNil(t, res, "no result for line %d", line)
		assert.Equal(t, w.typ, errType(res), "line %d: %s", line, errMessage(res))
		assert.Contains(t, errMessage(res), w.msg, "line %d", line)
	}
	return results
}

// Three scripts whose waits could hang a replay each finish; a wait that
// can never end is refused with a clear error.
func TestStagingScriptsThatHungFinish(t *testing.T) {
	t.Run("two-chunk JOIN_ON_FINISH task copying while a later step is freeze-gated", func(t *testing.T) {
		script := stagingStart +
			`{"op":"task_open","pipeline":"p","task":"t","req":"r","mode":"on_finish"}
{"op":"append","task":"t","device_bytes":512,"fill":1,"rows":[{"key":"k","slot":0}]}
{"op":"append","task":"t","device_bytes":512,"fill":2,"rows":[{"key":"k","slot":1}]}
{"op":"stage","pipeline":"p","step":"s","bytes":512,"freeze":"f"}
{"op":"submit","tasks":["t"]}
{"op":"wait","task":"t","until":"written"}
{"op":"read_pool","pipeline":"p","key":"k","slot":1}
`
		results := checkResultsWithin(t, script, 20*time.Second, map[int]wantResult{7: {"ok", ""}, 8: {"ok", ""}, 9: {"ok", ""}})
		assert.Equal(t, float64(2), payload(t, payload(t, results[9], "staging"), "row")["value"])
	})
	t.Run("a stage of another size into a slot whose previous copy waits on a freeze event", func(t *testing.T) {
		script := `{"op":"start","locations":{"pageable-host":null,"pinned-host":null,"cuda:0":"64KiB"}}
{"op":"staging_start","name":"p","device":"cuda:0","slots":1,"slot_bytes":"1KiB","keys":["k"],"pool_slots":4,"row_bytes":512}
{"op":"stage","pipeline":"p","step":"s0","bytes":1024,"freeze":"f"}
{"op":"step_release","step":"s0"}
{"op":"stage","pipeline":"p","step":"s1","bytes":512}
{"op":"freeze","event":"f"}
{"op":"stage","pipeline":"p","step":"s1","bytes":512}
`
		checkResultsWithin(t, script, 20*time.Second, map[int]wantResult{
			5: {"InvalidInput", `staging step "s1" would wait forever: the free slots' buffers have another size and their last copies wait for freeze event "f"`},
			7: {"ok", ""},
		})
	})
	t.Run("a refused append whose clone waits for a freeze event", func(t *testing.T) {
		script := stagingStart +
			`{"op":"task_open","pipeline":"p","task":"t1","req":"r","mode":"on_finish"}
{"op":"append","task":"t1","device_bytes":512,"fill":1,"rows":[{"key":"k","slot":0}]}
{"op":"task_open","pipeline":"p","task":"t2","req":"r","mode":"next_step"}
{"op":"stage","pipeline":"p","step":"s","bytes":512,"fill":5}
{"op":"append","task":"t2","step":"s","rows":[{"key":"k","slot":0}]}
{"op":"append","task":"t1","device_bytes":512,"fill":2,"freeze":"f","rows":[{"key":"k","slot":0}]}
{"op":"task_open","pipeline":"p","task":"t3","req":"r","mode":"on_finish"}
{"op":"append","task":"t3","device_bytes":512,"fill":3,"rows":[{"key":"k","slot":2}]}
{"op":"read_row","task":"t3","key":"k","slot":2}
{"op":"staging_stats","pipeline":"p"}
`
		results := checkResultsWithin(t, script, 20*time.Second, map[int]wantResult{
			8:  {"StagingAppendRefusedError", "a later task took one of its rows"},
			11: {"ok", ""},
		})
		assert.Equal(t, float64(3), payload(t, payload(t, results[11], "staging"), "row")["value"], "t3's clone was not held back")
		assert.Equal(t, float64(1024), payload(t, payload(t, results[12], "staging"), "stats")["clone_bytes"], "the refused clone holds nothing")
	})
	t.Run("a blocking append whose budget cannot come back", func(t *testing.T) {
		script := stagingStart +
			`{"op":"task_open","pipeline":"p","task":"t1","req":"r","mode":"on_finish"}
{"op":"append","task":"t1","device_bytes":1024,"fill":1,"freeze":"f","rows":[{"key":"k","slot":0}]}
{"op":"task_open","pipeline":"p","task":"t2","req":"r","mode":"on_finish"}
{"op":"append","task":"t2","device_bytes":512,"fill":2,"rows":[{"key":"k","slot":1}]}
{"op":"freeze","event":"f"}
{"op":"append","task":"t2","device_bytes":512,"fill":2,"rows":[{"key":"k","slot":1}]}
{"op":"wait","task":"t1","until":"written"}
`
		checkResultsWithin(t, script, 20*time.Second, map[int]wantResult{
			6: {"InvalidInput", `appending to task "t2" would wait forever: the clone budget is full and the clones that could free it wait for freeze event "f"`},
			8: {"ok", ""},
			9: {"ok", ""},
		})
	})
}

// Staging_start with 2^63−1 or 10^9 slots is a configuration
// error, before anything is reserved or allocated: no panic.
func TestStagingStartChecksSizes(t *testing.T) {
	script := `{"op":"start","locations":{"pageable-host":null,"pinned-host":null,"cuda:0":"64KiB"}}
{"op":"staging_start","name":"p","device":"cuda:0","slots":9223372036854775807,"slot_bytes":1,"keys":["k"],"pool_slots":4,"row_bytes":512}
{"op":"staging_start","name":"q","device":"cuda:0","slots":1000000000,"slot_bytes":1,"keys":["k"],"pool_slots":4,"row_bytes":512}
{"op":"staging_start","name":"r","device":"cuda:0","slots":2,"slot_bytes":"1KiB","keys":["k"],"pool_slots":4,"row_bytes":512}
{"op":"snapshot"}
`
	results := checkResultsWithin(t, script, 20*time.Second, map[int]wantResult{
		2: {"StagingConfigError", "Slots must be at most 65536"},
		3: {"StagingConfigError", "Slots must be at most 65536"},
		4: {"ok", ""},
	})
	assert.Equal(t, 2, version(results[4]), "only the third pipeline reserved (slots and pool)")
}
