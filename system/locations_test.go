package system

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/soft"
)

// A single-node runtime refuses a node-qualified location at Start (it
// never simulates `cuda:0@node-b` locally): invalid input naming it, and
// nothing is started.
func TestStartRefusesNodeQualifiedLocation(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"cuda:0@node-b", "pageable-host@n1", "pinned-host@a.b_c-d"} {
		s, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), Limit(name, 1<<20)}})
		require.Nil(t, s, name)
		var inv *InvalidInputError
		require.True(t, errors.As(err, &inv), "%s: %v", name, err)
		require.ErrorIs(t, err, ErrInvalidInput)
		require.Contains(t, err.Error(), `"`+name+`"`)
		require.Contains(t, err.Error(), "cluster")
	}
	// A malformed node qualifier is still the ledger's malformed-name error.
	_, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("cuda:0@")}})
	require.ErrorIs(t, err, ErrInvalidInput)
	require.Contains(t, err.Error(), "malformed")
	// Unqualified names still start.
	s, err := startSoft(t, ctx, Options{Locations: []LocationConfig{NoLimit("pageable-host"), Limit("cuda:0", 1<<20)}})
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
}

// SoftBackend names a malformed location instead of dropping it, alone
// (not "no locations configured") or beside a good name.
func TestSoftBackendNamesAMalformedLocation(t *testing.T) {
	for _, locs := range [][]LocationConfig{
		{Limit("cuda:x", 1<<30)},
		{NoLimit("pageable-host"), Limit("cuda:x", 1<<30)},
	} {
		b, err := SoftBackend(locs, soft.Config{})
		require.Nil(t, b)
		var inv *InvalidInputError
		require.ErrorAs(t, err, &inv)
		require.Contains(t, err.Error(), `malformed location "cuda:x"`)
		require.NotContains(t, err.Error(), "no locations configured")
	}
	b, err := SoftBackend(nil, soft.Config{})
	require.Nil(t, b)
	require.ErrorContains(t, err, "no locations configured")
}

func TestSplitLocation(t *testing.T) {
	local, node, err := SplitLocation("cuda:1@node-b")
	require.NoError(t, err)
	assert.Equal(t, "cuda:1", local)
	assert.Equal(t, "node-b", node)
	local, node, err = SplitLocation("pinned-host")
	require.NoError(t, err)
	assert.Equal(t, "pinned-host", local)
	assert.Empty(t, node)
	_, _, err = SplitLocation("cuda:x")
	var inv *InvalidInputError
	require.ErrorAs(t, err, &inv)
	assert.Contains(t, inv.Message, `"cuda:x"`)
}
