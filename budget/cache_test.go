package budget

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func cacheLedger(t *testing.T, budget int64) *Ledger {
	t.Helper()
	l, err := New(Config{ManagerID: "m", TraceCapacity: 64, Locations: []LocationConfig{
		{Name: "pageable-host"},
		{Name: "cuda:0", HasBudget: true, BudgetBytes: budget},
	}})
	require.NoError(t, err)
	return l
}

func TestCacheResizeOwnedShrinksAndGrowsWithAdmission(t *testing.T) {
	l := cacheLedger(t, 100)
	require.NoError(t, l.ReserveOwned("cuda:0", "c/a#1", 60, "c"))
	require.NoError(t, l.Reserve("cuda:0", "other", 20))
	v := l.Version()

	// Shrink: one version, peak unchanged, figures follow.
	require.NoError(t, l.ResizeOwned("c/a#1", "c", 50))
	assert.Equal(t, v+1, l.Version())
	snap := l.Snapshot()
	loc, _ := snap.Location("cuda:0")
	assert.Equal(t, int64(70), loc.ReservedBytes)
	assert.Equal(t, int64(80), loc.PeakBytes)
	assert.Equal(t, []ReservationRecord{{Name: "c/a#1", Bytes: 50, Owner: "c"}, {Name: "other", Bytes: 20}}, loc.Reservations)

	// Same size: no version.
	require.NoError(t, l.ResizeOwned("c/a#1", "c", 50))
	assert.Equal(t, v+1, l.Version())

	// Grow within the budget: admitted as a charge of the difference; the peak follows.
	require.NoError(t, l.ResizeOwned("c/a#1", "c", 80))
	assert.Equal(t, v+2, l.Version())
	snap = l.Snapshot()
	loc, _ = snap.Location("cuda:0")
	assert.Equal(t, int64(100), loc.ReservedBytes)
	assert.Equal(t, int64(100), loc.PeakBytes)

	// Grow past the budget: a BudgetError with the difference and the figures as they were.
	err := l.ResizeOwned("c/a#1", "c", 81)
	var be *BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 100, RequestedBytes: 1}, *be)
	assert.Equal(t, v+2, l.Version())

	tr := l.Trace()
	last := tr[len(tr)-1]
	assert.Equal(t, "resize", last.Kind)
	assert.Equal(t, "cuda:0", last.Location)
	assert.Equal(t, int64(80), last.Bytes)
	assert.Equal(t, "c/a#1: 50 → 80", last.Detail)
}

func TestCacheResizeOwnedRefusesBadInputAndChangesNothing(t *testing.T) {
	l := cacheLedger(t, 100)
	require.NoError(t, l.ReserveOwned("cuda:0", "c/a#1", 60, "c"))
	require.NoError(t, l.Reserve("cuda:0", "plain", 10))
	before := l.Snapshot()
	for name, err := range map[string]error{
		"not active":   l.ResizeOwned("c/b#1", "c", 10),
		"other owner":  l.ResizeOwned("c/a#1", "d", 10),
		"no owner":     l.ResizeOwned("c/a#1", "", 10),
		"zero bytes":   l.ResizeOwned("c/a#1", "c", 0),
		"negative":     l.ResizeOwned("c/a#1", "c", -5),
		"plain, owned": l.ResizeOwned("plain", "c", 5),
	} {
		assert.ErrorIs(t, err, ErrInvalidInput, name)
	}
	assert.Equal(t, before, l.Snapshot())
	// An ordinary reservation resizes with owner "".
	require.NoError(t, l.ResizeOwned("plain", "", 5))
}

func TestCacheOwnerChargesSumsOneOwnerAtOneLocation(t *testing.T) {
	l := cacheLedger(t, 100)
	require.NoError(t, l.ReserveOwned("cuda:0", "c/a", 30, "c"))
	require.NoError(t, l.ReserveOwned("cuda:0", "c/b", 5, "c"))
	require.NoError(t, l.ReserveOwned("cuda:0", "d/a", 7, "d"))
	require.NoError(t, l.ReserveOwned("pageable-host", "c/h", 1000, "c"))
	v := l.Version()
	got, err := l.OwnerCharges("cuda:0", "c")
	require.NoError(t, err)
	assert.Equal(t, OwnerCharges{Location: "cuda:0", HasBudget: true, BudgetBytes: 100, ReservedBytes: 42, OwnedBytes: 35, OwnedReservations: 2}, got)
	assert.Equal(t, v, l.Version(), "a read")

	_, err = l.OwnerCharges("cuda:7", "c")
	var ue *UnavailableError
	assert.ErrorAs(t, err, &ue)
	_, err = l.OwnerCharges("gpu", "c")
	assert.ErrorIs(t, err, ErrInvalidInput)
	_, err = l.OwnerCharges("cuda:0", "")
	assert.ErrorIs(t, err, ErrInvalidInput)
}

func always[E any](E) bool { return true }

