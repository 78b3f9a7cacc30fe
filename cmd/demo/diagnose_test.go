package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"github.com/residency-go/residency/system/replay"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
)

var updateDiagnose = flag.Bool("update-diagnose", false, "rewrite the bodies of testdata/diagnose/*.golden (their hand-checked headers are kept)")

// jsonGoldens are the scripts whose --json diagnosis is also kept, as
// NAME.json.golden: one with a budget part, one with a nested cause.
var jsonGoldens = map[string]bool{"budget_temporary_reconstruction": true, "exec_enter": true}

// diagnoseArgs are the extra arguments a script asks for in a comment
// line "# args: --line 7".
func diagnoseArgs(t *testing.T, script string) []string {
	t.Helper()
	b, err := os.ReadFile(script)
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "# args:"); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

func runDemo(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// splitGolden separates a golden's header (its leading # lines: how it
// was checked) from its body.
func splitGolden(b string) (header, body string) {
	for strings.HasPrefix(b, "#") {
		i := strings.IndexByte(b, '\n')
		if i < 0 {
			return header + b, ""
		}
		header, b = header+b[:i+1], b[i+1:]
	}
	return header, b
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	old, err := os.ReadFile(path)
	if *updateDiagnose {
		header := "# NOT YET CHECKED BY HAND\n"
		if err == nil {
			header, _ = splitGolden(string(old))
		}
		require.NoError(t, os.WriteFile(path, []byte(header+got), 0o644))
		return
	}
	require.NoError(t, err, "run with -update-diagnose to create it, then check it by hand and write its header")
	header, body := splitGolden(string(old))
	require.Contains(t, header, "Checked by hand", "%s: the header must say how the golden was checked", path)
	compareLines(t, body, got)
}

// TestDiagnoseGolden runs `demo diagnose` on every script of
// testdata/diagnose and compares its text (and for some, its JSON) with
// the hand-checked goldens. `go test ./cmd/demo -run TestDiagnoseGolden
// -update-diagnose` rewrites the bodies; check every change by hand
// against the diagnosis procedure before committing it.
func TestDiagnoseGolden(t *testing.T) {
	scripts, err := filepath.Glob("testdata/diagnose/*.jsonl")
	require.NoError(t, err)
	require.NotEmpty(t, scripts)
	for _, script := range scripts {
		name := strings.TrimSuffix(filepath.Base(script), ".jsonl")
		t.Run(name, func(t *testing.T) {
			args := append([]string{"diagnose", script}, diagnoseArgs(t, script)...)
			code, out, errs := runDemo(t, args...)
			require.Equal(t, 0, code, "stderr:\n%s", errs)
			assert.Empty(t, errs)
			checkGolden(t, strings.TrimSuffix(script, ".jsonl")+".golden", out)

			code, jout, errs := runDemo(t, append(args, "--json")...)
			require.Equal(t, 0, code, "stderr:\n%s", errs)
			var doc struct {
				Line      *int                       `json:"line"`
				Op        *string                    `json:"op"`
				Diagnosis map[string]json.RawMessage `json:"diagnosis"`
			}
			require.NoError(t, json.Unmarshal([]byte(jout), &doc))
			require.NotNil(t, doc.Line)
			for _, k := range []string{"class", "message", "meaning", "first_action", "operation", "state_version", "manager_id",
				"capture", "steps", "endpoints", "budget", "protection", "search", "stale", "execution"} {
				assert.Contains(t, doc.Diagnosis, k)
			}
			var class string
			require.NoError(t, json.Unmarshal(doc.Diagnosis["class"], &class))
			assert.Contains(t, out, "\n"+class+": ", "the text and the JSON name the same class")
			if jsonGoldens[name] {
				checkGolden(t, strings.TrimSuffix(script, ".jsonl")+".json.golden", jout)
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

const diagStart = `{"op":"start","locations":{"pageable-host":null,"pinned-host":1000,"cuda:0":1000}}` + "\n"

func TestDiagnoseExitStatus(t *testing.T) {
	dir := t.TempDir()
	okScript := writeFile(t, dir, "ok.jsonl", diagStart+`{"op":"register","handle":"w","bytes":400,"at":"pinned-host"}`+"\n")
	failing := writeFile(t, dir, "fail.jsonl", diagStart+
		`{"op":"register","handle":"w","bytes":400,"at":"pinned-host"}`+"\n"+
		"# a comment\n"+
		`{"op":"acquire","handle":"w","location":"cuda:0","as":"l","expect":"ok"}`+"\n"+
		`{"op":"place","handle":"w","location":"cuda:0"}`+"\n")

	code, out, errs := runDemo(t, "diagnose", okScript)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errs, "no op failed (2 ops ran): nothing to diagnose")

	// The first failure is diagnosed whatever the line expected, and no
	// expectation is reported.
	code, out, errs = runDemo(t, "diagnose", failing)
	assert.Equal(t, 0, code, errs)
	assert.Empty(t, errs)
	assert.Contains(t, out, "line 4 (acquire), diagnosed at the failure:\n\nResidencyUnavailableError: ")

	code, _, errs = runDemo(t, "diagnose", "--line", "5", failing)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "line 5 (place) succeeded: nothing to diagnose")

	for _, line := range []string{"3", "9"} { // a comment, past the end
		code, _, errs = runDemo(t, "diagnose", failing, "--line", line)
		assert.Equal(t, 2, code, line)
		assert.Contains(t, errs, "line "+line+" is not an op of the script")
	}

	code, _, errs = runDemo(t, "diagnose")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "usage: demo diagnose")
	code, _, errs = runDemo(t, "diagnose", failing, "--error", "e.json")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "not both")
	code, _, errs = runDemo(t, "diagnose", "--error", "e.json")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "need --error and --snapshot")
	code, _, errs = runDemo(t, "diagnose", writeFile(t, dir, "bad.jsonl", `{"op":"nope"}`+"\n"))
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "demo diagnose: ")
}

