package tests

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
)

func TestCloseReportsAndReleasesOutstanding(t *testing.T) {
	ctx := context.Background()
	locs := []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}
	backend, err := soft.New(soft.Config{Locations: locs})
	must(t, err, "soft backend")
	defer func() { must(t, backend.Close(), "close backend") }()
	sys, err := system.Start(ctx, system.Options{Locations: fourLocations(0, 0, 1<<20), Backend: backend})
	must(t, err, "start")

	w := register(t, sys, system.Value{Name: "w", Bytes: 4096, Mode: system.Replicable, At: "pinned-host", Data: pattern(4096, 9)})
	must(t, sys.Copy(ctx, w, "pinned-host", "cuda:0"), "copy")
	u := register(t, sys, system.Value{Name: "u", Bytes: 100, Source: "pageable-host", Loader: loaderOf(pattern(100, 1))})
	must(t, sys.Place(ctx, u, "cuda:1"), "place u")
	l1, err := sys.Acquire(ctx, w, "pinned-host")
	must(t, err, "acquire")
	l2, err := sys.Acquire(ctx, w, "cuda:0")
	must(t, err, "acquire")
	hd, err := sys.Hold(ctx, u, "cuda:1")
	must(t, err, "hold")
	l3, err := sys.Acquire(ctx, u, "cuda:1")
	must(t, err, "acquire")
	ev := system.NewManualEvent() // never completed
	evID, err := l3.RecordEvent(ctx, ev)
	must(t, err, "record")
	must(t, l3.Release(ctx), "release")
	must(t, sys.Reserve(ctx, "cuda:0", "act", 1000), "reserve")
	sc := sys.NewScope(system.Plan{Enter: []system.Action{{Handle: w, Location: "cuda:1"}}})
	must(t, sc.Enter(ctx), "enter a scope that is never exited")
	for _, l := range []string{"pinned-host", "cuda:0"} {
		if mi, err := backend.MemInfo(l); err != nil || mi.UsedBytes == 0 {
			t.Fatalf("%s: %+v %v", l, mi, err)
		}
	}
	beforeClose := snapshot(t, sys)

	err = sys.Close(ctx)
	oe := as[*system.OutstandingError](t, err, "close with outstanding protections")
	o := oe.Outstanding
	type ep struct{ h, l string }
	eps := func(list []system.Endpoint) []ep {
		var out []ep
		for _, e := range list {
			out = append(out, ep{e.Handle, e.Location})
		}
		return out
	}
	equal(t, []ep{{"w", "pinned-host"}, {"w", "cuda:0"}, {"w", "cuda:1"}}, eps(o.Leases), "outstanding leases (in id order; the last is the scope's)")
	equal(t, uint64(l1.ID()), o.Leases[0].ID, "lease id")
	equal(t, uint64(l2.ID()), o.Leases[1].ID, "lease id")
	equal(t, []ep{{"u", "cuda:1"}}, eps(o.Holds), "outstanding holds")
	equal(t, uint64(hd.ID()), o.Holds[0].ID, "hold id")
	equal(t, []ep{{"u", "cuda:1"}}, eps(o.Events), "outstanding events")
	equal(t, uint64(evID), o.Events[0].ID, "event id")

	// Idempotent: the same result again.
	if err2 := sys.Close(ctx); err2 != err {
		t.Fatalf("second close returned %v, first %v", err2, err)
	}

	// The final snapshot: everything released and freed.
	final, err := sys.Snapshot(ctx)
	must(t, err, "snapshot after close")
	must(t, checkInvariants(final), "invariants of the final snapshot")
	if final.StateVersion <= beforeClose.StateVersion {
		t.Fatalf("final version %d, before close %d", final.StateVersion, beforeClose.StateVersion)
	}
	for _, l := range final.Locations {
		if l.UsedBytes != 0 || l.ReservedBytes != 0 || l.TemporaryBytes != 0 || len(l.Reservations) != 0 {
			t.Fatalf("%s after close: %+v", l.Location, l)
		}
	}
	for _, v := range final.Values {
		if len(v.Materializations) != 0 {
			t.Fatalf("%s after close: %+v", v.Handle.Name, v)
		}
	}
	for _, l := range locs {
		mi, err := backend.MemInfo(l)
		must(t, err, "meminfo")
		if mi.UsedBytes != 0 {
			t.Fatalf("%s: backend still holds %d bytes after close", l, mi.UsedBytes)
		}
	}

	// Every call after Close: ErrClosed.
	calls := map[string]error{
		"place":     sys.Place(ctx, w, "cuda:1"),
		"copy":      sys.Copy(ctx, w, "cuda:0", "cuda:1"),
		"move":      sys.Move(ctx, w, "cuda:0", "cuda:1"),
		"evict":     sys.Evict(ctx, w, "cuda:0"),
		"discard":   sys.Discard(ctx, w),
		"reserve":   sys.Reserve(ctx, "cuda:0", "late", 1),
		"unreserve": sys.Unreserve(ctx, "act"),
		"release":   l1.Release(ctx),
		"unhold":    hd.Release(ctx),
		"by id":     sys.ReleaseByID(ctx, l2.ID()),
		"reaped":    sys.WaitReaped(ctx, evID),
		"enter":     sys.NewScope(system.Plan{}).Enter(ctx),
		"exit":      sc.Exit(ctx),
	}
	_, calls["register"] = sys.Register(ctx, system.Value{Name: "late", Bytes: 1, At: "cuda:0"})
	_, calls["acquire"] = sys.Acquire(ctx, w, "pinned-host")
	_, calls["hold"] = sys.Hold(ctx, w, "pinned-host")
	_, calls["record"] = l2.RecordEvent(ctx, system.NewManualEvent())
	_, calls["read"] = sys.Read(ctx, w, "pinned-host")
	_, calls["explain"] = sys.Explain(ctx, system.Plan{})
	_, calls["decide"] = sys.Decide(ctx, system.Request{Name: "late"})
	_, calls["execute"] = sys.Execute(ctx, system.Plan{})
	_, calls["trace"] = sys.Trace(ctx)
	_, calls["lookup"] = sys.Lookup(ctx, "w")
	for op, err := range calls {
		if !errors.Is(err, system.ErrClosed) {
			t.Errorf("%s after close: %v, want ErrClosed", op, err)
		}
	}
	if sc.ExitError() == nil || !errors.Is(sc.ExitError(), system.ErrClosed) {
		t.Errorf("exit error of the scope: %v", sc.ExitError())
	}
	again, err := sys.Snapshot(ctx)
	must(t, err, "snapshot after close")
	equal(t, final, again, "the final snapshot does not change")
}

