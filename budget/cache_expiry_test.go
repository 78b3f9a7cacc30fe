package budget

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func TestLongerKeepAlive(t *testing.T) {
	for _, tc := range []struct{ a, b, want time.Duration }{
		{0, 0, 0},
		{0, time.Second, time.Second},
		{time.Minute, time.Second, time.Minute},
		{-1, time.Hour, CacheKeepForever},
		{time.Hour, -5, CacheKeepForever},
		{0, -1, CacheKeepForever},
	} {
		assert.Equal(t, tc.want, LongerKeepAlive(tc.a, tc.b), "%v, %v", tc.a, tc.b)
		assert.Equal(t, tc.want, LongerKeepAlive(tc.b, tc.a), "%v, %v", tc.b, tc.a)
	}
}

// A script of book operations at given times (seconds after t0) and the
// entries Due returns at each step ("key:reason" in order, "" none).
type expiryStep struct {
	at  int    // seconds after t0
	op  string // "load k ka", "use k", "idle k", "mark k", "extend k ka", "busy k", "free k", "due", "loading k"
	due string // for "due": keys removed, "k1 k2"
}

func runExpiryScript(t *testing.T, steps []expiryStep) *CacheBook[string] {
	t.Helper()
	b := NewCacheBook[string]()
	busy := map[string]bool{}
	evictable := func(k string) bool { return !busy[k] }
	for i, s := range steps {
		now := t0.Add(time.Duration(s.at) * time.Second)
		f := strings.Fields(s.op)
		var err error
		switch f[0] {
		case "loading":
			err = b.StartLoad(f[1], f[1])
		case "load":
			var ka time.Duration
			ka, err = time.ParseDuration(f[2])
			require.NoError(t, err)
			if _, st := b.Peek(f[1]); st == CacheAbsent {
				require.NoError(t, b.StartLoad(f[1], f[1]))
			}
			require.NoError(t, b.SetKeepAlive(f[1], ka))
			require.NoError(t, b.FinishLoad(f[1], f[1]))
			err = b.Use(f[1], now)
		case "use":
			err = b.Use(f[1], now)
		case "idle":
			err = b.Idle(f[1], now)
		case "mark":
			b.MarkEvictWhenIdle(f[1])
		case "extend":
			ka, perr := time.ParseDuration(f[2])
			require.NoError(t, perr)
			err = b.ExtendKeepAlive(f[1], ka)
		case "busy":
			busy[f[1]] = true
		case "free":
			busy[f[1]] = false
		case "due":
			var got []string
			for _, d := range b.Due(now, evictable) {
				got = append(got, d.Key+":"+map[CacheDueReason]string{DueExpired: "expired", DueEvictWhenIdle: "marked"}[d.Reason])
			}
			require.Equal(t, s.due, strings.Join(got, " "), "step %d (%s at %ds)", i, s.op, s.at)
		default:
			t.Fatalf("bad op %q", s.op)
		}
		require.NoError(t, err, "step %d (%s)", i, s.op)
	}
	return b
}

