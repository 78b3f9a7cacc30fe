package tests

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

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/testhooks"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/messages"
	"github.com/residency-go/residency/system"
)

var stressLocations = []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}

// stressValue is a registered value and the bytes it must always read as.
type stressValue struct {
	h    system.Handle
	data []byte
	mode system.ReplicaMode
}

// stressShared is what the workers share: every value registered so far.
type stressShared struct {
	mu     sync.Mutex
	values []*stressValue
}

func (s *stressShared) add(v *stressValue) {
	s.mu.Lock()
	s.values = append(s.values, v)
	s.mu.Unlock()
}

// remove drops a discarded value (other workers may still hold its handle
// for a while: their calls get UnavailableError, discarded).
func (s *stressShared) remove(v *stressValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.values {
		if x == v {
			s.values = append(s.values[:i], s.values[i+1:]...)
			return
		}
	}
}

func (s *stressShared) pick(r *rand.Rand) *stressValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.values) == 0 {
		return nil
	}
	return s.values[r.IntN(len(s.values))]
}

// stressTally counts outcomes.
type stressTally struct {
	ops      int
	ok       map[string]int
	errs     map[string]int // by error type
	causes   map[string]int // PlanExecutionError causes
	untyped  []string
	failures []string // broken expectations
}

func newTally() *stressTally {
	return &stressTally{ok: map[string]int{}, errs: map[string]int{}, causes: map[string]int{}}
}

func (t *stressTally) merge(o *stressTally) {
	t.ops += o.ops
	for k, v := range o.ok {
		t.ok[k] += v
	}
	for k, v := range o.errs {
		t.errs[k] += v
	}
	for k, v := range o.causes {
		t.causes[k] += v
	}
	t.untyped = append(t.untyped, o.untyped...)
	t.failures = append(t.failures, o.failures...)
}

// stressWorker runs random operations on one goroutine.
type stressWorker struct {
	id     int
	r      *rand.Rand
	sys    *system.System
	shared *stressShared
	tally  *stressTally

	own    []*stressValue
	leases []*system.Lease
	holds  []*system.Hold
	events []*system.ManualEvent // recorded, not completed
	resv   []string
	seq    int
}

func (w *stressWorker) name(kind string) string {
	w.seq++
	return fmt.Sprintf("g%02d-%s%d", w.id, kind, w.seq)
}

func (w *stressWorker) loc() string { return stressLocations[w.r.IntN(len(stressLocations))] }

func (w *stressWorker) fail(format string, args ...any) {
	if len(w.tally.failures) < 20 {
		w.tally.failures = append(w.tally.failures, fmt.Sprintf("worker %d: ", w.id)+fmt.Sprintf(format, args...))
	}
}

// outcome records the result of op; every error must be a typed one.
func (w *stressWorker) outcome(op string, err error) bool {
	if err == nil {
		w.tally.ok[op]++
		return true
	}
	typ := errorType(err)
	if typ == "" {
		if len(w.tally.untyped) < 20 {
			w.tally.untyped = append(w.tally.untyped, fmt.Sprintf("%s: %T: %v", op, err, err))
		}
		w.tally.errs["untyped"]++
		return false
	}
	w.tally.errs[typ]++
	var pe *system.PlanExecutionError
	if errors.As(err, &pe) {
		cause := "untyped"
		switch {
		case errors.Is(pe.Cause, cuda.ErrInjectedFault):
			cause = "injected fault"
		case errorType(pe.Cause) != "":
			cause = errorType(pe.Cause)
		}
		if cause == "untyped" && len(w.tally.untyped) < 20 {
			w.tally.untyped = append(w.tally.untyped, fmt.Sprintf("%s: cause %T: %v", op, pe.Cause, pe.Cause))
		}
		w.tally.causes[cause]++
	}
	return false
}

// checkRead reads v at loc through a lease and compares the bytes.
func (w *stressWorker) checkRead(ctx context.Context, l *system.Lease, v *stressValue) {
	got, err := l.Read(ctx)
	if err != nil {
		w.fail("read %s at %s through a lease: %v", v.h.Name, l.Location(), err)
		return
	}
	if string(got) != string(v.data) {
		w.fail("read %s at %s: bytes differ", v.h.Name, l.Location())
	}
}

