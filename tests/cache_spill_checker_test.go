package tests

// TestCacheSpillChecker: a randomized checker of cache spill (issue 21:
// system/cache/spill.go, budget/charges_spill.go) against a small
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
//     idle; victims at pinned-host come first; enough bytes were freed and
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
// Bounded by default; RESIDENCY_SOAK and RESIDENCY_CACHE_SEED as for
// TestCacheChecker (ckSeeds).

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
	mu       sync.Mutex
	events   []spEvent
	problems []string
	count    int
	nextID   int64
	values   []*spVal
	copies   []*spCopy
	demotes  atomic.Int64 // Demote calls
	warm     atomic.Int64 // loaders handed a copy
}

func (r *spRec) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.count++
	if len(r.problems) < 25 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
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
		v.rec.fail("value %s#%d closed while leased", v.key, v.id)
	}
	if v.closed.Add(1) != 1 {
		v.rec.fail("value %s#%d closed twice", v.key, v.id)
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
		c.rec.fail("copy of %s#%d closed while its loader uses it", c.from.key, c.from.id)
	}
	if c.closed.Add(1) != 1 {
		c.rec.fail("copy of %s#%d closed twice", c.from.key, c.from.id)
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
		r.fail("Demote of key %s got %T %v", key, value, value)
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
func spLoad(ctx context.Context, g *spRig, c int, key string, peak, resident int64, fail bool, mode string, out *spLoaded) (*cache.Lease[*spVal], error) {
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
				g.rec.fail("load of %s handed the copy of %s#%d (closed %d)", key, cp.from.key, cp.from.id, cp.closed.Load())
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
		ckSeeds(t, 2101, 24, func(seed uint64) bool {
			rec := &spRec{}
			runSpillModel(t, rec, seed, 400, cov)
			return spReport(t, rec, "model", seed)
		})
		t.Logf("coverage: %s", spCoverage(cov))
	})
	t.Run("concurrent", func(t *testing.T) {
		var sum cache.Stats
		ckSeeds(t, 2201, 6, func(seed uint64) bool {
			rec := &spRec{}
			st := runSpillConcurrent(t, rec, seed, 5, 300)
			sum.Evictions += st.Evictions
			sum.Demotions += st.Demotions
			sum.DemotionFailures += st.DemotionFailures
			sum.WarmStarts += st.WarmStarts
			return spReport(t, rec, "concurrent", seed)
		})
		t.Logf("the spilling cache, all seeds: %d evictions, %d demotions, %d failed, %d warm starts", sum.Evictions, sum.Demotions, sum.DemotionFailures, sum.WarmStarts)
	})
}