func TestCacheBookExpiryTable(t *testing.T) {
	for _, tc := range []struct {
		name        string
		steps       []expiryStep
		expirations uint64
		evictions   uint64
		left        string // keys left, in order
	}{
		{name: "held entries never expire", steps: []expiryStep{
			{0, "load a 10s", ""}, {100, "due", ""},
		}, left: "a"},
		{name: "keep-alive counts from the last release", steps: []expiryStep{
			{0, "load a 10s", ""}, {5, "idle a", ""}, {14, "due", ""}, {15, "due", "a:expired"},
		}, expirations: 1, evictions: 1},
		{name: "a use resets the keep-alive", steps: []expiryStep{
			{0, "load a 10s", ""}, {5, "idle a", ""}, {12, "use a", ""}, {16, "due", ""},
			{20, "idle a", ""}, {29, "due", ""}, {30, "due", "a:expired"},
		}, expirations: 1, evictions: 1},
		{name: "zero: unload when idle", steps: []expiryStep{
			{0, "load a 0s", ""}, {0, "due", ""}, {3, "idle a", ""}, {3, "due", "a:expired"},
		}, expirations: 1, evictions: 1},
		{name: "negative: forever", steps: []expiryStep{
			{0, "load a -1s", ""}, {1, "idle a", ""}, {1 << 30, "due", ""},
		}, left: "a"},
		{name: "an extension lengthens, never shortens", steps: []expiryStep{
			{0, "load a 10s", ""}, {0, "extend a 30s", ""}, {0, "extend a 5s", ""}, {0, "idle a", ""},
			{29, "due", ""}, {30, "due", "a:expired"},
		}, expirations: 1, evictions: 1},
		{name: "an extension of an idle entry moves its expiry", steps: []expiryStep{
			{0, "load a 10s", ""}, {0, "idle a", ""}, {5, "extend a 20s", ""}, {10, "due", ""}, {20, "due", "a:expired"},
		}, expirations: 1, evictions: 1},
		{name: "extended to forever", steps: []expiryStep{
			{0, "load a 10s", ""}, {0, "idle a", ""}, {5, "extend a -1s", ""}, {1000, "due", ""},
		}, left: "a"},
		{name: "a busy predicate keeps it due until it is idle", steps: []expiryStep{
			{0, "load a 1s", ""}, {0, "idle a", ""}, {0, "busy a", ""}, {5, "due", ""}, {6, "due", ""},
			{6, "free a", ""}, {6, "due", "a:expired"},
		}, expirations: 1, evictions: 1},
		{name: "marked while held goes at its release", steps: []expiryStep{
			{0, "load a -1s", ""}, {1, "mark a", ""}, {2, "due", ""}, {3, "idle a", ""}, {3, "due", "a:marked"},
		}, evictions: 1},
		{name: "marked while idle goes at once", steps: []expiryStep{
			{0, "load a -1s", ""}, {1, "idle a", ""}, {2, "mark a", ""}, {2, "due", "a:marked"},
		}, evictions: 1},
		{name: "marked while loading goes at its release", steps: []expiryStep{
			{0, "loading a", ""}, {0, "mark a", ""}, {0, "load a -1s", ""}, {1, "due", ""}, {2, "idle a", ""}, {2, "due", "a:marked"},
		}, evictions: 1},
		{name: "due in expiry order, ties by key", steps: []expiryStep{
			{0, "load c 5s", ""}, {0, "load b 5s", ""}, {0, "load a 8s", ""},
			{0, "idle a", ""}, {0, "idle c", ""}, {0, "idle b", ""}, {10, "due", "b:expired c:expired a:expired"},
		}, expirations: 3, evictions: 3},
		{name: "only what is due goes", steps: []expiryStep{
			{0, "load a 5s", ""}, {0, "load b 50s", ""}, {0, "idle a", ""}, {0, "idle b", ""}, {10, "due", "a:expired"},
		}, expirations: 1, evictions: 1, left: "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := runExpiryScript(t, tc.steps)
			assert.Equal(t, tc.expirations, b.Expirations())
			assert.Equal(t, tc.evictions, b.Evictions())
			assert.Equal(t, tc.left, strings.Join(b.Order(), " "))
		})
	}
}

func TestCacheBookNextExpiry(t *testing.T) {
	b := NewCacheBook[string]()
	_, ok := b.NextExpiry()
	assert.False(t, ok, "empty")
	for _, k := range []string{"a", "b", "c"} {
		require.NoError(t, b.StartLoad(k, k))
		require.NoError(t, b.FinishLoad(k, k))
		require.NoError(t, b.Use(k, t0))
	}
	require.NoError(t, b.SetKeepAlive("a", 30*time.Second))
	require.NoError(t, b.SetKeepAlive("b", 10*time.Second))
	require.NoError(t, b.SetKeepAlive("c", 0))
	_, ok = b.NextExpiry()
	assert.False(t, ok, "held entries have no expiry")
	require.NoError(t, b.Idle("a", t0))
	require.NoError(t, b.Idle("b", t0))
	require.NoError(t, b.Idle("c", t0)) // due at once: not a time
	at, ok := b.NextExpiry()
	require.True(t, ok)
	assert.Equal(t, t0.Add(10*time.Second), at)
	require.NoError(t, b.Use("b", t0.Add(time.Second)))
	at, _ = b.NextExpiry()
	assert.Equal(t, t0.Add(30*time.Second), at, "a use takes b out")
	// Evicting a for room takes it out too.
	_, out := b.Evict("a", always[string])
	require.Equal(t, Evicted, out)
	_, ok = b.NextExpiry()
	assert.False(t, ok)
	assert.Len(t, b.Due(t0, always[string]), 1, "c")
	assert.Equal(t, uint64(1), b.Expirations())
}

func TestCacheBookKeepAliveRefusesWrongStates(t *testing.T) {
	b := NewCacheBook[int]()
	assert.ErrorIs(t, b.SetKeepAlive("a", time.Second), ErrInvalidInput)
	assert.ErrorIs(t, b.ExtendKeepAlive("a", time.Second), ErrInvalidInput)
	assert.ErrorIs(t, b.Use("a", t0), ErrInvalidInput)
	assert.ErrorIs(t, b.Idle("a", t0), ErrInvalidInput)
	assert.Equal(t, CacheAbsent, b.MarkEvictWhenIdle("a"))
	require.NoError(t, b.StartLoad("a", 1))
	assert.ErrorIs(t, b.Use("a", t0), ErrInvalidInput, "loading")
	assert.ErrorIs(t, b.Idle("a", t0), ErrInvalidInput, "loading")
	require.NoError(t, b.SetKeepAlive("a", time.Second), "a loading entry takes a keep-alive")
	assert.Equal(t, CacheLoading, b.MarkEvictWhenIdle("a"))
}

