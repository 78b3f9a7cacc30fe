package system

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replay.out.jsonl is `go run ./cmd/demo replay --json
// testdata/diagnose/replay.jsonl`: three failures, each followed by a
// snapshot and a trace.
func decodeReplay(t *testing.T, line int) Evidence {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "diagnose", "replay.out.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	ev, err := DecodeEvidence(f, line)
	require.NoError(t, err)
	return ev
}

func TestDecodeEvidenceBudget(t *testing.T) {
	ev := decodeReplay(t, 0) // the first failure: line 6
	require.Equal(t, &BudgetError{Location: "pinned-host", BudgetBytes: 1000, UsedBytes: 500, RequestedBytes: 600}, ev.Err)
	assert.Equal(t, "place", ev.Op.Kind)
	assert.Equal(t, uint64(3), ev.Snapshot.StateVersion)
	require.Len(t, ev.Trace, 3)
	d := DiagnoseEvidence(ev)
	assert.True(t, d.Capture.OneView)
	assert.Equal(t, ChargeUnknown, d.Budget.Charge, "the replay output does not carry the op's arguments")
	assert.Contains(t, d.Budget.ChargeReason, "temporary reconstruction charge fits big")
	// With the endpoint from the script, the charge is known.
	ev.Op = Operation{Kind: "place", Handle: Handle{Name: "big"}, Location: "cuda:0"}
	d = DiagnoseEvidence(ev)
	assert.Equal(t, ChargeTemporary, d.Budget.Charge)
	assert.Equal(t, int64(100), d.Budget.MissingBytes)
}

func TestDecodeEvidenceInUse(t *testing.T) {
	ev := decodeReplay(t, 12)
	require.Equal(t, &InUseError{Handle: "w", Location: "cuda:0", UseCount: 1}, ev.Err)
	d := DiagnoseEvidence(ev)
	require.NotNil(t, d.Protection)
	require.Len(t, d.Protection.Leases, 1)
	assert.Equal(t, "reader", d.Protection.Leases[0].ID, "the script's name for the lease")
	assert.Equal(t, uint64(8), d.Protection.Leases[0].Version)
}

func TestDecodeEvidenceExecution(t *testing.T) {
	ev := decodeReplay(t, 16)
	pe, ok := ev.Err.(*PlanExecutionError)
	require.True(t, ok)
	assert.Equal(t, PhaseExecute, pe.Phase)
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

func TestDecodeEvidenceCause(t *testing.T) {
	be := causeFromMessage("ResidencyBudgetError", (&BudgetError{Location: "cuda:0", BudgetBytes: 10, UsedBytes: 3, ReservedBytes: 2, RequestedBytes: 9}).Error())
	assert.Equal(t, &BudgetError{Location: "cuda:0", BudgetBytes: 10, UsedBytes: 3, ReservedBytes: 2, RequestedBytes: 9}, be)
	iu := causeFromMessage("ResidencyInUseError", (&InUseError{Handle: "a b", Location: "cuda:1", UseCount: 1, HoldCount: 2, PendingEventCount: 3}).Error())
	assert.Equal(t, &InUseError{Handle: "a b", Location: "cuda:1", UseCount: 1, HoldCount: 2, PendingEventCount: 3}, iu)
	st := causeFromMessage("ResidencyStaleStateError", (&StaleStateError{ExpectedVersion: 4, ActualVersion: 9}).Error())
	assert.Equal(t, &StaleStateError{ExpectedVersion: 4, ActualVersion: 9}, st)
	other := causeFromMessage("Error", "disk on fire")
	assert.Equal(t, "Error", Diagnose(other, Snapshot{}, nil).Class)
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
