package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
)

// A PlacementError says what actually ended the placement: the caller's
// context during the directory lookup (no candidates were computed: not
// "no candidate node"), no candidate at all, or each node's refusal.
func TestPlacementErrorMessage(t *testing.T) {
	e := &PlacementError{Request: "r", Stage: "asking the directory where w is resident", Ctx: context.DeadlineExceeded}
	require.Equal(t, `residency placement "r": stopped while asking the directory where w is resident, before any node was asked; stopped: context deadline exceeded`, e.Error())
	require.ErrorIs(t, e, context.DeadlineExceeded)

	e = &PlacementError{Request: "r"}
	require.Equal(t, `residency placement "r": no node admitted it (no candidate node)`, e.Error())

	un := &budget.UnavailableError{Location: "@node-c", Reason: budget.UnavailableLocation, Detail: "gone"}
	e = &PlacementError{Request: "r", Attempts: []PlacementAttempt{{Node: "node-c", Err: un}},
		Directory: []string{"directory did not answer for w within 2s: ranked by room only"}}
	require.Contains(t, e.Error(), `residency placement "r": no node admitted it; node-c: `)
	require.Contains(t, e.Error(), "; directory did not answer for w within 2s: ranked by room only")
	var got *budget.UnavailableError
	require.True(t, errors.As(e, &got))
}
