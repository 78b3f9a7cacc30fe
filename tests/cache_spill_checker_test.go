package tests

// TestCacheSpillChecker: a randomized checker of cache spill
// (system/cache/spill.go and its rules in budget) against a small
// reference model of its rules.
//
// The runtime: pageable-host without a limit, pinned-host and cuda:0 with
// small random budgets, spill cuda:0 → pinned-host; at cuda:0 a cache that
// spills ("sp") and a plain one ("pl").
//
//   - model: one goroutine drives random loads (held or released at once,
//     failing loaders, peaks above the resident bytes and above the whole
//     budget), lease releases, admissions at cuda:0, at pinned-host and at
//     both, scope exits, Evict, and Close of both caches; Demote fails
//     (an error, a panic, a copy with an error) on a random subset of the
//     values. The model does not re-implement the victim order: it reads
//     the victims from what the runtime did (the Demote and Close calls,
//     in the order the reclaim steps ran, and Decision.Evictions for an
//     Admit) and checks everything that follows from them: each victim was
//     idle; the request's own victims at pinned-host come first, and any
//     other copy evicted there was given up to make room for the demotion
//     of the next victim at cuda:0 (the spill cascade): those copies cover
//     what it lacked, none of them spare, and it is demoted (RoomFor in
//     the decision names it); enough bytes were freed and
//     nothing was evicted for a request that does not fit; each victim of
//     the spilling cache is demoted exactly when the spill rule's room
//     formula (computed here) says so; the eviction's To; the charges at
//     both locations (names and bytes, in the snapshot); the caches'
//     statistics; whether each load is a warm start and with which copy;
//     and that every value and copy is closed exactly once, when it
//     leaves.
//   - concurrent: several goroutines load, release, admit, exit and evict
//     at once while Demote fails at random and the spilling cache closes
//     midway; a watcher checks the budgets; at the end every charge is
//     released at both locations, every value and copy closed exactly
//     once (never while held or handed to a loader), and the statistics
//     add up.
//
// Bounded by default; RESIDENCY_SOAK runs seeds for that long,
// RESIDENCY_CACHE_SEED replays one (spChecker). The model's operations are in
// cache_spill_model_test.go; its checks, and the concurrent part, here.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/internal/checkharness"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

const (
	spGPU    = "cuda:0"
	spPinned = "pinned-host"
	spBudget = 100 // cuda:0
)

// spEvent is one call the runtime made into the checker's values.
type spEvent struct {
	kind string // "demote" (of a value), "close" (a value), "copy" (a copy's Close), "loader"
	id   int64  // the value's or the copy's id
}

// spRec records the events in order, and violations.
type spRec struct {
	checkharness.Recorder
	mu      sync.Mutex
	events  []spEvent
	nextID  int64
	values  []*spVal
	copies  []*spCopy
	demotes atomic.Int64 // Demote calls
	warm    atomic.Int64 // loaders handed a copy
}

func (r *spRec) add(kind string, id int64) {
	r.mu.Lock()
	r.events = append(r.events, spEvent{kind, id})
	r.mu.Unlock()
}

// take returns the events recorded since the last take.
func (r *spRec) take() []spEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// spVal is a loaded value. mode is what Demote does with it: "" copies,
// "error", "panic", "copy+error" (a copy returned with an error).
type spVal struct {
	rec     *spRec
	id      int64
	key     string
	bytes   int64
	mode    string
	holders atomic.Int64 // leases the checker holds
	busy    atomic.Bool  // its idle predicate says busy
	closed  atomic.Int32
	copy    atomic.Pointer[spCopy] // made by Demote
}

func (v *spVal) Close() error {
	if v.holders.Load() != 0 {
		v.rec.Fail("value %s#%d closed while leased", v.key, v.id)
	}
	if v.closed.Add(1) != 1 {
		v.rec.Fail("value %s#%d closed twice", v.key, v.id)
	}
	v.rec.add("close", v.id)
	return nil
}

func spIdle(v *spVal) bool { return !v.busy.Load() }

// spCopy is a demoted copy.
type spCopy struct {
	rec    *spRec
	id     int64
	from   *spVal
	inUse  atomic.Int32 // loaders using it
	closed atomic.Int32
}

func (c *spCopy) Close() error {
	if c.inUse.Load() != 0 {
		c.rec.Fail("copy of %s#%d closed while its loader uses it", c.from.key, c.from.id)
	}
	if c.closed.Add(1) != 1 {
		c.rec.Fail("copy of %s#%d closed twice", c.from.key, c.from.id)
	}
	c.rec.add("copy", c.id)
	return nil
}

