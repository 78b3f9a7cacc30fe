package tests

// TestCacheChecker: a randomized checker of the loader cache against a
// small reference model of its rules.
//
// Two parts, each with its own seeded *rand.Rand:
//
//   - model: one goroutine drives random loads (hits, misses, failures,
//     panics, a value returned with an error, bad byte reports), budgeted
//     loads whose values grow, leases, pins, keep-alives, idle flags,
//     evictions, memory budget reservations and resizes, runtime
//     reservations the cache cannot evict, and Close, and compares every
//     outcome with the model: the error class and its figures, which
//     entries were evicted (least recently used idle first), which values
//     were closed, and the cache's statistics after every step.
//   - concurrent: several goroutines do the same at once, with contexts
//     that end at random points, and the cache is closed midway. Checked
//     per call and by a watcher: no oversubscription, one loader per key
//     and none while a value of the key is held, no value closed while
//     held or twice, no refusal that the caller's own request would not
//     cause, every call done within its context (plus a grace, and minus
//     the time the process was kept from running meanwhile:
//     checkharness.Lag), and at the end every value closed once and the
//     location back to zero.
//
// Bounded by default. RESIDENCY_SOAK (a Go duration) repeats both parts
// with new seeds until it has passed; RESIDENCY_CACHE_SEED replays one
// seed.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/checkharness"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

var errInjected = errors.New("checker: injected loader failure")

// ckValue is a cached value of the checker.
type ckValue struct {
	ck       *ckRecorder
	key      string
	id       int64
	bytes    int64         // declared resident bytes (0: budgeted)
	idle     atomic.Int32  // 0 idle, 1 not idle, 2 the predicate panics
	holders  atomic.Int64  // leases, pins and keep-alives the checker holds
	closed   atomic.Int32  // Close calls
	slow     time.Duration // how long Close takes (simulated native release)
	mu       sync.Mutex
	res      []*cache.MemoryReservation // a budgeted value's allocations
	wantGone bool                       // model: the value left the cache (sequential part)
}

func (v *ckValue) String() string { return fmt.Sprintf("%s#%d", v.key, v.id) }

func (v *ckValue) Close() error {
	if n := v.holders.Load(); n != 0 {
		v.ck.Fail("value %v closed while the checker holds %d leases, pins or keep-alives of it", v, n)
	}
	if v.closed.Add(1) != 1 {
		v.ck.Fail("value %v closed twice", v)
	}
	if v.slow > 0 {
		t := time.NewTimer(v.slow)
		<-t.C
	}
	v.mu.Lock()
	res := v.res
	v.res = nil
	v.mu.Unlock()
	for _, r := range res {
		if err := r.Release(); err != nil {
			v.ck.Fail("value %v: releasing its reservation: %v", v, err)
		}
	}
	return nil
}

func ckIdle(v *ckValue) bool {
	switch v.idle.Load() {
	case 1:
		return false
	case 2:
		panic("checker: idle predicate panics")
	}
	return true
}

// ckRecorder collects violations and every value created.
type ckRecorder struct {
	checkharness.Recorder
	mu      sync.Mutex
	byKey   map[string][]*ckValue
	all     []*ckValue
	running map[string]int
	nextID  int64
	loaders atomic.Int64
	seen    map[string]int // outcomes by op, for the log
	// late: calls that returned more than ckLate after their context
	// ended.
	late checkharness.Overruns
}

// saw counts an outcome (what the checker covered).
func (ck *ckRecorder) saw(op, class string) {
	ck.mu.Lock()
	ck.seen[op+" "+class]++
	ck.mu.Unlock()
}

func (ck *ckRecorder) coverage() string {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	keys := make([]string, 0, len(ck.seen))
	for k := range ck.seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %d; ", k, ck.seen[k])
	}
	return b.String()
}

func newRecorder() *ckRecorder {
	return &ckRecorder{byKey: map[string][]*ckValue{}, running: map[string]int{}, seen: map[string]int{}}
}

// loaderStart: one loader per key at a time, and none while a value of
// the key is still held (a key is loaded once per residency).
func (ck *ckRecorder) loaderStart(key string) {
	ck.loaders.Add(1)
	ck.mu.Lock()
	ck.running[key]++
	n := ck.running[key]
	var held []string
	live := ck.byKey[key][:0]
	for _, v := range ck.byKey[key] {
		if v.closed.Load() != 0 {
			continue
		}
		live = append(live, v)
		if v.holders.Load() > 0 {
			held = append(held, v.String())
		}
	}
	ck.byKey[key] = live
	ck.mu.Unlock()
	if n > 1 {
		ck.Fail("key %s: %d loaders at once", key, n)
	}
	if len(held) > 0 {
		ck.Fail("key %s loaded again while %v of it are held", key, held)
	}
}

func (ck *ckRecorder) loaderEnd(key string) {
	ck.mu.Lock()
	ck.running[key]--
	ck.mu.Unlock()
	ck.loaders.Add(-1)
}

func (ck *ckRecorder) newValue(key string, bytes int64, slow time.Duration) *ckValue {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	ck.nextID++
	v := &ckValue{ck: ck, key: key, id: ck.nextID, bytes: bytes, slow: slow}
	ck.byKey[key] = append(ck.byKey[key], v)
	ck.all = append(ck.all, v)
	return v
}

func (ck *ckRecorder) values() []*ckValue {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	return append([]*ckValue(nil), ck.all...)
}

// ckClass names the class of a cache call's error.
func ckClass(err error) string {
	var (
		le   *system.CacheLoadError
		busy *system.CacheBusyError
		be   *system.BudgetError
	)
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &le):
		return "load"
	case errors.As(err, &busy):
		return "busy"
	case errors.As(err, &be):
		return "budget"
	case errors.Is(err, system.ErrCacheClosed):
		return "cache closed"
	case errors.Is(err, system.ErrClosed):
		return "closed"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "context"
	case errors.Is(err, system.ErrInvalidInput):
		return "invalid"
	}
	return "other"
}

// ckChecker is the seed loop of a part of TestCacheChecker: n seeds from
// base by default; RESIDENCY_CACHE_SEED replays one.
func ckChecker(part string, base uint64, n int) checkharness.Checker {
	return checkharness.Checker{SeedEnv: "RESIDENCY_CACHE_SEED", Pattern: "TestCacheChecker/" + part, Package: "./tests/", Seeds: n, Base: base}
}

