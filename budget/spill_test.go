package budget

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSpillConfig(t *testing.T) {
	cfg := func(spill map[string]string) Config {
		c := Config{ManagerID: "m"}
		for _, n := range []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"} {
			c.Locations = append(c.Locations, LocationConfig{Name: n, SpillTo: spill[n]})
		}
		return c
	}
	l, err := New(cfg(nil))
	require.NoError(t, err)
	assert.Nil(t, l.SpillTargets(), "none by default")
	_, ok := l.SpillTarget("cuda:0")
	assert.False(t, ok)

	l, err = New(cfg(map[string]string{"cuda:0": "pinned-host", "cuda:1": "pinned-host", "pinned-host": "pageable-host"}))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"cuda:0": "pinned-host", "cuda:1": "pinned-host", "pinned-host": "pageable-host"}, l.SpillTargets())
	to, ok := l.SpillTarget("cuda:1")
	assert.True(t, ok)
	assert.Equal(t, "pinned-host", to)

	for name, spill := range map[string]map[string]string{
		"itself":         {"cuda:0": "cuda:0"},
		"not configured": {"cuda:0": "cuda:2"},
		"malformed":      {"cuda:0": "gpu0"},
	} {
		_, err := New(cfg(spill))
		var ie *InvalidInputError
		assert.ErrorAs(t, err, &ie, name)
		assert.ErrorIs(t, err, ErrInvalidInput, name)
	}
}

func TestEvictionKindText(t *testing.T) {
	for _, k := range []EvictionKind{EvictionOther, EvictionLowestPriority, EvictionDemoted} {
		b, err := k.MarshalText()
		require.NoError(t, err)
		var back EvictionKind
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, k, back, string(b))
	}
	assert.Equal(t, "demoted", EvictionDemoted.String())
}