func (w *stressWorker) step(ctx context.Context, faults *cuda.Faults) {
	w.tally.ops++
	sys := w.sys
	n := w.r.IntN(100)
	if n >= 5 && n < 10 && len(w.own) >= 8 {
		n = 10 + w.r.IntN(15) // enough values of our own: place instead
	}
	switch {
	case n < 5: // inject a fault
		kinds := []cuda.FaultKind{cuda.FaultAlloc, cuda.FaultCopy, cuda.FaultReconstruct}
		faults.Arm(kinds[w.r.IntN(len(kinds))], w.loc())
		w.tally.ok["arm fault"]++
	case n < 10: // register
		size := 256 * (1 + w.r.IntN(16))
		v := &stressValue{data: pattern(size, byte(w.r.Uint32())), mode: system.Exclusive}
		if w.r.IntN(2) == 0 {
			v.mode = system.Replicable
		}
		spec := system.Value{Name: w.name("v"), Bytes: int64(size), Mode: v.mode}
		if w.r.IntN(2) == 0 {
			spec.At, spec.Data = w.loc(), v.data
		} else {
			spec.Source, spec.Loader = w.loc(), loaderOf(v.data)
		}
		h, err := sys.Register(ctx, spec)
		if w.outcome("register", err) {
			v.h = h
			w.own = append(w.own, v)
			w.shared.add(v)
		}
	case n < 25: // place
		if v := w.shared.pick(w.r); v != nil {
			w.outcome("place", sys.Place(ctx, v.h, w.loc()))
		}
	case n < 29: // copy
		if v := w.shared.pick(w.r); v != nil {
			w.outcome("copy", sys.Copy(ctx, v.h, w.loc(), w.loc()))
		}
	case n < 33: // move
		if v := w.shared.pick(w.r); v != nil {
			w.outcome("move", sys.Move(ctx, v.h, w.loc(), w.loc()))
		}
	case n < 40: // evict
		if v := w.shared.pick(w.r); v != nil {
			w.outcome("evict", sys.Evict(ctx, v.h, w.loc()))
		}
	case n < 42: // discard one of ours
		if len(w.own) > 0 {
			i := w.r.IntN(len(w.own))
			v := w.own[i]
			if w.outcome("discard", sys.Discard(ctx, v.h)) {
				w.own = append(w.own[:i], w.own[i+1:]...)
				w.shared.remove(v)
			}
		}
	case n < 52: // acquire (half the time right after a place there), read, then release or keep
		v := w.shared.pick(w.r)
		if v == nil {
			return
		}
		at := w.loc()
		if w.r.IntN(2) == 0 && !w.outcome("place", sys.Place(ctx, v.h, at)) {
			return
		}
		l, err := sys.Acquire(ctx, v.h, at)
		if !w.outcome("acquire", err) {
			return
		}
		w.checkRead(ctx, l, v)
		if len(w.leases) < 3 && w.r.IntN(2) == 0 {
			w.leases = append(w.leases, l)
			return
		}
		w.outcome("release", l.Release(ctx))
	case n < 58: // release a kept lease
		if len(w.leases) > 0 {
			i := w.r.IntN(len(w.leases))
			if w.outcome("release", w.leases[i].Release(ctx)) {
				w.leases = append(w.leases[:i], w.leases[i+1:]...)
			}
		}
	case n < 62: // record an event on a kept lease
		if len(w.leases) > 0 && len(w.events) < 3 {
			ev := system.NewManualEvent()
			if _, err := w.leases[w.r.IntN(len(w.leases))].RecordEvent(ctx, ev); w.outcome("record event", err) {
				w.events = append(w.events, ev)
			}
		}
	case n < 65: // complete an event (the runtime reaps it on its own)
		if len(w.events) > 0 {
			i := w.r.IntN(len(w.events))
			w.events[i].Complete()
			w.events = append(w.events[:i], w.events[i+1:]...)
			w.tally.ok["complete event"]++
		}
	case n < 70: // hold / unhold
		if len(w.holds) > 0 && (len(w.holds) >= 2 || w.r.IntN(2) == 0) {
			i := w.r.IntN(len(w.holds))
			if w.outcome("unhold", w.holds[i].Release(ctx)) {
				w.holds = append(w.holds[:i], w.holds[i+1:]...)
			}
			return
		}
		if v := w.shared.pick(w.r); v != nil {
			hd, err := sys.Hold(ctx, v.h, w.loc())
			if w.outcome("hold", err) {
				w.holds = append(w.holds, hd)
			}
		}
	case n < 76: // reserve / unreserve
		if len(w.resv) > 0 && (len(w.resv) >= 2 || w.r.IntN(2) == 0) {
			i := w.r.IntN(len(w.resv))
			if w.outcome("unreserve", sys.Unreserve(ctx, w.resv[i])) {
				w.resv = append(w.resv[:i], w.resv[i+1:]...)
			}
			return
		}
		name := w.name("r")
		if w.outcome("reserve", sys.Reserve(ctx, w.loc(), name, int64(256*(1+w.r.IntN(16))))) {
			w.resv = append(w.resv, name)
		}
	case n < 80: // explain a small plan
		plan := w.smallPlan(false)
		ex, err := sys.Explain(ctx, plan)
		if w.outcome("explain", err) && len(ex.PredictedPeakBytes) != len(stressLocations) {
			w.fail("explain predicted %v", ex.PredictedPeakBytes)
		}
	case n < 88: // decide, sometimes with a tiny limit, then enter the scope
		req := w.request()
		if req == nil {
			return
		}
		limit := 0
		if w.r.IntN(4) == 0 {
			limit = 1 + w.r.IntN(3)
		}
		d, err := sys.DecideWithLimit(ctx, *req, limit)
		if !w.outcome("decide", err) || w.r.IntN(2) == 0 {
			return
		}
		sc := sys.ScopeFor(d)
		if !w.outcome("scope enter", sc.Enter(ctx)) {
			return
		}
		if got := len(sc.Leases()); got != len(d.Plan.Enter) {
			w.fail("scope holds %d leases for %d enters", got, len(d.Plan.Enter))
		}
		if err := sc.Exit(ctx); err != nil {
			w.fail("scope exit: %v", err)
		}
		w.outcome("scope exit", sc.ExitError())
	default: // execute a small plan
		plan := w.smallPlan(true)
		_, err := sys.Execute(ctx, plan)
		if w.outcome("execute", err) {
			for _, r := range plan.Reservations {
				w.outcome("unreserve", sys.Unreserve(ctx, r.Name))
			}
		}
	}
}