func TestCacheChecker(t *testing.T) {
	t.Run("model", func(t *testing.T) {
		first := true
		c := ckChecker("model", 1, 12)
		t.Log(c.Loop(t, func(seed uint64) bool {
			ck := newRecorder()
			runModelChecker(t, ck, seed, 2000)
			if first {
				t.Logf("seed %d: %s", seed, ck.coverage())
				first = false
			}
			return ck.Report(t, c, "model", seed)
		}))
	})
	t.Run("concurrent", func(t *testing.T) {
		first := true
		var late checkharness.Overruns
		c := ckChecker("concurrent", 101, 8)
		t.Log(c.Loop(t, func(seed uint64) bool {
			ck := newRecorder()
			runConcurrentChecker(t, ck, seed, 6, 1500)
			if first {
				t.Logf("seed %d: %s", seed, ck.coverage())
				first = false
			}
			late.Merge(&ck.late)
			return ck.Report(t, c, "concurrent", seed)
		}))
		if late.Calls() > 0 {
			t.Log(late.String(ckLate))
		}
	})
}

// ---- the model, one goroutine --------------------------------------------------

const ckBudget = 100

type ckPin struct {
	p *cache.Pin
	v *ckValue
}

type ckKeep struct {
	k *cache.KeepAlive
	v *ckValue
}

type ckExt struct {
	name  string
	bytes int64
}

type modelChecker struct {
	// late: idle entries whose predicate turned true after their last
	// release; the cache offers them only when a request finds the
	// budget short, so a decision before that does not see them.
	late map[*ckValue]bool
	ck   *ckRecorder
	r    *rand.Rand
	ctx  context.Context
	sys  *system.System
	c    *cache.Cache
	step int
	op   string

	// The model.
	order     []*ckValue                            // ready entries, least recently used first
	res       map[*cache.MemoryReservation]int64    // live budget reservations (the checker's and values')
	owner     map[*cache.MemoryReservation]*ckValue // a budgeted value's reservations
	mine      []*cache.MemoryReservation
	ext       []ckExt
	evictions uint64
	closed    bool
	detached  []*ckValue // held when the cache closed

	leases []cache.Lease[*ckValue]
	pins   []ckPin
	keeps  []ckKeep
	extSeq int
}

func (m *modelChecker) fail(format string, args ...any) {
	m.ck.Fail("step %d (%s): %s", m.step, m.op, fmt.Sprintf(format, args...))
}

func (m *modelChecker) find(key string) (int, *ckValue) {
	for i, v := range m.order {
		if v.key == key {
			return i, v
		}
	}
	return -1, nil
}

func (m *modelChecker) touch(i int) {
	v := m.order[i]
	m.order = append(append(m.order[:i:i], m.order[i+1:]...), v)
}

// total is what the location holds: cache entries, budget reservations,
// runtime reservations.
func (m *modelChecker) total() int64 {
	var n int64
	for _, v := range m.order {
		n += v.bytes
	}
	for _, v := range m.detached {
		n += v.bytes
	}
	for _, b := range m.res {
		n += b
	}
	for _, e := range m.ext {
		n += e.bytes
	}
	return n
}

// charged is what the cache owns: entries and budget reservations.
func (m *modelChecker) charged() int64 {
	n := m.total()
	for _, e := range m.ext {
		n -= e.bytes
	}
	return n
}

func evictable(v *ckValue) bool { return v.holders.Load() == 0 && v.idle.Load() == 0 }

// gone: v leaves the cache (evicted, or drained by Close): it is closed
// and its charges released.
func (m *modelChecker) gone(v *ckValue) {
	v.wantGone = true
	for r, o := range m.owner {
		if o == v {
			delete(m.res, r)
			delete(m.owner, r)
		}
	}
}

// makeRoom evicts least recently used idle entries until need bytes fit
// (a resize and the entry cap: the cache's own choice).
// stop is asked after each eviction (a resize whose reservation went with
// its owner). It reports whether they fit, and the eviction that stopped.
func (m *modelChecker) makeRoom(need int64, stop func() bool) (fits, stopped bool) {
	for m.total()+need > ckBudget {
		if m.closed {
			return false, false
		}
		i := -1
		for j, v := range m.order {
			if evictable(v) {
				i = j
				break
			}
		}
		if i < 0 {
			return false, false
		}
		v := m.order[i]
		m.order = append(m.order[:i:i], m.order[i+1:]...)
		m.evictions++
		m.gone(v)
		if stop != nil && stop() {
			return false, true
		}
	}
	return true, false
}

// controllerRoom is what a request for need bytes that asks the
// runtime's controller (a load's peak, a memory budget reservation)
// expects: it fits if evicting every evictable entry would make room —
// those with a charge of their own are offered to the controller, which
// chooses among them least recently taken first (a load or a hit; one
// order with values); budgeted entries whose allocations were not made
// through their loader's budget have none, so when the controller
// refuses, the cache evicts its idle budgeted entries itself, least
// recently used first, and asks again. settle, called after the
// request, takes the entries whose value was closed out of the model and
// checks that they were evictable and, when the request fits, freed
// enough. A request that does not fit evicts no offered entry, except
// when an entry offered while idle became busy without a release (its
// predicate): the plan's drops before its refusal stay done; the idle
// budgeted entries it evicted before its refusal stay evicted.
func (m *modelChecker) controllerRoom(need int64) (fits bool, settle func()) {
	short := m.total() + need - ckBudget
	if short <= 0 {
		return true, func() {}
	}
	if m.closed {
		return false, func() {}
	}
	var avail int64
	offered := map[*ckValue]bool{}
	budgeted := map[*ckValue]bool{}
	stale := false
	for _, v := range m.order {
		switch {
		case v.bytes > 0 && evictable(v):
			avail += v.bytes
			offered[v] = true
		case v.holders.Load() == 0 && !evictable(v):
			stale = true // idle but its predicate says busy: maybe still offered (a budgeted entry's allocations too)
		case v.bytes == 0 && evictable(v):
			avail += m.budgetedBytes(v)
			budgeted[v] = true
		}
	}
	fits = avail >= short
	return fits, func() {
		var kept []*ckValue
		var freed, freedOffered int64
		// Least recently taken first: the controller evicts an offered
		// entry taken after one it keeps only when the one it keeps is
		// smaller (it could not make the same room in its place).
		var kept0 []*ckValue
		for _, v := range m.order {
			if !offered[v] {
				continue
			}
			if v.closed.Load() == 0 {
				if !m.late[v] {
					kept0 = append(kept0, v)
				}
				continue
			}
			for _, k := range kept0 {
				if fits && k.bytes >= v.bytes {
					m.fail("the controller evicted %v (%d bytes), taken after %v (%d bytes), which it kept", v, v.bytes, k, k.bytes)
				}
			}
		}
		for _, v := range m.order {
			if v.closed.Load() == 0 {
				kept = append(kept, v)
				continue
			}
			if !offered[v] && !budgeted[v] {
				m.fail("the controller evicted %v, which was not evictable", v)
			}
			b := v.bytes
			if budgeted[v] {
				b = m.budgetedBytes(v)
			} else {
				freedOffered += b
			}
			freed += b
			m.evictions++
			m.gone(v)
		}
		m.order = kept
		switch {
		case fits && freed < short:
			m.fail("the controller freed %d bytes, %d were short", freed, short)
		case !fits && freedOffered > 0 && !stale:
			m.fail("a request that does not fit evicted %d bytes of offered entries", freedOffered)
		}
	}
}

