package tests

import (
	"context"
	"testing"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// Every committed mutation bumps the state version by exactly the number
// docs/semantics.md gives, and the trace lists those transitions in order.
func TestStateVersionAccounting(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1<<20)})
	var last uint64
	step := func(what string, want uint64, call func() error) {
		t.Helper()
		must(t, call(), what)
		v := snapshot(t, sys).StateVersion
		if v-last != want {
			t.Fatalf("%s: %d versions, want %d", what, v-last, want)
		}
		last = v
	}
	var r, x, s system.Handle
	var l *system.Lease
	var hd *system.Hold
	var ev *system.ManualEvent
	var evID system.EventID
	var err error
	data := pattern(100, 4)
	step("register at", 2, func() error {
		r, err = sys.Register(ctx, system.Value{Name: "r", Bytes: 100, Mode: system.Replicable, At: "pageable-host", Data: data})
		return err
	})
	step("register with source", 1, func() error {
		s, err = sys.Register(ctx, system.Value{Name: "s", Bytes: 100, Source: "pinned-host", Loader: loaderOf(data)})
		return err
	})
	step("register exclusive", 2, func() error {
		x, err = sys.Register(ctx, system.Value{Name: "x", Bytes: 100, At: "pinned-host"})
		return err
	})
	step("copy", 2, func() error { return sys.Copy(ctx, r, "pageable-host", "cuda:1") })
	step("copy onto a resident copy", 0, func() error { return sys.Copy(ctx, r, "pageable-host", "cuda:1") })
	step("place onto a resident copy", 0, func() error { return sys.Place(ctx, r, "cuda:1") })
	step("place that copies", 2, func() error { return sys.Place(ctx, r, "pinned-host") })
	step("place that moves", 3, func() error { return sys.Place(ctx, x, "cuda:0") })
	step("move", 3, func() error { return sys.Move(ctx, x, "cuda:0", "cuda:1") })
	step("move onto itself", 0, func() error { return sys.Move(ctx, x, "cuda:1", "cuda:1") })
	step("reconstruction", 2, func() error { return sys.Place(ctx, s, "cuda:0") })
	step("acquire", 1, func() error { l, err = sys.Acquire(ctx, r, "cuda:1"); return err })
	step("record event", 1, func() error {
		ev = system.NewManualEvent()
		evID, err = l.RecordEvent(ctx, ev)
		return err
	})
	step("release", 1, func() error { return l.Release(ctx) })
	step("reap", 1, func() error { ev.Complete(); return sys.WaitReaped(ctx, evID) })
	step("hold", 1, func() error { hd, err = sys.Hold(ctx, r, "cuda:1"); return err })
	step("unhold", 1, func() error { return hd.Release(ctx) })
	step("reserve", 1, func() error { return sys.Reserve(ctx, "cuda:0", "a", 10) })
	step("unreserve", 1, func() error { return sys.Unreserve(ctx, "a") })
	step("explain, decide, trace, snapshot, fault injection", 0, func() error {
		plan := system.Plan{Enter: []system.Action{{Handle: x, Location: "cuda:0"}}}
		if _, err := sys.Explain(ctx, plan); err != nil {
			return err
		}
		if _, err := sys.Decide(ctx, system.Request{Name: "q", Requirements: []system.Requirement{{Handle: x, Tiers: [][]string{{"cuda:0"}}}}}); err != nil {
			return err
		}
		if _, err := sys.Trace(ctx); err != nil {
			return err
		}
		testsys.Faults(sys).Arm(cuda.FaultAlloc, "pageable-host")
		testsys.Faults(sys).Reset()
		return nil
	})
	step("evict", 1, func() error { return sys.Evict(ctx, r, "cuda:1") })
	step("discard of a value with 2 materializations", 3, func() error { return sys.Discard(ctx, r) })

	// The trace holds every transition, one per version, in order.
	tr, err := sys.Trace(ctx)
	must(t, err, "trace")
	if uint64(len(tr)) != last {
		t.Fatalf("trace has %d transitions for %d versions", len(tr), last)
	}
	for i, x := range tr {
		if x.Version != uint64(i+1) {
			t.Fatalf("trace[%d] = %s", i, x)
		}
	}
	// The place at pinned-host copied from the preferred source,
	// pageable-host (over cuda:1); the discard removed in location order.
	var details []string
	for _, x := range tr {
		if x.Handle == "r" && (x.Kind == "admit" || x.Kind == "remove") {
			details = append(details, x.Kind+" "+x.Location+" "+x.Detail)
		}
	}
	equal(t, []string{
		"admit pageable-host register at",
		"admit cuda:1 copy from pageable-host",
		"admit pinned-host copy from pageable-host",
		"remove cuda:1 evict",
		"remove pageable-host discard",
		"remove pinned-host discard",
	}, details, "r's admissions and removals")
}

