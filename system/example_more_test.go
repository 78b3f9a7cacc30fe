package system_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/system"
)

// Copy keeps a replicable value at several locations; Move relocates one
// copy (copy, then remove the source).
func ExampleSystem_Copy() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	data := bytes.Repeat([]byte("kv"), 512)
	h, err := sys.Register(ctx, system.Value{Name: "prefix", Bytes: int64(len(data)), Mode: system.Replicable, At: "pinned-host", Data: data})
	if err != nil {
		log.Fatal(err)
	}
	if err := sys.Copy(ctx, h, "pinned-host", "cuda:0"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after copy:", where(sys, "prefix"))
	if err := sys.Move(ctx, h, "cuda:0", "cuda:1"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after move:", where(sys, "prefix"))
	got, _ := sys.Read(ctx, h, "cuda:1")
	fmt.Println("bytes intact:", bytes.Equal(got, data))
	// Output:
	// after copy: [pinned-host cuda:0]
	// after move: [pinned-host cuda:1]
	// bytes intact: true
}

// A hold protects a materialization (for as long as the application
// wants it pinned) without a lease.
func ExampleSystem_Hold() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	h, _ := sys.Register(ctx, system.Value{Name: "adapter", Bytes: 1024, At: "cuda:0"})
	hold, err := sys.Hold(ctx, h, "cuda:0")
	if err != nil {
		log.Fatal(err)
	}
	var inUse *system.InUseError
	if err := sys.Discard(ctx, h); errors.As(err, &inUse) {
		fmt.Println("discard refused:", inUse.HoldCount, "hold")
	}
	if err := hold.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("discard after release:", sys.Discard(ctx, h))
	// Output:
	// discard refused: 1 hold
	// discard after release: <nil>
}

// Execute runs a plan without a scope: its reservation stays active until
// released by name.
func ExampleSystem_Execute() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 4096, At: "pinned-host"})
	report, err := sys.Execute(ctx, system.Plan{
		Reservations: []system.ReservationSpec{{Name: "activations", Location: "cuda:0", Bytes: 8192}},
		Enter:        []system.Action{{Handle: h, Location: "cuda:0"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range report.Transitions {
		fmt.Println(t.Kind, t.Handle, t.Location, t.Bytes)
	}
	snap, _ := sys.Snapshot(ctx)
	c0, _ := snap.Location("cuda:0")
	fmt.Println("cuda:0 used", c0.UsedBytes, "reserved", c0.ReservedBytes)
	fmt.Println(sys.Unreserve(ctx, "activations"))
	// Output:
	// reserve  cuda:0 8192
	// admit w cuda:0 4096
	// complete w cuda:0 4096
	// remove w pinned-host 4096
	// cuda:0 used 4096 reserved 8192
	// <nil>
}

// A scope prepared for an expected state version refuses to enter once
// anything changed in between: the decision it came from is stale.
func ExampleSystem_NewScopeExpecting() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 1024, At: "pinned-host"})
	snap, _ := sys.Snapshot(ctx)
	scope := sys.NewScopeExpecting(system.Plan{Enter: []system.Action{{Handle: h, Location: "cuda:0"}}}, snap.StateVersion)
	if err := sys.Reserve(ctx, "cuda:1", "other-tenant", 1024); err != nil { // an intervening mutation
		log.Fatal(err)
	}
	var stale *system.StaleStateError
	err := scope.Enter(ctx)
	if errors.As(err, &stale) {
		fmt.Println("stale:", stale.ExpectedVersion, "→", stale.ActualVersion, "plan category:", errors.Is(err, system.ErrPlan))
	}
	fmt.Println("nothing entered:", where(sys, "w"))
	// Output:
	// stale: 2 → 3 plan category: true
	// nothing entered: [pinned-host]
}

// Trace lists the committed transitions (a bounded ring).
func ExampleSystem_Trace() {
	ctx := context.Background()
	sys := startExample()
	defer closeExample(sys)
	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 512, Mode: system.Replicable, At: "pageable-host"})
	_ = sys.Place(ctx, h, "cuda:0")
	trace, _ := sys.Trace(ctx)
	for _, t := range trace {
		fmt.Println(t)
	}
	// Output:
	// v1 admit w @pageable-host 512B (register at)
	// v2 complete w @pageable-host 512B
	// v3 admit w @cuda:0 512B (copy from pageable-host)
	// v4 complete w @cuda:0 512B
}

// Close reports what the application forgot to release, and releases it.
func ExampleSystem_Close() {
	ctx := context.Background()
	sys := startExample()
	h, _ := sys.Register(ctx, system.Value{Name: "w", Bytes: 512, At: "cuda:0"})
	if _, err := sys.Acquire(ctx, h, "cuda:0"); err != nil {
		log.Fatal(err)
	}
	err := sys.Close(ctx)
	var out *system.OutstandingError
	if errors.As(err, &out) {
		fmt.Println("forgotten leases:", len(out.Outstanding.Leases), out.Outstanding.Leases[0].Handle, out.Outstanding.Leases[0].Location)
	}
	final, _ := sys.Snapshot(ctx)
	c0, _ := final.Location("cuda:0")
	fmt.Println("cuda:0 used after close:", c0.UsedBytes)
	fmt.Println("later calls:", sys.Place(ctx, h, "cuda:1") == system.ErrClosed)
	// Output:
	// forgotten leases: 1 w cuda:0
	// cuda:0 used after close: 0
	// later calls: true
}

// StateVersion reads the version without copying the state.
func ExampleSystem_StateVersion() {
	ctx := context.Background()
	sys, _ := system.Start(ctx, simulated(system.Options{ManagerID: "rm-example", Locations: []system.LocationConfig{system.NoLimit("pageable-host")}}))
	defer sys.Close(ctx)
	before, _ := sys.StateVersion(ctx)
	_, _ = sys.Register(ctx, system.Value{Name: "kv-block", Bytes: 4096, At: "pageable-host"})
	after, _ := sys.StateVersion(ctx)
	fmt.Println(before, after)
	// Output: 0 2
}

// DeviceLimit sizes a GPU's budget from what NVML reports (here a made-up
// 80 GiB device; use cuda/discover's inventory on a real machine): total
// memory less 6 GiB of headroom, capped at 70 GiB.
func ExampleDeviceLimit() {
	info := cuda.DeviceInfo{UUID: "GPU-example", Name: "an 80 GiB GPU", TotalBytes: 80 << 30}
	loc, err := system.DeviceLimit("cuda:0", info, 70<<30, 6<<30)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(loc.Name, loc.BudgetBytes>>30, "GiB")
	_, err = system.DeviceLimit("cuda:0", info, 0, 90<<30)
	fmt.Println(errors.Is(err, system.ErrInvalidInput))
	// Output:
	// cuda:0 70 GiB
	// true
}
