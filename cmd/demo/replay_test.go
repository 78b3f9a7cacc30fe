package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"github.com/residency-go/residency/system/replay"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/*.jsonl")

// replayFile runs `demo replay [--json] path` and returns its exit status,
// standard output and standard error.
func replayFile(t *testing.T, path string, asJSON bool) (int, string, string) {
	t.Helper()
	args := []string{"replay", path}
	if asJSON {
		args = []string{"replay", "--json", path}
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// replayScript writes script to a temporary file and replays it.
func replayScript(t *testing.T, script string, asJSON bool) (int, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.jsonl")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	return replayFile(t, path, asJSON)
}

// TestGolden replays every script in testdata and compares its --json
// output with NAME.golden. Run `go test ./cmd/demo -run TestGolden
// -update` to rewrite them, and review the diff by hand: the golden
// values are the semantics.
func TestGolden(t *testing.T) {
	scripts, err := filepath.Glob("testdata/*.jsonl")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, script := range scripts {
		name := strings.TrimSuffix(filepath.Base(script), ".jsonl")
		t.Run(name, func(t *testing.T) {
			code, out, errs := replayFile(t, script, true)
			if code != 0 {
				t.Errorf("exit status %d, want 0; stderr:\n%s", code, errs)
			}
			golden := strings.TrimSuffix(script, ".jsonl") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			compareLines(t, string(want), out)
		})
	}
}

func compareLines(t *testing.T, want, got string) {
	t.Helper()
	w := strings.Split(strings.TrimRight(want, "\n"), "\n")
	g := strings.Split(strings.TrimRight(got, "\n"), "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			t.Errorf("output line %d differs:\n got: %s\nwant: %s", i+1, gl, wl)
			return
		}
	}
}

// TestGoldenRefused replays every script of testdata/refused, each one
// the runtime refuses to start (a bad start: nothing runs, exit status
// 2), and compares its exit status and standard error with NAME.golden
// (its first line "exit status N", then the message). Standard output
// must be empty. -update rewrites them as TestGolden does.
func TestGoldenRefused(t *testing.T) {
	scripts, err := filepath.Glob("testdata/refused/*.jsonl")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in testdata/refused: %v", err)
	}
	for _, script := range scripts {
		name := strings.TrimSuffix(filepath.Base(script), ".jsonl")
		t.Run(name, func(t *testing.T) {
			code, out, errs := replayFile(t, script, true)
			if code != 2 || out != "" {
				t.Errorf("exit status %d with output %q, want 2 and nothing run; stderr:\n%s", code, out, errs)
			}
			got := fmt.Sprintf("exit status %d\n%s", code, errs)
			golden := strings.TrimSuffix(script, ".jsonl") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			compareLines(t, string(want), got)
		})
	}
}

// TestGoldenTable replays every script as a table: one row per op plus
// the header, and the same exit status.
func TestGoldenTable(t *testing.T) {
	scripts, _ := filepath.Glob("testdata/*.jsonl")
	for _, script := range scripts {
		t.Run(filepath.Base(script), func(t *testing.T) {
			code, out, errs := replayFile(t, script, false)
			if code != 0 {
				t.Fatalf("exit status %d; stderr:\n%s", code, errs)
			}
			_, jsonOut, _ := replayFile(t, script, true)
			rows := strings.Count(out, "\n")
			ops := strings.Count(jsonOut, "\n")
			if rows != ops+1 {
				t.Errorf("table has %d lines, want %d ops + a header:\n%s", rows, ops, out)
			}
			if !strings.HasPrefix(out, "LINE") {
				t.Errorf("no header:\n%s", out)
			}
		})
	}
}

// TestGoldenCoverage checks that the golden scripts together use every op
// and produce every error type at least once.
func TestGoldenCoverage(t *testing.T) {
	goldens, _ := filepath.Glob("testdata/*.golden")
	var all strings.Builder
	for _, g := range goldens {
		b, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	text := all.String()
	for _, op := range replay.OpNames() {
		if !strings.Contains(text, `"op":"`+op+`"`) {
			t.Errorf("no golden script uses op %q", op)
		}
	}
	for _, typ := range replay.ErrorTypes() {
		if typ == "Error" {
			continue // not a residency error; see TestClassify
		}
		if !strings.Contains(text, `"type":"`+typ+`"`) {
			t.Errorf("no golden script produces %s", typ)
		}
	}
}

const okStart = `{"op":"start","locations":{"pageable-host":null,"cuda:0":"1MiB"}}` + "\n"

func TestReplayExitStatus(t *testing.T) {
	tests := []struct {
		name   string
		script string
		code   int
		stderr string // a fragment the message must contain
	}{
		{"all expectations hold", okStart +
			`{"op":"register","handle":"a","bytes":100,"at":"cuda:0","expect":"ok"}` + "\n" +
			`{"op":"register","handle":"b","bytes":0,"at":"cuda:0","expect":"InvalidInput"}` + "\n", 0, ""},
		{"no expectations", okStart + `{"op":"snapshot"}` + "\n", 0, ""},
		{"a failed expectation", okStart +
			`{"op":"register","handle":"a","bytes":"2MiB","at":"cuda:0","expect":"ok"}` + "\n" +
			`{"op":"snapshot"}` + "\n", 1, "line 2: register: expected ok, got ResidencyBudgetError"},
		{"expected an error, got ok", okStart +
			`{"op":"register","handle":"a","bytes":1,"at":"cuda:0","expect":"ResidencyBudgetError"}` + "\n", 1, "line 2"},
		{"bad JSON", okStart + "\n# comment\n" + `{"op":"snapshot"` + "\n", 2, "line 4: malformed JSON: column 17"},
		{"not an object", okStart + `["snapshot"]` + "\n", 2, "line 2"},
		{"unknown op", okStart + `{"op":"teleport"}` + "\n", 2, `line 2: unknown op "teleport"`},
		{"missing op", okStart + `{"handle":"a"}` + "\n", 2, `line 2: missing field "op"`},
		{"missing field", okStart + `{"op":"place","handle":"a"}` + "\n", 2, `line 2: op "place": needs field "location"`},
		{"mistyped field", okStart + `{"op":"place","handle":7,"location":"cuda:0"}` + "\n", 2, `line 2: op "place": field "handle": want a string, got a number`},
		{"mistyped bytes", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":true}` + "\n", 2, `field "bytes"`},
		{"fractional bytes", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":1.5}` + "\n", 2, `field "bytes"`},
		{"bad byte string", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":"12 parsecs"}` + "\n", 2, `unknown unit "parsecs"`},
		{"unknown field", okStart + `{"op":"snapshot","verbose":true}` + "\n", 2, `unknown field "verbose"`},
		{"unknown nested field", okStart + `{"op":"explain","plan":{"enter":[{"handle":"a","location":"cuda:0","form":"x"}]}}` + "\n", 2, `unknown field "plan.enter[0].form"`},
		{"mistyped plan list", okStart + `{"op":"execute","plan":{"enter":{"handle":"a"}}}` + "\n", 2, `field "plan.enter": want an array`},
		{"mistyped tier", okStart + `{"op":"decide","as":"d","request":{"name":"r","requirements":[{"handle":"a","locations":[3]}]}}` + "\n", 2, `requirements[0].locations[0]`},
		{"request without requirements", okStart + `{"op":"decide","as":"d","request":{"name":"r"}}` + "\n", 2, `missing field "request.requirements"`},
		{"at and source", okStart + `{"op":"register","handle":"a","bytes":1,"at":"cuda:0","source":"cuda:0"}` + "\n", 2, "not both"},
		{"neither at nor source", okStart + `{"op":"register","handle":"a","bytes":1}` + "\n", 2, `needs "at"`},
		{"decision and plan", okStart + `{"op":"enter","as":"s","decision":"d","plan":{}}` + "\n", 2, "not both"},
		{"expected_version with decision", okStart + `{"op":"enter","as":"s","decision":"d","expected_version":3}` + "\n", 2, "expected_version"},
		{"bad expect", okStart + `{"op":"snapshot","expect":"fine"}` + "\n", 2, `"fine" is neither`},
		{"first op not start", `{"op":"snapshot"}` + "\n" + okStart, 2, `line 1: the first op must be "start"`},
		{"second start", okStart + okStart, 2, `line 2: "start" may appear only once`},
		{"empty script", "# nothing\n\n", 2, "no ops"},
		{"empty file", "", 2, "the script is empty"},
		{"malformed start location", `{"op":"start","locations":{"gpu:0":null}}` + "\n", 2, `line 1: op "start": field "locations": malformed location "gpu:0"`},
		{"zero budget", `{"op":"start","locations":{"cuda:0":0}}` + "\n", 2, "budget of cuda:0 must be > 0"},
		{"negative budget", `{"op":"start","locations":{"cuda:0":"-1GiB"}}` + "\n", 2, "budget of cuda:0 must be > 0"},
		{"no locations", `{"op":"start","locations":{}}` + "\n", 2, "at least one location"},
		{"spill not an object", `{"op":"start","locations":{"cuda:0":null},"spill":["cuda:0"]}` + "\n", 2, `field "spill": want an object`},
		{"malformed spill location", `{"op":"start","locations":{"cuda:0":null},"spill":{"gpu:0":"cuda:0"}}` + "\n", 2, `field "spill": malformed location "gpu:0"`},
		{"mistyped spill target", `{"op":"start","locations":{"cuda:0":null},"spill":{"cuda:0":null}}` + "\n", 2, `the spill target of cuda:0: want a location name, got null`},
		{"spill target not configured", `{"op":"start","locations":{"cuda:0":null},"spill":{"cuda:0":"pinned-host"}}` + "\n", 2,
			"line 1: bad start: residency invalid input: spill target pinned-host of cuda:0 is not a configured location"},
		{"spill source not configured", `{"op":"start","locations":{"cuda:0":null},"spill":{"cuda:1":"cuda:0"}}` + "\n", 2,
			"line 1: bad start: residency invalid input: spill cuda:1 → cuda:0: cuda:1 is not a configured location"},
		{"to on an enter action", okStart + `{"op":"execute","plan":{"enter":[{"handle":"a","location":"cuda:0","to":"pageable-host"}]}}` + "\n", 2,
			`line 2: op "execute": field "plan.enter[0].to": only a reclaim action may carry "to"`},
		{"from on a reclaim action", okStart + `{"op":"execute","plan":{"reclaim":[{"handle":"a","location":"cuda:0","from":"pageable-host"}]}}` + "\n", 2,
			`unknown field "plan.reclaim[0].from"`},
		{"negative trace", `{"op":"start","locations":{"cuda:0":null},"trace":-1}` + "\n", 2, `field "trace"`},
		{"a late line is checked before anything runs", okStart +
			`{"op":"register","handle":"a","bytes":1,"at":"cuda:0"}` + "\n" +
			`{"op":"evict","handle":"a"}` + "\n", 2, `line 3: op "evict": needs field "location"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := replayScript(t, tc.script, true)
			if code != tc.code {
				t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errs)
			}
			if !strings.Contains(errs, tc.stderr) {
				t.Errorf("stderr %q does not contain %q", errs, tc.stderr)
			}
			if tc.code == 2 && out != "" {
				t.Errorf("a malformed script ran: %s", out)
			}
			if tc.code == 1 && !strings.Contains(out, `"op":"snapshot"`) && strings.Contains(tc.script, `"snapshot"`) {
				t.Errorf("a failed expectation stopped the replay:\n%s", out)
			}
		})
	}
}

func TestReplayUsage(t *testing.T) {
	for _, args := range [][]string{{"replay"}, {"replay", "a", "b"}, {"replay", "--nope", "x"}, {"replay", "/does/not/exist.jsonl"}, {"frobnicate"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errb); code != 2 {
			t.Errorf("%v: exit status %d, want 2", args, code)
		}
		if errb.Len() == 0 {
			t.Errorf("%v: no message on stderr", args)
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"help"}, strings.NewReader(""), &out, &errb); code != 0 || !strings.Contains(out.String(), "demo replay [--json] FILE") {
		t.Errorf("help: exit %d, output:\n%s", code, out.String())
	}
}

// TestReplayDeterministic replays a script twice: a replay's output is
// the same every time (fixed manager id, deterministic loaders).
func TestReplayDeterministic(t *testing.T) {
	_, a, _ := replayFile(t, "testdata/faults.jsonl", true)
	_, b, _ := replayFile(t, "testdata/faults.jsonl", true)
	if a != b {
		t.Errorf("two replays differ:\n%s\n---\n%s", a, b)
	}
}
