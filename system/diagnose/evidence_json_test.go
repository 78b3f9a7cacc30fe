package diagnose

import (
	"errors"
	"github.com/residency-go/residency/system"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replay.out.jsonl is `go run ./cmd/demo replay --json
// testdata/replay.jsonl`: three failures, each followed by a
// snapshot and a trace.
func decodeReplay(t *testing.T, line int) Evidence {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "replay.out.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	ev, err := DecodeEvidence(f, line)
	require.NoError(t, err)
	return ev
}

func TestDecodeEvidenceBudget(t *testing.T) {
	ev := decodeReplay(t, 0) // the first failure: line 6
	require.Equal(t, &system.BudgetError{Location: "pinned-host", BudgetBytes: 1000, UsedBytes: 500, RequestedBytes: 600}, ev.Err)
	assert.Equal(t, "place", ev.Op.Kind)
	assert.Equal(t, uint64(3), ev.Snapshot.StateVersion)
	require.Len(t, ev.Trace, 3)
	d := DiagnoseEvidence(ev)
	assert.True(t, d.Capture.OneView)
	assert.Equal(t, ChargeUnknown, d.Budget.Charge, "the replay output does not carry the op's arguments")
	assert.Contains(t, d.Budget.ChargeReason, "temporary reconstruction charge fits big")
	// With the endpoint from the script, the charge is known.
	ev.Op = Operation{Kind: "place", Handle: system.Handle{Name: "big"}, Location: "cuda:0"}
	d = DiagnoseEvidence(ev)
	assert.Equal(t, ChargeTemporary, d.Budget.Charge)
	assert.Equal(t, int64(100), d.Budget.MissingBytes)
}

func TestDecodeEvidenceInUse(t *testing.T) {
	ev := decodeReplay(t, 12)
	require.Equal(t, &system.InUseError{Handle: "w", Location: "cuda:0", UseCount: 1}, ev.Err)
	d := DiagnoseEvidence(ev)
	require.NotNil(t, d.Protection)
	require.Len(t, d.Protection.Leases, 1)
	assert.Equal(t, "reader", d.Protection.Leases[0].ID, "the script's name for the lease")
	assert.Equal(t, uint64(8), d.Protection.Leases[0].Version)
}

func TestDecodeEvidenceExecution(t *testing.T) {
	ev := decodeReplay(t, 16)
	pe, ok := ev.Err.(*system.PlanExecutionError)
	require.True(t, ok)
	assert.Equal(t, system.PhaseExecute, pe.Phase)
	require.NotNil(t, pe.FailedAction)
	assert.Equal(t, "w", pe.FailedAction.Handle.Name)
	assert.Equal(t, 0, pe.FailedActionIndex)
	assert.Equal(t, -1, pe.FailedReservationIndex)
	assert.Len(t, pe.PartialReport.Transitions, 3)
	d := DiagnoseEvidence(ev)
	require.NotNil(t, d.Execution)
	assert.Equal(t, []string{"reservation ws: 100 B at cuda:0, still active (release it by name)"}, d.Execution.Kept)
	require.NotNil(t, d.Execution.Cause)
	assert.Equal(t, "Error", d.Execution.Cause.Class)
}

// decodeCause decodes a plan execution error whose cause is the JSON
// object cause.
func decodeCause(t *testing.T, cause string) error {
	t.Helper()
	in := `{"line":1,"op":"execute","ok":false,"error":{"type":"ResidencyPlanExecutionError","message":"m","phase":"execute","cause":` + cause + `}}
{"line":2,"op":"snapshot","ok":true,"snapshot":{"state_version":0,"manager_id":"m","locations":[],"values":[]}}`
	ev, err := DecodeEvidence(strings.NewReader(in), 0)
	require.NoError(t, err)
	pe, ok := ev.Err.(*system.PlanExecutionError)
	require.True(t, ok)
	return pe.Cause
}

// TestDecodeEvidenceCause: a cause is read from its fields, never from its
// message; a cause of an old file (type and message only) keeps its class.
func TestDecodeEvidenceCause(t *testing.T) {
	be := decodeCause(t, `{"type":"ResidencyBudgetError","message":"whatever","location":"cuda:0","budget_bytes":10,"used_bytes":3,"reserved_bytes":2,"requested_bytes":9}`)
	assert.Equal(t, &system.BudgetError{Location: "cuda:0", BudgetBytes: 10, UsedBytes: 3, ReservedBytes: 2, RequestedBytes: 9}, be)
	iu := decodeCause(t, `{"type":"ResidencyInUseError","message":"","handle":"a b","location":"cuda:1","use_count":1,"hold_count":2,"pending_event_count":3}`)
	assert.Equal(t, &system.InUseError{Handle: "a b", Location: "cuda:1", UseCount: 1, HoldCount: 2, PendingEventCount: 3}, iu)
	st := decodeCause(t, `{"type":"ResidencyStaleStateError","message":"","expected_version":4,"actual_version":9}`)
	assert.Equal(t, &system.StaleStateError{ExpectedVersion: 4, ActualVersion: 9}, st)
	un := decodeCause(t, `{"type":"ResidencyUnavailableError","message":"","handle":"w","location":null,"detail":"d","reason":"in_flight"}`)
	assert.Equal(t, &system.UnavailableError{Handle: "w", Detail: "d", Reason: system.UnavailableInFlight}, un)

	old := (&system.BudgetError{Location: "cuda:0", BudgetBytes: 10, UsedBytes: 3, ReservedBytes: 2, RequestedBytes: 9}).Error()
	oldCause := decodeCause(t, `{"type":"ResidencyBudgetError","message":"`+old+`"}`)
	assert.Equal(t, system.ErrorBudget, system.ErrorClass(oldCause))
	assert.Equal(t, old, oldCause.Error())
	var typed *system.BudgetError
	assert.False(t, errors.As(oldCause, &typed), "figures are never read from the message")
	d := Diagnose(oldCause, system.Snapshot{}, nil)
	assert.Equal(t, "ResidencyBudgetError", d.Class)
	assert.Nil(t, d.Budget)

	other := decodeCause(t, `{"type":"StagingFailedError","message":"disk on fire","task":"t"}`)
	assert.Equal(t, "Error", Diagnose(other, system.Snapshot{}, nil).Class)
}

func TestDecodeEvidenceErrors(t *testing.T) {
	_, err := DecodeEvidence(strings.NewReader(`{"line":1,"op":"start","ok":true,"state_version":0}`+"\n"), 0)
	assert.ErrorContains(t, err, "no failed result")
	_, err = DecodeEvidence(strings.NewReader(`{"line":2,"op":"reserve","ok":false,"state_version":0,"error":{"type":"InvalidInput","message":"x"}}`+"\n"), 2)
	assert.ErrorContains(t, err, "no snapshot after line 2")
	_, err = DecodeEvidence(strings.NewReader("{nope\n"), 0)
	assert.ErrorContains(t, err, "replay output line 1")
	_, err = DecodeEvidence(strings.NewReader(`{"line":2,"op":"reserve","ok":false,"state_version":0,"error":{"type":"InvalidInput","message":"x"}}`+"\n"), 7)
	assert.ErrorContains(t, err, "no failed result at line 7")
}

// TestDecodeEvidenceMessages: a value of the wrong kind is reported with
// its output line and field, in JSON's words: never a Go type's name
// (no "cannot unmarshal string into Go struct field
// replayErrorJSON.error.budget_bytes of type int64").
func TestDecodeEvidenceMessages(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"line":2,"op":"reserve","ok":false,"error":{"type":"ResidencyBudgetError","budget_bytes":"big"}}`, `replay output line 1: field "error.budget_bytes": want an integer, got a string`},
		{`{"line":"2"}`, `field "line": want an integer, got a string`},
		{`{"line":2,"state_version":-1}`, `field "state_version": want an integer ≥ 0, got -1, out of range`},
		{`{"line":1e99}`, `field "line": want an integer, got 1e99, out of range`},
		{`{"ok":"yes"}`, `field "ok": want true or false, got a string`},
		{`[1]`, `want an object, got an array`},
		{`{"snapshot":{"locations":[{"reservations":5}]}}`, `field "snapshot.locations.reservations": want an array, got a number`},
		{`{"trace":{}}`, `field "trace": want an array, got an object`},
		{`{"line":2,`, `malformed JSON at byte`},
	} {
		_, err := DecodeEvidence(strings.NewReader(tc.in+"\n"), 0)
		require.Error(t, err, tc.in)
		assert.Contains(t, err.Error(), tc.want, tc.in)
		for _, goWords := range []string{"Go ", "JSON", "struct", "int64", "uint64", "json:"} {
			if goWords == "JSON" && strings.Contains(tc.want, "malformed JSON") {
				continue
			}
			assert.NotContains(t, err.Error(), goWords, tc.in)
		}
	}
}

// A trace with the structured fields is read by them; the same trace
// without them (a script's replay output, an old file) gets them from its
// details, and the diagnosis is the same.
func TestDecodeEvidenceFieldsAndDetailsAgree(t *testing.T) {
	const errLine = `{"line":3,"op":"evict","ok":false,"error":{"type":"ResidencyInUseError","message":"m","handle":"w","location":"cuda:0","use_count":1,"pending_event_count":1}}`
	const snap = `{"line":4,"op":"snapshot","ok":true,"snapshot":{"state_version":6,"manager_id":"m","locations":[{"location":"cuda:0","budget_bytes":100,"used_bytes":10,"reserved_bytes":0,"peak_bytes":10,"reservations":[]}],"values":[{"handle":"w","bytes":10,"replica_mode":"exclusive","has_source":false,"source_location":null,"recoverable":false,"materializations":[{"location":"cuda:0","state":"resident","charged_bytes":10,"use_count":1,"hold_count":0,"pending_event_count":1}]}]}}`
	trace := func(fields bool) string {
		f := func(s string) string {
			if fields {
				return s
			}
			return ""
		}
		return `{"line":5,"op":"trace","ok":true,"trace":[` +
			`{"version":1,"kind":"admit","handle":"w","location":"cuda:0","bytes":10,"detail":"register at"},` +
			`{"version":2,"kind":"complete","handle":"w","location":"cuda:0","bytes":10,"detail":""},` +
			`{"version":3,"kind":"acquire","handle":"w","location":"cuda:0","bytes":0,"detail":"lease 7"` + f(`,"id":7`) + `},` +
			`{"version":4,"kind":"acquire","handle":"w","location":"cuda:0","bytes":0,"detail":"lease \"reader\""` + f(`,"id":8`) + `},` +
			`{"version":5,"kind":"record_event","handle":"w","location":"cuda:0","bytes":0,"detail":"event \"e\" on lease \"reader\""` + f(`,"id":2,"lease":8`) + `},` +
			`{"version":6,"kind":"release","handle":"w","location":"cuda:0","bytes":0,"detail":"lease 7"` + f(`,"id":7`) + `}]}`
	}
	decode := func(fields bool) Diagnosis {
		ev, err := DecodeEvidence(strings.NewReader(strings.Join([]string{errLine, snap, trace(fields)}, "\n")), 0)
		require.NoError(t, err)
		if fields {
			// A saved trace with ids names them by id unless told otherwise.
			ev.Names = map[LifetimeRef]string{{system.LifetimeLease, 8}: "reader", {system.LifetimeEvent, 2}: "e"}
		}
		return DiagnoseEvidence(ev)
	}
	withFields, fromDetails := decode(true), decode(false)
	require.NotNil(t, withFields.Protection)
	require.Equal(t, []Lifetime{{Kind: "lease", ID: "reader", Version: 4}}, withFields.Protection.Leases)
	require.Equal(t, []Lifetime{{Kind: "event", ID: "e", Version: 5, Lease: "reader"}}, withFields.Protection.Events)
	assert.Equal(t, withFields.String(), fromDetails.String())
}

// The diagnosis of an exit that could not release a lease finds the lease
// by the cause's fields, and names it as Evidence.Names does.
func TestLeaseEndedReadsTheCausesFields(t *testing.T) {
	ev := Evidence{
		Err: &system.PlanExecutionError{Phase: "exit", FailedActionIndex: -1, FailedReservationIndex: -1,
			Cause: &system.InvalidInputError{Message: "anything at all", Inactive: system.LifetimeLease, ID: 12}},
		Trace: []system.Transition{
			{Version: 1, Kind: "acquire", Handle: "x", Location: "cuda:0", Detail: "lease 12", ID: 12},
			{Version: 2, Kind: "acquire", Handle: "x", Location: "cuda:0", Detail: "lease 1", ID: 1},
			{Version: 3, Kind: "release", Handle: "x", Location: "cuda:0", Detail: "lease 12", ID: 12},
		},
		Names: map[LifetimeRef]string{{system.LifetimeLease, 12}: `of scope "s"`},
	}
	out := DiagnoseEvidence(ev).String()
	assert.Contains(t, out, "v1:  acquire x @cuda:0 (lease 12)")
	assert.Contains(t, out, "v3:  release x @cuda:0 (lease 12)")
	assert.NotContains(t, out, "v2:  acquire")
	assert.Contains(t, out, `lease of scope "s" was released outside the scope`)

	// A message alone (no fields) says nothing about which lease.
	ev.Err.(*system.PlanExecutionError).Cause = &system.InvalidInputError{Message: "lease 12 is not active (already released or never issued)"}
	assert.NotContains(t, DiagnoseEvidence(ev).String(), "the lease the exit could not release")
}