// randomPlan is a plan over own (not empty): maybe a reclaim, maybe a
// reservation named by resvName (called only when one is drawn), one or
// two enters, at locations drawn by loc. Both stress tests draw their
// plans here.
func randomPlan(r *rand.Rand, own []*stressValue, loc func() string, resvName func() string) system.Plan {
	var p system.Plan
	if r.IntN(3) == 0 {
		p.Reclaim = []system.Action{{Handle: own[r.IntN(len(own))].h, Location: loc()}}
	}
	if r.IntN(3) == 0 {
		p.Reservations = []system.ReservationSpec{{Name: resvName(), Location: loc(), Bytes: int64(128 * (1 + r.IntN(8)))}}
	}
	for i := 0; i < 1+r.IntN(2); i++ {
		p.Enter = append(p.Enter, system.Action{Handle: own[r.IntN(len(own))].h, Location: loc()})
	}
	return p
}

// randomRequest is a request named name over one or two distinct values
// of own (not empty), each tiered both GPUs → pinned → pageable, with the
// reservations resv draws (nil for none).
func randomRequest(r *rand.Rand, own []*stressValue, name string, resv func() []system.ReservationSpec) *system.Request {
	req := &system.Request{Name: name}
	used := map[system.Handle]bool{}
	for i := 0; i < 1+r.IntN(2); i++ {
		v := own[r.IntN(len(own))]
		if used[v.h] {
			continue
		}
		used[v.h] = true
		req.Requirements = append(req.Requirements, system.Requirement{Handle: v.h, Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}, {"pageable-host"}}})
	}
	req.Reservations = resv()
	return req
}

// smallPlan is randomPlan over our own values; withName false names its
// reservation "explain-only" (for plans that are only explained).
func (w *stressWorker) smallPlan(withName bool) system.Plan {
	if len(w.own) == 0 {
		return system.Plan{}
	}
	return randomPlan(w.r, w.own, w.loc, func() string {
		if withName {
			return w.name("p")
		}
		return "explain-only"
	})
}

func (w *stressWorker) request() *system.Request {
	if len(w.own) == 0 {
		return nil
	}
	return randomRequest(w.r, w.own, w.name("q"), func() []system.ReservationSpec {
		if w.r.IntN(4) == 0 {
			return []system.ReservationSpec{{Name: w.name("qr"), Location: "cuda:0", Bytes: 1024}}
		}
		return nil
	})
}

