package actors

import (
	"sync"
	"sync/atomic"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// BufferTable maps buffer keys to the physical buffers that location
// actors allocated. Location actors are its only writers; value actors and
// the public API read it. Safe for concurrent use.
//
// It holds one entry per materialization, so its size per entry counts at
// a million values: the table keeps one shard per location (a location
// appears in no entry), whose materializations are keyed by value id
// alone and whose temporaries (a few, while reconstructions run) by value
// id and admission. Each shard has its own lock.
type BufferTable struct {
	// shards is copy-on-write: a location's shard is added once, on its
	// first buffer, by copying the map under mu; readers load it without
	// locking.
	shards atomic.Pointer[map[string]*bufferShard]
	mu     sync.Mutex
}

type bufferShard struct {
	mu    sync.RWMutex
	bufs  map[uint64]cuda.Buffer  // materializations, by value id
	temps map[tempKey]cuda.Buffer // temporaries
}

type tempKey struct {
	value     uint64
	admission budget.AdmissionID
}

func newBufferTable() *BufferTable {
	t := &BufferTable{}
	m := map[string]*bufferShard{}
	t.shards.Store(&m)
	return t
}

// shard returns key's location shard; create adds it when missing.
func (t *BufferTable) shard(loc string, create bool) *bufferShard {
	if sh := (*t.shards.Load())[loc]; sh != nil || !create {
		return sh
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.shards.Load()
	if sh := old[loc]; sh != nil {
		return sh
	}
	m := make(map[string]*bufferShard, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	sh := &bufferShard{bufs: map[uint64]cuda.Buffer{}, temps: map[tempKey]cuda.Buffer{}}
	m[loc] = sh
	t.shards.Store(&m)
	return sh
}

// Get returns the buffer of key.
func (t *BufferTable) Get(key messages.BufferKey) (cuda.Buffer, bool) {
	sh := t.shard(key.Location, false)
	if sh == nil {
		return nil, false
	}
	sh.mu.RLock()
	var b cuda.Buffer
	var ok bool
	if key.Temporary == 0 {
		b, ok = sh.bufs[key.Value]
	} else {
		b, ok = sh.temps[tempKey{key.Value, key.Temporary}]
	}
	sh.mu.RUnlock()
	return b, ok
}

func (t *BufferTable) put(key messages.BufferKey, b cuda.Buffer) {
	sh := t.shard(key.Location, true)
	sh.mu.Lock()
	if key.Temporary == 0 {
		sh.bufs[key.Value] = b
	} else {
		sh.temps[tempKey{key.Value, key.Temporary}] = b
	}
	sh.mu.Unlock()
}

func (t *BufferTable) take(key messages.BufferKey) (cuda.Buffer, bool) {
	sh := t.shard(key.Location, false)
	if sh == nil {
		return nil, false
	}
	sh.mu.Lock()
	var b cuda.Buffer
	var ok bool
	if key.Temporary == 0 {
		b, ok = sh.bufs[key.Value]
		delete(sh.bufs, key.Value)
	} else {
		k := tempKey{key.Value, key.Temporary}
		b, ok = sh.temps[k]
		delete(sh.temps, k)
	}
	sh.mu.Unlock()
	return b, ok
}

// Len returns the number of live buffers.
func (t *BufferTable) Len() int {
	n := 0
	for _, sh := range *t.shards.Load() {
		sh.mu.RLock()
		n += len(sh.bufs) + len(sh.temps)
		sh.mu.RUnlock()
	}
	return n
}

// freeAll frees every buffer still in the table through backend, but
// those keep says to keep, and returns how many it freed.
func (t *BufferTable) freeAll(backend cuda.Backend, keep func(messages.BufferKey) bool) int {
	n := 0
	for loc, sh := range *t.shards.Load() {
		var free []cuda.Buffer
		sh.mu.Lock()
		for id, b := range sh.bufs {
			if !keep(messages.BufferKey{Value: id, Location: loc}) {
				free = append(free, b)
				delete(sh.bufs, id)
			}
		}
		for k, b := range sh.temps {
			if !keep(messages.BufferKey{Value: k.value, Location: loc, Temporary: k.admission}) {
				free = append(free, b)
				delete(sh.temps, k)
			}
		}
		sh.mu.Unlock()
		for _, b := range free {
			_ = backend.Free(b)
		}
		n += len(free)
	}
	return n
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