// budgetedBytes is what a budgeted value's allocations charge.
func (m *modelChecker) budgetedBytes(v *ckValue) int64 {
	var n int64
	for r, o := range m.owner {
		if o == v {
			n += m.res[r]
		}
	}
	return n
}

// want compares a call's outcome class with the model's.
func (m *modelChecker) want(class string, err error) bool {
	got := ckClass(err)
	if f := strings.Fields(m.op); len(f) > 0 {
		m.ck.saw(f[0], got)
	}
	if got != class {
		m.fail("want %s, got %s: %v", class, got, err)
		return false
	}
	return true
}

func (m *modelChecker) wantBusy(err error, key string, requested int64) {
	if !m.want("busy", err) {
		return
	}
	var busy *system.CacheBusyError
	errors.As(err, &busy)
	if busy.Key != key {
		m.fail("busy for key %q, want %q", busy.Key, key)
	}
	if busy.Refusal == nil {
		m.fail("busy without the ledger's refusal")
		return
	}
	if busy.Refusal.RequestedBytes != requested {
		m.fail("refusal of %d bytes, the call asked for %d: %v", busy.Refusal.RequestedBytes, requested, err)
	}
	if got := busy.Refusal.UsedBytes + busy.Refusal.ReservedBytes; got != m.total() {
		m.fail("refusal with %d bytes taken, the model has %d: %v", got, m.total(), err)
	}
}

func (m *modelChecker) wantClosedErr(err error) {
	if m.want("cache closed", err) && strings.Contains(err.Error(), "system is closed") {
		m.fail("the cache's refusal says the runtime is closed while it runs: %q", err)
	}
}

func runModelChecker(t *testing.T, ck *ckRecorder, seed uint64, steps int) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", ckBudget)}, TraceCapacity: 16})
	require.NoError(t, err)
	defer func() { require.NoError(t, sys.Close(ctx)) }()
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "model"})
	require.NoError(t, err)
	m := &modelChecker{late: map[*ckValue]bool{}, ck: ck, r: rand.New(rand.NewPCG(seed, 0xcac4e)), ctx: ctx, sys: sys, c: c,
		res: map[*cache.MemoryReservation]int64{}, owner: map[*cache.MemoryReservation]*ckValue{}}
	closeAt := steps * (70 + m.r.IntN(25)) / 100
	for m.step = 0; m.step < steps; m.step++ {
		if m.step == closeAt {
			m.closeCache()
		} else {
			m.randomOp()
		}
		ck.Note("step %d: %s", m.step, m.op)
		m.check()
		if n, _ := ck.Failed(); n > 0 {
			break
		}
	}
	m.drain()
}

func (m *modelChecker) randomOp() {
	switch x := m.r.IntN(100); {
	case x < 30:
		m.load()
	case x < 35:
		m.loadBudgeted()
	case x < 50:
		m.releaseLease()
	case x < 53:
		m.pin()
	case x < 58:
		m.unpin()
	case x < 61:
		m.keepAlive()
	case x < 65:
		m.releaseKeep()
	case x < 70:
		m.setIdle()
	case x < 75:
		m.evict()
	case x < 81:
		m.reserve()
	case x < 85:
		m.resize()
	case x < 90:
		m.releaseReservation()
	case x < 95:
		m.growModel()
	default:
		m.external()
	}
}

// withWatchdog runs f (a call with a context that never ends) and
// reports it if it has not returned in 10 s: a call waiting on itself.
func withWatchdog(ck *ckRecorder, what string, f func()) bool {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		ck.Fail("%s did not return within 10 s with a context that never ends (it waits on itself?); goroutines:\n%s", what, buf)
		return false
	}
}

func (m *modelChecker) load() {
	key := fmt.Sprintf("k%d", m.r.IntN(6))
	peak := 1 + m.r.Int64N(ckBudget*6/10)
	if m.r.IntN(10) == 0 {
		peak = 1 + m.r.Int64N(ckBudget+10)
	}
	mode := "ok"
	switch x := m.r.IntN(100); {
	case x < 6:
		mode = "error"
	case x < 9:
		mode = "panic"
	case x < 14:
		mode = "value and error"
	case x < 17:
		mode = "bad bytes"
	}
	resident := 1 + m.r.Int64N(peak)
	if mode == "bad bytes" {
		resident = []int64{0, -1, peak + 1}[m.r.IntN(3)]
	}
	keep := m.r.IntN(3) == 0 && len(m.leases) < 4
	m.op = fmt.Sprintf("load %s peak %d resident %d %s keep %v", key, peak, resident, mode, keep)

	var created *ckValue
	ran := false
	loader := func(context.Context) (*ckValue, int64, error) {
		ran = true
		m.ck.loaderStart(key)
		defer m.ck.loaderEnd(key)
		switch mode {
		case "error":
			return nil, 0, errInjected
		case "panic":
			panic("checker: injected loader panic")
		case "value and error":
			created = m.ck.newValue(key, resident, 0)
			return created, resident, errInjected
		}
		created = m.ck.newValue(key, resident, 0)
		return created, resident, nil
	}
	i, hit := m.find(key)
	switch {
	case m.closed:
		_, err := cache.Load(m.ctx, m.c, key, peak, ckIdle, loader)
		m.wantClosedErr(err)
	case peak > ckBudget:
		// The seed checks the peak before the lookup: refused, resident or not.
		_, err := cache.Load(m.ctx, m.c, key, peak, ckIdle, loader)
		if m.want("budget", err) {
			var be *system.BudgetError
			errors.As(err, &be)
			if be.RequestedBytes != peak {
				m.fail("budget refusal of %d bytes, the call asked for %d", be.RequestedBytes, peak)
			}
		}
	case hit != nil:
		m.touch(i)
		l, err := cache.Load(m.ctx, m.c, key, peak, ckIdle, loader)
		if !m.want("ok", err) {
			return
		}
		if ran || l.Value() != hit {
			m.fail("a hit ran the loader (%v) or returned %v, not %v", ran, l.Value(), hit)
		}
		m.hold(l, keep)
	default:
		fits, settle := m.controllerRoom(peak)
		l, err := cache.Load(m.ctx, m.c, key, peak, ckIdle, loader)
		settle()
		if !fits {
			m.wantBusy(err, key, peak)
			if ran {
				m.fail("the loader ran although the peak did not fit")
			}
			return
		}
		if !ran {
			m.fail("a miss did not run the loader: %v", err)
			return
		}
		switch mode {
		case "ok":
			if !m.want("ok", err) {
				return
			}
			if l.Value() != created || l.Bytes() != resident {
				m.fail("lease on %v (%d bytes), want %v (%d)", l.Value(), l.Bytes(), created, resident)
			}
			m.order = append(m.order, created)
			m.hold(l, keep)
		default:
			if !m.want("load", err) {
				return
			}
			var le *system.CacheLoadError
			errors.As(err, &le)
			switch {
			case mode == "panic" && le.Panic == nil:
				m.fail("a panic reported as %v", err)
			case mode == "bad bytes" && !errors.Is(err, system.ErrInvalidInput):
				m.fail("a bad byte report reported as %v", err)
			case (mode == "error" || mode == "value and error") && !errors.Is(err, errInjected):
				m.fail("a loader error reported as %v", err)
			}
			if created != nil {
				created.wantGone = true // closed before the reservation's release
			}
		}
	}
}

