package budget

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handle steps its own entry as the by-key calls do, and is absent
// once that entry leaves the book, also when the key has a new entry.
func TestCacheSlotStepsItsEntryUntilItLeaves(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := NewCacheBook[int]()
	h, err := b.StartLoadSlot("a", 1)
	require.NoError(t, err)
	assert.Equal(t, CacheLoading, h.State())
	assert.Error(t, b.UseSlot(h, t0), "loading: not ready")
	assert.Error(t, b.IdleSlot(h, t0), "loading: not ready")
	_, err = b.StartLoadSlot("a", 2)
	assert.Error(t, err, "already loading")

	require.NoError(t, b.FinishLoad("a", 1))
	require.NoError(t, b.SetKeepAlive("a", time.Minute))
	assert.Equal(t, CacheReady, h.State())
	require.NoError(t, b.UseSlot(h, t0))
	require.NoError(t, b.IdleSlot(h, t0.Add(time.Second)))
	at, ok := b.NextExpiry()
	require.True(t, ok)
	assert.Equal(t, t0.Add(time.Second+time.Minute), at, "the keep-alive counts from the idle stamp")
	require.NoError(t, b.UseSlot(h, t0.Add(2*time.Second)))
	_, ok = b.NextExpiry()
	assert.False(t, ok, "held: no expiry")
	got := b.Entries()
	require.Len(t, got, 1)
	assert.Equal(t, t0.Add(2*time.Second), got[0].LastUse)
	assert.False(t, got[0].Idle)

	// GetSlot hands out the same handle and moves the entry to the back.
	_, err = b.StartLoadSlot("b", 2)
	require.NoError(t, err)
	require.NoError(t, b.FinishLoad("b", 2))
	item, st, h2 := b.GetSlot("a")
	assert.Equal(t, 1, item)
	assert.Equal(t, CacheReady, st)
	assert.Equal(t, h, h2)
	assert.Equal(t, []string{"b", "a"}, b.Order())
	_, st, h3 := b.GetSlot("none")
	assert.Equal(t, CacheAbsent, st)
	assert.Equal(t, CacheAbsent, h3.State())

	// Evicted: the handle is absent, and stays so when the key loads again.
	_, out := b.Evict("a", func(int) bool { return true })
	require.Equal(t, Evicted, out)
	assert.Equal(t, CacheAbsent, h.State())
	assert.Error(t, b.UseSlot(h, t0))
	assert.Error(t, b.IdleSlot(h, t0))
	_, err = b.StartLoadSlot("a", 3)
	require.NoError(t, err)
	require.NoError(t, b.FinishLoad("a", 3))
	assert.Equal(t, CacheAbsent, h.State(), "a handle is its entry's, not its key's")
	assert.Error(t, b.UseSlot(h, t0))
}

// Every way out of the book makes a handle absent; a handle of another
// book and the zero handle are refused.
func TestCacheSlotIsAbsentAfterEveryExitAndElsewhere(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ready := func(b *CacheBook[int], key string) CacheSlot[int] {
		h, err := b.StartLoadSlot(key, 1)
		require.NoError(t, err)
		require.NoError(t, b.FinishLoad(key, 1))
		return h
	}
	yes := func(int) bool { return true }
	exits := map[string]func(b *CacheBook[int]){
		"abort": nil,
		"victim": func(b *CacheBook[int]) {
			_, _, ok := b.Victim(yes)
			require.True(t, ok)
		},
		"drain":     func(b *CacheBook[int]) { require.Len(t, b.Drain(), 1) },
		"evict all": func(b *CacheBook[int]) { require.Len(t, b.EvictAll(yes), 1) },
		"cap": func(b *CacheBook[int]) {
			_, _, out := b.MakeCapRoom(1, 0, yes)
			require.Equal(t, CapEvicted, out)
		},
		"expiry": func(b *CacheBook[int]) {
			require.NoError(t, b.SetKeepAlive("k", 0))
			require.NoError(t, b.Idle("k", t0))
			require.Len(t, b.Due(t0, yes), 1)
		},
	}
	for name, exit := range exits {
		t.Run(name, func(t *testing.T) {
			b := NewCacheBook[int]()
			var h CacheSlot[int]
			if exit == nil {
				var err error
				h, err = b.StartLoadSlot("k", 1)
				require.NoError(t, err)
				require.NoError(t, b.AbortLoad("k"))
			} else {
				h = ready(b, "k")
				exit(b)
			}
			assert.Equal(t, CacheAbsent, h.State())
			assert.Error(t, b.UseSlot(h, t0))
			assert.Error(t, b.IdleSlot(h, t0))
		})
	}

	a, other := NewCacheBook[int](), NewCacheBook[int]()
	h := ready(a, "k")
	ready(other, "k")
	assert.Error(t, other.UseSlot(h, t0), "a handle of another book")
	assert.Error(t, other.IdleSlot(h, t0))
	assert.Error(t, a.UseSlot(CacheSlot[int]{}, t0), "the zero handle")
	got := other.Entries()
	require.Len(t, got, 1)
	assert.True(t, got[0].LastUse.IsZero(), "nothing changed in the other book")
}
