package system_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

// A waiting Admit that reserves more at the members of a shared budget
// than the group's whole figure can never be admitted: it is refused at
// once (a *PlanError), not left waiting until its context ends.
func TestWaitingAdmitLargerThanItsSharedBudgetIsRefusedAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sys, err := system.Start(ctx, simulated(system.Options{
		Locations:     []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<20)},
		SharedBudgets: []system.SharedBudget{{Name: "igpu", Locations: []string{"cuda:0", "pageable-host"}, Bytes: 1 << 20}},
	}))
	require.NoError(t, err)
	defer closeExample(sys)
	_, _, err = sys.Admit(ctx, system.Request{Name: "big", Reservations: []system.ReservationSpec{
		{Name: "a", Location: "cuda:0", Bytes: 600 << 10},
		{Name: "b", Location: "pageable-host", Bytes: 600 << 10},
	}}, system.WaitForRoom())
	var pe *system.PlanError
	require.ErrorAs(t, err, &pe)
	require.Contains(t, pe.Reason, `shared budget "igpu"`)
	require.NoError(t, ctx.Err(), "refused before its context ended")
}