func (m *modelChecker) hold(l cache.Lease[*ckValue], keep bool) {
	delete(m.late, l.Value()) // taken: offered again at its release
	if keep {
		l.Value().holders.Add(1)
		m.leases = append(m.leases, l)
		return
	}
	if err := l.Release(); err != nil {
		m.fail("release: %v", err)
	}
}

// loadBudgeted: the loader reserves its allocation through the budget
// (which may evict), or fails after reserving.
func (m *modelChecker) loadBudgeted() {
	key := fmt.Sprintf("b%d", m.r.IntN(3))
	n := 1 + m.r.Int64N(60)
	fail := m.r.IntN(8) == 0
	keep := m.r.IntN(2) == 0
	m.op = fmt.Sprintf("load budgeted %s %d bytes fail %v keep %v", key, n, fail, keep)
	var created *ckValue
	var got *cache.MemoryReservation
	ran := false
	loader := func(ctx context.Context, b *cache.MemoryBudget) (*ckValue, error) {
		ran = true
		m.ck.loaderStart(key)
		defer m.ck.loaderEnd(key)
		r, err := b.Reserve(ctx, n)
		if err != nil {
			return nil, err
		}
		if fail {
			_ = r.Release()
			return nil, errInjected
		}
		created = m.ck.newValue(key, 0, 0)
		created.res = []*cache.MemoryReservation{r}
		got = r
		return created, nil
	}
	i, hit := m.find(key)
	switch {
	case m.closed:
		_, err := cache.LoadBudgeted(m.ctx, m.c, key, ckIdle, loader)
		m.wantClosedErr(err)
	case hit != nil:
		m.touch(i)
		l, err := cache.LoadBudgeted(m.ctx, m.c, key, ckIdle, loader)
		if !m.want("ok", err) {
			return
		}
		if ran || l.Value() != hit {
			m.fail("a hit ran the loader or returned another value")
		}
		m.hold(l, keep)
	default:
		fits, settle := m.controllerRoom(n)
		l, err := cache.LoadBudgeted(m.ctx, m.c, key, ckIdle, loader)
		settle()
		switch {
		case !fits:
			if m.want("load", err) && !errors.Is(err, system.ErrBusy) {
				m.fail("a budgeted load refused for its allocation: %v", err)
			}
		case fail:
			if m.want("load", err) && !errors.Is(err, errInjected) {
				m.fail("want the injected failure: %v", err)
			}
		default:
			if !m.want("ok", err) {
				return
			}
			if l.Value() != created || l.Bytes() != 0 {
				m.fail("budgeted lease on %v (%d bytes)", l.Value(), l.Bytes())
			}
			m.res[got] = n
			m.owner[got] = created
			m.order = append(m.order, created)
			m.hold(l, keep)
		}
	}
}

// growModel resizes a budgeted value's allocation, held or not, with a
// context that never ends: the value itself may be the victim.
func (m *modelChecker) growModel() {
	var rs []*cache.MemoryReservation
	for r := range m.owner {
		rs = append(rs, r)
	}
	if len(rs) == 0 {
		return
	}
	// Map order is random but not seeded: pick the smallest name.
	r := rs[0]
	for _, x := range rs[1:] {
		if x.Name() < r.Name() {
			r = x
		}
	}
	v := m.owner[r]
	cur := m.res[r]
	n := cur + 1 + m.r.Int64N(60)
	m.op = fmt.Sprintf("grow %v from %d to %d (held %d, idle %d)", v, cur, n, v.holders.Load(), v.idle.Load())
	var err error
	var fits, stopped bool
	if n > ckBudget {
		fits = false
	} else {
		fits, stopped = m.makeRoom(n-cur, func() bool { _, ok := m.res[r]; return !ok })
	}
	if !withWatchdog(m.ck, m.op, func() { err = r.Resize(context.Background(), n) }) {
		return
	}
	switch {
	case n > ckBudget:
		m.want("budget", err)
	case stopped:
		// Its owner was evicted to make room and released it.
		m.want("invalid", err)
	case !fits:
		m.wantBusy(err, "", n-cur)
	default:
		if m.want("ok", err) {
			m.res[r] = n
		}
	}
}

func (m *modelChecker) releaseLease() {
	if len(m.leases) == 0 {
		return
	}
	i := m.r.IntN(len(m.leases))
	l := m.leases[i]
	m.leases = append(m.leases[:i:i], m.leases[i+1:]...)
	m.op = "release lease of " + l.Value().String()
	m.unhold(l.Value(), l.Release)
}

// unhold drops one holder of v; after Close the last one releases it.
func (m *modelChecker) unhold(v *ckValue, release func() error) {
	v.holders.Add(-1)
	if err := release(); err != nil {
		m.fail("release: %v", err)
	}
	if m.closed && v.holders.Load() == 0 {
		for i, d := range m.detached {
			if d == v {
				m.detached = append(m.detached[:i:i], m.detached[i+1:]...)
				m.gone(v)
			}
		}
	}
}

func (m *modelChecker) pin() {
	if len(m.leases) == 0 {
		return
	}
	l := m.leases[m.r.IntN(len(m.leases))]
	m.op = "pin " + l.Value().String()
	l.Value().holders.Add(1)
	m.pins = append(m.pins, ckPin{l.Pin(), l.Value()})
}

func (m *modelChecker) unpin() {
	if len(m.pins) == 0 {
		return
	}
	i := m.r.IntN(len(m.pins))
	p := m.pins[i]
	m.pins = append(m.pins[:i:i], m.pins[i+1:]...)
	m.op = "unpin " + p.v.String()
	m.unhold(p.v, p.p.Release)
}

func (m *modelChecker) keepAlive() {
	if len(m.leases) == 0 {
		return
	}
	l := m.leases[m.r.IntN(len(m.leases))]
	m.op = "keep-alive " + l.Value().String()
	l.Value().holders.Add(1)
	m.keeps = append(m.keeps, ckKeep{l.KeepAlive(), l.Value()})
}

func (m *modelChecker) releaseKeep() {
	if len(m.keeps) == 0 {
		return
	}
	i := m.r.IntN(len(m.keeps))
	k := m.keeps[i]
	m.keeps = append(m.keeps[:i:i], m.keeps[i+1:]...)
	m.op = "release keep-alive " + k.v.String()
	m.unhold(k.v, k.k.Release)
}