// TestDiagnoseCapturesBeforeTheNextOp: the diagnosis shows the state at the
// failure, not after the release the next line would do.
func TestDiagnoseCapturesBeforeTheNextOp(t *testing.T) {
	code, out, errs := runDemo(t, "diagnose", "--json", "testdata/diagnose/in_use_lease.jsonl")
	require.Equal(t, 0, code, errs)
	var doc struct {
		Diagnosis struct {
			StateVersion uint64 `json:"state_version"`
			Protection   struct {
				UseCount int `json:"use_count"`
				Leases   []struct {
					ID string `json:"id"`
				} `json:"leases"`
				Now struct {
					UseCount int `json:"use_count"`
				} `json:"now"`
			} `json:"protection"`
			Capture struct {
				AtFailure *bool `json:"at_failure"`
			} `json:"capture"`
		} `json:"diagnosis"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	d := doc.Diagnosis
	assert.Equal(t, uint64(5), d.StateVersion)
	assert.Equal(t, 1, d.Protection.UseCount)
	assert.Equal(t, 1, d.Protection.Now.UseCount)
	require.Len(t, d.Protection.Leases, 1)
	assert.Equal(t, "reader", d.Protection.Leases[0].ID, "the script's name, not the runtime's id")
	require.NotNil(t, d.Capture.AtFailure)
	assert.True(t, *d.Capture.AtFailure)
}

// splitReplayOutput writes the failed result, the snapshot and the trace of
// `replay --json` output to three files, in the forms an application may
// keep: the error as a whole result line, the snapshot as the bare object,
// the trace as a whole result line.
func splitReplayOutput(t *testing.T, dir, out string) (e, s, tr string) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var res map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(l), &res))
		switch {
		case string(res["ok"]) == "false" && e == "":
			e = writeFile(t, dir, "E.json", l)
		case res["snapshot"] != nil && s == "":
			s = writeFile(t, dir, "S.json", string(res["snapshot"]))
		case res["trace"] != nil && tr == "":
			tr = writeFile(t, dir, "T.json", l)
		}
	}
	require.NotEmpty(t, e)
	require.NotEmpty(t, s)
	require.NotEmpty(t, tr)
	return e, s, tr
}

// withoutHeader drops the script form's first lines (which line, and the
// operation's endpoint, which the replay output does not repeat).
func withoutHeader(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "line ") || strings.HasPrefix(l, "operation: ") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.TrimLeft(strings.Join(keep, "\n"), "\n")
}

// TestDiagnoseEvidenceFiles: evidence saved from the replay output gives
// the diagnosis `demo diagnose FILE` gives for the same failure.
func TestDiagnoseEvidenceFiles(t *testing.T) {
	for _, name := range []string{"in_use_event", "exec_enter", "budget_reservation", "stale_three_transitions"} {
		t.Run(name, func(t *testing.T) {
			script := "testdata/diagnose/" + name + ".jsonl"
			b, err := os.ReadFile(script)
			require.NoError(t, err)
			// A snapshot and a trace op right after the failing line.
			var lines []string
			var decided bool
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				lines = append(lines, l)
				decided = decided || strings.Contains(l, `"op":"decide"`)
				if strings.Contains(l, `"expect":"Residency`) || strings.Contains(l, `"expect":"InvalidInput"`) {
					lines = append(lines, `{"op":"snapshot"}`, `{"op":"trace"}`)
				}
			}
			dir := t.TempDir()
			withCapture := writeFile(t, dir, "script.jsonl", strings.Join(lines, "\n")+"\n")
			code, out, errs := runDemo(t, "replay", "--json", withCapture)
			require.Equal(t, 0, code, errs)
			e, s, tr := splitReplayOutput(t, dir, out)
			args := []string{"diagnose", "--error", e, "--snapshot", s, "--trace", tr}
			if decided {
				for _, l := range strings.Split(out, "\n") {
					if strings.Contains(l, `"op":"decide"`) {
						args = append(args, "--decision", writeFile(t, dir, "D.json", l))
					}
				}
			}
			code, got, errs := runDemo(t, args...)
			require.Equal(t, 0, code, errs)
			_, want, _ := runDemo(t, "diagnose", script)
			// The replay output's decision does not carry its request's
			// name.
			want = strings.Replace(want, "decision for request a-on-gpu\n", "decision for request \n", 1)
			assert.Equal(t, withoutHeader(want), withoutHeader(got))
		})
	}
}

