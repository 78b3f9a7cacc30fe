package budget

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// ---- fixture ---------------------------------------------------------------

// dtFixture builds ledger states for controller tests. Helper names carry
// the dt prefix so that they never clash with other tests of the package.
type dtFixture struct {
	t *testing.T
	l *Ledger
	h map[string]Handle
}

// dtNew configures locations given as "name" (no budget) or "name=bytes".
func dtNew(t *testing.T, locs ...string) *dtFixture {
	t.Helper()
	cfg := Config{ManagerID: "dt", TraceCapacity: 64}
	for _, s := range locs {
		name, b, ok := strings.Cut(s, "=")
		lc := LocationConfig{Name: name}
		if ok {
			n, err := strconv.ParseInt(b, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			lc.HasBudget, lc.BudgetBytes = true, n
		}
		cfg.Locations = append(cfg.Locations, lc)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &dtFixture{t: t, l: l, h: map[string]Handle{}}
}

func (f *dtFixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *dtFixture) settle(adm Admission, err error) {
	f.t.Helper()
	f.must(err)
	if adm.Pending {
		_, err := f.l.Complete(adm.ID)
		f.must(err)
	}
	f.must(f.l.CheckInvariants())
}

// src registers a value with a source (no materialization) and places it
// at each of at.
func (f *dtFixture) src(name string, bytes int64, mode ReplicaMode, source string, at ...string) Handle {
	f.t.Helper()
	h, _, err := f.l.Register(ValueSpec{Name: name, Bytes: bytes, Mode: mode, Source: source})
	f.must(err)
	f.h[name] = h
	for _, loc := range at {
		f.place(name, loc)
	}
	return h
}

// at registers a value without a source, first materialized at first,
// then copied to each of more.
func (f *dtFixture) at(name string, bytes int64, mode ReplicaMode, first string, more ...string) Handle {
	f.t.Helper()
	h, adm, err := f.l.Register(ValueSpec{Name: name, Bytes: bytes, Mode: mode, At: first})
	f.settle(adm, err)
	f.h[name] = h
	for _, loc := range more {
		f.settle(f.l.Copy(h, first, loc))
	}
	return h
}

func (f *dtFixture) place(name, loc string) {
	f.t.Helper()
	f.settle(f.l.Place(f.h[name], loc))
}

// bump takes and releases n leases on name at loc: freq and H rise by n.
func (f *dtFixture) bump(name, loc string, n int) {
	f.t.Helper()
	for range n {
		id, err := f.l.Acquire(f.h[name], loc)
		f.must(err)
		f.must(f.l.Release(id))
	}
}

func (f *dtFixture) lease(name, loc string) LeaseID {
	f.t.Helper()
	id, err := f.l.Acquire(f.h[name], loc)
	f.must(err)
	return id
}

func (f *dtFixture) hold(name, loc string) HoldID {
	f.t.Helper()
	id, err := f.l.Hold(f.h[name], loc)
	f.must(err)
	return id
}

// pendingEvent leaves a pending consumer event (and no lease) on name at loc.
func (f *dtFixture) pendingEvent(name, loc string) EventID {
	f.t.Helper()
	id := f.lease(name, loc)
	e, err := f.l.RecordEvent(id)
	f.must(err)
	f.must(f.l.Release(id))
	return e
}

// mat returns the internal materialization of name at loc (white box).
func (f *dtFixture) mat(name, loc string) *mat {
	f.t.Helper()
	v := f.l.valueByID(f.h[name].ID)
	m := v.mat(f.l.locIndex[loc])
	if m == nil {
		f.t.Fatalf("%s has no materialization at %s", name, loc)
	}
	return m
}

// setRank overrides a materialization's priority and last use (white box:
// it makes ties that the public operations cannot produce).
func (f *dtFixture) setRank(name, loc string, prio int64, lastUse uint64) {
	m := f.mat(name, loc)
	m.prio, m.lastUse = prio, lastUse
	f.l.reindex(f.l.valueByID(f.h[name].ID)) // as every mutation does
}

func (f *dtFixture) inflation(loc string) int64 { return f.l.locs[f.l.locIndex[loc]].inflation }

// need builds a requirement; each tier is a string or a []string.
func (f *dtFixture) need(name string, tiers ...any) Requirement {
	f.t.Helper()
	h, ok := f.h[name]
	if !ok {
		f.t.Fatalf("no value %q", name)
	}
	r := Requirement{Handle: h}
	for _, t := range tiers {
		switch t := t.(type) {
		case string:
			r.Tiers = append(r.Tiers, []string{t})
		case []string:
			r.Tiers = append(r.Tiers, t)
		default:
			f.t.Fatalf("tier %v", t)
		}
	}
	return r
}

// exec runs a decision's plan on the ledger, checking its version.
func (f *dtFixture) exec(dec Decision) Report {
	f.t.Helper()
	rep, err := dtExecute(f.l, dec)
	f.must(err)
	f.must(f.l.CheckInvariants())
	return rep
}

// dtExecute runs dec.Plan through StartRun/Next/Complete/Finish.
func dtExecute(l *Ledger, dec Decision) (Report, error) {
	run, err := l.StartRun(dec.Plan, RunOptions{CheckVersion: true, ExpectedVersion: dec.ExpectedStateVersion})
	if err != nil {
		return Report{}, err
	}
	for {
		step, ok, err := run.Next()
		if err != nil {
			return Report{}, err
		}
		if !ok {
			break
		}
		if step.Admission.Pending {
			if _, err := run.Complete(); err != nil {
				return Report{}, err
			}
		}
	}
	rep, _, err := run.Finish()
	return rep, err
}

func (f *dtFixture) resident(name, loc string) bool {
	v := f.l.valueByID(f.h[name].ID)
	m := v.mat(f.l.locIndex[loc])
	return m != nil && m.state == Resident
}

func dtEvictions(d Decision) []string {
	var out []string
	for _, e := range d.Evictions {
		out = append(out, e.Handle.Name+"@"+e.Location)
	}
	return out
}

func dtEnters(d Decision) []string {
	var out []string
	for _, a := range d.Plan.Enter {
		out = append(out, a.Handle.Name+"@"+a.Location)
	}
	return out
}

func dtList(s ...string) []string { return s }

// ---- decisions -------------------------------------------------------------

// dtCase is one table case: setup builds the state and returns the request.
type dtCase struct {
	name  string
	setup func(f *dtFixture) Request
	limit int
	// success
	evict      []string // handle@location, in plan order
	enter      []string
	explored   int
	exhaustive bool
	// failure: "plan", "limit", "unavailable", "invalid"; reason holds
	// substrings of the error text.
	err    string
	reason []string
	check  func(f *dtFixture, d Decision)
}

func dtRun(t *testing.T, cases []dtCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := dtNew(t, "pageable-host", "pinned-host=100", "cuda:0=100", "cuda:1=100")
			req := tc.setup(f)
			before := f.l.Snapshot()
			d, err := f.l.Decide(req, tc.limit)
			if after := f.l.Snapshot(); !reflect.DeepEqual(before, after) {
				t.Fatalf("Decide changed the ledger:\nbefore %+v\nafter  %+v", before, after)
			}
			if tc.err != "" {
				dtCheckErr(t, err, tc.err, tc.reason)
				return
			}
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if got := dtEvictions(d); !reflect.DeepEqual(got, tc.evict) {
				t.Errorf("evictions %v, want %v", got, tc.evict)
			}
			if got := dtEnters(d); !reflect.DeepEqual(got, tc.enter) {
				t.Errorf("enter %v, want %v", got, tc.enter)
			}
			if d.ExploredStates != tc.explored || d.Exhaustive != tc.exhaustive {
				t.Errorf("explored %d exhaustive %v, want %d %v", d.ExploredStates, d.Exhaustive, tc.explored, tc.exhaustive)
			}
			if !d.Explanation.Feasible || !reflect.DeepEqual(d.Explanation, f.l.Explain(d.Plan)) {
				t.Errorf("explanation %+v is not Explain(plan)", d.Explanation)
			}
			if d.RequestName != req.Name || d.ExpectedStateVersion != f.l.Version() {
				t.Errorf("request %q version %d", d.RequestName, d.ExpectedStateVersion)
			}
			for i, e := range d.Evictions {
				if e.Reason == "" || !strings.Contains(e.Reason, e.Location) || !strings.Contains(e.Reason, req.Name) {
					t.Errorf("eviction %d reason %q", i, e.Reason)
				}
				if a := d.Plan.Reclaim[i]; a.Handle != e.Handle || a.Location != e.Location {
					t.Errorf("eviction %d %v does not match reclaim %v", i, e, a)
				}
			}
			if tc.check != nil {
				tc.check(f, d)
			}
			f.exec(d)
			for _, a := range d.Plan.Enter {
				if !f.resident(a.Handle.Name, a.Location) {
					t.Errorf("%s not resident at %s after execution", a.Handle.Name, a.Location)
				}
			}
		})
	}
}

