package tests

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
)

// readBoth reads (h, at) through sys.Read and through a lease of its own,
// and checks both against want.
func readBoth(t *testing.T, sys *system.System, h system.Handle, at string, want []byte) {
	t.Helper()
	ctx := context.Background()
	got, err := sys.Read(ctx, h, at)
	must(t, err, "read "+h.Name+" at "+at)
	requireBytes(t, want, got, "sys.Read of "+h.Name+" at "+at)
	l, err := sys.Acquire(ctx, h, at)
	must(t, err, "acquire "+h.Name+" at "+at)
	if l.Handle() != h || l.Location() != at || l.Buffer() == nil || l.Buffer().Location() != at || l.Buffer().Size() != int64(len(want)) {
		t.Fatalf("lease %+v: buffer %v", l, l.Buffer())
	}
	got, err = l.Read(ctx)
	must(t, err, "lease read")
	requireBytes(t, want, got, "lease.Read of "+h.Name+" at "+at)
	must(t, l.Release(ctx), "release")
	_, err = l.Read(ctx)
	as[*system.InvalidInputError](t, err, "read through a released lease")
}

func TestBytesAcrossLocationKinds(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 0)})
	const n = 64<<10 + 13 // not a round size

	t.Run("exclusive value moved everywhere", func(t *testing.T) {
		data := pattern(n, 0x5a)
		h := register(t, sys, system.Value{Name: "moved", Bytes: n, At: "pageable-host", Data: data})
		readBoth(t, sys, h, "pageable-host", data)
		steps := []struct {
			op       string
			from, to string
		}{
			{"move", "pageable-host", "pinned-host"},
			{"place", "", "cuda:0"},
			{"move", "cuda:0", "cuda:1"},
			{"place", "", "pinned-host"},
			{"move", "pinned-host", "cuda:0"},
			{"place", "", "pageable-host"},
		}
		for _, st := range steps {
			if st.op == "move" {
				must(t, sys.Move(ctx, h, st.from, st.to), "move to "+st.to)
			} else {
				must(t, sys.Place(ctx, h, st.to), "place at "+st.to)
			}
			equal(t, []string{st.to}, keys(mats(t, snapshot(t, sys), "moved")), "after "+st.op+" to "+st.to)
			readBoth(t, sys, h, st.to, data)
		}
	})

	t.Run("replicable value copied everywhere", func(t *testing.T) {
		data := pattern(n, 0xa5)
		h := register(t, sys, system.Value{Name: "copied", Bytes: n, Mode: system.Replicable, At: "pinned-host", Data: data})
		must(t, sys.Copy(ctx, h, "pinned-host", "cuda:0"), "copy to cuda:0")
		readBoth(t, sys, h, "cuda:0", data)
		must(t, sys.Copy(ctx, h, "cuda:0", "cuda:1"), "copy to cuda:1")
		readBoth(t, sys, h, "cuda:1", data)
		must(t, sys.Copy(ctx, h, "cuda:1", "pageable-host"), "copy to pageable-host")
		readBoth(t, sys, h, "pageable-host", data)
		equal(t, []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}, keys(mats(t, snapshot(t, sys), "copied")), "four replicas")
		// Every replica is its own buffer.
		seen := map[cuda.Buffer]bool{}
		for _, at := range []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"} {
			l, err := sys.Acquire(ctx, h, at)
			must(t, err, "acquire")
			if seen[l.Buffer()] {
				t.Fatalf("replica at %s shares a buffer", at)
			}
			seen[l.Buffer()] = true
			must(t, l.Release(ctx), "release")
		}
		// Remove replicas one by one; the others keep the bytes.
		for _, at := range []string{"pinned-host", "pageable-host", "cuda:0"} {
			must(t, sys.Evict(ctx, h, at), "evict at "+at)
		}
		readBoth(t, sys, h, "cuda:1", data)
		must(t, sys.Move(ctx, h, "cuda:1", "pinned-host"), "move the last replica")
		readBoth(t, sys, h, "pinned-host", data)
		must(t, sys.Place(ctx, h, "cuda:1"), "place (a copy)")
		equal(t, []string{"pinned-host", "cuda:1"}, keys(mats(t, snapshot(t, sys), "copied")), "after place")
		readBoth(t, sys, h, "cuda:1", data)
	})
}

// blockingLoader produces data, but first reports that it started and
// waits until release is closed (or its context ends).
type blockingLoader struct {
	data    []byte
	started chan struct{}
	release chan struct{}
	calls   atomic.Int32
}