func spReport(t *testing.T, rec *spRec, part string, seed uint64) bool {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.count == 0 {
		return true
	}
	t.Errorf("%s, seed %d: %d violations (replay: RESIDENCY_CACHE_SEED=%d go test -race -run 'TestCacheSpillChecker/%s' ./tests/):\n  %s",
		part, seed, rec.count, seed, part, strings.Join(rec.problems, "\n  "))
	return false
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

// ---- the model, one goroutine -------------------------------------------------

// spEntry is a ready entry of a cache at cuda:0.
type spEntry struct {
	c        int
	v        *spVal
	charge   string
	held     int
	detached bool // drained by Close while held
	// offered: the ledger has its charge offered (a victim candidate).
	// Not after a refused drop (its predicate said busy) until it is
	// offered again: a release, or a load of its cache refused for room.
	offered bool
}

// spCopyM is a demoted copy kept at pinned-host.
type spCopyM struct {
	cp     *spCopy
	key    string
	charge string
	bytes  int64
}

type spResv struct {
	name, loc string
	bytes     int64
}

type spScope struct {
	sc  *system.Scope
	res []spResv
}

type spHeld struct {
	l *cache.Lease[*spVal]
	e *spEntry
}

type spModel struct {
	rec  *spRec
	g    *spRig
	r    *rand.Rand
	ctx  context.Context
	cov  map[string]int
	step int
	op   string

	entries [2]map[string]*spEntry // ready entries by key, per cache
	gone    []*spEntry             // detached entries still held
	copies  map[string]*spCopyM    // the spilling cache's copies by key
	scopes  []spScope
	leases  []spHeld
	closed  [2]bool

	evictions                   [2]uint64
	demotions, failures, warmed uint64
	nextScope                   int
}

func (m *spModel) fail(format string, args ...any) {
	m.rec.fail("step %d (%s): %s", m.step, m.op, fmt.Sprintf(format, args...))
}

func runSpillModel(t *testing.T, rec *spRec, seed uint64, steps int, cov map[string]int) {
	r := rand.New(rand.NewPCG(seed, 0x5b111))
	g := startSpillRig(t, rec, 30+r.Int64N(120))
	m := &spModel{rec: rec, g: g, r: r, ctx: context.Background(), cov: cov,
		entries: [2]map[string]*spEntry{{}, {}}, copies: map[string]*spCopyM{}}
	closeAt := [2]int{steps * (75 + r.IntN(20)) / 100, steps * (75 + r.IntN(20)) / 100}
	for m.step = 0; m.step < steps; m.step++ {
		switch {
		case m.step == closeAt[0]:
			m.closeCache(0)
		case m.step == closeAt[1]:
			m.closeCache(1)
		default:
			m.randomOp()
		}
		if rec.count > 0 {
			break
		}
		m.check()
	}
	m.op = "end"
	for len(m.leases) > 0 {
		m.release(0)
	}
	for len(m.scopes) > 0 {
		m.exit(0)
	}
	m.closeCache(0)
	m.closeCache(1)
	m.check()
	require.NoError(t, g.sys.Close(m.ctx))
}

func (m *spModel) randomOp() {
	switch x := m.r.IntN(100); {
	case x < 40:
		m.load()
	case x < 52:
		if len(m.leases) > 0 {
			m.release(m.r.IntN(len(m.leases)))
		}
	case x < 75:
		if len(m.scopes) >= 3 {
			m.exit(0)
		}
		if m.r.IntN(4) == 0 {
			m.admitBusy()
		} else {
			m.admit(false)
		}
	case x < 90:
		if len(m.scopes) > 0 {
			m.exit(m.r.IntN(len(m.scopes)))
		}
	default:
		m.evict()
	}
}

func (m *spModel) saw(what string) { m.cov[what]++ }

// total is what the model charges at loc; idle what the controller may
// evict there.
func (m *spModel) total(loc string) (total, idle int64) {
	for _, s := range m.scopes {
		for _, r := range s.res {
			if r.loc == loc {
				total += r.bytes
			}
		}
	}
	if loc == spPinned {
		for _, cp := range m.copies {
			total += cp.bytes
			idle += cp.bytes
		}
		return total, idle
	}
	for c := range m.entries {
		for _, e := range m.entries[c] {
			total += e.v.bytes
			if e.offered {
				idle += e.v.bytes
			}
		}
	}
	for _, e := range m.gone {
		total += e.v.bytes
	}
	return total, idle
}

// reofferable: the idle entries of cache c not offered, which a load of
// c refused for room offers again (their bytes, and them).
func (m *spModel) reofferable(c int) (int64, []*spEntry) {
	var n int64
	var out []*spEntry
	for _, e := range m.entries[c] {
		if !e.offered && e.held == 0 && !e.v.busy.Load() {
			n += e.v.bytes
			out = append(out, e)
		}
	}
	return n, out
}

func (m *spModel) budget(loc string) int64 {
	if loc == spPinned {
		return m.g.pinned
	}
	return spBudget
}

// fits: a request of need bytes by location fits once every idle charge
// there is evicted.
func (m *spModel) fits(need map[string]int64) bool {
	for loc, b := range need {
		total, idle := m.total(loc)
		if total-idle+b > m.budget(loc) {
			return false
		}
	}
	return true
}

func (m *spModel) key() (int, string) {
	c := 0
	if m.r.IntN(3) == 0 {
		c = 1
	}
	return c, fmt.Sprintf("k%d", m.r.IntN(7))
}

func (m *spModel) load() {
	c, key := m.key()
	peak := 1 + m.r.Int64N(spBudget*6/10)
	if m.r.IntN(20) == 0 {
		peak = spBudget + 1 + m.r.Int64N(10)
	}
	resident := 1 + m.r.Int64N(peak)
	failLoad := m.r.IntN(8) == 0
	mode := spMode(m.r)
	keep := m.r.IntN(3) == 0 && len(m.leases) < 4
	m.op = fmt.Sprintf("load %s peak %d resident %d fail %v demote %q keep %v", key, peak, resident, failLoad, mode, keep)
	before, _ := m.total(spPinned)
	fits := m.fits(map[string]int64{spGPU: peak})
	probe := m.probe(c, key, peak, fits)
	// Refused for room, the load offers the cache's idle entries that are
	// not offered (refused drops) and decides again.
	reBytes, re := m.reofferable(c)
	fitsAgain := fits
	if total, idle := m.total(spGPU); !fits {
		fitsAgain = total-idle-reBytes+peak <= spBudget
	}
	var out spLoaded
	l, err := spLoad(m.ctx, m.g, c, key, peak, resident, failLoad, mode, &out)
	made, warm, ran := out.made, out.warm, out.ran
	events := m.rec.take()
	e := m.entries[c][key]
	var be *system.BudgetError
	var busy *system.CacheBusyError
	var le *system.CacheLoadError
	switch {
	case m.closed[c]:
		m.wantErr(errors.Is(err, system.ErrCacheClosed), "cache closed", err)
	case peak > spBudget:
		m.wantErr(errors.As(err, &be), "budget", err)
	case e != nil:
		m.saw("load hit")
		if err != nil || ran || l.Value() != e.v {
			m.fail("a hit: err %v, loader ran %v", err, ran)
			return
		}
		m.hold(l, e, keep)
	case !fitsAgain:
		m.saw("load busy")
		m.wantErr(errors.As(err, &busy), "busy", err)
		m.offer(re)
	default:
		if !fits {
			m.saw("load after offering again")
			m.offer(re)
		}
		loaderAt := len(events)
		for i, ev := range events {
			if ev.kind == "loader" {
				loaderAt = i
				break
			}
		}
		m.victims(events[:loaderAt], probe, before, 0)
		m.loaded(c, key, events[loaderAt:], warm, failLoad, made, err)
		if failLoad {
			m.wantErr(errors.As(err, &le), "load error", err)
			return
		}
		if err != nil || made == nil {
			m.fail("load failed: %v", err)
			return
		}
		e := &spEntry{c: c, v: made, charge: m.newCharge(c, key)}
		m.entries[c][key] = e
		m.hold(l, e, keep)
		return
	}
	if len(events) > 0 {
		m.fail("no load ran, yet the runtime called %v", events)
	}
}

// probe returns the evictions the controller decides (Decide, nothing
// run) for the reservation of a load's peak that the model expects to
// reserve: the load's own admission must evict the same, with the same To.
func (m *spModel) probe(c int, key string, peak int64, fits bool) []budget.Eviction {
	if m.closed[c] || peak > spBudget || m.entries[c][key] != nil || !fits {
		return nil
	}
	d, err := m.g.sys.Decide(m.ctx, system.Request{Name: "probe", Reservations: []system.ReservationSpec{{Name: "probe", Location: spGPU, Bytes: peak}}})
	if err != nil {
		m.fail("decide a reservation of the peak: %v", err)
		return nil
	}
	if ev := m.rec.take(); len(ev) > 0 {
		m.fail("Decide ran %v", ev)
	}
	return append([]budget.Eviction{}, d.Evictions...)
}

// loaded checks what follows the loader's start: the copy handed to it
// (the model's, if any) and its release once the load succeeded.
func (m *spModel) loaded(c int, key string, events []spEvent, warm *spCopy, failLoad bool, made *spVal, err error) {
	if len(events) == 0 {
		m.fail("the loader did not run: %v", err)
		return
	}
	events = events[1:]
	cp := m.copies[key]
	if c != 0 {
		cp = nil
	}
	switch {
	case cp == nil && warm != nil:
		m.fail("a cold load was handed the copy of %s#%d", warm.from.key, warm.from.id)
	case cp != nil && warm != cp.cp:
		m.fail("the load was not handed the copy of %s (got %v)", key, warm)
	}
	if cp != nil {
		m.warmed++
		m.saw("load warm")
		if !failLoad {
			m.saw("load warm ok")
			delete(m.copies, key)
			if len(events) != 1 || events[0] != (spEvent{"copy", cp.cp.id}) {
				m.fail("the copy of a warm load that succeeded: want it closed, got %v", events)
			}
			return
		}
		m.saw("load warm failed")
	} else {
		m.saw("load cold")
	}
	if len(events) > 0 {
		m.fail("after the loader: unexpected %v", events)
	}
}

// newCharge finds the charge of the entry just loaded: the one
// reservation at cuda:0 of the cache's key the model does not know yet.
func (m *spModel) newCharge(c int, key string) string {
	res, _, err := m.g.reservations(spGPU)
	if err != nil {
		m.fail("snapshot: %v", err)
		return ""
	}
	prefix := fmt.Sprintf("cache %q/%s#", []string{"sp", "pl"}[c], key)
	for name := range res {
		if strings.HasPrefix(name, prefix) && !m.known(name) {
			return name
		}
	}
	m.fail("no new charge %s… at %s: %v", prefix, spGPU, res)
	return ""
}

func (m *spModel) known(name string) bool {
	for c := range m.entries {
		for _, e := range m.entries[c] {
			if e.charge == name {
				return true
			}
		}
	}
	for _, e := range m.gone {
		if e.charge == name {
			return true
		}
	}
	return false
}

func (m *spModel) offer(es []*spEntry) {
	for _, e := range es {
		e.offered = true
	}
}

func (m *spModel) hold(l *cache.Lease[*spVal], e *spEntry, keep bool) {
	e.offered = false // withdrawn while a lease holds it
	if !keep {
		if err := l.Release(); err != nil {
			m.fail("release: %v", err)
		}
		e.offered = e.held == 0
		return
	}
	e.held++
	e.v.holders.Add(1)
	m.leases = append(m.leases, spHeld{l, e})
}

func (m *spModel) wantErr(ok bool, class string, err error) {
	m.saw(strings.Fields(m.op)[0] + " " + class)
	if !ok {
		m.fail("want %s, got %T: %v", class, err, err)
	}
}

// victim is one victim read from the events, in the order its reclaim
// step ran.
type spVictim struct {
	e       *spEntry // a cache entry at cuda:0, or
	cp      *spCopyM // a copy at pinned-host
	demoted bool     // Demote was called
}

func (v spVictim) charge() string {
	if v.e != nil {
		return v.e.charge
	}
	return v.cp.charge
}

// victims reads the victims of one decision from events (nothing else
// may be there), checks them, applies them to the model, and returns
// them. before: the model's charges at pinned-host before the request;
// adds: the request's own bytes there.
func (m *spModel) victims(events []spEvent, evictions []budget.Eviction, before, adds int64) []spVictim {
	var out []spVictim
	seen := map[string]bool{}
	for i := 0; i < len(events); i++ {
		ev := events[i]
		var v spVictim
		switch ev.kind {
		case "copy":
			for _, cp := range m.copies {
				if cp.cp.id == ev.id {
					v.cp = cp
				}
			}
		case "demote", "close":
			v.e = m.entryOf(ev.id)
			if ev.kind == "demote" {
				v.demoted = true
				if i+1 < len(events) && events[i+1].kind == "copy" && v.e != nil && v.e.v.mode == "copy+error" {
					i++ // the copy returned with the error, closed
				}
				if i+1 >= len(events) || events[i+1] != (spEvent{"close", ev.id}) {
					m.fail("demotion of value %d: its Close does not follow Demote: %v", ev.id, events)
					return nil
				}
				i++
			}
		}
		if v.e == nil && v.cp == nil {
			m.fail("event %v names no idle entry or copy of the model (events %v)", ev, events)
			return nil
		}
		if seen[v.charge()] {
			m.fail("victim %s evicted twice", v.charge())
		}
		seen[v.charge()] = true
		out = append(out, v)
	}
	m.checkVictims(out, evictions, before, adds)
	return out
}

func (m *spModel) entryOf(id int64) *spEntry {
	for c := range m.entries {
		for _, e := range m.entries[c] {
			if e.v.id == id {
				return e
			}
		}
	}
	return nil
}

// checkVictims checks the victims (in reclaim order) against the spill
// rule and the decision's evictions, and applies them.
func (m *spModel) checkVictims(vs []spVictim, evictions []budget.Eviction, before, adds int64) {
	if evictions != nil && len(evictions) != len(vs) {
		m.fail("the decision lists %d evictions, %d victims were reclaimed", len(evictions), len(vs))
		evictions = nil
	}
	var removed int64 // victims at the target
	for _, v := range vs {
		if v.cp != nil {
			removed += v.cp.bytes
		}
	}
	var into, atT int64
	pastT := false
	for i, v := range vs {
		if v.cp != nil {
			if pastT {
				m.fail("victim %s at %s after a victim at %s: not location order", v.cp.charge, spPinned, spGPU)
			}
			atT += v.cp.bytes
			m.saw("victim copy")
			m.checkEviction(evictions, i, v, spPinned, v.cp.bytes, "")
			delete(m.copies, v.cp.key)
			continue
		}
		pastT = true
		e := v.e
		if e.held > 0 || !e.offered {
			m.fail("victim %s was not an offered idle entry (held %d, offered %v)", e.charge, e.held, e.offered)
		}
		b := e.v.bytes
		// The spill rule's room at the target, from the model's figures.
		base := before + into + b
		want := e.c == 0 && base-removed+adds <= m.g.pinned && base-atT <= m.g.pinned
		to := ""
		if want {
			to = spPinned
			into += b
		}
		m.checkEviction(evictions, i, v, spGPU, b, to)
		if v.demoted != want {
			m.fail("victim %s (%d bytes, cache %d): demoted %v, the rule says %v (pinned: %d charged, budget %d, %d removed, %d added, %d demoted before)",
				e.charge, b, e.c, v.demoted, want, before, m.g.pinned, removed, adds, into)
		}
		delete(m.entries[e.c], e.v.key)
		m.evictions[e.c]++
		switch {
		case !want:
			m.saw(fmt.Sprintf("victim dropped (cache %d)", e.c))
		case e.v.mode == "":
			m.saw("victim demoted")
			m.demotions++
			cp := e.v.copy.Load()
			if cp == nil {
				m.fail("demotion of %s: no copy", e.charge)
				continue
			}
			if old := m.copies[e.v.key]; old != nil {
				m.fail("demotion of %s while the copy %s is kept", e.charge, old.charge)
			}
			m.copies[e.v.key] = &spCopyM{cp: cp, key: e.v.key, charge: e.charge + "→" + spPinned, bytes: b}
		default:
			m.saw("victim demote " + e.v.mode)
			m.failures++
		}
	}
}

func (m *spModel) checkEviction(evictions []budget.Eviction, i int, v spVictim, loc string, bytes int64, to string) {
	if evictions == nil {
		return
	}
	ev := evictions[i]
	if ev.Kind != budget.EvictionIdleCacheEntry || ev.Charge != v.charge() || ev.Location != loc || ev.Bytes != bytes || ev.To != to {
		m.fail("eviction %d: %+v; want charge %s at %s, %d bytes, to %q", i, ev, v.charge(), loc, bytes, to)
	}
	if to != "" && !strings.Contains(ev.Reason, "demoted to "+to) {
		m.fail("eviction %d: reason %q does not say demoted to %s", i, ev.Reason, to)
	}
}

func (m *spModel) release(i int) {
	h := m.leases[i]
	m.leases = append(m.leases[:i], m.leases[i+1:]...)
	m.op = "release " + h.e.v.key
	h.e.held--
	h.e.v.holders.Add(-1)
	if err := h.l.Release(); err != nil {
		m.fail("release: %v", err)
	}
	events := m.rec.take()
	if h.e.detached && h.e.held == 0 {
		m.saw("release detached")
		for j, e := range m.gone {
			if e == h.e {
				m.gone = append(m.gone[:j], m.gone[j+1:]...)
			}
		}
		if len(events) != 1 || events[0] != (spEvent{"close", h.e.v.id}) {
			m.fail("the last release of an entry drained by Close: want its value closed, got %v", events)
		}
		return
	}
	if len(events) > 0 {
		m.fail("release: unexpected %v", events)
	}
	h.e.offered = h.e.held == 0
}

// admitBusy admits at cuda:0 while an offered idle entry's predicate
// says busy: a plan that picks it is refused when it runs (the entry
// stays, not offered until released or offered again by a load).
func (m *spModel) admitBusy() {
	var idle []*spEntry
	for c := range m.entries {
		for _, e := range m.entries[c] {
			if e.offered {
				idle = append(idle, e)
			}
		}
	}
	if len(idle) == 0 {
		return
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].v.id < idle[j].v.id })
	e := idle[m.r.IntN(len(idle))]
	e.v.busy.Store(true)
	m.admit(true)
	e.v.busy.Store(false)
}

