package actors

import (
	"sync"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// BufferTable maps buffer keys to the physical buffers that location
// actors allocated. Location actors are its only writers; value actors and
// the public API read it. Safe for concurrent use.
type BufferTable struct {
	mu   sync.RWMutex
	bufs map[messages.BufferKey]cuda.Buffer
}

func newBufferTable() *BufferTable {
	return &BufferTable{bufs: map[messages.BufferKey]cuda.Buffer{}}
}

// Get returns the buffer of key.
func (t *BufferTable) Get(key messages.BufferKey) (cuda.Buffer, bool) {
	t.mu.RLock()
	b, ok := t.bufs[key]
	t.mu.RUnlock()
	return b, ok
}

func (t *BufferTable) put(key messages.BufferKey, b cuda.Buffer) {
	t.mu.Lock()
	t.bufs[key] = b
	t.mu.Unlock()
}

func (t *BufferTable) take(key messages.BufferKey) (cuda.Buffer, bool) {
	t.mu.Lock()
	b, ok := t.bufs[key]
	delete(t.bufs, key)
	t.mu.Unlock()
	return b, ok
}

// Len returns the number of live buffers.
func (t *BufferTable) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.bufs)
}

// freeAll frees every buffer still in the table through backend and
// returns how many there were.
func (t *BufferTable) freeAll(backend cuda.Backend) int {
	t.mu.Lock()
	bufs := t.bufs
	t.bufs = map[messages.BufferKey]cuda.Buffer{}
	t.mu.Unlock()
	for _, b := range bufs {
		_ = backend.Free(b)
	}
	return len(bufs)
}

// registry is a concurrency-safe map from keys to objects that cannot
// travel inside messages (loaders, device events).
type registry[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]V
}

func newRegistry[K comparable, V any]() *registry[K, V] { return &registry[K, V]{m: map[K]V{}} }

func (r *registry[K, V]) put(k K, v V) {
	r.mu.Lock()
	r.m[k] = v
	r.mu.Unlock()
}

func (r *registry[K, V]) get(k K) (V, bool) {
	r.mu.Lock()
	v, ok := r.m[k]
	r.mu.Unlock()
	return v, ok
}

func (r *registry[K, V]) take(k K) (V, bool) {
	r.mu.Lock()
	v, ok := r.m[k]
	delete(r.m, k)
	r.mu.Unlock()
	return v, ok
}

func (r *registry[K, V]) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}