func newBlockingLoader(data []byte) *blockingLoader {
	return &blockingLoader{data: data, started: make(chan struct{}, 16), release: make(chan struct{})}
}

func (b *blockingLoader) load(ctx context.Context, dst []byte) error {
	b.calls.Add(1)
	b.started <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	copy(dst, b.data)
	return nil
}

func TestReconstructionThroughTemporaryBuffer(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 10000, 10000)})
	const n = 3000
	data := pattern(n, 0x33)
	ld := newBlockingLoader(data)
	h := register(t, sys, system.Value{Name: "w", Bytes: n, Source: "pinned-host", Loader: ld.load})
	s0 := snapshot(t, sys)
	if v, _ := s0.Value("w"); !v.HasSource || v.SourceLocation != "pinned-host" || !v.Recoverable || len(v.Materializations) != 0 {
		t.Fatalf("value record %+v", v)
	}

	done := make(chan error, 1)
	go func() { done <- sys.Place(ctx, h, "cuda:0") }()
	<-ld.started

	// While the loader runs: the destination is entering and charged, the
	// source location carries the temporary charge.
	mid := snapshot(t, sys)
	if p := loc(t, mid, "pinned-host"); p.TemporaryBytes != n || p.UsedBytes != n {
		t.Fatalf("pinned-host during the load: %+v", p)
	}
	if c := loc(t, mid, "cuda:0"); c.TemporaryBytes != 0 || c.UsedBytes != n {
		t.Fatalf("cuda:0 during the load: %+v", c)
	}
	if m := mats(t, mid, "w")["cuda:0"]; m.State != budget.Entering || m.ChargedBytes != n {
		t.Fatalf("w at cuda:0 during the load: %+v", m)
	}
	// An entering endpoint is not there yet for leases or removals.
	_, err := sys.Acquire(ctx, h, "cuda:0")
	if ue := as[*system.UnavailableError](t, err, "acquire while entering"); ue.Reason != budget.UnavailableInFlight {
		t.Fatalf("%+v", *ue)
	}
	err = sys.Evict(ctx, h, "cuda:0")
	if ue := as[*system.UnavailableError](t, err, "evict while entering"); ue.Reason != budget.UnavailableInFlight {
		t.Fatalf("%+v", *ue)
	}
	unchanged(t, sys, mid, "refusals during the load")
	select {
	case err := <-done:
		t.Fatalf("place returned %v before the loader finished", err)
	default:
	}

	close(ld.release)
	must(t, <-done, "place")
	after := snapshot(t, sys)
	if p := loc(t, after, "pinned-host"); p.TemporaryBytes != 0 || p.UsedBytes != 0 {
		t.Fatalf("pinned-host after the load: %+v", p)
	}
	if p := loc(t, after, "pinned-host"); p.PeakBytes != n {
		t.Fatalf("pinned-host peak %d, want the temporary %d", p.PeakBytes, n)
	}
	equal(t, s0.StateVersion+2, after.StateVersion, "versions of a reconstruction")
	readBoth(t, sys, h, "cuda:0", data)

	// Reconstruction at the source location itself: no temporary charge.
	must(t, sys.Evict(ctx, h, "cuda:0"), "evict (the value has a source)")
	must(t, sys.Place(ctx, h, "pinned-host"), "place at the source location")
	if p := loc(t, snapshot(t, sys), "pinned-host"); p.TemporaryBytes != 0 || p.UsedBytes != n {
		t.Fatalf("pinned-host: %+v", p)
	}
	readBoth(t, sys, h, "pinned-host", data)
	equal(t, int32(2), ld.calls.Load(), "loader calls")
}

