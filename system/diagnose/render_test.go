package diagnose_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
)

// A budget refusal at device scale prints each byte figure for people with
// the exact figure beside it, and names the steps it leaves out and why.
func TestRenderHumanBytesAndSkippedSteps(t *testing.T) {
	const gib = int64(1) << 30
	err := &system.BudgetError{Location: "cuda:0", BudgetBytes: 26 * gib, UsedBytes: 20 * gib, RequestedBytes: 8 * gib}
	snap := system.Snapshot{StateVersion: 3, ManagerID: "big", Locations: []system.LocationRecord{
		{Location: "cuda:0", HasBudget: true, BudgetBytes: 26 * gib, UsedBytes: 20 * gib},
	}}
	text := diagnose.Diagnose(err, snap, nil).String()
	assert.Contains(t, text, "budget_bytes:     26 GiB (27917287424)")
	assert.Contains(t, text, "requested_bytes:  8 GiB (8589934592)")
	require.Contains(t, text, "steps 4–7 do not apply to this ResidencyBudgetError:")
	assert.Contains(t, text, "  7: only for a failed execution (ResidencyPlanExecutionError)")
	// Every number from 1 to 8 is either a step or named as skipped.
	for _, n := range []string{"step 1. ", "step 2 does not apply", "step 3. ", "  4: ", "  5: ", "  6: ", "  7: ", "step 8. "} {
		assert.True(t, strings.Contains(text, n), "missing %q in\n%s", n, text)
	}
}