func TestStress(t *testing.T) {
	goroutines, opsPer, minSnapshots := 32, 2000, 500
	if testing.Short() {
		opsPer, minSnapshots = 200, 50
	}
	ctx := context.Background()
	backend, err := soft.New(soft.Config{Locations: stressLocations})
	must(t, err, "soft backend")
	sys, err := startSoft(t, ctx, system.Options{
		Locations: []system.LocationConfig{
			system.Limit("pageable-host", 512<<10), system.Limit("pinned-host", 128<<10),
			system.Limit("cuda:0", 96<<10), system.Limit("cuda:1", 96<<10)},
		Backend:       faulty.Wrap(backend, soft.ErrorPrefix),
		TraceCapacity: 4096,
	})
	must(t, err, "start")
	began := time.Now()

	// The snapshot checker runs until the workers are done and it has
	// checked at least minSnapshots snapshots taken while they ran.
	var workersDone atomic.Bool
	snapResult := make(chan error, 1)
	var snapshots, snapshotsDuringRun atomic.Int64
	go func() {
		var last uint64
		for {
			running := !workersDone.Load()
			s, err := sys.Snapshot(ctx)
			if err != nil {
				snapResult <- fmt.Errorf("snapshot: %w", err)
				return
			}
			snapshots.Add(1)
			if running {
				snapshotsDuringRun.Add(1)
			}
			if s.StateVersion < last {
				snapResult <- fmt.Errorf("state version went back from %d to %d", last, s.StateVersion)
				return
			}
			last = s.StateVersion
			if err := checkInvariants(s); err != nil {
				snapResult <- err
				return
			}
			if !running {
				snapResult <- nil
				return
			}
		}
	}()

	shared := &stressShared{}
	workers := make([]*stressWorker, goroutines)
	var wg sync.WaitGroup
	for g := range workers {
		w := &stressWorker{id: g, r: rand.New(rand.NewPCG(20240822, uint64(g))), sys: sys, shared: shared, tally: newTally()}
		workers[g] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < opsPer; i++ {
				w.step(ctx, testsys.Faults(sys))
			}
		}()
	}
	wg.Wait()
	workersDone.Store(true)
	if err := <-snapResult; err != nil {
		t.Fatalf("snapshot checker: %v", err)
	}
	if n := snapshotsDuringRun.Load(); n < int64(minSnapshots) {
		t.Errorf("only %d snapshots checked while the workers ran, want at least %d", n, minSnapshots)
	}
	ran := time.Since(began)

	total := newTally()
	for _, w := range workers {
		total.merge(w.tally)
	}
	for _, f := range total.failures {
		t.Error(f)
	}
	for _, u := range total.untyped {
		t.Errorf("untyped error: %s", u)
	}
	if n := total.errs["InvalidInputError"]; n != 0 {
		t.Errorf("%d invalid-input errors: every operation of the stress test is well formed", n)
	}

	// The trace ring holds consecutive versions.
	tr, err := sys.Trace(ctx)
	must(t, err, "trace")
	for i := 1; i < len(tr); i++ {
		if tr[i].Version != tr[i-1].Version+1 {
			t.Fatalf("trace versions jump from %d to %d", tr[i-1].Version, tr[i].Version)
		}
	}

	// Leave what the workers kept outstanding for Close to report: their
	// leases and holds exactly, and at least their uncompleted events (an
	// event completed just before Close may not be reaped yet).
	var wantLeases, wantHolds, wantEvents int
	for _, w := range workers {
		wantLeases += len(w.leases)
		wantHolds += len(w.holds)
		wantEvents += len(w.events)
	}
	pre := snapshot(t, sys)
	err = sys.Close(ctx)
	var oe *system.OutstandingError
	if wantLeases+wantHolds+wantEvents > 0 {
		oe = as[*system.OutstandingError](t, err, "close with outstanding protections")
		if len(oe.Outstanding.Leases) != wantLeases || len(oe.Outstanding.Holds) != wantHolds || len(oe.Outstanding.Events) < wantEvents {
			t.Errorf("close reported %d leases, %d holds, %d events; the workers kept %d, %d and %d (events: at least)",
				len(oe.Outstanding.Leases), len(oe.Outstanding.Holds), len(oe.Outstanding.Events), wantLeases, wantHolds, wantEvents)
		}
	} else {
		must(t, err, "close")
	}
	final, err := sys.Snapshot(ctx)
	must(t, err, "final snapshot")
	must(t, checkInvariants(final), "final snapshot")
	if final.StateVersion < pre.StateVersion {
		t.Fatalf("final version %d < %d", final.StateVersion, pre.StateVersion)
	}
	for _, l := range final.Locations {
		if l.UsedBytes != 0 || l.ReservedBytes != 0 || l.TemporaryBytes != 0 {
			t.Errorf("%s after close: used %d, reserved %d, temporary %d", l.Location, l.UsedBytes, l.ReservedBytes, l.TemporaryBytes)
		}
	}
	for _, l := range stressLocations {
		mi, err := backend.MemInfo(l)
		must(t, err, "meminfo")
		if mi.UsedBytes != 0 {
			t.Errorf("%s: the backend still holds %d bytes after close", l, mi.UsedBytes)
		}
	}
	must(t, backend.Close(), "close backend")
	if err := sys.Place(ctx, system.Handle{}, "cuda:0"); !errors.Is(err, system.ErrClosed) {
		t.Errorf("place after close: %v", err)
	}

	t.Logf("stress: %d goroutines × %d ops = %d ops in %v (+ close %v); %d snapshots checked (%d while the workers ran); final state version %d",
		goroutines, opsPer, total.ops, ran.Round(time.Millisecond), (time.Since(began) - ran).Round(time.Millisecond), snapshots.Load(), snapshotsDuringRun.Load(), final.StateVersion)
	t.Logf("stress: errors by type: %s", formatCounts(total.errs))
	t.Logf("stress: plan execution error causes: %s", formatCounts(total.causes))
	t.Logf("stress: successes: %s", formatCounts(total.ok))
	if oe != nil {
		t.Logf("stress: outstanding at close: %d leases, %d holds, %d events", len(oe.Outstanding.Leases), len(oe.Outstanding.Holds), len(oe.Outstanding.Events))
	}
	// Refusals must be common, and faults must have fired.
	for _, typ := range []string{"BudgetError", "PlanExecutionError", "UnavailableError", "InUseError"} {
		if total.errs[typ] == 0 && !testing.Short() {
			t.Errorf("no %s in the whole run: the op mix does not exercise it", typ)
		}
	}
	if total.causes["injected fault"] == 0 && !testing.Short() {
		t.Errorf("no injected fault fired")
	}
}

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// A value actor that panics during a transfer: the place fails with a
// PlanExecutionError whose cause is the crash, the ledger stays consistent,
// the actor is restarted, and the value's bytes are intact.
func TestValueActorCrashIsSupervised(t *testing.T) {
	ctx := context.Background()
	var armed atomic.Bool
	var crashes atomic.Int32
	sys := startHooked(t, testhooks.Knobs{PanicOnTransfer: func(e budget.Effect) bool {
		if e.Handle.Name == "victim" && e.Location == "cuda:0" && armed.CompareAndSwap(true, false) {
			crashes.Add(1)
			return true
		}
		return false
	}}, system.Options{
		Locations: fourLocations(0, 0, 1<<20),
	})
	data := pattern(10000, 0x11)
	h := register(t, sys, system.Value{Name: "victim", Bytes: 10000, At: "pinned-host", Data: data})
	other := register(t, sys, system.Value{Name: "bystander", Bytes: 100, Mode: system.Replicable, At: "pinned-host", Data: pattern(100, 2)})

	before := snapshot(t, sys)
	armed.Store(true)
	err := sys.Place(ctx, h, "cuda:0")
	pe := checkExecErr(t, err, budget.PhaseExecute, &system.Action{Handle: h, Location: "cuda:0", From: "pinned-host"}, 0, nil, -1, []string{"admit", "fail"})
	ce := as[*system.ActorCrashError](t, pe.Cause, "cause")
	if !strings.Contains(ce.Error(), "crashed") || !strings.Contains(ce.Reason, "injected value actor panic") {
		t.Fatalf("crash error %q (reason %q)", ce.Error(), ce.Reason)
	}
	equal(t, int32(1), crashes.Load(), "crashes")

	// The ledger is consistent and back where it was, two versions later.
	after := snapshot(t, sys)
	equal(t, before.StateVersion+2, after.StateVersion, "versions")
	equal(t, []string{"pinned-host"}, keys(mats(t, after, "victim")), "victim after the crash")
	for i := range after.Locations {
		if a, b := after.Locations[i], before.Locations[i]; a.UsedBytes != b.UsedBytes || a.ReservedBytes != b.ReservedBytes {
			t.Fatalf("%s: before %+v after %+v", a.Location, b, a)
		}
	}
	readBoth(t, sys, h, "pinned-host", data)

	// The actor was restarted: the same value moves now, bytes intact; the
	// other values were never affected.
	must(t, sys.Place(ctx, h, "cuda:0"), "place after the restart")
	readBoth(t, sys, h, "cuda:0", data)
	must(t, sys.Move(ctx, h, "cuda:0", "cuda:1"), "move after the restart")
	readBoth(t, sys, h, "cuda:1", data)
	must(t, sys.Copy(ctx, other, "pinned-host", "cuda:0"), "copy of another value")
	readBoth(t, sys, other, "cuda:0", pattern(100, 2))
	equal(t, int32(1), crashes.Load(), "crashes")
}