func TestCloseWithNothingOutstanding(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: fourLocations(0, 0, 0)})
	must(t, err, "start")
	h := register(t, sys, system.Value{Name: "v", Bytes: 10, At: "cuda:0"})
	l, err := sys.Acquire(ctx, h, "cuda:0")
	must(t, err, "acquire")
	must(t, l.Release(ctx), "release")
	must(t, sys.Close(ctx), "close")
	must(t, sys.Close(ctx), "second close")
	_, err = sys.Acquire(ctx, h, "cuda:0")
	if !errors.Is(err, system.ErrClosed) {
		t.Fatalf("acquire after close: %v", err)
	}
}

// A call made with a context that is already cancelled returns ctx.Err()
// and changes nothing.
func TestCancelledContextChangesNothing(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1<<20)})
	w := register(t, sys, system.Value{Name: "w", Bytes: 100, Mode: system.Replicable, At: "pinned-host"})
	s := register(t, sys, system.Value{Name: "s", Bytes: 100, Source: "pinned-host", Loader: loaderOf(pattern(100, 2))})
	lease, err := sys.Acquire(ctx, w, "pinned-host")
	must(t, err, "acquire")
	hd, err := sys.Hold(ctx, w, "pinned-host")
	must(t, err, "hold")
	must(t, sys.Reserve(ctx, "cuda:0", "r", 10), "reserve")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	plan := system.Plan{Enter: []system.Action{{Handle: w, Location: "cuda:1"}}}
	calls := []struct {
		name string
		call func() error
	}{
		{"register", func() error {
			_, err := sys.Register(cancelled, system.Value{Name: "n", Bytes: 10, At: "cuda:0"})
			return err
		}},
		{"register with source", func() error {
			_, err := sys.Register(cancelled, system.Value{Name: "n2", Bytes: 10, Source: "pinned-host", Loader: loaderOf(pattern(10, 1))})
			return err
		}},
		{"place", func() error { return sys.Place(cancelled, s, "cuda:0") }},
		{"copy", func() error { return sys.Copy(cancelled, w, "pinned-host", "cuda:0") }},
		{"move", func() error { return sys.Move(cancelled, w, "pinned-host", "cuda:0") }},
		{"evict", func() error { return sys.Evict(cancelled, w, "pinned-host") }},
		{"discard", func() error { return sys.Discard(cancelled, s) }},
		{"acquire", func() error { _, err := sys.Acquire(cancelled, w, "pinned-host"); return err }},
		{"hold", func() error { _, err := sys.Hold(cancelled, w, "pinned-host"); return err }},
		{"lease release", func() error { return lease.Release(cancelled) }},
		{"release by id", func() error { return sys.ReleaseByID(cancelled, lease.ID()) }},
		{"hold release", func() error { return hd.Release(cancelled) }},
		{"record event", func() error { _, err := lease.RecordEvent(cancelled, system.NewManualEvent()); return err }},
		{"reserve", func() error { return sys.Reserve(cancelled, "cuda:0", "r2", 10) }},
		{"unreserve", func() error { return sys.Unreserve(cancelled, "r") }},
		{"execute", func() error { _, err := sys.Execute(cancelled, plan); return err }},
		{"enter", func() error { return sys.NewScope(plan).Enter(cancelled) }},
		{"with scope", func() error {
			return sys.WithScope(cancelled, plan, func(*system.Scope) error { t.Error("body ran"); return nil })
		}},
		{"read", func() error { _, err := sys.Read(cancelled, w, "pinned-host"); return err }},
		{"explain", func() error { _, err := sys.Explain(cancelled, plan); return err }},
		{"decide", func() error { _, err := sys.Decide(cancelled, system.Request{Name: "r"}); return err }},
		{"snapshot", func() error { _, err := sys.Snapshot(cancelled); return err }},
		{"trace", func() error { _, err := sys.Trace(cancelled); return err }},
		{"lookup", func() error { _, err := sys.Lookup(cancelled, "w"); return err }},
		{"start", func() error {
			_, err := startSoft(t, cancelled, system.Options{Locations: fourLocations(0, 0, 0)})
			return err
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			// Several times: a reply racing the cancelled context must not
			// win either.
			for i := 0; i < 20; i++ {
				before := snapshot(t, sys)
				err := c.call()
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("try %d: %v, want context.Canceled", i, err)
				}
				unchanged(t, sys, before, c.name+" with a cancelled context")
			}
		})
	}
	// The lease and the hold are still usable afterwards.
	must(t, lease.Release(ctx), "release")
	must(t, hd.Release(ctx), "unhold")
	if _, err := sys.Lookup(ctx, "n"); !errors.Is(err, system.ErrInvalidInput) {
		t.Fatalf("a value registered with a cancelled context exists: %v", err)
	}
	// The names refused with a cancelled context can be registered now,
	// the source one with its own loader.
	n2data := pattern(10, 3)
	n2 := register(t, sys, system.Value{Name: "n2", Bytes: 10, Source: "pinned-host", Loader: loaderOf(n2data)})
	must(t, sys.Place(ctx, n2, "cuda:0"), "place n2")
	got, err := sys.Read(ctx, n2, "cuda:0")
	must(t, err, "read n2")
	requireBytes(t, n2data, got, "n2")
}

