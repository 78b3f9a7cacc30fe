package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replayResults replays script with --json and decodes one result per
// line, keyed by the script line of the op.
func replayResults(t *testing.T, script string) (map[int]map[string]any, int, string) {
	t.Helper()
	code, out, errs := replayScript(t, script, true)
	results := map[int]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "output line %q", line)
		results[int(m["line"].(float64))] = m
	}
	return results, code, errs
}

// errType returns the error type of a result, or "ok".
func errType(res map[string]any) string {
	if res["ok"] == true {
		return "ok"
	}
	return res["error"].(map[string]any)["type"].(string)
}

func errMessage(res map[string]any) string {
	e, _ := res["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}

// orderStart configures cuda:0 only (cuda:9 is well formed but absent);
// a is resident at cuda:0, d is registered and discarded.
const orderStart = `{"op":"start","locations":{"pageable-host":null,"cuda:0":"1MiB"}}
{"op":"register","handle":"a","bytes":100,"at":"cuda:0"}
{"op":"register","handle":"d","bytes":100,"source":"pageable-host"}
{"op":"discard","handle":"d"}
{"op":"acquire","handle":"a","location":"cuda:0","as":"taken"}
{"op":"decide","as":"taken","request":{"name":"q","requirements":[{"handle":"a","locations":["cuda:0"]}]}}
`

// orderFirstLine is the line of the first op after orderStart.
const orderFirstLine = 7

// TestOrderOfChecks: one op with several problems reports the first in
// document order, handle names included (SEMANTICS "Order of checks").
func TestOrderOfChecks(t *testing.T) {
	tests := []struct {
		name     string
		op       string
		wantType string
		wantMsg  string // a fragment of the message
	}{
		{"unconfigured location in an earlier enter wins over a later unknown name",
			`{"op":"execute","plan":{"enter":[{"handle":"a","location":"cuda:9"},{"handle":"ghost","location":"cuda:0"}]}}`,
			"ResidencyUnavailableError", "cuda:9"},
		{"an unknown name in reclaim wins over a later unconfigured location",
			`{"op":"execute","plan":{"reclaim":[{"handle":"ghost","location":"cuda:0"}],"enter":[{"handle":"a","location":"cuda:9"}]}}`,
			"InvalidInput", `unknown handle "ghost" (register it first)`},
		{"a reservation's unconfigured location wins over a later unknown name in enter",
			`{"op":"execute","plan":{"reservations":[{"name":"r","location":"cuda:9","bytes":1}],"enter":[{"handle":"ghost","location":"cuda:0"}]}}`,
			"ResidencyUnavailableError", "cuda:9"},
		{"a malformed location wins over a later unknown name",
			`{"op":"execute","plan":{"enter":[{"handle":"a","location":"gpu0"},{"handle":"ghost","location":"cuda:0"}]}}`,
			"InvalidInput", `malformed location "gpu0"`},
		{"a discarded handle wins over a later unknown name",
			`{"op":"execute","plan":{"enter":[{"handle":"d","location":"cuda:0"},{"handle":"ghost","location":"cuda:0"}]}}`,
			"ResidencyUnavailableError", "discarded"},
		{"an unknown name wins over a later rule (budget)",
			`{"op":"execute","plan":{"reservations":[{"name":"big","location":"cuda:0","bytes":"1GiB"}],"enter":[{"handle":"ghost","location":"cuda:0"}]}}`,
			"InvalidInput", `unknown handle "ghost"`},
		{"enter: the same order as execute",
			`{"op":"enter","as":"s","plan":{"enter":[{"handle":"a","location":"cuda:9"},{"handle":"ghost","location":"cuda:0"}]}}`,
			"ResidencyUnavailableError", "cuda:9"},
		{"enter: a stale version comes before everything",
			`{"op":"enter","as":"s","expected_version":1,"plan":{"enter":[{"handle":"ghost","location":"cuda:0"}]}}`,
			"ResidencyStaleStateError", "expected version 1"},
		{"decide: an earlier requirement's unconfigured location wins over a later unknown name",
			`{"op":"decide","as":"d1","request":{"name":"q","requirements":[{"handle":"a","locations":["cuda:9"]},{"handle":"ghost","locations":["cuda:0"]}]}}`,
			"ResidencyUnavailableError", "cuda:9"},
		{"decide: an unknown name in a requirement wins over a bad reservation",
			`{"op":"decide","as":"d1","request":{"name":"q","requirements":[{"handle":"ghost","locations":["cuda:0"]}],"reservations":[{"name":"r","location":"cuda:9","bytes":1}]}}`,
			"InvalidInput", `unknown handle "ghost" (register it first)`},
		{"decide: a field of the request wins over a duplicate decision name",
			`{"op":"decide","as":"taken","request":{"name":"q","requirements":[{"handle":"a","locations":["cuda:9"]}]}}`,
			"ResidencyUnavailableError", "cuda:9"},
		{"decide: a duplicate decision name wins over a rule",
			`{"op":"decide","as":"taken","request":{"name":"q","requirements":[{"handle":"a","locations":[]}]}}`,
			"InvalidInput", `duplicate decision name "taken"`},
		{"acquire: the location wins over a duplicate lease name",
			`{"op":"acquire","handle":"a","location":"cuda:9","as":"taken"}`,
			"ResidencyUnavailableError", "cuda:9"},
		{"acquire: a malformed location wins over a duplicate lease name",
			`{"op":"acquire","handle":"a","location":"gpu0","as":"taken"}`,
			"InvalidInput", "malformed location"},
		{"acquire: a discarded handle wins over a duplicate lease name",
			`{"op":"acquire","handle":"d","location":"cuda:0","as":"taken"}`,
			"ResidencyUnavailableError", "discarded"},
		{"acquire: a duplicate lease name wins over residency (a rule)",
			`{"op":"acquire","handle":"a","location":"pageable-host","as":"taken"}`,
			"InvalidInput", `duplicate lease name "taken"`},
		{"register: a duplicate name wins over an unknown replica mode",
			`{"op":"register","handle":"a","bytes":1,"replica":"shared","source":"pageable-host"}`,
			"InvalidInput", `duplicate value name "a"`},
		{"register: bytes ≤ 0 wins over an unknown replica mode",
			`{"op":"register","handle":"n","bytes":0,"replica":"shared","source":"pageable-host"}`,
			"InvalidInput", "bytes must be positive"},
		{"register: an unknown replica mode wins over an unconfigured location",
			`{"op":"register","handle":"n","bytes":1,"replica":"shared","at":"cuda:9"}`,
			"InvalidInput", `unknown replica mode "shared" (use exclusive or replicable)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			results, code, errs := replayResults(t, orderStart+tc.op+"\n")
			require.Equal(t, 0, code, errs)
			res := results[orderFirstLine]
			require.NotNil(t, res, "no result for the op")
			assert.Equal(t, tc.wantType, errType(res), "message: %s", errMessage(res))
			assert.Contains(t, errMessage(res), tc.wantMsg)
			assert.NotContains(t, errMessage(res), "id 0", "a runtime id reached the output")
		})
	}
}

// TestExplainNeverFailsOnContent: explain of a plan that fails validation
// is an infeasible explanation whose reason is the validation message and
// whose predicted peaks are the current used+reserved, unknown handles
// included; it changes nothing.
func TestExplainNeverFailsOnContent(t *testing.T) {
	script := `{"op":"start","locations":{"pageable-host":null,"cuda:0":"1MiB"}}
{"op":"register","handle":"a","bytes":"256KiB","at":"cuda:0"}
{"op":"reserve","location":"cuda:0","bytes":"128KiB","name":"kv"}
{"op":"explain","plan":{"enter":[{"handle":"ghost","location":"cuda:0"}]}}
{"op":"explain","plan":{"enter":[{"handle":"a","location":"cuda:9"}]}}
{"op":"explain","plan":{"enter":[{"handle":"a","location":"gpu0"}]}}
{"op":"explain","plan":{"reservations":[{"name":"kv","location":"cuda:0","bytes":1}]}}
{"op":"explain","plan":{"enter":[{"handle":"a","location":"cuda:9"},{"handle":"ghost","location":"cuda:0"}]}}
{"op":"snapshot"}
`
	results, code, errs := replayResults(t, script)
	require.Equal(t, 0, code, errs)
	wantPeaks := map[string]any{"pageable-host": float64(0), "cuda:0": float64(384 << 10)}
	reasons := map[int]string{
		4: `unknown handle "ghost" (register it first)`,
		5: "cuda:9",
		6: `malformed location "gpu0"`,
		7: `duplicate reservation name "kv"`,
		8: "cuda:9",
	}
	for line, want := range reasons {
		res := results[line]
		require.Equal(t, "ok", errType(res), "line %d: %s", line, errMessage(res))
		ex := res["explanation"].(map[string]any)
		assert.Equal(t, false, ex["feasible"], "line %d", line)
		assert.Contains(t, ex["reason"], want, "line %d", line)
		assert.Equal(t, wantPeaks, ex["predicted_peak_bytes"], "line %d", line)
		assert.Equal(t, float64(3), res["state_version"], "line %d: explain changed the state", line)
	}
	assert.Equal(t, float64(3), results[9]["state_version"])
}

// TestNameBinding: `enter … as S` binds S whatever the outcome,
// validation failures included; lease and hold names bind only on
// success (SEMANTICS "Edge cases").
func TestNameBinding(t *testing.T) {
	script := `{"op":"start","locations":{"pageable-host":null,"cuda:0":"1MiB"}}
{"op":"register","handle":"a","bytes":100,"at":"cuda:0"}
{"op":"enter","as":"s1","decision":"nope"}
{"op":"exit","scope":"s1"}
{"op":"enter","as":"s1","plan":{}}
{"op":"enter","as":"s2","plan":{"enter":[{"handle":"ghost","location":"cuda:0"}]}}
{"op":"exit","scope":"s2"}
{"op":"enter","as":"s2","plan":{}}
{"op":"enter","as":"s3","plan":{"enter":[{"handle":"a","location":"cuda:9"}]}}
{"op":"exit","scope":"s3"}
{"op":"enter","as":"s4","expected_version":0,"plan":{}}
{"op":"exit","scope":"s4"}
{"op":"acquire","handle":"a","location":"pageable-host","as":"L"}
{"op":"release","lease":"L"}
{"op":"acquire","handle":"a","location":"cuda:0","as":"L"}
{"op":"release","lease":"L"}
{"op":"release","lease":"L"}
{"op":"hold","handle":"a","location":"pageable-host","as":"H"}
{"op":"unhold","hold":"H"}
{"op":"hold","handle":"a","location":"cuda:0","as":"H"}
{"op":"unhold","hold":"H"}
{"op":"unhold","hold":"H"}
{"op":"exit","scope":"never"}
`
	results, code, errs := replayResults(t, script)
	require.Equal(t, 0, code, errs)
	want := map[int]struct{ typ, msg string }{
		3:  {"InvalidInput", `unknown decision "nope"`},
		4:  {"InvalidInput", `scope "s1" cannot exit: its entry failed`},
		5:  {"InvalidInput", `scope "s1" already exists`},
		6:  {"InvalidInput", `unknown handle "ghost"`},
		7:  {"InvalidInput", `scope "s2" cannot exit: its entry failed`},
		8:  {"InvalidInput", `scope "s2" already exists`},
		9:  {"ResidencyUnavailableError", "cuda:9"},
		10: {"InvalidInput", `scope "s3" cannot exit: its entry failed`},
		11: {"ResidencyStaleStateError", "expected version 0"},
		12: {"InvalidInput", `scope "s4" cannot exit: its entry failed`},
		13: {"ResidencyUnavailableError", "no resident materialization"},
		14: {"InvalidInput", `unknown lease "L"`},
		15: {"ok", ""},
		16: {"ok", ""},
		17: {"InvalidInput", `lease "L" was already released`},
		18: {"ResidencyUnavailableError", "no resident materialization"},
		19: {"InvalidInput", `unknown hold "H"`},
		20: {"ok", ""},
		21: {"ok", ""},
		22: {"InvalidInput", `hold "H" was already released`},
		23: {"InvalidInput", `unknown scope "never"`},
	}
	for line, w := range want {
		res := results[line]
		require.NotNil(t, res, "line %d", line)
		assert.Equal(t, w.typ, errType(res), "line %d: %s", line, errMessage(res))
		assert.Contains(t, errMessage(res), w.msg, "line %d", line)
	}
}

// TestScriptNamesInResults: results name leases, holds, events and
// scopes as the script does, never by the runtime's ids ("lease 1",
// "scope-1").
func TestScriptNamesInResults(t *testing.T) {
	script := `{"op":"start","locations":{"pageable-host":null,"cuda:0":"1MiB"}}
{"op":"register","handle":"m","bytes":100,"replica":"replicable","at":"cuda:0"}
{"op":"acquire","handle":"m","location":"cuda:0","as":"reader"}
{"op":"record_event","lease":"reader","event":"kernel"}
{"op":"release","lease":"reader"}
{"op":"complete_event","event":"kernel"}
{"op":"hold","handle":"m","location":"cuda:0","as":"pin"}
{"op":"unhold","hold":"pin"}
{"op":"enter","as":"serve","plan":{"reservations":[{"name":"kv","location":"cuda:0","bytes":10}],"enter":[{"handle":"m","location":"cuda:0"}]}}
{"op":"unreserve","name":"kv"}
{"op":"exit","scope":"serve"}
{"op":"exit","scope":"serve"}
{"op":"trace"}
`
	results, code, errs := replayResults(t, script)
	require.Equal(t, 0, code, errs)
	var details []string
	for _, tr := range results[13]["trace"].([]any) {
		details = append(details, tr.(map[string]any)["detail"].(string))
	}
	for _, want := range []string{`lease "reader"`, `event "kernel" on lease "reader"`, `event "kernel"`,
		`hold "pin"`, `lease of scope "serve"`} {
		assert.Contains(t, details, want)
	}
	assert.Contains(t, errMessage(results[10]), `belongs to scope "serve"`)
	assert.Contains(t, errMessage(results[12]), `scope "serve" cannot exit: it already exited`)

	_, out, _ := replayScript(t, script, true)
	for _, internal := range []string{"lease 1", "lease 2", "hold 1", "event 1", "scope-1"} {
		assert.NotContains(t, out, internal)
	}
}