func (m *modelChecker) setIdle() {
	vs := append(append([]*ckValue(nil), m.order...), m.detached...)
	if len(vs) == 0 {
		return
	}
	v := vs[m.r.IntN(len(vs))]
	s := int32(0)
	if x := m.r.IntN(20); x >= 16 {
		s = 1
		if x == 19 {
			s = 2
		}
	}
	m.op = fmt.Sprintf("set idle of %v to %d", v, s)
	if s == 0 && v.idle.Load() != 0 && v.holders.Load() == 0 {
		m.late[v] = true
	}
	v.idle.Store(s)
}

func (m *modelChecker) evict() {
	key := fmt.Sprintf("k%d", m.r.IntN(6))
	if m.r.IntN(4) == 0 {
		key = fmt.Sprintf("b%d", m.r.IntN(3))
	}
	m.op = "evict " + key
	evicted, err := m.c.Evict(m.ctx, key)
	i, v := m.find(key)
	switch {
	case m.closed:
		m.wantClosedErr(err)
	case v == nil:
		if m.want("ok", err) && evicted {
			m.fail("evicted an absent key")
		}
	case !evictable(v):
		if m.want("busy", err) {
			var busy *system.CacheBusyError
			errors.As(err, &busy)
			if busy.Key != key || busy.Refusal != nil {
				m.fail("evict's refusal: %+v", busy)
			}
		}
	default:
		if m.want("ok", err) && !evicted {
			m.fail("an idle entry was not evicted")
		}
		m.order = append(m.order[:i:i], m.order[i+1:]...)
		m.evictions++
		m.gone(v)
	}
}

func (m *modelChecker) reserve() {
	n := m.r.Int64N(50)
	if m.r.IntN(20) == 0 {
		n = ckBudget + 1
	}
	if len(m.mine) >= 3 {
		m.releaseReservation()
		return
	}
	m.op = fmt.Sprintf("reserve %d", n)
	var fits bool
	settle := func() {}
	if n <= ckBudget {
		fits, settle = m.controllerRoom(n)
	}
	r, err := m.c.Budget().Reserve(m.ctx, n)
	settle()
	switch {
	case n > ckBudget:
		m.want("budget", err)
	case !fits:
		m.wantBusy(err, "", n)
	default:
		if !m.want("ok", err) {
			return
		}
		m.mine = append(m.mine, r)
		if n > 0 {
			m.res[r] = n
		}
	}
}

func (m *modelChecker) resize() {
	if len(m.mine) == 0 {
		return
	}
	r := m.mine[m.r.IntN(len(m.mine))]
	cur := m.res[r]
	n := 1 + m.r.Int64N(80)
	m.op = fmt.Sprintf("resize %q from %d to %d", r.Name(), cur, n)
	var fits bool
	if cur > 0 && n > cur {
		fits, _ = m.makeRoom(n-cur, nil)
	}
	err := r.Resize(m.ctx, n)
	switch {
	case cur == 0:
		m.want("invalid", err)
	case n <= cur:
		if m.want("ok", err) {
			m.res[r] = n
		}
	case !fits:
		m.wantBusy(err, "", n-cur)
	default:
		if m.want("ok", err) {
			m.res[r] = n
		}
	}
}

func (m *modelChecker) releaseReservation() {
	if len(m.mine) == 0 {
		return
	}
	i := m.r.IntN(len(m.mine))
	r := m.mine[i]
	m.mine = append(m.mine[:i:i], m.mine[i+1:]...)
	m.op = "release " + r.Name()
	m.want("ok", r.Release())
	delete(m.res, r)
}

// external: a runtime reservation at the location, which the cache
// cannot evict and which never evicts the cache's entries.
func (m *modelChecker) external() {
	if len(m.ext) > 1 || len(m.ext) > 0 && m.r.IntN(2) == 0 {
		i := m.r.IntN(len(m.ext))
		e := m.ext[i]
		m.ext = append(m.ext[:i:i], m.ext[i+1:]...)
		m.op = "external-unreserve " + e.name
		m.want("ok", m.sys.Unreserve(m.ctx, e.name))
		return
	}
	m.extSeq++
	e := ckExt{fmt.Sprintf("ext%d", m.extSeq), 1 + m.r.Int64N(30)}
	m.op = fmt.Sprintf("external-reserve %s %d", e.name, e.bytes)
	err := m.sys.Reserve(m.ctx, "cuda:0", e.name, e.bytes)
	if m.total()+e.bytes > ckBudget {
		m.want("budget", err)
		return
	}
	if m.want("ok", err) {
		m.ext = append(m.ext, e)
	}
}

func (m *modelChecker) closeCache() {
	m.op = "close"
	if !withWatchdog(m.ck, "Close", func() {
		if err := m.c.Close(m.ctx); err != nil {
			m.fail("close: %v", err)
		}
	}) {
		return
	}
	m.closed = true
	for _, v := range m.order {
		if v.holders.Load() == 0 {
			m.gone(v)
		} else {
			m.detached = append(m.detached, v)
		}
	}
	m.order = nil
}

// check compares the cache's figures and its values' state with the
// model.
func (m *modelChecker) check() {
	st, err := m.c.Statistics(m.ctx)
	if err != nil {
		m.fail("statistics: %v", err)
		return
	}
	if st.ReservedBytes != m.charged() || st.Resources != len(m.order)+len(m.detached) || st.Evictions != m.evictions {
		m.fail("statistics: reserved %d, resources %d, evictions %d; the model: %d, %d (%d detached), %d; order %v",
			st.ReservedBytes, st.Resources, st.Evictions, m.charged(), len(m.order)+len(m.detached), len(m.detached), m.evictions, m.order)
	}
	if st.LocationReservedBytes != m.total() || st.LocationUsedBytes != 0 {
		m.fail("location: used %d reserved %d, the model: 0, %d", st.LocationUsedBytes, st.LocationReservedBytes, m.total())
	}
	for _, v := range m.ck.values() {
		want := int32(0)
		if v.wantGone {
			want = 1
		}
		if got := v.closed.Load(); got != want {
			m.fail("value %v closed %d times, the model says %d", v, got, want)
		}
	}
}

// drain releases everything the checker holds, closes the cache and
// checks that the location is back to zero.
func (m *modelChecker) drain() {
	m.step++
	for len(m.leases) > 0 {
		m.releaseLease()
	}
	for len(m.pins) > 0 {
		m.unpin()
	}
	for len(m.keeps) > 0 {
		m.releaseKeep()
	}
	for len(m.mine) > 0 {
		m.releaseReservation()
	}
	for len(m.ext) > 0 {
		e := m.ext[0]
		m.ext = m.ext[1:]
		m.want("ok", m.sys.Unreserve(m.ctx, e.name))
	}
	if !m.closed {
		m.closeCache()
	}
	m.op = "drained"
	m.check()
	for _, v := range m.ck.values() {
		if v.closed.Load() != 1 {
			m.fail("value %v closed %d times at the end", v, v.closed.Load())
		}
	}
}

