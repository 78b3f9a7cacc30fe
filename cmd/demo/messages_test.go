package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestEvidenceMessagesNoGoTypes: `demo diagnose` on evidence files with
// a value of the wrong kind says which field and what it wants, in
// JSON's words: no Go type names (never "Go struct field
// replayErrorJSON.error.budget_bytes of type int64" or "Go value of type
// map[string]json.RawMessage").
func TestEvidenceMessagesNoGoTypes(t *testing.T) {
	dir := t.TempDir()
	snap := writeFile(t, dir, "s.json", `{"state_version":1,"manager_id":"m","locations":[]}`)
	errOK := writeFile(t, dir, "e.json", `{"type":"ResidencyBudgetError","message":"x"}`)
	for _, tc := range []struct {
		name, errFile, snapFile, traceFile, want string
	}{
		{"mistyped error field", `{"type":"ResidencyBudgetError","message":"x","budget_bytes":"big"}`, "", "", `field "error.budget_bytes": want an integer, got a string`},
		{"not an object", `[1,2]`, "", "", `want an object, got an array`},
		{"Go API snapshot mistyped", "", `{"StateVersion":"x"}`, "", `field "StateVersion": want an integer ≥ 0, got a string`},
		{"Go API trace mistyped", "", "", `[{"Version":"a"}]`, `field "Version": want an integer ≥ 0, got a string`},
		{"trace not an array", "", "", `{"trace":5}`, `want an array, got a number`},
		{"snapshot part mistyped", "", `{"locations":[{"reservations":5}],"state_version":1}`, "", `field "snapshot.locations.reservations": want an array, got a number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"diagnose"}
			e, s := errOK, snap
			if tc.errFile != "" {
				e = writeFile(t, t.TempDir(), "e.json", tc.errFile)
			}
			if tc.snapFile != "" {
				s = writeFile(t, t.TempDir(), "s.json", tc.snapFile)
			}
			args = append(args, "--error", e, "--snapshot", s)
			if tc.traceFile != "" {
				args = append(args, "--trace", writeFile(t, t.TempDir(), "t.json", tc.traceFile))
			}
			code, _, errs := runDemo(t, args...)
			assert.Equal(t, 2, code, errs)
			assert.Contains(t, errs, tc.want)
			for _, goWords := range []string{"Go struct", "Go value", "replayErrorJSON", "RawMessage", "of type", "cannot unmarshal", "[]system."} {
				assert.NotContains(t, errs, goWords)
			}
		})
	}
}