func TestCacheBookLRUOrderAndVictims(t *testing.T) {
	b := NewCacheBook[int]()
	for i, k := range []string{"a", "b", "c"} {
		require.NoError(t, b.StartLoad(k, 0))
		require.NoError(t, b.FinishLoad(k, i+1))
	}
	require.NoError(t, b.StartLoad("d", 0)) // loading: never a victim
	assert.Equal(t, []string{"a", "b", "c"}, b.Order())
	assert.Equal(t, 4, b.Len())
	assert.Equal(t, 3, b.Ready())

	item, st := b.Get("a") // a becomes most recently used
	assert.Equal(t, 1, item)
	assert.Equal(t, CacheReady, st)
	assert.Equal(t, []string{"b", "c", "a"}, b.Order())
	_, st = b.Peek("b") // Peek does not touch
	assert.Equal(t, CacheReady, st)
	assert.Equal(t, []string{"b", "c", "a"}, b.Order())
	_, st = b.Get("d")
	assert.Equal(t, CacheLoading, st)
	_, st = b.Get("zz")
	assert.Equal(t, CacheAbsent, st)

	// The least recently used evictable entry goes: b is not evictable.
	key, item, ok := b.Victim(func(i int) bool { return i != 2 })
	require.True(t, ok)
	assert.Equal(t, "c", key)
	assert.Equal(t, 3, item)
	assert.Equal(t, uint64(1), b.Evictions())
	assert.Equal(t, []string{"b", "a"}, b.Order())

	// Nothing evictable: nothing changes.
	_, _, ok = b.Victim(func(int) bool { return false })
	assert.False(t, ok)
	assert.Equal(t, uint64(1), b.Evictions())
	assert.Equal(t, 3, b.Len())
}

func TestCacheBookEvictOutcomes(t *testing.T) {
	b := NewCacheBook[string]()
	require.NoError(t, b.StartLoad("x", "x0"))
	_, out := b.Evict("x", always[string])
	assert.Equal(t, EvictBusy, out, "loading")
	require.NoError(t, b.FinishLoad("x", "x1"))
	_, out = b.Evict("x", func(string) bool { return false })
	assert.Equal(t, EvictBusy, out, "not evictable")
	_, out = b.Evict("nope", always[string])
	assert.Equal(t, EvictAbsent, out)
	assert.Equal(t, uint64(0), b.Evictions())
	item, out := b.Evict("x", always[string])
	assert.Equal(t, Evicted, out)
	assert.Equal(t, "x1", item)
	assert.Equal(t, uint64(1), b.Evictions())
	assert.Equal(t, 0, b.Len())
}

func TestCacheBookLoadTransitionsRefuseWrongStates(t *testing.T) {
	b := NewCacheBook[int]()
	assert.ErrorIs(t, b.FinishLoad("a", 1), ErrInvalidInput)
	assert.ErrorIs(t, b.AbortLoad("a"), ErrInvalidInput)
	require.NoError(t, b.StartLoad("a", 1))
	assert.ErrorIs(t, b.StartLoad("a", 2), ErrInvalidInput)
	require.NoError(t, b.AbortLoad("a"))
	assert.Equal(t, 0, b.Len())
	require.NoError(t, b.StartLoad("a", 1))
	require.NoError(t, b.FinishLoad("a", 1))
	assert.ErrorIs(t, b.StartLoad("a", 2), ErrInvalidInput)
	assert.ErrorIs(t, b.FinishLoad("a", 2), ErrInvalidInput)
	assert.ErrorIs(t, b.AbortLoad("a"), ErrInvalidInput)

	require.NoError(t, b.StartLoad("b", 0))
	require.NoError(t, b.FinishLoad("b", 2))
	require.NoError(t, b.StartLoad("c", 0))
	assert.Equal(t, []int{1, 2}, b.Drain())
	assert.Equal(t, 1, b.Len(), "the loading entry stays")
	assert.Equal(t, uint64(0), b.Evictions(), "draining is not evicting")
}

// The book against a naive model (a slice in recency order), over random
// operations: same states, same order, same victims.
func TestCacheBookAgainstNaiveModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	b := NewCacheBook[int]()
	state := map[string]CacheState{}
	var order []string // ready keys, least recently used first
	touch := func(k string) {
		order = slices.DeleteFunc(order, func(x string) bool { return x == k })
		order = append(order, k)
	}
	var evictions uint64
	for step := 0; step < 20000; step++ {
		k := fmt.Sprintf("k%d", r.IntN(12))
		odd := func(i int) bool { return i%2 == 1 }
		item := len(k) + r.IntN(4) // parity decides evictability
		switch r.IntN(6) {
		case 0:
			err := b.StartLoad(k, item)
			if state[k] == CacheAbsent {
				require.NoError(t, err)
				state[k] = CacheLoading
			} else {
				require.Error(t, err)
			}
		case 1:
			err := b.FinishLoad(k, item)
			if state[k] == CacheLoading {
				require.NoError(t, err)
				state[k] = CacheReady
				touch(k)
			} else {
				require.Error(t, err)
			}
		case 2:
			err := b.AbortLoad(k)
			if state[k] == CacheLoading {
				require.NoError(t, err)
				delete(state, k)
			} else {
				require.Error(t, err)
			}
		case 3:
			_, st := b.Get(k)
			require.Equal(t, state[k], st)
			if st == CacheReady {
				touch(k)
			}
		case 4:
			want := ""
			for _, x := range order {
				if v, _ := b.Peek(x); odd(v) {
					want = x
					break
				}
			}
			key, it, ok := b.Victim(odd)
			if want == "" {
				require.False(t, ok, "no entry is evictable")
				break
			}
			require.True(t, ok, "a victim was missed")
			require.Equal(t, want, key, "not the least recently used evictable entry")
			require.True(t, odd(it))
			delete(state, key)
			order = slices.DeleteFunc(order, func(x string) bool { return x == key })
			evictions++
		case 5:
			_, out := b.Evict(k, odd)
			if out == Evicted {
				delete(state, k)
				order = slices.DeleteFunc(order, func(x string) bool { return x == k })
				evictions++
			} else if out == EvictAbsent {
				require.Equal(t, CacheAbsent, state[k])
			}
		}
		require.Equal(t, append([]string{}, order...), b.Order())
		require.Equal(t, len(state), b.Len())
		require.Equal(t, evictions, b.Evictions())
	}
}