// ---- concurrent ------------------------------------------------------------------

const ckGrace = time.Second

// ckLate: a call that returns later than this after its context ended is
// counted in the run's figures (a near miss when it is under the grace).
const ckLate = 250 * time.Millisecond

type concurrentChecker struct {
	ck      *ckRecorder
	lag     *checkharness.Lag
	sys     *system.System
	c       *cache.Cache
	closing atomic.Bool // Close has been called
	budgets sync.Map    // *cache.MemoryReservation → *ckValue: budgeted values' allocations
}

// ckWorker is one goroutine's state.
type ckWorker struct {
	cc     *concurrentChecker
	r      *rand.Rand
	id     int
	leases []cache.Lease[*ckValue]
	pins   []ckPin
	keeps  []ckKeep
	mine   []*cache.MemoryReservation
	sizes  map[*cache.MemoryReservation]int64
}

// callCtx returns a context for one call: one that never ends (checked
// by a watchdog), one with a deadline, or one canceled at a random point.
// done returns when the context ended (zero: it has not): when it was
// canceled, or when its Done channel was seen closed after its deadline
// (see checkharness.ContextEnd).
func (w *ckWorker) callCtx() (ctx context.Context, done func() time.Time, cancel func()) {
	switch x := w.r.IntN(10); {
	case x < 5:
		return context.Background(), func() time.Time { return time.Time{} }, func() {}
	case x < 8:
		d := time.Duration(w.r.IntN(3000)) * time.Microsecond
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(d))
		ended, stop := checkharness.ContextEnd(ctx)
		return ctx, ended, func() {
			stop()
			cancel()
		}
	default:
		ctx, cancel := context.WithCancel(context.Background())
		var at atomic.Int64
		timer := time.AfterFunc(time.Duration(w.r.IntN(3000))*time.Microsecond, func() {
			at.Store(time.Now().UnixNano())
			cancel()
		})
		return ctx, func() time.Time {
				if n := at.Load(); n != 0 {
					return time.Unix(0, n)
				}
				return time.Time{}
			}, func() {
				timer.Stop()
				cancel()
			}
	}
}

// call runs f with a context of callCtx and checks that it returned
// within its context: a context error only once the context ended, and
// no later than the grace after it ended.
func (w *ckWorker) call(what string, f func(ctx context.Context) error) error {
	ctx, done, cancel := w.callCtx()
	defer cancel()
	var err error
	background := ctx.Done() == nil
	if background {
		if !withWatchdog(w.cc.ck, what, func() { err = f(ctx) }) {
			return errors.New("hung")
		}
	} else {
		err = f(ctx)
	}
	returned := time.Now()
	w.cc.ck.saw(strings.Fields(what)[2], ckClass(err))
	if ckClass(err) == "context" && ctx.Err() == nil {
		w.cc.ck.Fail("%s: %v, but the caller's context is live", what, err)
	}
	if at := done(); !at.IsZero() && returned.Sub(at) > ckLate {
		late := returned.Sub(at)
		lag := w.cc.lag.Worst(at, returned)
		w.cc.ck.late.Add(late, lag)
		if late-lag > ckGrace {
			w.cc.ck.Fail("%s returned %v after its context ended (%v; the process was kept from running for %v meanwhile)", what, late.Round(time.Millisecond), err, lag.Round(time.Millisecond))
		}
	}
	return err
}

// allowed checks an error class that any call may get: closed once the
// cache closes (with the cache's words), the caller's own context.
func (w *ckWorker) common(what string, err error) bool {
	switch ckClass(err) {
	case "cache closed":
		if !w.cc.closing.Load() {
			w.cc.ck.Fail("%s: %v before the cache was closed", what, err)
		}
		if strings.Contains(err.Error(), "system is closed") {
			w.cc.ck.Fail("%s: the cache's refusal says the runtime is closed while it runs: %q", what, err)
		}
		return true
	case "context":
		return true // checked by call
	}
	return false
}

func (w *ckWorker) checkBusy(what string, err error, key string, requested int64) {
	var busy *system.CacheBusyError
	errors.As(err, &busy)
	if busy.Key != key {
		w.cc.ck.Fail("%s: busy for key %q", what, busy.Key)
	}
	if busy.Refusal == nil {
		w.cc.ck.Fail("%s: busy without the ledger's refusal: %v", what, err)
		return
	}
	f := busy.Refusal
	if requested >= 0 && f.RequestedBytes != requested {
		w.cc.ck.Fail("%s: refused for %d bytes, its own request is %d: %v", what, f.RequestedBytes, requested, err)
	}
	if f.UsedBytes+f.ReservedBytes+f.RequestedBytes <= f.BudgetBytes {
		w.cc.ck.Fail("%s: busy although its figures fit: %v", what, err)
	}
}

func runConcurrentChecker(t *testing.T, ck *ckRecorder, seed uint64, workers, ops int) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", ckBudget*2)}, TraceCapacity: 16})
	require.NoError(t, err)
	defer func() { require.NoError(t, sys.Close(ctx)) }()
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "concurrent"})
	require.NoError(t, err)
	cc := &concurrentChecker{ck: ck, sys: sys, c: c, lag: checkharness.NewLag(2 * runtime.GOMAXPROCS(0))}
	master := rand.New(rand.NewPCG(seed, 0xc0c0))

	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() { cc.lag.Run(stop) })
	watch.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := sys.Snapshot(ctx)
			if err != nil {
				ck.Fail("snapshot: %v", err)
				return
			}
			if err := checkInvariants(s); err != nil {
				ck.Fail("invariants: %v", err)
			}
			runtime.Gosched()
		}
	})

	var progress atomic.Int64
	closeAt := int64(workers * ops * (60 + master.IntN(35)) / 100)
	closed := make(chan struct{})
	var wg sync.WaitGroup
	ws := make([]*ckWorker, workers)
	for i := range ws {
		ws[i] = &ckWorker{cc: cc, r: rand.New(rand.NewPCG(seed, uint64(i))), id: i, sizes: map[*cache.MemoryReservation]int64{}}
		w := ws[i]
		wg.Go(func() {
			for range ops {
				w.randomOp()
				if progress.Add(1) == closeAt {
					go func() {
						defer close(closed)
						cc.closing.Store(true)
						withWatchdog(ck, "Close amid calls", func() {
							if err := c.Close(ctx); err != nil {
								ck.Fail("close: %v", err)
							}
						})
					}()
				}
			}
		})
	}
	wg.Wait()
	<-closed
	close(stop)
	watch.Wait()
	for _, w := range ws {
		w.drain()
	}
	if n := ck.loaders.Load(); n != 0 {
		ck.Fail("%d loaders still running after Close", n)
	}
	for _, v := range ck.values() {
		if v.closed.Load() != 1 {
			ck.Fail("value %v closed %d times at the end", v, v.closed.Load())
		}
	}
	st, err := c.Statistics(ctx)
	require.NoError(t, err)
	if st.ReservedBytes != 0 || st.Resources != 0 || st.LocationReservedBytes != 0 || st.LocationUsedBytes != 0 {
		ck.Fail("after Close and every release: %+v", st)
	}
}

