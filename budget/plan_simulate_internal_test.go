package budget

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The simulation's copies of several values share their allocations; a
// materialization the simulation adds to one value leaves the next
// value's materializations as they were, and the ledger's own values
// untouched.
func TestSimCloneCopiesStayApart(t *testing.T) {
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{{Name: "pageable-host"}, {Name: "cuda:0"}}})
	require.NoError(t, err)
	var vals []*value
	for _, name := range []string{"a", "b"} {
		h, adm, err := l.Register(ValueSpec{Name: name, Bytes: 8, Mode: Replicable, At: "pageable-host"})
		require.NoError(t, err)
		_, err = l.Complete(adm.ID)
		require.NoError(t, err)
		v, err := l.value(h)
		require.NoError(t, err)
		vals = append(vals, v)
	}
	c := l.simClone(append(vals, vals[0]))
	a, b := c.simValue(vals[0].id), c.simValue(vals[1].id)
	require.NotSame(t, vals[0], a)
	bFirst := b.mats[0]
	a.mats = append(a.mats, &mat{loc: 1, state: Entering})
	require.Same(t, bFirst, b.mats[0], "b's materializations are its own")
	require.Equal(t, 0, b.mats[0].loc)
	require.Len(t, vals[0].mats, 1, "the ledger's value is not touched")
	a.mats[0].state = Leaving
	require.Equal(t, Resident, vals[0].mats[0].state)
}