func TestLoaderFailureFailsThePlaceCleanly(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 10000, 10000)})
	const n = 1000
	data := pattern(n, 0x77)
	errDisk := errors.New("disk read failed")
	var mode atomic.Int32 // 0 ok, 1 error, 2 panic
	h := register(t, sys, system.Value{Name: "w", Bytes: n, Source: "pinned-host", Loader: func(_ context.Context, dst []byte) error {
		switch mode.Load() {
		case 1:
			copy(dst, "garbage")
			return errDisk
		case 2:
			copy(dst, "garbage")
			panic("loader exploded")
		}
		copy(dst, data)
		return nil
	}})

	for _, c := range []struct {
		name  string
		mode  int32
		check func(t *testing.T, err error)
	}{
		{"loader error", 1, func(t *testing.T, err error) {
			if !errors.Is(err, errDisk) {
				t.Fatalf("cause %v does not wrap the loader's error", err)
			}
		}},
		{"loader panic", 2, func(t *testing.T, err error) {
			lp := as[*cuda.LoaderPanicError](t, err, "cause")
			if lp.Value != "loader exploded" || len(lp.Stack) == 0 {
				t.Fatalf("panic error %+v", lp)
			}
		}},
	} {
		for _, dest := range []string{"cuda:0", "pinned-host"} {
			t.Run(c.name+" into "+dest, func(t *testing.T) {
				before := snapshot(t, sys)
				mode.Store(c.mode)
				err := sys.Place(ctx, h, dest)
				mode.Store(0)
				pe := checkExecErr(t, err, budget.PhaseExecute, &system.Action{Handle: h, Location: dest}, 0, nil, -1, []string{"admit", "fail"})
				c.check(t, pe.Cause)
				after := snapshot(t, sys)
				equal(t, before.StateVersion+2, after.StateVersion, "versions")
				if v, _ := after.Value("w"); len(v.Materializations) != 0 || !v.Recoverable {
					t.Fatalf("value after the failed load: %+v", v)
				}
				for i := range after.Locations {
					a, b := after.Locations[i], before.Locations[i]
					if a.UsedBytes != b.UsedBytes || a.TemporaryBytes != 0 {
						t.Fatalf("%s: before %+v, after %+v", a.Location, b, a)
					}
				}
			})
		}
	}
	// The next reconstruction works and produces the loader's exact bytes.
	must(t, sys.Place(ctx, h, "cuda:0"), "place")
	readBoth(t, sys, h, "cuda:0", data)
}

// A consumer event recorded on a lease protects the bytes after the lease
// is released, until the event completes and the runtime has reaped it. The
// consumer here is a copy from the leased device buffer into a host buffer
// on a stream of our own; the stream first waits for a gate we complete
// ourselves, so "the copy has not run yet" is a state we hold, not a race.
func TestLeaseEventProtectsBytesUntilCopyCompletes(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 0)})
	const n = 32<<10 + 5
	data := pattern(n, 0x42)
	h := register(t, sys, system.Value{Name: "w", Bytes: n, Mode: system.Replicable, At: "pinned-host", Data: data})
	must(t, sys.Copy(ctx, h, "pinned-host", "cuda:0"), "copy to cuda:0")

	b := sys.Backend()
	host, err := b.Allocate(ctx, "pageable-host", n)
	must(t, err, "allocate host buffer")
	defer func() { must(t, b.Free(host), "free host buffer") }()
	st, err := b.NewStream("cuda:0")
	must(t, err, "stream")
	defer func() { must(t, st.Close(), "close stream") }()

	lease, err := sys.Acquire(ctx, h, "cuda:0")
	must(t, err, "acquire")
	gate := system.NewManualEvent()
	must(t, st.WaitEvent(gate), "wait event")
	must(t, st.CopyAsync(host, lease.Buffer()), "copy from the leased buffer")
	ev, err := st.Record()
	must(t, err, "record")
	id, err := lease.RecordEvent(ctx, ev)
	must(t, err, "record event on the lease")
	must(t, lease.Release(ctx), "release")

	// The copy has not run: the evict must be refused by the pending event
	// alone.
	err = sys.Evict(ctx, h, "cuda:0")
	iu := as[*system.InUseError](t, err, "evict while the consumer copy is pending")
	equal(t, system.InUseError{Handle: "w", Location: "cuda:0", UseCount: 0, HoldCount: 0, PendingEventCount: 1}, *iu, "in use error")
	if ev.Query() {
		t.Fatal("the consumer event completed before the refusal was checked")
	}
	err = sys.Discard(ctx, h)
	as[*system.InUseError](t, err, "discard while the consumer copy is pending")
	err = sys.Move(ctx, h, "cuda:0", "cuda:1")
	as[*system.InUseError](t, err, "move while the consumer copy is pending")
	if m := mats(t, snapshot(t, sys), "w")["cuda:0"]; m.PendingEventCount != 1 || m.UseCount != 0 {
		t.Fatalf("w at cuda:0: %+v", m)
	}
	hostNow, err := b.Read(ctx, host)
	must(t, err, "read host buffer")
	requireBytes(t, make([]byte, n), hostNow, "host buffer before the copy ran")

	// Let the copy run; the runtime reaps the event once it completes.
	gate.Complete()
	must(t, ev.Wait(ctx), "consumer copy")
	must(t, sys.WaitReaped(ctx, id), "wait reaped")
	if m := mats(t, snapshot(t, sys), "w")["cuda:0"]; m.PendingEventCount != 0 {
		t.Fatalf("w at cuda:0 after reaping: %+v", m)
	}
	must(t, sys.Evict(ctx, h, "cuda:0"), "evict after the copy completed")
	got, err := b.Read(ctx, host)
	must(t, err, "read host buffer")
	requireBytes(t, data, got, "bytes the consumer copied")
	must(t, sys.WaitReaped(ctx, id), "wait reaped of a reaped event")
}