// Close cancels the context of a transfer in flight and lets it settle
// before it shuts down: new calls are refused at once, the transfer's
// caller gets its result (the loader saw the cancellation), and the final
// snapshot is all zeros.
func TestCloseSettlesTransfersInFlight(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: fourLocations(0, 0, 1<<20)})
	must(t, err, "start")
	ld := newBlockingLoader(pattern(3000, 8))
	defer close(ld.release)
	h := register(t, sys, system.Value{Name: "s", Bytes: 3000, Source: "pinned-host", Loader: ld.load})
	placed := make(chan error, 1)
	go func() { placed <- sys.Place(ctx, h, "cuda:0") }()
	<-ld.started

	closed := make(chan error, 1)
	go func() { closed <- sys.Close(ctx) }()
	// Wait until Close has begun: calls are refused from then on.
	for {
		if _, err := sys.Explain(ctx, system.Plan{}); errors.Is(err, system.ErrClosed) {
			break
		}
		runtime.Gosched()
	}
	if err := <-placed; !errors.Is(err, context.Canceled) {
		t.Fatalf("the place in flight: want its loader canceled by Close, got %v", err)
	}
	must(t, <-closed, "close")
	final, err := sys.Snapshot(ctx)
	must(t, err, "final snapshot")
	for _, l := range final.Locations {
		if l.UsedBytes != 0 || l.ReservedBytes != 0 || l.TemporaryBytes != 0 {
			t.Fatalf("%s after close: %+v", l.Location, l)
		}
	}
	// The transfer failed before the shutdown: register, admit, fail.
	equal(t, uint64(3), final.StateVersion, "final state version")
}
