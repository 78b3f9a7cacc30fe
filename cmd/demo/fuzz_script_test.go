package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fuzzScripts returns the scripts of testdata/*.jsonl, the seeds of the
// fuzz targets.
func fuzzScripts(f *testing.F) [][]byte {
	paths, err := filepath.Glob(filepath.Join("testdata", "*.jsonl"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no scripts in testdata: %v", err)
	}
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
// small accepted script then runs to its end within fuzzRunTime with exit
// status 0, 1 or 2 and one well-formed JSON result per op that ran.
// Seeds: every script of testdata/*.jsonl, whole, and each of its lines
// after the script's start.
//
//	go test -run '^$' -fuzz '^FuzzReplayScript$' -fuzztime 10m ./cmd/demo/
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
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > fuzzScriptBytes {
			t.Skip()
		}
		ops, err := parseScript(bytes.NewReader(data))
		if err != nil {
			var se *scriptError
			if !errors.As(err, &se) {
				t.Fatalf("checking failed with %T, not a script error: %v", err, err)
			}
			if msg := err.Error(); msg == "" || strings.Contains(msg, "Go struct") || strings.Contains(msg, "Go value") {
				t.Fatalf("message %q", msg)
			}
			return
		}
		if len(ops) == 0 || ops[0].name != "start" {
			t.Fatalf("accepted a script whose first op is not start: %+v", ops)
		}
		for i := 1; i < len(ops); i++ {
			if ops[i].line <= ops[i-1].line || ops[i].name == "start" {
				t.Fatalf("op %d: line %d after line %d (%s)", i, ops[i].line, ops[i-1].line, ops[i].name)
			}
		}
		if !fuzzRunnable(ops) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), fuzzRunTime)
		defer cancel()
		var out, errb bytes.Buffer
		code := run(ctx, []string{"replay", "--json", "-"}, bytes.NewReader(data), &out, &errb)
		if ctx.Err() != nil {
			t.Fatalf("the script did not finish within %v (exit %d): %s", fuzzRunTime, code, errb.String())
		}
		if code != 0 && code != 1 && code != 2 {
			t.Fatalf("exit status %d: %s", code, errb.String())
		}
		if strings.Contains(errb.String(), "goroutine ") || strings.Contains(errb.String(), "panic") {
			t.Fatalf("a stack trace or panic on stderr: %s", errb.String())
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
				t.Fatalf("result %q: %v", l, err)
			}
			results++
		}
		if code != 2 && results != len(ops) {
			t.Fatalf("%d results for %d ops (exit %d): %s", results, len(ops), code, errb.String())
		}
	})
}

// fuzzRunnable says whether a checked script is small enough to run in
// FuzzReplayScript (see its bounds).
func fuzzRunnable(ops []op) bool {
	if len(ops) > fuzzRunOps || len(ops[0].locations) > fuzzRunLocations {
		return false
	}
	for _, o := range ops {
		if o.name == "register" && o.bytes > fuzzRunBytes {
			return false
		}
		if s := o.staging; s != nil {
			pool := int64(len(s.keys)) * max(s.poolSlots, 0)
			if s.slots > 16 || s.slotBytes > fuzzRunBytes || s.bytes > fuzzRunBytes || s.claimTimeoutMS > 100 ||
				pool > 1024 || pool*max(s.rowBytes, 0) > fuzzRunBytes || s.rowBytes > fuzzRunBytes {
				return false
			}
		}
	}
	return true
}