// gatedSleep is a soft-backend Sleep that, while armed, holds the next
// stream copy in flight until released: a copy in flight becomes a state
// the test holds and inspects.
type gatedSleep struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newGatedSleep() *gatedSleep {
	return &gatedSleep{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (g *gatedSleep) sleep(ctx context.Context, _ time.Duration) {
	if !g.armed.CompareAndSwap(true, false) {
		return
	}
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

// While a move is in flight both ends are charged (overlap), the source is
// leaving and the destination entering; neither can be leased or removed.
// A copy's source stays removable only once the copy has settled.
func TestTransferInFlightChargesBothEnds(t *testing.T) {
	ctx := context.Background()
	gate := newGatedSleep()
	backend, err := soft.New(soft.Config{Locations: stressLocations, BandwidthBytesPerSec: 1 << 30, Sleep: gate.sleep})
	must(t, err, "soft backend")
	defer func() { must(t, backend.Close(), "close backend") }()
	sys := start(t, system.Options{Locations: fourLocations(0, 1<<20, 1<<20), Backend: backend})
	const n = 8192
	xData, rData := pattern(n, 1), pattern(n, 2)
	x := register(t, sys, system.Value{Name: "x", Bytes: n, At: "pinned-host", Data: xData})
	r := register(t, sys, system.Value{Name: "r", Bytes: n, Mode: system.Replicable, At: "pinned-host", Data: rData})

	t.Run("move", func(t *testing.T) {
		gate.armed.Store(true)
		done := make(chan error, 1)
		go func() { done <- sys.Move(ctx, x, "pinned-host", "cuda:0") }()
		<-gate.entered
		mid := snapshot(t, sys)
		m := mats(t, mid, "x")
		if m["pinned-host"].State != budget.Leaving || m["cuda:0"].State != budget.Entering {
			t.Fatalf("x during the move: %+v", m)
		}
		if p, c := loc(t, mid, "pinned-host"), loc(t, mid, "cuda:0"); p.UsedBytes != 2*n || c.UsedBytes != n {
			t.Fatalf("during the move: pinned-host %+v, cuda:0 %+v", p, c)
		}
		for _, at := range []string{"pinned-host", "cuda:0"} {
			_, err := sys.Acquire(ctx, x, at)
			as[*system.UnavailableError](t, err, "acquire x at "+at+" during the move")
			as[*system.UnavailableError](t, sys.Evict(ctx, x, at), "evict x at "+at+" during the move")
		}
		as[*system.UnavailableError](t, sys.Place(ctx, x, "cuda:1"), "place x during the move")
		unchanged(t, sys, mid, "refusals during the move")
		gate.release <- struct{}{}
		must(t, <-done, "move")
		after := snapshot(t, sys)
		equal(t, []string{"cuda:0"}, keys(mats(t, after, "x")), "x after the move")
		if p := loc(t, after, "pinned-host"); p.UsedBytes != n {
			t.Fatalf("pinned-host after the move: %+v", p)
		}
		readBoth(t, sys, x, "cuda:0", xData)
	})

	t.Run("copy", func(t *testing.T) {
		gate.armed.Store(true)
		done := make(chan error, 1)
		go func() { done <- sys.Copy(ctx, r, "pinned-host", "cuda:1") }()
		<-gate.entered
		mid := snapshot(t, sys)
		if m := mats(t, mid, "r"); m["pinned-host"].State != budget.Resident || m["cuda:1"].State != budget.Entering {
			t.Fatalf("r during the copy: %+v", m)
		}
		// The source is read by the copy: it stays resident and leasable,
		// but cannot be removed until the copy settles.
		ue := as[*system.UnavailableError](t, sys.Evict(ctx, r, "pinned-host"), "evict the source of a copy in flight")
		if ue.Reason != budget.UnavailableInFlight {
			t.Fatalf("%+v", *ue)
		}
		readBoth(t, sys, r, "pinned-host", rData)
		gate.release <- struct{}{}
		must(t, <-done, "copy")
		readBoth(t, sys, r, "cuda:1", rData)
		must(t, sys.Evict(ctx, r, "pinned-host"), "evict the source once the copy settled")
	})
}