func TestCacheBookMakeCapRoom(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ready     int  // ready entries k0..
		loading   int  // loading entries l0..
		pending   int  //
		max       int  //
		evictable bool // every ready entry
		want      CacheCapOutcome
		victim    string
	}{
		{name: "no cap", ready: 9, max: 0, want: CapFits},
		{name: "under the cap", ready: 2, max: 3, want: CapFits},
		{name: "at the cap, an idle entry", ready: 3, max: 3, evictable: true, want: CapEvicted, victim: "k0"},
		{name: "at the cap, nothing idle", ready: 3, max: 3, want: CapFull},
		{name: "loading entries count", ready: 1, loading: 2, max: 3, evictable: true, want: CapEvicted, victim: "k0"},
		{name: "pending loads count", ready: 1, pending: 1, max: 2, evictable: true, want: CapEvicted, victim: "k0"},
		{name: "loading entries are never victims", loading: 3, max: 3, evictable: true, want: CapFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewCacheBook[string]()
			for i := range tc.ready {
				k := fmt.Sprintf("k%d", i)
				require.NoError(t, b.StartLoad(k, k))
				require.NoError(t, b.FinishLoad(k, k))
			}
			for i := range tc.loading {
				require.NoError(t, b.StartLoad(fmt.Sprintf("l%d", i), ""))
			}
			n := b.Len()
			key, item, out := b.MakeCapRoom(tc.max, tc.pending, func(string) bool { return tc.evictable })
			assert.Equal(t, tc.want, out)
			assert.Equal(t, tc.victim, key)
			assert.Equal(t, tc.victim, item)
			if out == CapEvicted {
				assert.Equal(t, n-1, b.Len())
				assert.Equal(t, uint64(1), b.Evictions())
			} else {
				assert.Equal(t, n, b.Len())
				assert.Equal(t, uint64(0), b.Evictions())
			}
		})
	}
}

func TestCacheBookEntriesInKeyOrder(t *testing.T) {
	b := NewCacheBook[int]()
	require.NoError(t, b.StartLoad("b", 2))
	require.NoError(t, b.FinishLoad("b", 2))
	require.NoError(t, b.SetKeepAlive("b", time.Minute))
	require.NoError(t, b.Use("b", t0))
	require.NoError(t, b.Idle("b", t0.Add(time.Second)))
	require.NoError(t, b.StartLoad("a", 1))
	b.MarkEvictWhenIdle("a")
	require.NoError(t, b.StartLoad("c", 3))
	require.NoError(t, b.FinishLoad("c", 3))
	require.NoError(t, b.Use("c", t0))
	got := b.Entries()
	require.Len(t, got, 3)
	assert.Equal(t, CacheBookEntry[int]{Key: "a", Item: 1, State: CacheLoading, KeepAlive: CacheKeepForever, EvictWhenIdle: true}, got[0])
	assert.Equal(t, CacheBookEntry[int]{Key: "b", Item: 2, State: CacheReady, KeepAlive: time.Minute, LastUse: t0.Add(time.Second), Idle: true, Expiry: t0.Add(time.Minute + time.Second)}, got[1])
	assert.Equal(t, CacheBookEntry[int]{Key: "c", Item: 3, State: CacheReady, KeepAlive: CacheKeepForever, LastUse: t0}, got[2])
}

func TestCacheBookEvictAll(t *testing.T) {
	b := NewCacheBook[int]()
	for i, k := range []string{"a", "b", "c", "d"} {
		require.NoError(t, b.StartLoad(k, i))
		require.NoError(t, b.FinishLoad(k, i))
		require.NoError(t, b.Use(k, t0))
		require.NoError(t, b.SetKeepAlive(k, time.Second))
		require.NoError(t, b.Idle(k, t0))
	}
	require.NoError(t, b.StartLoad("e", 9))
	b.Get("a") // a is the most recently used
	assert.Equal(t, []int{1, 3, 0}, b.EvictAll(func(i int) bool { return i != 2 }))
	assert.Equal(t, []string{"c"}, b.Order())
	assert.Equal(t, 2, b.Len(), "c and the loading e")
	assert.Equal(t, uint64(3), b.Evictions())
	at, ok := b.NextExpiry()
	assert.True(t, ok)
	assert.Equal(t, t0.Add(time.Second), at, "c's, the evicted ones are out of the heap")
	assert.Nil(t, b.EvictAll(func(int) bool { return false }))
}