func (w *ckWorker) randomOp() {
	switch x := w.r.IntN(100); {
	case x < 35:
		w.load()
	case x < 40:
		w.loadBudgeted()
	case x < 60:
		w.release()
	case x < 64:
		w.pinOrKeep()
	case x < 68:
		w.setIdle()
	case x < 73:
		w.evict()
	case x < 81:
		w.reserve()
	case x < 86:
		w.resize()
	case x < 91:
		w.growModel()
	default:
		if _, err := w.cc.c.Statistics(context.Background()); err != nil {
			w.cc.ck.Fail("statistics: %v", err)
		}
	}
}

// slowness: most loaders and releases are instant, some take a little
// while (a loader waits on its context or a timer).
func (w *ckWorker) slowness() time.Duration {
	if w.r.IntN(4) == 0 {
		return time.Duration(w.r.IntN(2000)) * time.Microsecond
	}
	return 0
}

func (w *ckWorker) load() {
	key := fmt.Sprintf("k%d", w.r.IntN(8))
	peak := 1 + w.r.Int64N(ckBudget)
	if w.r.IntN(30) == 0 {
		peak = 2*ckBudget + 1
	}
	mode := "ok"
	switch x := w.r.IntN(100); {
	case x < 6:
		mode = "error"
	case x < 8:
		mode = "panic"
	case x < 12:
		mode = "value and error"
	case x < 14:
		mode = "bad bytes"
	}
	resident := 1 + w.r.Int64N(peak)
	if mode == "bad bytes" {
		resident = 0
	}
	loadSlow, closeSlow := w.slowness(), w.slowness()
	keep := w.r.IntN(3) == 0 && len(w.leases) < 3
	what := fmt.Sprintf("worker %d: load %s peak %d %s", w.id, key, peak, mode)
	ck := w.cc.ck
	loader := func(ctx context.Context) (*ckValue, int64, error) {
		ck.loaderStart(key)
		defer ck.loaderEnd(key)
		if loadSlow > 0 {
			t := time.NewTimer(loadSlow)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, 0, ctx.Err()
			}
		}
		switch mode {
		case "error":
			return nil, 0, errInjected
		case "panic":
			panic("checker: injected loader panic")
		case "value and error":
			return ck.newValue(key, resident, closeSlow), resident, errInjected
		}
		return ck.newValue(key, resident, closeSlow), resident, nil
	}
	var l cache.Lease[*ckValue]
	err := w.call(what, func(ctx context.Context) (err error) {
		l, err = cache.Load(ctx, w.cc.c, key, peak, ckIdle, loader)
		return err
	})
	switch ckClass(err) {
	case "ok":
		v := l.Value()
		v.holders.Add(1)
		if v.key != key || v.closed.Load() != 0 || l.Bytes() != v.bytes {
			ck.Fail("%s: lease on %v (%d bytes), closed %d", what, v, l.Bytes(), v.closed.Load())
		}
		w.leases = append(w.leases, l)
		if !keep {
			w.releaseAt(len(w.leases) - 1)
		}
	case "budget":
		if peak <= 2*ckBudget {
			ck.Fail("%s: %v, for a peak within the budget", what, err)
		}
	case "busy":
		w.checkBusy(what, err, key, peak)
	case "load":
		// A shared load's failure is every caller's; but never a
		// context's, which would be a refusal nobody asked for.
		var le *system.CacheLoadError
		errors.As(err, &le)
		if le.Panic == nil && !errors.Is(err, errInjected) && !errors.Is(err, system.ErrInvalidInput) {
			ck.Fail("%s: a failed load that no loader's failure explains: %v", what, err)
		}
	default:
		if !w.common(what, err) {
			ck.Fail("%s: %v", what, err)
		}
	}
}

func (w *ckWorker) loadBudgeted() {
	key := fmt.Sprintf("b%d", w.r.IntN(3))
	n := 1 + w.r.Int64N(ckBudget/2)
	keep := w.r.IntN(2) == 0 && len(w.leases) < 3
	closeSlow := w.slowness()
	what := fmt.Sprintf("worker %d: load budgeted %s %d bytes", w.id, key, n)
	ck := w.cc.ck
	loader := func(ctx context.Context, b *cache.MemoryBudget) (*ckValue, error) {
		ck.loaderStart(key)
		defer ck.loaderEnd(key)
		r, err := b.Reserve(ctx, n)
		if err != nil {
			return nil, err
		}
		v := ck.newValue(key, 0, closeSlow)
		v.res = []*cache.MemoryReservation{r}
		w.cc.budgets.Store(r, v)
		return v, nil
	}
	var l cache.Lease[*ckValue]
	err := w.call(what, func(ctx context.Context) (err error) {
		l, err = cache.LoadBudgeted(ctx, w.cc.c, key, ckIdle, loader)
		return err
	})
	switch ckClass(err) {
	case "ok":
		v := l.Value()
		v.holders.Add(1)
		if v.key != key || v.closed.Load() != 0 {
			ck.Fail("%s: lease on %v, closed %d", what, v, v.closed.Load())
		}
		w.leases = append(w.leases, l)
		if !keep {
			w.releaseAt(len(w.leases) - 1)
		}
	case "load":
		// The loader's own reservation was refused (busy), or its
		// context ended because every caller gave up.
		if !errors.Is(err, system.ErrBusy) {
			ck.Fail("%s: %v", what, err)
		}
	default:
		if !w.common(what, err) {
			ck.Fail("%s: %v", what, err)
		}
	}
}

func (w *ckWorker) releaseAt(i int) {
	l := w.leases[i]
	w.leases = append(w.leases[:i:i], w.leases[i+1:]...)
	l.Value().holders.Add(-1)
	if err := l.Release(); err != nil {
		w.cc.ck.Fail("worker %d: release: %v", w.id, err)
	}
}

