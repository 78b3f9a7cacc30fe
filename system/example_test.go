package system_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/system"
)

// startExample starts a small runtime on the soft (simulated) backend:
// unlimited pageable host memory, 1 MiB of pinned memory and two simulated
// GPUs of 64 KiB each.
func startExample() *system.System {
	sys, err := system.Start(context.Background(), simulated(system.Options{
		Locations: []system.LocationConfig{
			system.NoLimit("pageable-host"),
			system.Limit("pinned-host", 1<<20),
			system.Limit("cuda:0", 64<<10),
			system.Limit("cuda:1", 64<<10),
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	return sys
}

func closeExample(sys *system.System) {
	if err := sys.Close(context.Background()); err != nil {
		log.Fatal(err)
	}
	if err := sys.Backend().Close(); err != nil {
		log.Fatal(err)
	}
}

// where lists the locations a value is materialized at.
func where(sys *system.System, name string) []string {
	s, err := sys.Snapshot(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	v, _ := s.Value(name)
	var out []string
	for _, m := range v.Materializations {
		out = append(out, m.Location)
	}
	return out
}

func ExampleStart() {
	ctx := context.Background()
	locs := []system.LocationConfig{
		system.NoLimit("pageable-host"),
		system.Limit("cuda:0", 16<<20),
	}
	// There is no default backend. This example has no GPU, so it asks
	// for simulated devices by name; on a GPU machine open cu.New (package
	// cuda/cu, build tag cuda) over the same names instead.
	backend, err := system.SoftBackend(locs, soft.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close() // after the runtime: Start never closes it
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: backend})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sys.Backend().Name(), cuda.IsSimulated(sys.Backend()))

	_, err = system.Start(ctx, system.Options{Locations: locs})
	fmt.Println("no backend:", errors.Is(err, system.ErrInvalidInput))

	fmt.Println("close:", sys.Close(ctx))
	fmt.Println("again:", sys.Close(ctx)) // idempotent
	err = sys.Reserve(ctx, "cuda:0", "late", 1)
	fmt.Println("after close:", errors.Is(err, system.ErrClosed))
	// Output:
	// soft (simulated devices) true
	// no backend: true
	// close: <nil>
	// again: <nil>
	// after close: true
}

func ExampleSystem_Register() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	// A value registered at a location is resident there at once.
	_, err := sys.Register(ctx, system.Value{Name: "weights", Bytes: 4, At: "pinned-host", Data: []byte{1, 2, 3, 4}})
	if err != nil {
		log.Fatal(err)
	}
	// A value with a source is registered without a materialization; its
	// loader produces the bytes whenever it must be reconstructed, through
	// a temporary buffer at the source location.
	_, err = sys.Register(ctx, system.Value{
		Name: "table", Bytes: 3, Source: "pageable-host",
		Loader: func(_ context.Context, dst []byte) error {
			copy(dst, "abc")
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	s, _ := sys.Snapshot(ctx)
	for _, v := range s.Values {
		fmt.Printf("%s: %d bytes, at %v, source %q, recoverable %v\n", v.Handle.Name, v.Bytes, where(sys, v.Handle.Name), v.SourceLocation, v.Recoverable)
	}
	// Output:
	// weights: 4 bytes, at [pinned-host], source "", recoverable true
	// table: 3 bytes, at [], source "pageable-host", recoverable true
}

func ExampleSystem_Place() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	w, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 1024, At: "pinned-host"})
	r, _ := sys.Register(ctx, system.Value{Name: "r", Bytes: 1024, Mode: system.Replicable, At: "pinned-host"})

	// An exclusive value is moved; a replicable one is copied.
	for _, h := range []system.Handle{w, r} {
		if err := sys.Place(ctx, h, "cuda:0"); err != nil {
			log.Fatal(err)
		}
		fmt.Println(h.Name, where(sys, h.Name))
	}
	// Output:
	// w [cuda:0]
	// r [pinned-host cuda:0]
}

func ExampleSystem_Acquire() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 5, At: "pinned-host", Data: []byte("hello")})

	// Acquire never places: the value is not on cuda:0 yet.
	_, err := sys.Acquire(ctx, h, "cuda:0")
	var unavailable *system.UnavailableError
	fmt.Println("before place:", errors.As(err, &unavailable))

	if err := sys.Place(ctx, h, "cuda:0"); err != nil {
		log.Fatal(err)
	}
	lease, err := sys.Acquire(ctx, h, "cuda:0")
	if err != nil {
		log.Fatal(err)
	}
	data, err := lease.Read(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s at %s: %s\n", lease.Handle().Name, lease.Location(), data)
	fmt.Println("release:", lease.Release(ctx))
	// Output:
	// before place: true
	// w at cuda:0: hello
	// release: <nil>
}

