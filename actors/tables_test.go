package actors

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/messages"
)

func TestRegistryTakeRemovesOnce(t *testing.T) {
	r := newRegistry[uint64, string]()
	r.put(1, "a")
	v, ok := r.get(1)
	require.True(t, ok)
	assert.Equal(t, "a", v)
	v, ok = r.take(1)
	require.True(t, ok)
	assert.Equal(t, "a", v)
	_, ok = r.take(1)
	assert.False(t, ok, "a taken entry must be gone")
}

func TestRegistryConcurrentTakeHandsOutEachEntryOnce(t *testing.T) {
	r := newRegistry[uint64, int]()
	const n = 1000
	for i := range n {
		r.put(uint64(i), i)
	}
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				if v, ok := r.take(uint64(i)); ok {
					mu.Lock()
					got[v]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, got, n)
	for v, c := range got {
		assert.Equal(t, 1, c, "entry %d handed out %d times", v, c)
	}
}

func TestBufferTableLen(t *testing.T) {
	bt := newBufferTable()
	k := messages.BufferKey{Value: 1, Location: "cuda:0"}
	bt.put(k, nil)
	assert.Equal(t, 1, bt.Len())
	_, ok := bt.take(k)
	assert.True(t, ok)
	assert.Equal(t, 0, bt.Len())
}
