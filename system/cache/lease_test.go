package cache_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// A lease is a value: its copies are the same lease, and a copy kept
// after the release stays released while later leases reuse what the
// release gave back.
func TestCacheLeaseCopiesAreOneLease(t *testing.T) {
	ctx := context.Background()
	_, cs := startVictims(t, 1)
	c := cs[0]
	l, _, err := loadBlob(ctx, c, "a", 10)
	require.NoError(t, err)
	cp := l
	require.NoError(t, cp.Release())
	var inv *system.InvalidInputError
	assert.ErrorAs(t, l.Release(), &inv, "released through its copy")
	assert.Panics(t, func() { l.Clone() })
	assert.Panics(t, func() { l.Pin() })
	assert.Panics(t, func() { l.KeepAlive() })

	// Many later hits: whatever they reuse, the stale copies stay
	// released and never release a later lease.
	for range 100 {
		h, _, err := loadBlob(ctx, c, "a", 10)
		require.NoError(t, err)
		assert.ErrorAs(t, l.Release(), &inv)
		assert.ErrorAs(t, cp.Release(), &inv)
		e := entryOf(t, c, "a")
		assert.Equal(t, 1, e.Leases, "the stale release took nothing")
		require.NoError(t, h.Release())
	}
	assert.Equal(t, 0, entryOf(t, c, "a").Leases)

	// A clone is a lease of its own.
	h, _, err := loadBlob(ctx, c, "a", 10)
	require.NoError(t, err)
	cl := h.Clone()
	require.NoError(t, h.Release())
	assert.Equal(t, 1, entryOf(t, c, "a").Leases)
	assert.Equal(t, "a", cl.Key())
	require.NoError(t, cl.Release())
	assert.ErrorAs(t, cl.Release(), &inv)
}

// The zero Lease holds nothing: its Release is invalid input, its
// readers answer zero values, and taking a reference from it panics as
// from a released lease.
func TestCacheZeroLeaseHoldsNothing(t *testing.T) {
	var l cache.Lease[*blob]
	var inv *system.InvalidInputError
	assert.ErrorAs(t, l.Release(), &inv)
	assert.Nil(t, l.Value())
	assert.Equal(t, "", l.Key())
	assert.Equal(t, int64(0), l.Bytes())
	assert.Nil(t, l.Parts())
	assert.Panics(t, func() { l.Clone() })
	assert.Panics(t, func() { l.Pin() })
	assert.Panics(t, func() { l.KeepAlive() })
}

// A failed load answers the zero Lease.
func TestCacheFailedLoadAnswersTheZeroLease(t *testing.T) {
	_, cs := startVictims(t, 1)
	l, err := cache.Load(context.Background(), cs[0], "", 10, nil, func(context.Context) (int, int64, error) { return 1, 10, nil })
	require.Error(t, err)
	assert.Equal(t, cache.Lease[int]{}, l)
}

func entryOf(t *testing.T, c *cache.Cache, key string) cache.Entry {
	t.Helper()
	for _, e := range c.Entries() {
		if e.Key == key {
			return e
		}
	}
	t.Fatalf("no entry %q", key)
	return cache.Entry{}
}