// admit admits a reservation at cuda:0, at pinned-host, or both (gpu: at
// cuda:0 at least).
func (m *spModel) admit(gpu bool) {
	m.nextScope++
	var res []spResv
	need := map[string]int64{}
	where := m.r.IntN(5)
	if where < 3 || gpu {
		res = append(res, spResv{fmt.Sprintf("g%d", m.nextScope), spGPU, 1 + m.r.Int64N(spBudget/2)})
	}
	if where >= 2 {
		res = append(res, spResv{fmt.Sprintf("h%d", m.nextScope), spPinned, 1 + m.r.Int64N(m.g.pinned*2/3)})
	}
	req := system.Request{Name: fmt.Sprintf("q%d", m.nextScope)}
	for _, r := range res {
		need[r.loc] += r.bytes
		req.Reservations = append(req.Reservations, system.ReservationSpec{Name: r.name, Location: r.loc, Bytes: r.bytes})
	}
	m.op = fmt.Sprintf("admit %v", res)
	before, _ := m.total(spPinned)
	fits := m.fits(need)
	sc, d, err := m.g.sys.Admit(m.ctx, req)
	events := m.rec.take()
	if !fits {
		var pe *budget.PlanError
		m.wantErr(errors.As(err, &pe), "refused", err)
		if len(events) > 0 || len(d.Evictions) > 0 {
			m.fail("a request that does not fit evicted %v (%v)", events, d.Evictions)
		}
		return
	}
	// The first victim whose predicate says busy refuses its drop: the
	// run stops there, its earlier victims evicted.
	for k, ev := range d.Evictions {
		e := m.entryByCharge(ev.Charge)
		if e == nil || !e.v.busy.Load() {
			continue
		}
		var xe *budget.PlanExecutionError
		m.wantErr(errors.As(err, &xe) && errors.Is(err, system.ErrBusy), "refused drop", err)
		if ev.To != "" {
			m.saw("admit refused demotion")
		}
		m.victims(events, append([]budget.Eviction{}, d.Evictions[:k]...), before, need[spPinned])
		if sc != nil {
			m.fail("a refused run returned a scope")
		}
		e.offered = false
		return
	}
	if err != nil {
		m.fail("want admitted, got %T: %v", err, err)
		return
	}
	m.saw(fmt.Sprintf("admit ok, %d evictions", min(len(d.Evictions), 3)))
	m.victims(events, append([]budget.Eviction{}, d.Evictions...), before, need[spPinned])
	m.scopes = append(m.scopes, spScope{sc, res})
	for loc := range need {
		if total, _ := m.total(loc); total > m.budget(loc) {
			m.fail("%s over its budget after the admission: %d > %d", loc, total, m.budget(loc))
		}
	}
}