func ExampleLease_RecordEvent() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 5, Mode: system.Replicable, At: "pinned-host", Data: []byte("bytes")})
	_ = sys.Copy(ctx, h, "pinned-host", "cuda:0")

	// Our own work reads the leased buffer on a stream: a copy to a host
	// buffer that first waits for its input to be ready.
	b := sys.Backend()
	out, _ := b.Allocate(ctx, "pageable-host", 5)
	defer func() { _ = b.Free(out) }()
	st, _ := b.NewStream("cuda:0")
	defer func() { _ = st.Close() }()
	inputReady := system.NewManualEvent()

	lease, _ := sys.Acquire(ctx, h, "cuda:0")
	_ = st.WaitEvent(inputReady)
	_ = st.CopyAsync(out, lease.Buffer())
	done, _ := st.Record()
	id, _ := lease.RecordEvent(ctx, done)
	_ = lease.Release(ctx) // the recorded event still protects the bytes

	err := sys.Evict(ctx, h, "cuda:0")
	var inUse *system.InUseError
	if errors.As(err, &inUse) {
		fmt.Println("pending events:", inUse.PendingEventCount)
	}

	inputReady.Complete()
	_ = done.Wait(ctx)
	_ = sys.WaitReaped(ctx, id)
	fmt.Println("evict:", sys.Evict(ctx, h, "cuda:0"))
	got, _ := b.Read(ctx, out)
	fmt.Printf("copied: %s\n", got)
	// Output:
	// pending events: 1
	// evict: <nil>
	// copied: bytes
}

func ExampleSystem_Evict() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 1024, Mode: system.Replicable, At: "pinned-host"})
	_ = sys.Copy(ctx, h, "pinned-host", "cuda:0")
	hold, _ := sys.Hold(ctx, h, "cuda:0")

	err := sys.Evict(ctx, h, "cuda:0")
	var inUse *system.InUseError
	if errors.As(err, &inUse) {
		fmt.Printf("%s at %s is in use: %d leases, %d holds, %d pending events\n",
			inUse.Handle, inUse.Location, inUse.UseCount, inUse.HoldCount, inUse.PendingEventCount)
		_ = hold.Release(ctx)
		err = sys.Evict(ctx, h, "cuda:0")
	}
	fmt.Println("evict:", err)

	// The last copy of a value without a source cannot be evicted.
	err = sys.Evict(ctx, h, "pinned-host")
	var planErr *system.PlanError
	fmt.Println("last copy:", errors.As(err, &planErr), errors.Is(err, system.ErrPlan))
	// Output:
	// w at cuda:0 is in use: 0 leases, 1 holds, 0 pending events
	// evict: <nil>
	// last copy: true true
}

func ExampleSystem_Reserve() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	// Reserve 60 KiB of cuda:0's 64 KiB for activations.
	if err := sys.Reserve(ctx, "cuda:0", "activations", 60<<10); err != nil {
		log.Fatal(err)
	}
	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 8 << 10, At: "pinned-host"})
	err := sys.Place(ctx, h, "cuda:0")
	var be *system.BudgetError
	if errors.As(err, &be) {
		fmt.Printf("%s: budget %d, used %d, reserved %d, requested %d\n",
			be.Location, be.BudgetBytes, be.UsedBytes, be.ReservedBytes, be.RequestedBytes)
	}
	_ = sys.Unreserve(ctx, "activations")
	fmt.Println("after unreserve:", sys.Place(ctx, h, "cuda:0"))
	// Output:
	// cuda:0: budget 65536, used 0, reserved 61440, requested 8192
	// after unreserve: <nil>
}

func ExampleSystem_Explain() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	old, _ := sys.Register(ctx, system.Value{Name: "old", Bytes: 40 << 10, Mode: system.Replicable, At: "pinned-host"})
	_ = sys.Copy(ctx, old, "pinned-host", "cuda:0")
	h, _ := sys.Register(ctx, system.Value{Name: "new", Bytes: 32 << 10, At: "pinned-host"})

	// Without a reclaim, 40 KiB + 32 KiB do not fit in 64 KiB.
	ex, _ := sys.Explain(ctx, system.Plan{Enter: []system.Action{{Handle: h, Location: "cuda:0"}}})
	fmt.Println("feasible:", ex.Feasible)

	ex, _ = sys.Explain(ctx, system.Plan{
		Reclaim: []system.Action{{Handle: old, Location: "cuda:0"}},
		Enter:   []system.Action{{Handle: h, Location: "cuda:0"}},
	})
	fmt.Println("with the reclaim:", ex.Feasible, "peak at cuda:0:", ex.PredictedPeakBytes["cuda:0"])
	// Explain changed nothing.
	fmt.Println(where(sys, "old"), where(sys, "new"))
	// Output:
	// feasible: false
	// with the reclaim: true peak at cuda:0: 40960
	// [pinned-host cuda:0] [pinned-host]
}