// A location actor that panics while allocating: the transfer fails with a
// PlanExecutionError naming the panic, nothing is charged, and the location
// keeps serving later allocations.
func TestLocationActorAllocationPanic(t *testing.T) {
	ctx := context.Background()
	var armed atomic.Bool
	sys := startHooked(t, testhooks.Knobs{PanicOnAllocate: func(k messages.BufferKey) bool {
		return k.Location == "cuda:1" && armed.CompareAndSwap(true, false)
	}}, system.Options{
		Locations: fourLocations(0, 0, 1<<20),
	})
	data := pattern(5000, 0x21)
	h := register(t, sys, system.Value{Name: "w", Bytes: 5000, Mode: system.Replicable, At: "pinned-host", Data: data})
	before := snapshot(t, sys)
	armed.Store(true)
	err := sys.Copy(ctx, h, "pinned-host", "cuda:1")
	pe := checkExecErr(t, err, budget.PhaseExecute, &system.Action{Handle: h, Location: "cuda:1", From: "pinned-host"}, 0, nil, -1, []string{"admit", "fail"})
	if !strings.Contains(pe.Cause.Error(), "panic") {
		t.Fatalf("cause %v does not mention the panic", pe.Cause)
	}
	after := snapshot(t, sys)
	equal(t, before.StateVersion+2, after.StateVersion, "versions")
	equal(t, []string{"pinned-host"}, keys(mats(t, after, "w")), "w after the failed copy")
	if l := loc(t, after, "cuda:1"); l.UsedBytes != 0 {
		t.Fatalf("cuda:1 after the failed copy: %+v", l)
	}
	must(t, sys.Copy(ctx, h, "pinned-host", "cuda:1"), "copy after the panic")
	readBoth(t, sys, h, "cuda:1", data)
}