func (r *spRec) newValue(key string, bytes int64, mode string) *spVal {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	v := &spVal{rec: r, id: r.nextID, key: key, bytes: bytes, mode: mode}
	r.values = append(r.values, v)
	return v
}

func (r *spRec) demote(_ context.Context, key string, value any) (any, error) {
	r.demotes.Add(1)
	v, ok := value.(*spVal)
	if !ok || v.key != key {
		r.Fail("Demote of key %s got %T %v", key, value, value)
		return nil, errInjected
	}
	r.add("demote", v.id)
	if v.mode == "error" {
		return nil, errInjected
	}
	if v.mode == "panic" {
		panic("checker: injected Demote panic")
	}
	r.mu.Lock()
	r.nextID++
	cp := &spCopy{rec: r, id: r.nextID, from: v}
	r.copies = append(r.copies, cp)
	r.mu.Unlock()
	if v.mode == "copy+error" {
		return cp, errInjected
	}
	v.copy.Store(cp)
	return cp, nil
}

// ---- the runtime -------------------------------------------------------------

type spRig struct {
	rec    *spRec
	sys    *system.System
	caches [2]*cache.Cache // sp (spills), pl (plain)
	pinned int64
}

func startSpillRig(t *testing.T, rec *spRec, pinned int64) *spRig {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{
		Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit(spPinned, pinned), system.Limit(spGPU, spBudget)},
		Spill:     map[string]string{spGPU: spPinned}, TraceCapacity: 16,
	})
	require.NoError(t, err)
	g := &spRig{rec: rec, sys: sys, pinned: pinned}
	g.caches[0], err = cache.New(ctx, sys, cache.Options{Location: spGPU, Name: "sp", Spill: &cache.Spill{Demote: rec.demote}})
	require.NoError(t, err)
	g.caches[1], err = cache.New(ctx, sys, cache.Options{Location: spGPU, Name: "pl"})
	require.NoError(t, err)
	return g
}

// reservations returns the reservations at loc by name, and the
// location's used bytes.
func (g *spRig) reservations(loc string) (map[string]int64, int64, error) {
	snap, err := g.sys.Snapshot(context.Background())
	if err != nil {
		return nil, 0, err
	}
	rec, ok := snap.Location(loc)
	if !ok {
		return nil, 0, fmt.Errorf("no location %s in the snapshot", loc)
	}
	out := map[string]int64{}
	for _, r := range rec.Reservations {
		out[r.Name] += r.Bytes
	}
	return out, rec.UsedBytes, nil
}

// spLoaded is what a loader of spLoad saw and made.
type spLoaded struct {
	ran  bool
	warm *spCopy // the copy it was handed
	made *spVal
}

// spLoad loads key through cache c: the loader records the copy it is
// handed, then fails or returns a value of resident bytes with Demote mode
// mode. out (nil: not recorded) is written by the loader: read it only
// once the load is known to be over.
func spLoad(ctx context.Context, g *spRig, c int, key string, peak, resident int64, fail bool, mode string, out *spLoaded) (cache.Lease[*spVal], error) {
	if out == nil {
		out = new(spLoaded)
	}
	return cache.Load(ctx, g.caches[c], key, peak, spIdle, func(ctx context.Context) (*spVal, int64, error) {
		out.ran = true
		g.rec.add("loader", 0)
		if cp, ok := cache.Demoted[*spCopy](ctx); ok {
			g.rec.warm.Add(1)
			out.warm = cp
			cp.inUse.Add(1)
			defer cp.inUse.Add(-1)
			if cp.closed.Load() != 0 || cp.from.key != key {
				g.rec.Fail("load of %s handed the copy of %s#%d (closed %d)", key, cp.from.key, cp.from.id, cp.closed.Load())
			}
		}
		if fail {
			return nil, 0, errInjected
		}
		out.made = g.rec.newValue(key, resident, mode)
		return out.made, resident, nil
	})
}

func spMode(r *rand.Rand) string {
	switch x := r.IntN(100); {
	case x < 12:
		return "error"
	case x < 16:
		return "panic"
	case x < 20:
		return "copy+error"
	}
	return ""
}