// Admit is the path to use under load: the controller decides and the
// scope is entered in one step, so the decision can never be stale.
func ExampleSystem_Admit() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	old, _ := sys.Register(ctx, system.Value{Name: "old", Bytes: 40 << 10, Mode: system.Replicable, At: "pinned-host"})
	_ = sys.Copy(ctx, old, "pinned-host", "cuda:0")
	_ = sys.Copy(ctx, old, "pinned-host", "cuda:1")
	h, _ := sys.Register(ctx, system.Value{Name: "new", Bytes: 32 << 10, At: "pinned-host"})

	sc, d, err := sys.Admit(ctx, system.Request{
		Name:         "step-1",
		Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sc.Exit(ctx)
	// The decision is the evidence of what was done and why.
	for _, e := range d.Evictions {
		fmt.Printf("evicted %s at %s (%d bytes): %s\n", e.Handle.Name, e.Location, e.Bytes, e.Reason)
	}
	fmt.Println("explored states:", d.ExploredStates)
	fmt.Println("leases held:", len(sc.Leases()))
	fmt.Println(where(sys, "old"), where(sys, "new"))
	// Output:
	// evicted old at cuda:0 (40960 bytes): priority H=2 (last use v4) among the lowest at cuda:0; evicted to free 40960 bytes of the 8192-byte shortfall for request "step-1"
	// explored states: 2
	// leases held: 1
	// [pinned-host cuda:1] [cuda:0]
}

func ExampleSystem_Decide() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	old, _ := sys.Register(ctx, system.Value{Name: "old", Bytes: 40 << 10, Mode: system.Replicable, At: "pinned-host"})
	_ = sys.Copy(ctx, old, "pinned-host", "cuda:0")
	_ = sys.Copy(ctx, old, "pinned-host", "cuda:1")
	h, _ := sys.Register(ctx, system.Value{Name: "new", Bytes: 32 << 10, At: "pinned-host"})

	// Put "new" on a GPU (either one), else leave it in pinned memory.
	d, err := sys.Decide(ctx, system.Request{
		Name:         "step-1",
		Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range d.Evictions {
		fmt.Printf("evict %s at %s (%d bytes)\n", e.Handle.Name, e.Location, e.Bytes)
	}
	for _, a := range d.Plan.Enter {
		fmt.Printf("enter %s at %s\n", a.Handle.Name, a.Location)
	}

	// Enter the decision's scope: it fails with a StaleStateError if the
	// state changed since the decision.
	sc := sys.ScopeFor(d)
	if err := sc.Enter(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("leases held:", len(sc.Leases()))
	fmt.Println("exit:", sc.Exit(ctx))
	fmt.Println(where(sys, "old"), where(sys, "new"))
	// Output:
	// evict old at cuda:0 (40960 bytes)
	// enter new at cuda:0
	// leases held: 1
	// exit: <nil>
	// [pinned-host cuda:1] [cuda:0]
}

func ExampleSystem_WithScope() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 3, At: "pinned-host", Data: []byte("xyz")})
	plan := system.Plan{
		Reservations: []system.ReservationSpec{{Name: "scratch", Location: "cuda:0", Bytes: 1024}},
		Enter:        []system.Action{{Handle: h, Location: "cuda:0"}},
	}
	err := sys.WithScope(ctx, plan, func(sc *system.Scope) error {
		// Inside, w is leased at cuda:0 and the scratch space is reserved.
		data, err := sys.Read(ctx, h, "cuda:0")
		if err != nil {
			return err
		}
		s, _ := sys.Snapshot(ctx)
		c0, _ := s.Location("cuda:0")
		fmt.Printf("inside: %s, reserved %d\n", data, c0.ReservedBytes)
		return nil
	})
	fmt.Println("with scope:", err)
	s, _ := sys.Snapshot(ctx)
	c0, _ := s.Location("cuda:0")
	fmt.Println("after: reserved", c0.ReservedBytes)
	// Output:
	// inside: xyz, reserved 1024
	// with scope: <nil>
	// after: reserved 0
}

func ExampleSystem_Snapshot() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)

	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 2048, Mode: system.Replicable, At: "pinned-host"})
	_ = sys.Copy(ctx, h, "pinned-host", "cuda:1")
	_ = sys.Reserve(ctx, "cuda:1", "kv-cache", 4096)
	lease, _ := sys.Acquire(ctx, h, "cuda:1")
	defer func() { _ = lease.Release(ctx) }()

	s, _ := sys.Snapshot(ctx)
	for _, l := range s.Locations {
		fmt.Printf("%-13s used %5d reserved %5d\n", l.Location, l.UsedBytes, l.ReservedBytes)
	}
	v, _ := s.Value("w")
	for _, m := range v.Materializations {
		fmt.Printf("w at %s: %s, %d uses\n", m.Location, m.State, m.UseCount)
	}
	// Output:
	// pageable-host used     0 reserved     0
	// pinned-host   used  2048 reserved     0
	// cuda:0        used     0 reserved     0
	// cuda:1        used  2048 reserved  4096
	// w at pinned-host: resident, 0 uses
	// w at cuda:1: resident, 1 uses
}