// TestDiagnoseEvidenceFromTheAPI: a snapshot and trace an application saved
// with encoding/json (the system's own types) read as the replay output's.
func TestDiagnoseEvidenceFromTheAPI(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{ManagerID: "app", Locations: []system.LocationConfig{system.NoLimit("pinned-host"), system.Limit("cuda:0", 1000)}})
	require.NoError(t, err)
	w, err := sys.Register(ctx, system.Value{Name: "w", Bytes: 400, Mode: system.Replicable, At: "pinned-host"})
	require.NoError(t, err)
	require.NoError(t, sys.Copy(ctx, w, "pinned-host", "cuda:0"))
	l, err := sys.Acquire(ctx, w, "cuda:0")
	require.NoError(t, err)
	failure := sys.Evict(ctx, w, "cuda:0")
	ev, err := diagnose.Capture(ctx, sys, failure, diagnose.Operation{})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	require.NoError(t, sys.Close(ctx))

	dir := t.TempDir()
	eb, err := replay.Marshal(replay.ErrorOf(failure))
	require.NoError(t, err)
	sb, err := json.Marshal(ev.Snapshot)
	require.NoError(t, err)
	tb, err := json.Marshal(ev.Trace)
	require.NoError(t, err)
	code, out, errs := runDemo(t, "diagnose", "--error", writeFile(t, dir, "E.json", string(eb)),
		"--snapshot", writeFile(t, dir, "S.json", string(sb)), "--trace", writeFile(t, dir, "T.json", string(tb)))
	require.Equal(t, 0, code, errs)
	assert.Equal(t, diagnose.DiagnoseEvidence(ev).String(), out)
	assert.Contains(t, out, "leases:          lease 1 (taken at v5)")
}
