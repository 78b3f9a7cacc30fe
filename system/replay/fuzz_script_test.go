package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/stretchr/testify/require"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fuzzScripts returns the golden scripts of cmd/demo/testdata/*.jsonl
// (spill.jsonl among them) and the scripts whose start the runtime refuses,
// cmd/demo/testdata/refused/*.jsonl: the seeds of the fuzz targets.
func fuzzScripts(f *testing.F) [][]byte {
	testdata := filepath.Join("..", "..", "cmd", "demo", "testdata")
	paths, err := filepath.Glob(filepath.Join(testdata, "*.jsonl"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no scripts in testdata: %v", err)
	}
	refused, err := filepath.Glob(filepath.Join(testdata, "refused", "*.jsonl"))
	if err != nil || len(refused) == 0 {
		f.Fatalf("no scripts in testdata/refused: %v", err)
	}
	paths = append(paths, refused...)
	var out [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// Bounds of FuzzReplayScript: an input of at most fuzzScriptBytes is
// parsed and checked whatever it holds; it runs (on a fresh runtime, on
// the replay's simulated devices) only when it has at most fuzzRunOps ops,
// fuzzRunLocations locations, values and staging buffers of at most
// fuzzRunBytes, and slot claims that wait at most 100 ms: so a run holds
// at most a few tens of MiB of real memory, and must end within
// fuzzRunTime.
const (
	fuzzScriptBytes  = 64 << 10
	fuzzRunOps       = 40
	fuzzRunLocations = 8
	fuzzRunBytes     = 64 << 10
	fuzzRunTime      = 30 * time.Second
)

// FuzzReplayScript: whatever a script holds, checking it never panics
// and either accepts it (its first op is start, its line numbers rise) or
// refuses it as malformed with a message naming what (no Go names); a
// small accepted script then runs to its end within fuzzRunTime (Run)
// with one well-formed JSON Result per op, unless the runtime refused its
// start.
// Seeds: every script of testdata/*.jsonl, whole, and each of its lines
// after the script's start.
//
//	go test -run '^$' -fuzz '^FuzzReplayScript$' -fuzztime 10m ./system/replay/
func FuzzReplayScript(f *testing.F) {
	for _, script := range fuzzScripts(f) {
		f.Add(script)
		lines := strings.Split(string(script), "\n")
		for _, l := range lines[1:] {
			if t := strings.TrimSpace(l); t != "" && t[0] != '#' {
				f.Add([]byte(lines[0] + "\n" + l + "\n"))
			}
		}
	}
	f.Add([]byte(spillSeed))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > fuzzScriptBytes {
			t.Skip()
		}
		ops, err := Parse(bytes.NewReader(data))
		if err != nil {
			var se *ScriptError
			if !errors.As(err, &se) {
				t.Fatalf("checking failed with %T, not a script error: %v", err, err)
			}
			if msg := err.Error(); msg == "" || strings.Contains(msg, "Go struct") || strings.Contains(msg, "Go value") {
				t.Fatalf("message %q", msg)
			}
			return
		}
		if len(ops) == 0 || ops[0].Name != "start" {
			t.Fatalf("accepted a script whose first op is not start: %+v", ops)
		}
		for i := 1; i < len(ops); i++ {
			if ops[i].Line <= ops[i-1].Line || ops[i].Name == "start" {
				t.Fatalf("op %d: line %d after line %d (%s)", i, ops[i].Line, ops[i-1].Line, ops[i].Name)
			}
		}
		if !fuzzRunnable(ops) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), fuzzRunTime)
		defer cancel()
		var out bytes.Buffer
		sum, err := Run(ctx, bytes.NewReader(data), &out, Options{})
		if ctx.Err() != nil {
			t.Fatalf("the script did not finish within %v: %v", fuzzRunTime, err)
		}
		refused := err != nil && sum.Ops == 0 // the runtime refused the start op
		if err != nil && (strings.Contains(err.Error(), "goroutine ") || strings.Contains(err.Error(), "panic")) {
			t.Fatalf("a stack trace or panic: %v", err)
		}
		results := 0
		for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if l == "" {
				continue
			}
			var res struct {
				Line *int    `json:"line"`
				Op   *string `json:"op"`
				OK   *bool   `json:"ok"`
			}
			if err := json.Unmarshal([]byte(l), &res); err != nil || res.Line == nil || res.Op == nil || res.OK == nil {
				t.Fatalf("Result %q: %v", l, err)
			}
			results++
		}
		if !refused && results != len(ops) {
			t.Fatalf("%d results for %d ops: %v", results, len(ops), err)
		}
	})
}

