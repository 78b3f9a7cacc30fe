package tests

// The model part of TestCacheSpillChecker (cache_spill_checker_test.go):
// one goroutine, a reference model of cache spill's rules.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

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
	l cache.Lease[*spVal]
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
	m.rec.Fail("step %d (%s): %s", m.step, m.op, fmt.Sprintf(format, args...))
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
		rec.Note("step %d: %s", m.step, m.op)
		if n, _ := rec.Failed(); n > 0 {
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

func (m *spModel) hold(l cache.Lease[*spVal], e *spEntry, keep bool) {
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
// rule (its cascade included) and the decision's evictions, and applies
// them. The request's own victims at pinned-host (copies; only when it
// needs room there, and then with RoomFor 0 in the decision) come first;
// any other copy was given up by pinned-host to make room for the
// demotion of the next victim at cuda:0: those copies must
// cover what that demotion lacked there, each of them needed (the least
// valuable set leaves none spare), and the victim is then demoted.
func (m *spModel) checkVictims(vs []spVictim, evictions []budget.Eviction, before, adds int64) {
	if evictions != nil && len(evictions) != len(vs) {
		m.fail("the decision lists %d evictions, %d victims were reclaimed", len(evictions), len(vs))
		evictions = nil
	}
	own := func(i int) bool { // the request's own victim at pinned-host
		if evictions != nil {
			return evictions[i].RoomFor == 0
		}
		return adds > 0
	}
	var removed int64 // victims at the target
	for i, v := range vs {
		if v.cp != nil && own(i) {
			removed += v.cp.bytes
		}
	}
	var into, atT int64
	pastT := false
	var room []int // copies given up since the last victim at cuda:0
	var roomBytes int64
	for i, v := range vs {
		if v.cp != nil {
			atT += v.cp.bytes
			if !own(i) {
				room, roomBytes = append(room, i), roomBytes+v.cp.bytes
				removed += v.cp.bytes
				m.saw("victim copy for a demotion's room")
			} else {
				if pastT {
					m.fail("victim %s at %s after a victim at %s: not location order", v.cp.charge, spPinned, spGPU)
				}
				m.saw("victim copy")
				m.checkEviction(evictions, i, v, spPinned, v.cp.bytes, "", 0)
			}
			delete(m.copies, v.cp.key)
			continue
		}
		pastT = true
		e := v.e
		if e.held > 0 || !e.offered {
			m.fail("victim %s was not an offered idle entry (held %d, offered %v)", e.charge, e.held, e.offered)
		}
		b := e.v.bytes
		// The spill rule's room at the target, from the model's figures,
		// before the copies given up for this victim.
		base := before + into + b - m.g.pinned
		short := max(base-(removed-roomBytes)+adds, base-(atT-roomBytes))
		want := e.c == 0 && short <= 0
		if len(room) > 0 {
			m.checkRoom(vs, room, roomBytes, short, evictions, i)
			want = true
		}
		room, roomBytes = nil, 0
		to := ""
		if want {
			to = spPinned
			into += b
		}
		m.checkEviction(evictions, i, v, spGPU, b, to, 0)
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
	// Copies given up last made room for a demotion that did not run (the
	// run stopped there: evictions lists the victims that ran).
	for _, j := range room {
		if evictions == nil || evictions[j].RoomFor < len(evictions) {
			m.fail("copy %s at %s evicted after the last victim at %s: room for no demotion (evictions %+v)", vs[j].cp.charge, spPinned, spGPU, evictions)
		}
	}
}

// checkRoom checks the copies (positions room in vs, roomBytes in all)
// that pinned-host gave up for the demotion of victim i, which lacked
// short bytes there: they cover it, none of them is spare, and each
// eviction names the demotion.
func (m *spModel) checkRoom(vs []spVictim, room []int, roomBytes, short int64, evictions []budget.Eviction, i int) {
	e := vs[i].e
	if e.c != 0 || short <= 0 || roomBytes < short {
		m.fail("copies %v given up for victim %s (cache %d) that lacked %d bytes at %s: %d bytes", room, e.charge, e.c, short, spPinned, roomBytes)
	}
	for _, j := range room {
		if roomBytes-vs[j].cp.bytes >= short {
			m.fail("copy %s given up for victim %s is not needed (%d of %d bytes lacking)", vs[j].cp.charge, e.charge, roomBytes, short)
		}
		m.checkEviction(evictions, j, vs[j], spPinned, vs[j].cp.bytes, "", i)
	}
	m.saw("victim demoted after a cascade")
}

func (m *spModel) checkEviction(evictions []budget.Eviction, i int, v spVictim, loc string, bytes int64, to string, roomFor int) {
	if evictions == nil {
		return
	}
	ev := evictions[i]
	if ev.Kind != budget.EvictionIdleCacheEntry || ev.Charge != v.charge() || ev.Location != loc || ev.Bytes != bytes || ev.To != to || ev.RoomFor != roomFor {
		m.fail("eviction %d: %+v; want charge %s at %s, %d bytes, to %q, room for %d", i, ev, v.charge(), loc, bytes, to, roomFor)
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