// The snapshot checker the stress test relies on must reject every kind of
// inconsistency it claims to find.
func TestInvariantCheckerCatchesViolations(t *testing.T) {
	good := func() system.Snapshot {
		return system.Snapshot{
			StateVersion: 7,
			Locations: []budget.LocationRecord{
				{Location: "pinned-host", UsedBytes: 300, TemporaryBytes: 100, PeakBytes: 300},
				{Location: "cuda:0", HasBudget: true, BudgetBytes: 500, UsedBytes: 200, ReservedBytes: 250, PeakBytes: 450,
					Reservations: []system.ReservationRecord{{Name: "a", Bytes: 50}, {Name: "b", Bytes: 200}}},
			},
			Values: []budget.ValueRecord{{Handle: system.Handle{Name: "v", ID: 1}, Bytes: 200, Materializations: []system.MaterializationRecord{
				{Location: "pinned-host", ChargedBytes: 200}, {Location: "cuda:0", ChargedBytes: 200, UseCount: 1}}}},
		}
	}
	must(t, checkInvariants(good()), "a consistent snapshot")
	for name, corrupt := range map[string]func(*system.Snapshot){
		"over budget": func(s *system.Snapshot) {
			s.Locations[1].ReservedBytes, s.Locations[1].Reservations[1].Bytes = 350, 300
		},
		"used without a charge":   func(s *system.Snapshot) { s.Locations[0].UsedBytes = 400 },
		"temporary not counted":   func(s *system.Snapshot) { s.Locations[0].TemporaryBytes = 0 },
		"reservations mismatch":   func(s *system.Snapshot) { s.Locations[1].Reservations = s.Locations[1].Reservations[:1] },
		"negative count":          func(s *system.Snapshot) { s.Values[0].Materializations[1].UseCount = -1 },
		"negative pending events": func(s *system.Snapshot) { s.Values[0].Materializations[0].PendingEventCount = -1 },
		"wrong charge":            func(s *system.Snapshot) { s.Values[0].Materializations[0].ChargedBytes = 100 },
		"peak below current":      func(s *system.Snapshot) { s.Locations[1].PeakBytes = 400 },
	} {
		s := good()
		corrupt(&s)
		if err := checkInvariants(s); err == nil {
			t.Errorf("%s: not detected", name)
		}
	}
}
