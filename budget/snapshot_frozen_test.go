package budget

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// A frozen snapshot is the state at its version whatever the ledger does
// afterwards (copy on write of the record chunks), its rendering shares
// nothing, and it can be rendered on another goroutine while the ledger
// changes (run with -race).
func TestFrozenSnapshotIsImmutable(t *testing.T) {
	l, err := New(Config{ManagerID: "m", Locations: []LocationConfig{{Name: "pageable-host"}, {Name: "cuda:0", HasBudget: true, BudgetBytes: 1 << 40}}})
	require.NoError(t, err)
	const n = 3*recChunkSize + 17 // several chunks, the last one partial
	hs := make([]Handle, n)
	for i := range hs {
		h, adm, err := l.Register(ValueSpec{Name: fmt.Sprint("v", i), Bytes: int64(1 + i%7), Mode: Replicable, At: "pageable-host"})
		require.NoError(t, err)
		_, err = l.Complete(adm.ID)
		require.NoError(t, err)
		hs[i] = h
	}
	require.NoError(t, l.Reserve("cuda:0", "r", 5))
	f := l.Freeze()
	want := f.Snapshot()
	require.Len(t, want.Values, n)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // renders concurrently with the mutations below
		defer wg.Done()
		for range 5 {
			if s := f.Snapshot(); len(s.Values) != n {
				panic("frozen snapshot changed")
			}
		}
	}()
	// Change values in every chunk, retire most of them (a compaction of
	// the value table), register more, take a lease and a hold.
	for i := 0; i < n; i++ {
		switch {
		case i%3 == 0:
			adm, err := l.Place(hs[i], "cuda:0")
			require.NoError(t, err)
			_, err = l.Complete(adm.ID)
			require.NoError(t, err)
		default:
			_, err := l.Discard(hs[i])
			require.NoError(t, err)
		}
	}
	_, err = l.Acquire(hs[0], "cuda:0")
	require.NoError(t, err)
	_, err = l.Hold(hs[3], "pageable-host")
	require.NoError(t, err)
	for i := range 2000 {
		_, _, err := l.Register(ValueSpec{Name: fmt.Sprint("w", i), Bytes: 3, Source: "pageable-host"})
		require.NoError(t, err)
	}
	require.NoError(t, l.Unreserve("r"))
	wg.Wait()
	require.Equal(t, want, f.Snapshot(), "the frozen snapshot is the state at its version")
	// A rendering shares nothing: changing it changes no other one.
	got := f.Snapshot()
	got.Values[0].Materializations[0].UseCount = 99
	got.Locations[1].Reservations[0].Bytes = 99
	require.Equal(t, want, f.Snapshot())
	// The ledger's own snapshot is its state now (CheckInvariants also
	// compares every record with the value).
	require.NoError(t, l.CheckInvariants())
	now := l.Snapshot()
	require.Len(t, now.Values, (n+2)/3+2000)
	require.Equal(t, 1, now.Values[0].Materializations[1].UseCount)
	require.Equal(t, 1, now.Values[1].Materializations[0].HoldCount)
	require.Empty(t, now.Locations[1].Reservations)
	require.NoError(t, l.CheckInvariants())
}