func (m *spModel) entryByCharge(charge string) *spEntry {
	for c := range m.entries {
		for _, e := range m.entries[c] {
			if e.charge == charge {
				return e
			}
		}
	}
	return nil
}

func (m *spModel) exit(i int) {
	s := m.scopes[i]
	m.scopes = append(m.scopes[:i], m.scopes[i+1:]...)
	m.op = fmt.Sprintf("exit %v", s.res)
	if err := s.sc.Exit(m.ctx); err != nil {
		m.fail("exit: %v", err)
	}
	if ev := m.rec.take(); len(ev) > 0 {
		m.fail("exit: unexpected %v", ev)
	}
}

func (m *spModel) evict() {
	c, key := m.key()
	m.op = "evict " + key
	removed, err := m.g.caches[c].Evict(m.ctx, key)
	events := m.rec.take()
	e := m.entries[c][key]
	var busy *system.CacheBusyError
	switch {
	case m.closed[c]:
		m.wantErr(errors.Is(err, system.ErrCacheClosed), "cache closed", err)
	case e == nil:
		m.wantErr(err == nil && !removed, "absent", err)
	case e.held > 0:
		m.wantErr(errors.As(err, &busy), "busy", err)
	default:
		m.wantErr(err == nil && removed, "removed", err)
		delete(m.entries[c], key)
		m.evictions[c]++
		if len(events) != 1 || events[0] != (spEvent{"close", e.v.id}) {
			m.fail("evict: want %s#%d closed (its copy, if any, kept), got %v", key, e.v.id, events)
		}
		return
	}
	if len(events) > 0 {
		m.fail("evict: unexpected %v", events)
	}
}

