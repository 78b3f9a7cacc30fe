package budget_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
)

// runAll admits and completes every step of run and returns its report.
func runAll(t *testing.T, run *budget.Run) budget.Report {
	t.Helper()
	for {
		step, ok, err := run.Next()
		require.NoError(t, err)
		if !ok {
			break
		}
		if step.Admission.Pending {
			_, err := run.Complete()
			require.NoError(t, err)
		}
	}
	rep, _, err := run.Finish()
	require.NoError(t, err)
	return rep
}

// evictingDecision is a ledger and a decision of it whose plan evicts (a
// run of several steps).
func evictingDecision(t *testing.T) (*budget.Ledger, budget.Decision) {
	t.Helper()
	l := decideExampleLedger()
	decideExamplePut(l, "embeddings", 60, "cuda:0", 4)
	decideExamplePut(l, "decoder", 40, "cuda:0", 0)
	w := decideExamplePut(l, "weights", 40, "", 0)
	d, err := l.Decide(budget.Request{Name: "generate", Requirements: []budget.Requirement{{Handle: w, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	require.NoError(t, err)
	require.NotEmpty(t, d.Plan.Reclaim, "the decision evicts, so its run has several steps")
	return l, d
}

// StartDecided runs a fresh decision exactly as StartRun with its
// expected version does (same report, same end state), and refuses a
// decision the ledger has moved past with the StaleStateError StartRun
// gives.
func TestStartDecidedRunsAsStartRun(t *testing.T) {
	setup := func() (*budget.Ledger, budget.Decision) { return evictingDecision(t) }
	l1, d1 := setup()
	r1, err := l1.StartRun(d1.Plan, budget.RunOptions{Scope: "s", CheckVersion: true, ExpectedVersion: d1.ExpectedStateVersion})
	require.NoError(t, err)
	l2, d2 := setup()
	r2, err := l2.StartDecided(&d2, "s")
	require.NoError(t, err)
	require.Equal(t, runAll(t, r1), runAll(t, r2))
	require.Equal(t, l1.Snapshot(), l2.Snapshot())

	l3, d3 := setup()
	decideExamplePut(l3, "late", 10, "cuda:1", 0)
	_, err = l3.StartDecided(&d3, "s")
	var stale *budget.StaleStateError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, d3.ExpectedStateVersion, stale.ExpectedVersion)
}

// A plan's simulation explains the same after the run starts from the
// decision: the explanation StartDecided relies on is what Explain gives
// for the plan at that version.
func TestDecisionExplanationIsExplain(t *testing.T) {
	l, d := evictingDecision(t)
	require.Equal(t, l.Explain(d.Plan), d.Explanation)
}