func (w *ckWorker) release() {
	switch x := w.r.IntN(4); {
	case x == 3 && len(w.mine) > 0:
		i := w.r.IntN(len(w.mine))
		r := w.mine[i]
		w.mine = append(w.mine[:i:i], w.mine[i+1:]...)
		delete(w.sizes, r)
		if err := r.Release(); err != nil {
			w.cc.ck.Fail("worker %d: release reservation: %v", w.id, err)
		}
	case x == 0 && len(w.pins) > 0:
		i := w.r.IntN(len(w.pins))
		p := w.pins[i]
		w.pins = append(w.pins[:i:i], w.pins[i+1:]...)
		p.v.holders.Add(-1)
		if err := p.p.Release(); err != nil {
			w.cc.ck.Fail("worker %d: unpin: %v", w.id, err)
		}
	case x == 1 && len(w.keeps) > 0:
		i := w.r.IntN(len(w.keeps))
		k := w.keeps[i]
		w.keeps = append(w.keeps[:i:i], w.keeps[i+1:]...)
		k.v.holders.Add(-1)
		if err := k.k.Release(); err != nil {
			w.cc.ck.Fail("worker %d: release keep-alive: %v", w.id, err)
		}
	case len(w.leases) > 0:
		w.releaseAt(w.r.IntN(len(w.leases)))
	case len(w.mine) > 0:
		i := w.r.IntN(len(w.mine))
		r := w.mine[i]
		w.mine = append(w.mine[:i:i], w.mine[i+1:]...)
		delete(w.sizes, r)
		if err := r.Release(); err != nil {
			w.cc.ck.Fail("worker %d: release reservation: %v", w.id, err)
		}
	}
}

func (w *ckWorker) pinOrKeep() {
	if len(w.leases) == 0 {
		return
	}
	if len(w.pins)+len(w.keeps) >= 2 {
		return
	}
	l := w.leases[w.r.IntN(len(w.leases))]
	l.Value().holders.Add(1)
	if w.r.IntN(2) == 0 {
		w.pins = append(w.pins, ckPin{l.Pin(), l.Value()})
	} else {
		w.keeps = append(w.keeps, ckKeep{l.KeepAlive(), l.Value()})
	}
}

func (w *ckWorker) setIdle() {
	// A value not idle stays so until picked again: pick among the live
	// ones, so that none stays busy for the rest of the run.
	var vs []*ckValue
	for _, v := range w.cc.ck.values() {
		if v.closed.Load() == 0 {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return
	}
	v := vs[w.r.IntN(len(vs))]
	s := int32(0)
	if x := w.r.IntN(20); x >= 16 {
		s = 1
		if x == 19 {
			s = 2
		}
	}
	v.idle.Store(s)
}

func (w *ckWorker) evict() {
	key := fmt.Sprintf("k%d", w.r.IntN(8))
	what := fmt.Sprintf("worker %d: evict %s", w.id, key)
	err := w.call(what, func(ctx context.Context) error {
		_, err := w.cc.c.Evict(ctx, key)
		return err
	})
	switch ckClass(err) {
	case "ok":
	case "busy":
		var busy *system.CacheBusyError
		errors.As(err, &busy)
		if busy.Key != key || busy.Refusal != nil {
			w.cc.ck.Fail("%s: %+v", what, busy)
		}
	default:
		if !w.common(what, err) {
			w.cc.ck.Fail("%s: %v", what, err)
		}
	}
}

func (w *ckWorker) reserve() {
	if len(w.mine) >= 2 {
		w.release()
		return
	}
	n := w.r.Int64N(ckBudget / 2)
	if w.r.IntN(30) == 0 {
		n = 2*ckBudget + 1
	}
	what := fmt.Sprintf("worker %d: reserve %d", w.id, n)
	var r *cache.MemoryReservation
	err := w.call(what, func(ctx context.Context) (err error) {
		r, err = w.cc.c.Budget().Reserve(ctx, n)
		return err
	})
	switch ckClass(err) {
	case "ok":
		w.mine = append(w.mine, r)
		w.sizes[r] = n
	case "budget":
		if n <= 2*ckBudget {
			w.cc.ck.Fail("%s: %v", what, err)
		}
	case "busy":
		w.checkBusy(what, err, "", n)
	default:
		if !w.common(what, err) {
			w.cc.ck.Fail("%s: %v", what, err)
		}
	}
}

func (w *ckWorker) resize() {
	var rs []*cache.MemoryReservation
	for _, r := range w.mine {
		if w.sizes[r] > 0 {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return
	}
	r := rs[w.r.IntN(len(rs))]
	cur := w.sizes[r]
	n := 1 + w.r.Int64N(ckBudget/2)
	what := fmt.Sprintf("worker %d: resize %d → %d", w.id, cur, n)
	err := w.call(what, func(ctx context.Context) error { return r.Resize(ctx, n) })
	switch ckClass(err) {
	case "ok":
		w.sizes[r] = n
	case "busy":
		w.checkBusy(what, err, "", n-cur)
	default:
		if !w.common(what, err) {
			w.cc.ck.Fail("%s: %v", what, err)
		}
	}
	if got := r.Bytes(); got != w.sizes[r] {
		w.cc.ck.Fail("%s: %v, and the reservation holds %d bytes", what, err, got)
	}
}

// growModel resizes a budgeted value's allocation, leased or not: it may
// evict that value, whose Close releases the reservation being resized.
func (w *ckWorker) growModel() {
	var rs []*cache.MemoryReservation
	w.cc.budgets.Range(func(k, v any) bool {
		if v.(*ckValue).closed.Load() == 0 {
			rs = append(rs, k.(*cache.MemoryReservation))
		} else {
			w.cc.budgets.Delete(k)
		}
		return len(rs) < 8
	})
	if len(rs) == 0 {
		return
	}
	r := rs[w.r.IntN(len(rs))]
	n := r.Bytes() + 1 + w.r.Int64N(ckBudget/2)
	what := fmt.Sprintf("worker %d: grow a budgeted value's allocation to %d", w.id, n)
	err := w.call(what, func(ctx context.Context) error { return r.Resize(ctx, n) })
	switch ckClass(err) {
	case "ok":
	case "budget":
		if n <= 2*ckBudget {
			w.cc.ck.Fail("%s: %v", what, err)
		}
	case "busy":
		var busy *system.CacheBusyError
		if errors.As(err, &busy) && busy.Refusal == nil && busy.Key == "" {
			break // a plan is evicting the value this allocation is of
		}
		w.checkBusy(what, err, "", -1)
	case "invalid":
		// Released by its value's Close meanwhile (the value was evicted,
		// perhaps to make room for this very resize).
	default:
		if !w.common(what, err) {
			w.cc.ck.Fail("%s: %v", what, err)
		}
	}
}

// drain releases what the worker holds.
func (w *ckWorker) drain() {
	for len(w.leases) > 0 {
		w.releaseAt(0)
	}
	for _, p := range w.pins {
		p.v.holders.Add(-1)
		if err := p.p.Release(); err != nil {
			w.cc.ck.Fail("unpin: %v", err)
		}
	}
	for _, k := range w.keeps {
		k.v.holders.Add(-1)
		if err := k.k.Release(); err != nil {
			w.cc.ck.Fail("release keep-alive: %v", err)
		}
	}
	for _, r := range w.mine {
		if err := r.Release(); err != nil {
			w.cc.ck.Fail("release reservation: %v", err)
		}
	}
	w.pins, w.keeps, w.mine = nil, nil, nil
}