func TestCacheSpillChecker(t *testing.T) {
	t.Run("model", func(t *testing.T) {
		cov := map[string]int{}
		c := spChecker("model", 2101, 16)
		t.Log(c.Loop(t, func(seed uint64) bool {
			rec := &spRec{}
			runSpillModel(t, rec, seed, 400, cov)
			return rec.Report(t, c, "model", seed)
		}))
		t.Logf("coverage: %s", spCoverage(cov))
	})
	t.Run("concurrent", func(t *testing.T) {
		var sum cache.Stats
		c := spChecker("concurrent", 2201, 6)
		t.Log(c.Loop(t, func(seed uint64) bool {
			rec := &spRec{}
			st := runSpillConcurrent(t, rec, seed, 5, 300)
			sum.Evictions += st.Evictions
			sum.Demotions += st.Demotions
			sum.DemotionFailures += st.DemotionFailures
			sum.WarmStarts += st.WarmStarts
			return rec.Report(t, c, "concurrent", seed)
		}))
		t.Logf("the spilling cache, all seeds: %d evictions, %d demotions, %d failed, %d warm starts", sum.Evictions, sum.Demotions, sum.DemotionFailures, sum.WarmStarts)
	})
}

// spChecker is the seed loop of a part of TestCacheSpillChecker: n seeds
// from base by default; RESIDENCY_CACHE_SEED replays one.
func spChecker(part string, base uint64, n int) checkharness.Checker {
	return checkharness.Checker{SeedEnv: "RESIDENCY_CACHE_SEED", Pattern: "TestCacheSpillChecker/" + part, Package: "./tests/", Seeds: n, Base: base}
}

func spCoverage(cov map[string]int) string {
	keys := make([]string, 0, len(cov))
	for k := range cov {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %d; ", k, cov[k])
	}
	return b.String()
}

// ---- the model's checks (the model: cache_spill_model_test.go) ------------------

// check compares the ledger, the statistics and the values with the model.
func (m *spModel) check() {
	for _, loc := range []string{spGPU, spPinned} {
		want := map[string]int64{}
		for _, s := range m.scopes {
			for _, r := range s.res {
				if r.loc == loc {
					want[r.name] = r.bytes
				}
			}
		}
		if loc == spPinned {
			for _, cp := range m.copies {
				want[cp.charge] = cp.bytes
			}
		} else {
			for c := range m.entries {
				for _, e := range m.entries[c] {
					want[e.charge] = e.v.bytes
				}
			}
			for _, e := range m.gone {
				want[e.charge] = e.v.bytes
			}
		}
		got, used, err := m.g.reservations(loc)
		if err != nil {
			m.fail("snapshot: %v", err)
			return
		}
		if used != 0 || fmt.Sprint(got) != fmt.Sprint(want) {
			m.fail("%s: reservations %v (used %d), the model has %v", loc, got, used, want)
		}
	}
	for c := range m.g.caches {
		m.checkStats(c)
	}
	m.checkClosed()
}

func (m *spModel) checkStats(c int) {
	st, err := m.g.caches[c].Statistics(m.ctx)
	if err != nil {
		m.fail("statistics of cache %d: %v", c, err)
		return
	}
	var owned int64
	for _, e := range m.entries[c] {
		owned += e.v.bytes
	}
	n := len(m.entries[c])
	for _, e := range m.gone {
		if e.c == c {
			owned += e.v.bytes
			n++
		}
	}
	want := cache.Stats{ReservedBytes: owned, Resources: n, Evictions: m.evictions[c]}
	if c == 0 {
		want.Demoted = len(m.copies)
		for _, cp := range m.copies {
			want.DemotedBytes += cp.bytes
		}
		want.Demotions, want.DemotionFailures, want.WarmStarts = m.demotions, m.failures, m.warmed
	}
	got := cache.Stats{ReservedBytes: st.ReservedBytes, Resources: st.Resources, Evictions: st.Evictions,
		Demoted: st.Demoted, DemotedBytes: st.DemotedBytes, Demotions: st.Demotions, DemotionFailures: st.DemotionFailures, WarmStarts: st.WarmStarts}
	if got != want {
		m.fail("statistics of cache %d: %+v, the model has %+v", c, got, want)
	}
}

// checkClosed: a value or copy is closed once it left, never before.
func (m *spModel) checkClosed() {
	live := map[*spVal]bool{}
	for c := range m.entries {
		for _, e := range m.entries[c] {
			live[e.v] = true
		}
	}
	for _, e := range m.gone {
		live[e.v] = true
	}
	kept := map[*spCopy]bool{}
	for _, cp := range m.copies {
		kept[cp.cp] = true
	}
	m.rec.mu.Lock()
	values, copies := append([]*spVal(nil), m.rec.values...), append([]*spCopy(nil), m.rec.copies...)
	m.rec.mu.Unlock()
	for _, v := range values {
		if n := v.closed.Load(); (n == 0) != live[v] {
			m.fail("value %s#%d closed %d times, live in the model %v", v.key, v.id, n, live[v])
		}
	}
	for _, cp := range copies {
		if n := cp.closed.Load(); (n == 0) != kept[cp] {
			m.fail("copy of %s#%d closed %d times, kept in the model %v", cp.from.key, cp.from.id, n, kept[cp])
		}
	}
}

