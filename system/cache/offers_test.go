package cache_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// Lazy offers (docs/semantics.md, "In the runtime"): the cache records
// offers and withdrawals; the runtime commits them before its next ledger
// step, one version per entry and drain however many leases and releases
// came between.

// offerKinds returns the kinds of the trace's transitions after version
// from that are offers and withdrawals.
func offerKinds(t *testing.T, sys *system.System, from uint64) []string {
	t.Helper()
	tr, err := sys.Trace(context.Background())
	require.NoError(t, err)
	var out []string
	for _, x := range tr {
		if x.Version > from && (x.Kind == "offer_charge" || x.Kind == "withdraw_charge") {
			out = append(out, x.Kind)
		}
	}
	return out
}

func TestLazyOffersCountPerDrain(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	c := cs[0]
	idleBlob(t, c, "a", 10)
	v0, err := sys.StateVersion(ctx) // drains: the offer of a is committed
	require.NoError(t, err)
	require.Equal(t, []string{"offer_charge"}, offerKinds(t, sys, 0))

	// Nothing recorded since: a step commits nothing.
	v, err := sys.StateVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, v0, v)

	// Many hits and releases between two steps: one new offer (new stamp,
	// new use count), not two versions per cycle.
	for range 50 {
		l, _, err := loadBlob(ctx, c, "a", 10)
		require.NoError(t, err)
		require.NoError(t, l.Release())
	}
	v1, err := sys.StateVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, v0+1, v1)
	require.Equal(t, []string{"offer_charge"}, offerKinds(t, sys, v0))

	// A lease held across a step: withdrawn at that step.
	l, _, err := loadBlob(ctx, c, "a", 10)
	require.NoError(t, err)
	v2, err := sys.StateVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, v1+1, v2)
	require.Equal(t, []string{"withdraw_charge"}, offerKinds(t, sys, v1))

	// Released and leased again before the next step: back to what the
	// ledger has (withdrawn): nothing.
	require.NoError(t, l.Release())
	l, _, err = loadBlob(ctx, c, "a", 10)
	require.NoError(t, err)
	v3, err := sys.StateVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, v2, v3)
	require.NoError(t, l.Release())
}

// A decision sees a release made just before it: the offer is drained
// before the decision, so Admit evicts the entry released a moment ago.
func TestLazyOfferVisibleToTheNextDecision(t *testing.T) {
	ctx := context.Background()
	sys, cs := startVictims(t, 1)
	l, b, err := loadBlob(ctx, cs[0], "a", 60)
	require.NoError(t, err)
	_, err = sys.StateVersion(ctx) // the lease is known to the ledger: nothing offered
	require.NoError(t, err)
	require.Empty(t, offerKinds(t, sys, 0))
	require.NoError(t, l.Release()) // recorded only
	sc, d, err := sys.Admit(ctx, gpuResv("kv", 80))
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1)
	require.Equal(t, budget.EvictionIdleCacheEntry, d.Evictions[0].Kind)
	require.Equal(t, int32(1), b.closed.Load(), "the idle entry was the victim")
	require.NoError(t, sc.Exit(ctx))
}