func TestTraceCapacity(t *testing.T) {
	ctx := context.Background()
	off := start(t, system.Options{Locations: fourLocations(0, 0, 0), DisableTrace: true})
	small := start(t, system.Options{Locations: fourLocations(0, 0, 0), TraceCapacity: 3})
	for _, sys := range []*system.System{off, small} {
		h := register(t, sys, system.Value{Name: "v", Bytes: 10, At: "cuda:0"})
		must(t, sys.Place(ctx, h, "cuda:1"), "place")
	}
	tr, err := off.Trace(ctx)
	must(t, err, "trace")
	if len(tr) != 0 {
		t.Fatalf("disabled trace has %v", tr)
	}
	if v := snapshot(t, off).StateVersion; v != 5 {
		t.Fatalf("versions count without a trace: %d", v)
	}
	tr, err = small.Trace(ctx)
	must(t, err, "trace")
	var kinds []string
	for _, x := range tr {
		kinds = append(kinds, x.Kind)
	}
	equal(t, []string{"admit", "complete", "remove"}, kinds, "the last 3 transitions")
	equal(t, uint64(3), tr[0].Version, "oldest kept version")
}

// Explain and decide never consume an armed fault, and neither does a
// no-op; the next real transfer does.
func TestFaultsNotConsumedByReadsOrNoOps(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 0)})
	r := register(t, sys, system.Value{Name: "r", Bytes: 10, Mode: system.Replicable, At: "pinned-host"})
	must(t, sys.Copy(ctx, r, "pinned-host", "cuda:0"), "copy")
	x := register(t, sys, system.Value{Name: "x", Bytes: 10, At: "pinned-host"})
	f := testsys.Faults(sys)
	f.Arm(cuda.FaultAlloc, "cuda:0")
	f.Arm(cuda.FaultCopy, "cuda:0")
	plan := system.Plan{Enter: []system.Action{{Handle: x, Location: "cuda:0"}}}
	if ex, err := sys.Explain(ctx, plan); err != nil || !ex.Feasible {
		t.Fatalf("explain %+v %v", ex, err)
	}
	if _, err := sys.Decide(ctx, system.Request{Name: "q", Requirements: []system.Requirement{{Handle: x, Tiers: [][]string{{"cuda:0"}}}}}); err != nil {
		t.Fatal(err)
	}
	must(t, sys.Place(ctx, r, "cuda:0"), "no-op place")
	must(t, sys.Copy(ctx, r, "pinned-host", "cuda:0"), "no-op copy")
	if f.Armed(cuda.FaultAlloc, "cuda:0") != 1 || f.Armed(cuda.FaultCopy, "cuda:0") != 1 {
		t.Fatalf("faults consumed: alloc %d, copy %d", f.Armed(cuda.FaultAlloc, "cuda:0"), f.Armed(cuda.FaultCopy, "cuda:0"))
	}
	// The two armed faults fail the next two transfers into cuda:0.
	for i, want := range []cuda.FaultKind{cuda.FaultAlloc, cuda.FaultCopy} {
		err := sys.Place(ctx, x, "cuda:0")
		ife := as[*cuda.InjectedFaultError](t, err, "place")
		if ife.Kind != want {
			t.Fatalf("transfer %d failed with %v, want %v", i, ife.Kind, want)
		}
	}
	must(t, sys.Place(ctx, x, "cuda:0"), "place once the faults are spent")
}

// discard reports the first protected materialization in location order.
func TestDiscardReportsFirstProtectedInLocationOrder(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 0)})
	r := register(t, sys, system.Value{Name: "r", Bytes: 10, Mode: system.Replicable, At: "cuda:1"})
	must(t, sys.Copy(ctx, r, "cuda:1", "pinned-host"), "copy")
	must(t, sys.Copy(ctx, r, "cuda:1", "cuda:0"), "copy")
	l, err := sys.Acquire(ctx, r, "cuda:1")
	must(t, err, "acquire")
	hd, err := sys.Hold(ctx, r, "cuda:0")
	must(t, err, "hold")
	before := snapshot(t, sys)
	iu := as[*system.InUseError](t, sys.Discard(ctx, r), "discard")
	equal(t, system.InUseError{Handle: "r", Location: "cuda:0", HoldCount: 1}, *iu, "first protected in location order")
	unchanged(t, sys, before, "refused discard")
	must(t, hd.Release(ctx), "unhold")
	iu = as[*system.InUseError](t, sys.Discard(ctx, r), "discard")
	equal(t, system.InUseError{Handle: "r", Location: "cuda:1", UseCount: 1}, *iu, "next protected")
	must(t, l.Release(ctx), "release")
	must(t, sys.Discard(ctx, r), "discard")
}