// ---- concurrent -----------------------------------------------------------------

type spWorker struct {
	g      *spRig
	r      *rand.Rand
	leases []cache.Lease[*spVal]
	scopes []*system.Scope
}

func runSpillConcurrent(t *testing.T, rec *spRec, seed uint64, workers, steps int) cache.Stats {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 0xc0c))
	g := startSpillRig(t, rec, 30+r.Int64N(120))
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go spWatch(g, stopWatch, watched)
	// The spilling cache closes midway in odd seeds; in even ones its
	// copies are there at the end.
	closeAt := int64(workers * steps * (40 + r.IntN(50)) / 100)
	if seed%2 == 0 {
		closeAt = -1
	}
	closeNow, closed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(closed)
		<-closeNow
		if err := g.caches[0].Close(ctx); err != nil {
			rec.Fail("close of the spilling cache midway: %v", err)
		}
	}()
	var ops atomic.Int64
	var wg sync.WaitGroup
	for i := range workers {
		w := &spWorker{g: g, r: rand.New(rand.NewPCG(seed, uint64(i)))}
		wg.Go(func() {
			for range steps {
				if ops.Add(1) == closeAt {
					close(closeNow)
				}
				w.step()
			}
			for _, l := range w.leases {
				l.Value().holders.Add(-1)
				if err := l.Release(); err != nil {
					rec.Fail("release: %v", err)
				}
			}
			for _, sc := range w.scopes {
				if err := sc.Exit(ctx); err != nil {
					rec.Fail("exit: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if closeAt < 0 {
		spAllIdle(g)
	}
	if ops.Load() < closeAt || closeAt < 0 {
		close(closeNow)
	}
	<-closed
	close(stopWatch)
	<-watched
	st, err := g.caches[0].Statistics(ctx)
	require.NoError(t, err)
	for _, c := range g.caches {
		require.NoError(t, c.Close(ctx))
	}
	spConserved(g, st)
	require.NoError(t, g.sys.Close(ctx))
	return st
}

// spAllIdle: with nothing held and no call running, every entry and copy
// is the controller's to evict: the whole budget of cuda:0, then of
// pinned-host, is admitted (waiting for room: an offer made as a drop was
// refused is recorded again once the refusal is settled).
func spAllIdle(g *spRig) {
	ctx := context.Background()
	for _, loc := range []string{spGPU, spPinned} {
		b := int64(spBudget)
		if loc == spPinned {
			b = g.pinned
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		sc, _, err := g.sys.Admit(actx, system.Request{Name: "all", Reservations: []system.ReservationSpec{{Name: "all", Location: loc, Bytes: b}}}, system.WaitForRoom())
		cancel()
		if err != nil {
			g.rec.Fail("end: the whole of %s is not admitted once everything is idle: %v", loc, err)
			continue
		}
		if err := sc.Exit(ctx); err != nil {
			g.rec.Fail("end: exit: %v", err)
		}
	}
}

// spWatch checks, until stop, that neither location is over its budget
// (while an entry is copied both its charges count).
func spWatch(g *spRig, stop, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		snap, err := g.sys.Snapshot(context.Background())
		if err != nil {
			g.rec.Fail("watcher: snapshot: %v", err)
			return
		}
		for _, loc := range snap.Locations {
			if loc.HasBudget && loc.UsedBytes+loc.ReservedBytes > loc.BudgetBytes {
				g.rec.Fail("watcher: %s holds %d+%d bytes, over its budget %d", loc.Location, loc.UsedBytes, loc.ReservedBytes, loc.BudgetBytes)
			}
		}
	}
}

// spConserved: with both caches closed and every lease and scope gone,
// nothing is charged, every value and copy was closed once, and the
// spilling cache's figures add up (st: taken after the workers ended).
func spConserved(g *spRig, st cache.Stats) {
	rec := g.rec
	for _, loc := range []string{spGPU, spPinned} {
		res, used, err := g.reservations(loc)
		if err != nil || used != 0 || len(res) != 0 {
			rec.Fail("end: %s still charges %v (used %d, %v)", loc, res, used, err)
		}
	}
	rec.mu.Lock()
	values, copies := append([]*spVal(nil), rec.values...), append([]*spCopy(nil), rec.copies...)
	rec.mu.Unlock()
	for _, v := range values {
		if n := v.closed.Load(); n != 1 {
			rec.Fail("end: value %s#%d closed %d times", v.key, v.id, n)
		}
	}
	for _, cp := range copies {
		if n := cp.closed.Load(); n != 1 {
			rec.Fail("end: copy of %s#%d closed %d times", cp.from.key, cp.from.id, n)
		}
	}
	if d := rec.demotes.Load(); uint64(d) != st.Demotions+st.DemotionFailures {
		rec.Fail("end: %d Demote calls, statistics %d demotions + %d failures", d, st.Demotions, st.DemotionFailures)
	}
	if w := rec.warm.Load(); uint64(w) != st.WarmStarts {
		rec.Fail("end: %d loaders handed a copy, statistics %d warm starts", w, st.WarmStarts)
	}
	if st.Demoted != 0 || st.DemotedBytes != 0 || st.ReservedBytes != 0 {
		rec.Fail("end: the closed spilling cache keeps %d copies (%d bytes), %d bytes at %s", st.Demoted, st.DemotedBytes, st.ReservedBytes, spGPU)
	}
}

// ctx returns a context that never ends, or, now and then, one that ends
// within a few milliseconds.
func (w *spWorker) ctx() (context.Context, context.CancelFunc) {
	if w.r.IntN(5) == 0 {
		return context.WithTimeout(context.Background(), time.Duration(w.r.IntN(3000))*time.Microsecond)
	}
	return context.WithCancel(context.Background())
}

func (w *spWorker) step() {
	rec := w.g.rec
	ctx, cancel := w.ctx()
	defer cancel()
	c := w.r.IntN(3) / 2 // cache 0 twice as often
	key := fmt.Sprintf("k%d", w.r.IntN(6))
	switch x := w.r.IntN(100); {
	case x < 45:
		peak := 1 + w.r.Int64N(spBudget*6/10)
		l, err := spLoad(ctx, w.g, c, key, peak, 1+w.r.Int64N(peak), w.r.IntN(8) == 0, spMode(w.r), nil)
		if err != nil {
			if !spAllowed(err, "busy", "load") {
				rec.Fail("load %s: %T: %v", key, err, err)
			}
			return
		}
		if len(w.leases) < 3 && w.r.IntN(2) == 0 {
			l.Value().holders.Add(1)
			w.leases = append(w.leases, l)
			return
		}
		if err := l.Release(); err != nil {
			rec.Fail("release: %v", err)
		}
	case x < 65:
		if len(w.leases) > 0 {
			i := w.r.IntN(len(w.leases))
			l := w.leases[i]
			w.leases = append(w.leases[:i], w.leases[i+1:]...)
			l.Value().holders.Add(-1)
			if err := l.Release(); err != nil {
				rec.Fail("release: %v", err)
			}
		}
	case x < 85:
		if len(w.scopes) >= 2 {
			sc := w.scopes[0]
			w.scopes = w.scopes[1:]
			if err := sc.Exit(context.Background()); err != nil {
				rec.Fail("exit: %v", err)
			}
			return
		}
		var req system.Request
		req.Name = fmt.Sprintf("c%d", w.r.Uint64())
		if w.r.IntN(3) > 0 {
			req.Reservations = append(req.Reservations, system.ReservationSpec{Name: req.Name + "g", Location: spGPU, Bytes: 1 + w.r.Int64N(50)})
		}
		if len(req.Reservations) == 0 || w.r.IntN(2) == 0 {
			req.Reservations = append(req.Reservations, system.ReservationSpec{Name: req.Name + "h", Location: spPinned, Bytes: 1 + w.r.Int64N(w.g.pinned)})
		}
		sc, _, err := w.g.sys.Admit(ctx, req)
		if err != nil {
			if !spAllowed(err, "plan", "busy") && !errors.Is(err, system.ErrBusy) {
				rec.Fail("admit: %T: %v", err, err)
			}
			return
		}
		w.scopes = append(w.scopes, sc)
	default:
		if _, err := w.g.caches[c].Evict(ctx, key); err != nil && !spAllowed(err, "busy") {
			rec.Fail("evict %s: %T: %v", key, err, err)
		}
	}
}

// spAllowed: err is the cache's closing, a context's end, or of one of
// the classes (ckClass; "plan": a refused or raced admission).
func spAllowed(err error, classes ...string) bool {
	var pe *budget.PlanError
	var xe *budget.PlanExecutionError
	class := ckClass(err)
	if errors.As(err, &pe) || errors.As(err, &xe) {
		class = "plan"
	}
	for _, c := range append(classes, "cache closed", "context") {
		if c == class {
			return true
		}
	}
	return false
}
