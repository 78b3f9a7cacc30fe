package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDiagnoseBlamesTheRightFile: evidence that reads as JSON but holds a
// value of the wrong kind is reported against the file it came from: a
// bad --snapshot or --trace is never reported as an error in the
// --error file.
func TestDiagnoseBlamesTheRightFile(t *testing.T) {
	dir := t.TempDir()
	script := writeFile(t, dir, "s.jsonl", `{"op":"start","locations":{"pageable-host":null,"cuda:0":1000}}`+"\n"+
		`{"op":"reserve","location":"cuda:0","name":"r","bytes":1001,"expect":"ResidencyBudgetError"}`+"\n"+
		`{"op":"snapshot"}`+"\n"+`{"op":"trace"}`+"\n")
	code, out, errs := runDemo(t, "replay", "--json", script)
	require.Equal(t, 0, code, errs)
	e, s, tr := splitReplayOutput(t, dir, out)
	badSnap := writeFile(t, dir, "bad-snapshot.json", `{"state_version":"x"}`)
	badTrace := writeFile(t, dir, "bad-trace.json", `[{"version":"x"}]`)
	badErr := writeFile(t, dir, "bad-error.json", `{"type":"ResidencyBudgetError","budget_bytes":"x"}`)
	for _, c := range []struct {
		args      []string
		blamed    string
		wantField string
	}{
		{[]string{"--error", e, "--snapshot", badSnap}, badSnap, `"snapshot.state_version"`},
		{[]string{"--error", e, "--snapshot", s, "--trace", badTrace}, badTrace, `version": want an integer`},
		{[]string{"--error", badErr, "--snapshot", s, "--trace", tr}, badErr, `"error.budget_bytes"`},
	} {
		code, out, errs := runDemo(t, append([]string{"diagnose"}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errs)
		assert.Empty(t, out)
		assert.True(t, strings.HasPrefix(errs, "demo diagnose: "+c.blamed+": "), "%v: %s", c.args, errs)
		assert.Contains(t, errs, c.wantField)
		assert.NotContains(t, errs, "replay output line", "the evidence files are no replay output")
	}
	code, _, errs = runDemo(t, "diagnose", "--error", e, "--snapshot", s, "--trace", tr)
	assert.Equal(t, 0, code, errs)
}