// closeCache closes cache c: idle entries and copies closed, held
// entries left until their last release.
func (m *spModel) closeCache(c int) {
	m.op = fmt.Sprintf("close cache %d", c)
	if err := m.g.caches[c].Close(m.ctx); err != nil {
		m.fail("close: %v", err)
	}
	events := m.rec.take()
	if m.closed[c] {
		if len(events) > 0 {
			m.fail("a second Close: unexpected %v", events)
		}
		return
	}
	m.closed[c] = true
	want := map[spEvent]bool{}
	for _, e := range m.entries[c] {
		if e.held > 0 {
			e.detached = true
			m.gone = append(m.gone, e)
			continue
		}
		want[spEvent{"close", e.v.id}] = true
	}
	m.entries[c] = map[string]*spEntry{}
	if c == 0 {
		for _, cp := range m.copies {
			want[spEvent{"copy", cp.cp.id}] = true
		}
		m.copies = map[string]*spCopyM{}
	}
	got := map[spEvent]bool{}
	for _, ev := range events {
		got[ev] = true
	}
	if len(got) != len(events) || fmt.Sprint(got) != fmt.Sprint(want) {
		m.fail("close: want %v closed, got %v", want, events)
	}
}

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
	leases []*cache.Lease[*spVal]
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
			rec.fail("close of the spilling cache midway: %v", err)
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
					rec.fail("release: %v", err)
				}
			}
			for _, sc := range w.scopes {
				if err := sc.Exit(ctx); err != nil {
					rec.fail("exit: %v", err)
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
			g.rec.fail("end: the whole of %s is not admitted once everything is idle: %v", loc, err)
			continue
		}
		if err := sc.Exit(ctx); err != nil {
			g.rec.fail("end: exit: %v", err)
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
			g.rec.fail("watcher: snapshot: %v", err)
			return
		}
		for _, loc := range snap.Locations {
			if loc.HasBudget && loc.UsedBytes+loc.ReservedBytes > loc.BudgetBytes {
				g.rec.fail("watcher: %s holds %d+%d bytes, over its budget %d", loc.Location, loc.UsedBytes, loc.ReservedBytes, loc.BudgetBytes)
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
			rec.fail("end: %s still charges %v (used %d, %v)", loc, res, used, err)
		}
	}
	rec.mu.Lock()
	values, copies := append([]*spVal(nil), rec.values...), append([]*spCopy(nil), rec.copies...)
	rec.mu.Unlock()
	for _, v := range values {
		if n := v.closed.Load(); n != 1 {
			rec.fail("end: value %s#%d closed %d times", v.key, v.id, n)
		}
	}
	for _, cp := range copies {
		if n := cp.closed.Load(); n != 1 {
			rec.fail("end: copy of %s#%d closed %d times", cp.from.key, cp.from.id, n)
		}
	}
	if d := rec.demotes.Load(); uint64(d) != st.Demotions+st.DemotionFailures {
		rec.fail("end: %d Demote calls, statistics %d demotions + %d failures", d, st.Demotions, st.DemotionFailures)
	}
	if w := rec.warm.Load(); uint64(w) != st.WarmStarts {
		rec.fail("end: %d loaders handed a copy, statistics %d warm starts", w, st.WarmStarts)
	}
	if st.Demoted != 0 || st.DemotedBytes != 0 || st.ReservedBytes != 0 {
		rec.fail("end: the closed spilling cache keeps %d copies (%d bytes), %d bytes at %s", st.Demoted, st.DemotedBytes, st.ReservedBytes, spGPU)
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
				rec.fail("load %s: %T: %v", key, err, err)
			}
			return
		}
		if len(w.leases) < 3 && w.r.IntN(2) == 0 {
			l.Value().holders.Add(1)
			w.leases = append(w.leases, l)
			return
		}
		if err := l.Release(); err != nil {
			rec.fail("release: %v", err)
		}
	case x < 65:
		if len(w.leases) > 0 {
			i := w.r.IntN(len(w.leases))
			l := w.leases[i]
			w.leases = append(w.leases[:i], w.leases[i+1:]...)
			l.Value().holders.Add(-1)
			if err := l.Release(); err != nil {
				rec.fail("release: %v", err)
			}
		}
	case x < 85:
		if len(w.scopes) >= 2 {
			sc := w.scopes[0]
			w.scopes = w.scopes[1:]
			if err := sc.Exit(context.Background()); err != nil {
				rec.fail("exit: %v", err)
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
				rec.fail("admit: %T: %v", err, err)
			}
			return
		}
		w.scopes = append(w.scopes, sc)
	default:
		if _, err := w.g.caches[c].Evict(ctx, key); err != nil && !spAllowed(err, "busy") {
			rec.fail("evict %s: %T: %v", key, err, err)
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