func dtCheckErr(t *testing.T, err error, kind string, reason []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Decide succeeded, want %s error", kind)
	}
	var pe *PlanError
	var le *SearchLimitError
	var ue *UnavailableError
	var ie *InvalidInputError
	ok := false
	switch kind {
	case "plan":
		ok = errors.As(err, &pe) && errors.Is(err, ErrPlan)
	case "limit":
		ok = errors.As(err, &le) && errors.Is(err, ErrPlan)
	case "unavailable":
		ok = errors.As(err, &ue)
	case "invalid":
		ok = errors.As(err, &ie) && errors.Is(err, ErrInvalidInput)
	}
	if !ok {
		t.Fatalf("error %T %v, want %s", err, err, kind)
	}
	for _, s := range reason {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func dtReq(name string, rs ...Requirement) Request { return Request{Name: name, Requirements: rs} }

var dtGPUs = []string{"cuda:0", "cuda:1"}

func TestDecideFitsWithoutEviction(t *testing.T) {
	dtRun(t, []dtCase{{
		name: "empty GPU",
		setup: func(f *dtFixture) Request {
			f.src("w", 40, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
		check: func(f *dtFixture, d Decision) {
			if d.Plan.Reclaim != nil || d.Evictions != nil {
				f.t.Errorf("victims %v", d.Evictions)
			}
			if p := d.Explanation.PredictedPeakBytes; p["cuda:0"] != 40 || p["pageable-host"] != 40 {
				f.t.Errorf("peaks %v (temporary reconstruction charge at the source included)", p)
			}
		},
	}, {
		name: "already resident adds nothing",
		setup: func(f *dtFixture) Request {
			f.src("w", 100, Replicable, "pageable-host", "cuda:0")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "exact fit",
		setup: func(f *dtFixture) Request {
			f.src("x", 60, Replicable, "pageable-host", "cuda:0")
			f.src("w", 40, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "no requirements, reservation only",
		setup: func(f *dtFixture) Request {
			return Request{Name: "r", Reservations: []ReservationSpec{{Name: "kv", Location: "cuda:0", Bytes: 10}}}
		},
		explored: 1, exhaustive: true,
		check: func(f *dtFixture, d Decision) {
			if len(d.Plan.Reservations) != 1 || d.Plan.Enter == nil && len(d.Plan.Enter) != 0 {
				f.t.Errorf("plan %+v", d.Plan)
			}
		},
	}})
}

// dtThree places x, y, z (30 bytes each, source pageable-host) at cuda:0
// with priorities H = 1, 2, 3.
func dtThree(f *dtFixture) {
	for i, n := range []string{"x", "y", "z"} {
		f.src(n, 30, Replicable, "pageable-host", "cuda:0")
		f.bump(n, "cuda:0", i)
	}
	for i, n := range []string{"x", "y", "z"} {
		if got := f.mat(n, "cuda:0").prio; got != int64(i+1) {
			f.t.Fatalf("%s H=%d", n, got)
		}
	}
}

func TestDecideVictimRule(t *testing.T) {
	// Each case fills cuda:0 (budget 100) with evictable values of known
	// priority plus a held filler, then requires w there.
	fill := func(f *dtFixture, spec ...any) {
		for i := 0; i < len(spec); i += 2 {
			name, bytes := spec[i].(string), int64(spec[i+1].(int))
			f.src(name, bytes, Replicable, "pageable-host", "cuda:0")
			f.bump(name, "cuda:0", i/2)
		}
	}
	dtRun(t, []dtCase{{
		name: "lowest priority first",
		setup: func(f *dtFixture) Request {
			dtThree(f) // 90 used, 10 free
			f.src("w", 30, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0")) // short 20
		},
		evict: dtList("x@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
		check: func(f *dtFixture, d Decision) {
			e := d.Evictions[0]
			if e.Bytes != 30 || !strings.Contains(e.Reason, "H=1") || !strings.Contains(e.Reason, "20-byte shortfall") {
				f.t.Errorf("eviction %+v", e)
			}
		},
	}, {
		name: "two lowest when one is not enough",
		setup: func(f *dtFixture) Request {
			dtThree(f)
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0")) // short 40
		},
		evict: dtList("x@cuda:0", "y@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		// a(5,H1) b(10,H2) c(40,H3) + held filler 40: 5 free. w=35 → short
		// 30. Running sums 5, 15, 55 reach 30 at c; c alone frees 40 ≥ 30,
		// so a and b stay although their priority is lower.
		name: "least valuable set keeps cheaper values that cannot help",
		setup: func(f *dtFixture) Request {
			fill(f, "a", 5, "b", 10, "c", 40)
			f.src("filler", 40, Replicable, "pageable-host", "cuda:0")
			f.hold("filler", "cuda:0")
			f.src("w", 35, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		evict: dtList("c@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		// a(10,H1) b(25,H2) c(30,H3) + held filler 30: 5 free. w=55 → short
		// 50. Running sums reach 50 at c; the rest (20) among a, b reaches
		// at b (10, 35); b frees 25 ≥ 20, so a stays.
		name: "recursive rule",
		setup: func(f *dtFixture) Request {
			fill(f, "a", 10, "b", 25, "c", 30)
			f.src("filler", 30, Replicable, "pageable-host", "cuda:0")
			f.hold("filler", "cuda:0")
			f.src("w", 55, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		evict: dtList("b@cuda:0", "c@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		// a(10,H1) b(20,H2) c(15,H3) + held filler 50: 5 free. w=45 → short
		// 40: c, then 25 among a, b → b, then 5 among a → a.
		name: "recursive rule down to the first",
		setup: func(f *dtFixture) Request {
			fill(f, "a", 10, "b", 20, "c", 15)
			f.src("filler", 50, Replicable, "pageable-host", "cuda:0")
			f.hold("filler", "cuda:0")
			f.src("w", 45, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		evict: dtList("a@cuda:0", "b@cuda:0", "c@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "equal priority: least recently used first",
		setup: func(f *dtFixture) Request {
			f.src("x", 50, Replicable, "pageable-host", "cuda:0")
			f.src("y", 50, Replicable, "pageable-host", "cuda:0")
			// A hold and its release touch x (last use) but not its H.
			hid := f.hold("x", "cuda:0")
			f.must(f.l.Unhold(hid))
			if f.mat("x", "cuda:0").prio != f.mat("y", "cuda:0").prio {
				f.t.Fatal("priorities differ")
			}
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		evict: dtList("y@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "equal priority and last use: registration order",
		setup: func(f *dtFixture) Request {
			f.src("x", 50, Replicable, "pageable-host", "cuda:0")
			f.src("y", 50, Replicable, "pageable-host", "cuda:0")
			f.setRank("y", "cuda:0", 7, 3)
			f.setRank("x", "cuda:0", 7, 3)
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		evict: dtList("x@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "victims of the request's own values are never chosen",
		setup: func(f *dtFixture) Request {
			f.src("x", 50, Replicable, "pageable-host", "cuda:0") // H=1, but required
			f.src("y", 50, Replicable, "pageable-host", "cuda:0")
			f.bump("y", "cuda:0", 3)
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"), f.need("x", "pinned-host"))
		},
		evict: dtList("y@cuda:0"), enter: dtList("w@cuda:0", "x@pinned-host"), explored: 1, exhaustive: true,
	}})
}

func TestCandidateOrder(t *testing.T) {
	cs := []candidate{
		{id: 2, prio: 1, lastUse: 5},
		{id: 1, prio: 1, lastUse: 5},
		{id: 1, prio: 1, lastUse: 4},
		{id: 2, prio: 0, lastUse: 9},
	}
	for i := 0; i+1 < len(cs); i++ {
		if !candLess(&cs[i+1], &cs[i]) || candLess(&cs[i], &cs[i+1]) {
			t.Errorf("order of %d and %d", i, i+1)
		}
	}
}

func TestLeastValuableSet(t *testing.T) {
	for _, tc := range []struct {
		sizes []int64
		n     int64
		want  []int // ascending
	}{
		{[]int64{30, 30, 30}, 20, []int{0}},
		{[]int64{30, 30, 30}, 40, []int{0, 1}},
		{[]int64{5, 10, 40}, 30, []int{2}},
		{[]int64{10, 25, 30}, 50, []int{1, 2}},
		{[]int64{10, 20, 15}, 40, []int{0, 1, 2}},
		{[]int64{10, 20, 15}, 45, []int{0, 1, 2}},
		{[]int64{7}, 7, []int{0}},
		{[]int64{1, 2, 4, 8, 16}, 11, []int{0, 1, 3}},
	} {
		prefix := []int64{0}
		for _, s := range tc.sizes {
			prefix = append(prefix, prefix[len(prefix)-1]+s)
		}
		got := leastValuableSet(prefix, tc.n, nil)
		for i, j := 0, len(got)-1; i < j; i, j = i+1, j-1 {
			got[i], got[j] = got[j], got[i]
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("sizes %v n %d: %v, want %v", tc.sizes, tc.n, got, tc.want)
		}
	}
}

func TestDecidePlacementChoice(t *testing.T) {
	dtRun(t, []dtCase{{
		name: "second GPU of the tier when it needs no eviction",
		setup: func(f *dtFixture) Request {
			f.src("x", 100, Replicable, "pageable-host", "cuda:0")
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", dtGPUs))
		},
		enter: dtList("w@cuda:1"), explored: 2, exhaustive: true,
	}, {
		name: "GPU with lower victim priorities",
		setup: func(f *dtFixture) Request {
			f.src("x", 100, Replicable, "pageable-host", "cuda:0")
			f.bump("x", "cuda:0", 4) // H=5
			f.src("y", 100, Replicable, "pageable-host", "cuda:1")
			f.bump("y", "cuda:1", 1) // H=2
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", dtGPUs))
		},
		evict: dtList("y@cuda:1"), enter: dtList("w@cuda:1"), explored: 2, exhaustive: true,
	}, {
		name: "equal victim priorities: the GPU where the value is resident",
		setup: func(f *dtFixture) Request {
			f.src("w", 50, Replicable, "pageable-host", "cuda:1")
			return dtReq("r", f.need("w", dtGPUs))
		},
		enter: dtList("w@cuda:1"), explored: 2, exhaustive: true,
	}, {
		name: "equal victim priorities: fewer evicted bytes",
		setup: func(f *dtFixture) Request {
			// cuda:0 would evict x (H=1, 90 bytes); cuda:1 evicts y (H=1,
			// 60 bytes: the first in candidate order whose running sum
			// reaches the 40-byte shortfall). Same priorities, same
			// transfer: fewer evicted bytes wins.
			f.src("x", 90, Replicable, "pageable-host", "cuda:0")
			f.src("y", 60, Replicable, "pageable-host", "cuda:1")
			f.src("z", 40, Replicable, "pageable-host", "cuda:1")
			f.src("w", 40, Replicable, "pageable-host")
			return dtReq("r", f.need("w", dtGPUs))
		},
		evict: dtList("y@cuda:1"), enter: dtList("w@cuda:1"), explored: 2, exhaustive: true,
	}, {
		name: "equal rank: earliest position",
		setup: func(f *dtFixture) Request {
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", dtGPUs))
		},
		enter: dtList("w@cuda:0"), explored: 2, exhaustive: true,
	}, {
		name: "tier order beats evictions",
		setup: func(f *dtFixture) Request {
			f.src("x", 100, Replicable, "pageable-host", "cuda:0")
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0", "pinned-host"))
		},
		evict: dtList("x@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "fallback to the second tier when the first is blocked",
		setup: func(f *dtFixture) Request {
			f.src("x", 100, Replicable, "pageable-host", "cuda:0")
			f.hold("x", "cuda:0")
			f.src("y", 100, Replicable, "pageable-host", "cuda:1")
			f.lease("y", "cuda:1")
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", dtGPUs, "pinned-host"))
		},
		enter: dtList("w@pinned-host"), explored: 3, exhaustive: true,
	}, {
		name: "first requirement's tier is most significant",
		setup: func(f *dtFixture) Request {
			f.src("a", 60, Replicable, "pageable-host")
			f.src("b", 60, Replicable, "pageable-host")
			// Both fit on cuda:0 only one at a time: (0,0) is infeasible
			// without cuda:0 room; (0,1) puts b on pinned-host.
			f.src("x", 40, Replicable, "pageable-host", "cuda:0")
			f.hold("x", "cuda:0")
			return dtReq("r", f.need("a", "cuda:0", "pinned-host"), f.need("b", "cuda:0", "pinned-host"))
		},
		enter: dtList("a@cuda:0", "b@pinned-host"), explored: 2, exhaustive: true,
	}, {
		name: "replicable value required at two locations",
		setup: func(f *dtFixture) Request {
			f.src("w", 60, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"), f.need("w", "cuda:1"))
		},
		enter: dtList("w@cuda:0", "w@cuda:1"), explored: 1, exhaustive: true,
		check: func(f *dtFixture, d Decision) {
			// The first enter reconstructs (temporary charge at the
			// source), the second copies from cuda:0.
			p := d.Explanation.PredictedPeakBytes
			if p["cuda:0"] != 60 || p["cuda:1"] != 60 || p["pageable-host"] != 60 {
				f.t.Errorf("peaks %v", p)
			}
			f.t.Cleanup(func() {
				if !f.resident("w", "cuda:0") || !f.resident("w", "cuda:1") {
					f.t.Error("w not resident at both GPUs")
				}
			})
		},
	}, {
		name: "replicable value required twice at one location",
		setup: func(f *dtFixture) Request {
			f.src("w", 60, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"), f.need("w", "cuda:0"))
		},
		enter: dtList("w@cuda:0", "w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "exclusive value moves",
		setup: func(f *dtFixture) Request {
			f.at("e", 70, Exclusive, "pinned-host")
			f.src("x", 50, Replicable, "pageable-host", "cuda:0")
			return dtReq("r", f.need("e", "cuda:0"))
		},
		evict: dtList("x@cuda:0"), enter: dtList("e@cuda:0"), explored: 1, exhaustive: true,
		check: func(f *dtFixture, d Decision) {
			f.t.Cleanup(func() {
				if f.resident("e", "pinned-host") {
					f.t.Error("exclusive value still at pinned-host after the move")
				}
			})
		},
	}, {
		name: "reservation adds to the shortfall",
		setup: func(f *dtFixture) Request {
			dtThree(f)
			f.src("w", 10, Replicable, "pageable-host")
			r := dtReq("r", f.need("w", "cuda:0"))
			r.Reservations = []ReservationSpec{{Name: "kv", Location: "cuda:0", Bytes: 30}}
			return r // adds 40, free 10: short 30
		},
		evict: dtList("x@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
		check: func(f *dtFixture, d Decision) {
			if len(d.Plan.Reservations) != 1 || d.Plan.Reservations[0].Name != "kv" {
				f.t.Errorf("reservations %v", d.Plan.Reservations)
			}
		},
	}})
}

func TestDecideInflationAfterEviction(t *testing.T) {
	f := dtNew(t, "pageable-host", "cuda:0=100")
	dtThree(f)
	f.src("w", 30, Replicable, "pageable-host")
	if f.inflation("cuda:0") != 0 {
		t.Fatal("L starts at 0")
	}
	d, err := f.l.Decide(dtReq("r", f.need("w", "cuda:0")), 0)
	f.must(err)
	f.exec(d)
	// x (H=1) was evicted: L(cuda:0) = 1; w completed with freq 1: H = 2.
	if got := f.inflation("cuda:0"); got != 1 {
		t.Errorf("L(cuda:0) = %d, want 1", got)
	}
	if got := f.mat("w", "cuda:0").prio; got != 2 {
		t.Errorf("H(w) = %d, want L+freq = 2", got)
	}
	// Now w ties with y (H=2) and was used later: y goes next.
	f.src("v", 30, Replicable, "pageable-host")
	d, err = f.l.Decide(dtReq("r2", f.need("v", "cuda:0")), 0)
	f.must(err)
	if got := dtEvictions(d); !reflect.DeepEqual(got, dtList("y@cuda:0")) {
		t.Errorf("second victims %v", got)
	}
	f.exec(d)
	if got := f.inflation("cuda:0"); got != 2 {
		t.Errorf("L(cuda:0) = %d, want 2", got)
	}
	if got := f.mat("v", "cuda:0").prio; got != 3 {
		t.Errorf("H(v) = %d, want 3", got)
	}
}

func TestDecideProtectedSkipped(t *testing.T) {
	protect := map[string]func(f *dtFixture){
		"lease":         func(f *dtFixture) { f.lease("x", "cuda:0") },
		"hold":          func(f *dtFixture) { f.hold("x", "cuda:0") },
		"pending event": func(f *dtFixture) { f.pendingEvent("x", "cuda:0") },
	}
	var cases []dtCase
	for _, kind := range []string{"lease", "hold", "pending event"} {
		p := protect[kind]
		cases = append(cases, dtCase{
			name: kind + ": next candidate",
			setup: func(f *dtFixture) Request {
				dtThree(f)
				p(f) // x is the lowest priority but protected
				// the pending-event lease raised x's H; pin it back to 1
				f.setRank("x", "cuda:0", 1, f.mat("x", "cuda:0").lastUse)
				f.src("w", 30, Replicable, "pageable-host")
				return dtReq("r", f.need("w", "cuda:0"))
			},
			evict: dtList("y@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
		}, dtCase{
			name: kind + ": nothing else, no waiting",
			setup: func(f *dtFixture) Request {
				f.src("x", 100, Replicable, "pageable-host", "cuda:0")
				p(f)
				f.src("w", 30, Replicable, "pageable-host")
				return dtReq("r", f.need("w", "cuda:0"))
			},
			err:    "plan",
			reason: []string{"budget at cuda:0: short 30 bytes", "100 bytes protected by leases, holds or pending events"},
		})
	}
	cases = append(cases, dtCase{
		name: "protected source of an exclusive move",
		setup: func(f *dtFixture) Request {
			f.at("e", 30, Exclusive, "pinned-host")
			f.lease("e", "pinned-host")
			return dtReq("r", f.need("e", "cuda:0"))
		},
		err:    "plan",
		reason: []string{"protected", "e would move from pinned-host to cuda:0", "1 leases"},
	})
	dtRun(t, cases)
}

func TestDecideUnrecoverableNeverChosen(t *testing.T) {
	dtRun(t, []dtCase{{
		name: "last copy without a source",
		setup: func(f *dtFixture) Request {
			f.at("only", 50, Replicable, "cuda:0") // H=1, last copy
			f.src("y", 50, Replicable, "pageable-host", "cuda:0")
			f.bump("y", "cuda:0", 5)
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		evict: dtList("y@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "last copy is the only room",
		setup: func(f *dtFixture) Request {
			f.at("only", 100, Replicable, "cuda:0")
			f.src("w", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		err:    "plan",
		reason: []string{"short 50 bytes", "100 bytes last copies of values without a source"},
	}, {
		// z (no source) is resident at both GPUs with the lowest H at
		// each. Each location alone would evict z; together they would
		// lose it. Locations are settled in location order: cuda:0 takes
		// z, cuda:1 its next candidate.
		name: "last two copies at two locations",
		setup: func(f *dtFixture) Request {
			f.at("z", 50, Replicable, "cuda:0", "cuda:1")
			f.src("y0", 50, Replicable, "pageable-host", "cuda:0")
			f.bump("y0", "cuda:0", 3)
			f.src("y1", 50, Replicable, "pageable-host", "cuda:1")
			f.bump("y1", "cuda:1", 3)
			f.setRank("z", "cuda:0", 1, 1)
			f.setRank("z", "cuda:1", 1, 1)
			f.src("a", 50, Replicable, "pageable-host")
			f.src("b", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("a", "cuda:0"), f.need("b", "cuda:1"))
		},
		evict: dtList("z@cuda:0", "y1@cuda:1"), enter: dtList("a@cuda:0", "b@cuda:1"), explored: 1, exhaustive: true,
		check: func(f *dtFixture, d Decision) {
			f.t.Cleanup(func() {
				if !f.resident("z", "cuda:1") {
					f.t.Error("z lost")
				}
			})
		},
	}, {
		name: "last two copies and no other room",
		setup: func(f *dtFixture) Request {
			f.at("z", 100, Replicable, "cuda:0", "cuda:1")
			f.src("a", 50, Replicable, "pageable-host")
			f.src("b", 50, Replicable, "pageable-host")
			return dtReq("r", f.need("a", "cuda:0"), f.need("b", "cuda:1"))
		},
		err:    "plan",
		reason: []string{"unrecoverable", "cuda:1", "short 50"},
	}})
}

func TestDecideReconstructionChargeAtSource(t *testing.T) {
	dtRun(t, []dtCase{{
		name: "temporary charge does not fit at the source",
		setup: func(f *dtFixture) Request {
			f.src("filler", 80, Replicable, "pageable-host", "pinned-host")
			f.hold("filler", "pinned-host")
			f.src("w", 30, Replicable, "pinned-host") // loads through pinned-host
			return dtReq("r", f.need("w", "cuda:0"))
		},
		err:    "plan",
		reason: []string{"budget at pinned-host: short 10 bytes", "80 bytes protected"},
	}, {
		name: "temporary charge evicts at the source",
		setup: func(f *dtFixture) Request {
			f.src("x", 80, Replicable, "pageable-host", "pinned-host")
			f.src("w", 30, Replicable, "pinned-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		evict: dtList("x@pinned-host"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}, {
		name: "no temporary charge when the destination is the source",
		setup: func(f *dtFixture) Request {
			f.src("x", 70, Replicable, "pageable-host", "pinned-host")
			f.hold("x", "pinned-host")
			f.src("w", 30, Replicable, "pinned-host")
			return dtReq("r", f.need("w", "pinned-host"))
		},
		enter: dtList("w@pinned-host"), explored: 1, exhaustive: true,
	}, {
		name: "a resident copy is preferred to reconstruction",
		setup: func(f *dtFixture) Request {
			f.src("w", 30, Replicable, "pinned-host", "cuda:1")
			f.src("filler", 80, Replicable, "pageable-host", "pinned-host")
			f.hold("filler", "pinned-host")
			return dtReq("r", f.need("w", "cuda:0"))
		},
		enter: dtList("w@cuda:0"), explored: 1, exhaustive: true,
	}})
}

func TestDecideLimits(t *testing.T) {
	blocked := func(f *dtFixture) Request {
		f.src("x", 100, Replicable, "pageable-host", "cuda:0")
		f.hold("x", "cuda:0")
		f.src("y", 100, Replicable, "pageable-host", "cuda:1")
		f.hold("y", "cuda:1")
		f.src("w", 50, Replicable, "pageable-host")
		return dtReq("r", f.need("w", dtGPUs))
	}
	oneFeasibleEach := func(f *dtFixture) Request {
		f.src("x", 100, Replicable, "pageable-host", "cuda:0")
		f.src("w", 50, Replicable, "pageable-host")
		return dtReq("r", f.need("w", dtGPUs))
	}
	dtRun(t, []dtCase{{
		name:  "exhaustive infeasible search",
		setup: blocked,
		err:   "plan",
		reason: []string{`request "r": no feasible assignment (2 explored, search exhaustive)`,
			"budget at cuda:0: short 50 bytes", "budget at cuda:1: short 50 bytes", "w→cuda:1"},
	}, {
		name:  "limit equal to the whole search is not a limit",
		setup: blocked, limit: 2,
		err: "plan", reason: []string{"2 explored, search exhaustive"},
	}, {
		name:  "limit after a feasible assignment",
		setup: oneFeasibleEach, limit: 1,
		evict: dtList("x@cuda:0"), enter: dtList("w@cuda:0"), explored: 1, exhaustive: false,
	}, {
		name:  "same request within the limit",
		setup: oneFeasibleEach, limit: 2,
		enter: dtList("w@cuda:1"), explored: 2, exhaustive: true,
	}})

	// The limit reached before any feasible assignment: exact fields.
	f := dtNew(t, "pageable-host", "pinned-host=100", "cuda:0=100", "cuda:1=100")
	req := blocked(f)
	_, err := f.l.Decide(req, 1)
	var le *SearchLimitError
	if !errors.As(err, &le) || !errors.Is(err, ErrPlan) {
		t.Fatalf("%T %v", err, err)
	}
	var pe *PlanError
	if errors.As(err, &pe) {
		t.Fatal("a search limit is not proof of infeasibility")
	}
	want := SearchLimitError{RequestName: "r", StateLimit: 1, ExploredStates: 1,
		Detail: "no feasible assignment among the 1 evaluated; stopped before tier-index vector [0], position vector [1]; last blocker: " +
			"budget at cuda:0: short 50 bytes (budget 100, used 100, reserved 0), but evictable candidates free at most 0; not evictable there: 100 bytes protected by leases, holds or pending events, 0 bytes last copies of values without a source, 0 bytes required by this request, 0 bytes in flight (entering, leaving or the source of a copy)"}
	if *le != want {
		t.Errorf("limit error\n%+v\nwant\n%+v", *le, want)
	}
	// The default limit and an invalid one.
	if _, err := f.l.Decide(req, -1); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("negative limit: %v", err)
	}
}

func TestDecideLimitAcrossTierVectors(t *testing.T) {
	// Two requirements with two single-location tiers each: tier vectors
	// (0,0), (0,1), (1,0), (1,1). Only (1,1) is feasible.
	setup := func(f *dtFixture) Request {
		f.src("x", 100, Replicable, "pageable-host", "cuda:0")
		f.hold("x", "cuda:0")
		f.src("a", 10, Replicable, "pageable-host")
		f.src("b", 10, Replicable, "pageable-host")
		return dtReq("r", f.need("a", "cuda:0", "cuda:1"), f.need("b", "cuda:0", "pinned-host"))
	}
	dtRun(t, []dtCase{{
		name: "found on the fourth", setup: setup,
		enter: dtList("a@cuda:1", "b@pinned-host"), explored: 4, exhaustive: true,
	}, {
		name: "limit three", setup: setup, limit: 3,
		err: "limit", reason: []string{"explored 3 of limit 3", "tier-index vector [1 1]"},
	}})
}

func TestDecideValidation(t *testing.T) {
	other, err := New(Config{ManagerID: "other", Locations: []LocationConfig{{Name: "cuda:0"}}})
	if err != nil {
		t.Fatal(err)
	}
	foreign, _, err := other.Register(ValueSpec{Name: "f", Bytes: 1, Source: "cuda:0"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		req    func(f *dtFixture) Request
		limit  int
		err    string
		reason []string
		is     error
	}{
		{name: "empty request name", req: func(f *dtFixture) Request { return Request{} }, err: "invalid", reason: []string{"request name is empty"}},
		{name: "negative limit", limit: -3, req: func(f *dtFixture) Request { return dtReq("r", f.need("w", "cuda:0")) }, err: "invalid", reason: []string{"-3"}},
		{name: "foreign handle", req: func(f *dtFixture) Request {
			return dtReq("r", Requirement{Handle: foreign, Tiers: [][]string{{"cuda:0"}}})
		}, err: "unavailable", is: ErrForeign},
		{name: "discarded handle", req: func(f *dtFixture) Request {
			r := dtReq("r", f.need("gone", "cuda:0"))
			_, err := f.l.Discard(f.h["gone"])
			f.must(err)
			return r
		}, err: "unavailable", is: ErrDiscarded},
		{name: "unknown handle", req: func(f *dtFixture) Request {
			return dtReq("r", Requirement{Handle: Handle{Manager: "dt", ID: 99, Name: "nope"}, Tiers: [][]string{{"cuda:0"}}})
		}, err: "invalid", reason: []string{"unknown handle"}},
		{name: "malformed location", req: func(f *dtFixture) Request { return dtReq("r", f.need("w", "gpu0")) }, err: "invalid", reason: []string{`"gpu0"`}},
		{name: "unconfigured location", req: func(f *dtFixture) Request { return dtReq("r", f.need("w", "cuda:0", "cuda:7")) }, err: "unavailable", reason: []string{"cuda:7", "not configured"}},
		{name: "reservation without name", req: func(f *dtFixture) Request {
			return Request{Name: "r", Reservations: []ReservationSpec{{Location: "cuda:0", Bytes: 1}}}
		}, err: "invalid", reason: []string{"empty name"}},
		{name: "reservation twice", req: func(f *dtFixture) Request {
			return Request{Name: "r", Reservations: []ReservationSpec{{Name: "k", Location: "cuda:0", Bytes: 1}, {Name: "k", Location: "cuda:1", Bytes: 1}}}
		}, err: "invalid", reason: []string{`"k" appears twice`}},
		{name: "reservation already active", req: func(f *dtFixture) Request {
			f.must(f.l.Reserve("cuda:1", "k", 5))
			return Request{Name: "r", Reservations: []ReservationSpec{{Name: "k", Location: "cuda:0", Bytes: 1}}}
		}, err: "invalid", reason: []string{"already active"}},
		{name: "reservation of zero bytes", req: func(f *dtFixture) Request {
			return Request{Name: "r", Reservations: []ReservationSpec{{Name: "k", Location: "cuda:0"}}}
		}, err: "invalid", reason: []string{"bytes must be positive"}},
		{name: "reservation at an unconfigured location", req: func(f *dtFixture) Request {
			return Request{Name: "r", Reservations: []ReservationSpec{{Name: "k", Location: "cuda:3", Bytes: 1}}}
		}, err: "unavailable"},
		{name: "exclusive handle twice", req: func(f *dtFixture) Request {
			return dtReq("r", f.need("e", "cuda:0"), f.need("e", "cuda:1"))
		}, err: "plan", reason: []string{"exclusive"}},
		{name: "no locations", req: func(f *dtFixture) Request { return dtReq("r", f.need("w")) }, err: "plan", reason: []string{"no locations"}},
		{name: "empty tier", req: func(f *dtFixture) Request { return dtReq("r", f.need("w", "cuda:0", []string{})) }, err: "plan", reason: []string{"tier 1 has no locations"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := dtNew(t, "pageable-host", "cuda:0=100", "cuda:1=100")
			f.src("w", 10, Replicable, "pageable-host")
			f.src("e", 10, Exclusive, "pageable-host")
			f.src("gone", 10, Replicable, "pageable-host")
			req := tc.req(f)
			before, v := f.l.Snapshot(), f.l.Version()
			_, err := f.l.Decide(req, tc.limit)
			dtCheckErr(t, err, tc.err, tc.reason)
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("%v is not %v", err, tc.is)
			}
			if f.l.Version() != v || !reflect.DeepEqual(before, f.l.Snapshot()) {
				t.Error("a refused Decide changed the ledger")
			}
		})
	}
}

func TestDecideDeterministicAndReadOnly(t *testing.T) {
	f := dtNew(t, "pageable-host", "pinned-host=300", "cuda:0=400", "cuda:1=400")
	for i := range 12 {
		name := fmt.Sprintf("v%d", i)
		f.src(name, int64(20+7*i), Replicable, "pageable-host", dtGPUs[i%2])
		f.bump(name, dtGPUs[i%2], i%4)
	}
	f.at("solo", 30, Replicable, "pinned-host")
	f.src("a", 90, Replicable, "pageable-host")
	f.src("b", 70, Exclusive, "pageable-host", "pinned-host")
	f.lease("v3", "cuda:1")
	req := Request{Name: "r", Requirements: []Requirement{
		f.need("a", dtGPUs, "pinned-host"),
		f.need("b", dtGPUs, "pinned-host"),
		f.need("v1", dtGPUs),
	}, Reservations: []ReservationSpec{{Name: "kv", Location: "cuda:0", Bytes: 40}}}
	before, trace, v := f.l.Snapshot(), f.l.Trace(), f.l.Version()
	d1, err1 := f.l.Decide(req, 0)
	d2, err2 := f.l.Decide(req, 0)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if !reflect.DeepEqual(d1, d2) {
		t.Fatalf("two decisions differ:\n%+v\n%+v", d1, d2)
	}
	if f.l.Version() != v || !reflect.DeepEqual(before, f.l.Snapshot()) || !reflect.DeepEqual(trace, f.l.Trace()) {
		t.Fatal("Decide changed the ledger")
	}
	if len(d1.Evictions) == 0 {
		t.Fatalf("expected evictions in this state: %+v", d1)
	}
	// Rebuilding the same state from scratch gives the same decision.
	g := dtNew(t, "pageable-host", "pinned-host=300", "cuda:0=400", "cuda:1=400")
	for i := range 12 {
		name := fmt.Sprintf("v%d", i)
		g.src(name, int64(20+7*i), Replicable, "pageable-host", dtGPUs[i%2])
		g.bump(name, dtGPUs[i%2], i%4)
	}
	g.at("solo", 30, Replicable, "pinned-host")
	g.src("a", 90, Replicable, "pageable-host")
	g.src("b", 70, Exclusive, "pageable-host", "pinned-host")
	g.lease("v3", "cuda:1")
	d3, err := g.l.Decide(req, 0)
	if err != nil || !reflect.DeepEqual(d1, d3) {
		t.Fatalf("rebuilt state decides differently: %v\n%+v\n%+v", err, d1, d3)
	}
	f.exec(d1)
}

func TestDecideStaleDecisionRefused(t *testing.T) {
	f := dtNew(t, "pageable-host", "cuda:0=100")
	f.src("w", 40, Replicable, "pageable-host")
	f.src("x", 10, Replicable, "pageable-host", "cuda:0")
	d, err := f.l.Decide(dtReq("r", f.need("w", "cuda:0")), 0)
	f.must(err)
	f.bump("x", "cuda:0", 1)
	_, err = dtExecute(f.l, d)
	var se *StaleStateError
	if !errors.As(err, &se) || se.ExpectedVersion != d.ExpectedStateVersion || se.ActualVersion != f.l.Version() {
		t.Fatalf("%v", err)
	}
}

func TestDecideRejectedByExplain(t *testing.T) {
	// Make the final check refuse every plan that enters at cuda:1, the
	// best assignment here: the search must fall back to the next best of
	// the same tier vector, keep its explored count, and name the refusal
	// if nothing else is left.
	orig := decideExplain
	t.Cleanup(func() { decideExplain = orig })
	decideExplain = func(l *Ledger, p Plan) (Explanation, error) {
		for _, a := range p.Enter {
			if a.Location == "cuda:1" {
				return Explanation{Reason: "test refuses cuda:1"}, errors.New("test refuses cuda:1")
			}
		}
		return orig(l, p)
	}
	f := dtNew(t, "pageable-host", "pinned-host=100", "cuda:0=100", "cuda:1=100")
	f.src("x", 100, Replicable, "pageable-host", "cuda:0")
	f.src("w", 50, Replicable, "pageable-host")
	d, err := f.l.Decide(dtReq("r", f.need("w", dtGPUs)), 0)
	f.must(err)
	if got := dtEnters(d); !reflect.DeepEqual(got, dtList("w@cuda:0")) || d.ExploredStates != 2 || !d.Exhaustive {
		t.Fatalf("%v explored %d exhaustive %v", got, d.ExploredStates, d.Exhaustive)
	}
	_, err = f.l.Decide(dtReq("r", f.need("w", "cuda:1")), 0)
	dtCheckErr(t, err, "plan", []string{"1 explored", "internal: the controller's arithmetic admitted a plan that Explain finds infeasible: test refuses cuda:1"})
}
