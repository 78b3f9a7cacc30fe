package diagnose_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
)

// TestDiagnoseEvidenceOverflow: evidence read from a file can carry any
// int64; used = reserved = 2^63−1 never prints a wrapped sum such as
// "current charged … = -2 B" or "short by -502 bytes". The arithmetic is
// exact, the structured figures saturate, and the diagnosis says that no
// runtime reports such figures.
func TestDiagnoseEvidenceOverflow(t *testing.T) {
	const m = math.MaxInt64
	berr := &system.BudgetError{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: m, ReservedBytes: m, RequestedBytes: 500}
	assert.Contains(t, berr.Error(), "(short by 18446744073709551114 bytes)")
	ev := diagnose.Evidence{Err: berr, Snapshot: system.Snapshot{StateVersion: 2, ManagerID: "m", Locations: []system.LocationRecord{
		{Location: "cuda:0", HasBudget: true, BudgetBytes: 1000, UsedBytes: m, ReservedBytes: m}}}}
	d := diagnose.DiagnoseEvidence(ev)
	out := d.String()
	for _, want := range []string{
		"used + reserved = 9223372036854775807 + 9223372036854775807 = 18446744073709551614 B",
		"current charged + requested = 18446744073709551614 + 500 = 18446744073709552114 B",
		"new peak 18446744073709552114 <= budget 1000: false",
		"cuda:0 is 18446744073709551114 bytes short (these sums are beyond the int64 range",
		"headroom:        -18446744073709550614 B",
		"still 18446744073709551114 short of the 500 requested",
	} {
		assert.Contains(t, out, want)
	}
	for _, line := range strings.Split(out, "\n") {
		assert.NotRegexp(t, `= -[0-9]+ B$|short by -`, line)
	}
	require.NotNil(t, d.Budget)
	assert.Equal(t, int64(m), d.Budget.CurrentCharged)
	assert.Equal(t, int64(m), d.Budget.NewPeak)
	assert.Equal(t, int64(m), d.Budget.MissingBytes)

	// Ordinary figures are unchanged.
	berr = &system.BudgetError{Location: "cuda:0", BudgetBytes: 1000, UsedBytes: 700, ReservedBytes: 100, RequestedBytes: 500}
	d = diagnose.DiagnoseEvidence(diagnose.Evidence{Err: berr})
	assert.Equal(t, int64(800), d.Budget.CurrentCharged)
	assert.Equal(t, int64(1300), d.Budget.NewPeak)
	assert.Equal(t, int64(300), d.Budget.MissingBytes)
	assert.Contains(t, d.String(), "refused: cuda:0 is 300 bytes short\n")
	assert.Contains(t, berr.Error(), "(short by 300 bytes)")
}