// spillSeed is a short spill script for FuzzReplayScript: spill targets
// both ways between two devices and pinned host, a decision that demotes,
// a user's demotion explained and run, and a demotion whose copy fails.
const spillSeed = `{"op":"start","locations":{"pageable-host":null,"pinned-host":64,"cuda:0":64,"cuda:1":64},"spill":{"cuda:0":"pinned-host","cuda:1":"cuda:0"}}
{"op":"register","handle":"a","bytes":40,"source":"pageable-host"}
{"op":"register","handle":"b","bytes":40,"source":"pageable-host"}
{"op":"place","handle":"a","location":"cuda:0"}
{"op":"decide","request":{"name":"r","requirements":[{"handle":"b","locations":["cuda:0"]}]},"as":"d"}
{"op":"fail_next","kind":"copy","location":"pinned-host"}
{"op":"enter","as":"s","decision":"d"}
{"op":"exit","scope":"s"}
{"op":"explain","plan":{"reclaim":[{"handle":"b","location":"cuda:0","to":"cuda:1"}]}}
{"op":"execute","plan":{"reclaim":[{"handle":"b","location":"cuda:0","to":"pinned-host"}],"enter":[{"handle":"a","location":"cuda:1"}]}}
{"op":"snapshot"}
`

// fuzzRunnable says whether a checked script is small enough to run in
// FuzzReplayScript (see its bounds).
func fuzzRunnable(ops []Op) bool {
	if len(ops) > fuzzRunOps || len(ops[0].locations) > fuzzRunLocations {
		return false
	}
	for _, o := range ops {
		if o.Name == "register" && o.bytes > fuzzRunBytes {
			return false
		}
		if s := o.staging; s != nil {
			pool := int64(len(s.keys)) * max(s.poolSlots, 0)
			if s.slots > 16 || s.slotBytes > fuzzRunBytes || s.bytes > fuzzRunBytes || s.claimTimeout > 100*time.Millisecond ||
				pool > 1024 || pool*max(s.rowBytes, 0) > fuzzRunBytes || s.rowBytes > fuzzRunBytes {
				return false
			}
		}
	}
	return true
}

// FuzzStagingScript feeds staging ops to the replay: a fixed start and
// pipeline, then the fuzzed lines. Parsing never panics; a script that
// parses runs to its end within 10 s (a wait that could never end is
// refused, not hung), and no Go stack trace reaches its output.
//
//	go test -run '^$' -fuzz FuzzStagingScript -fuzztime 10m ./system/replay/
func FuzzStagingScript(f *testing.F) {
	seeds, err := os.ReadFile(filepath.Join("..", "..", "cmd", "demo", "testdata", "staging.jsonl"))
	require.NoError(f, err)
	for _, line := range strings.Split(string(seeds), "\n") {
		if strings.HasPrefix(line, `{"op":"`) && !strings.HasPrefix(line, `{"op":"start"`) {
			f.Add(line)
		}
	}
	f.Add(`{"op":"staging_start","name":"q","device":"cuda:0","slots":9223372036854775807,"slot_bytes":1,"keys":["k"],"pool_slots":1,"row_bytes":1}`)
	f.Add(`{"op":"stage","pipeline":"p","step":"s","bytes":512,"freeze":"f"}` + "\n" + `{"op":"step_release","step":"s"}` + "\n" + `{"op":"stage","pipeline":"p","step":"t","bytes":1024}`)
	f.Add(`{"op":"task_open","pipeline":"p","task":"t","req":"r","mode":"on_finish"}` + "\n" +
		`{"op":"append","task":"t","device_bytes":1024,"freeze":"f","rows":[{"key":"k","slot":0}]}` + "\n" +
		`{"op":"append","task":"t","device_bytes":512,"rows":[{"key":"k","slot":1}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > 1<<14 {
			return
		}
		script := stagingStart + body + "\n"
		if _, err := Parse(strings.NewReader(script)); err != nil {
			return // malformed: refused before anything runs
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var out bytes.Buffer
		_, err := Run(ctx, strings.NewReader(script), &out, Options{})
		if ctx.Err() != nil {
			t.Fatalf("the replay did not finish within 10s: %v\nscript:\n%s", err, script)
		}
		if strings.Contains(fmt.Sprint(err)+out.String(), "goroutine ") {
			t.Fatalf("a Go stack trace:\n%v%s", err, out.String())
		}
	})
}

// stagingStart: a pipeline "p" on cuda:0 (line 2), two slots of 1 KiB, a
// pool of one key × 4 slots × 512 B, 1 KiB of clone budget.
const stagingStart = `{"op":"start","locations":{"pageable-host":null,"pinned-host":null,"cuda:0":"64KiB"}}
{"op":"staging_start","name":"p","device":"cuda:0","slots":2,"slot_bytes":"1KiB","keys":["k"],"pool_slots":4,"row_bytes":512,"clone_budget":"1KiB"}
`
