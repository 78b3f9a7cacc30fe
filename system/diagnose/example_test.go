package diagnose_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
)

// A refused placement, diagnosed. The evidence is captured right after the
// call fails and before anything is cleaned up: the snapshot must show the
// state that refused the call. Here the destination has room, but the
// value is rebuilt from its source through a temporary buffer at
// pinned-host, and that is where the budget is short.
func ExampleDiagnose() {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{
		ManagerID: "example",
		Locations: []system.LocationConfig{
			system.NoLimit("pageable-host"),
			system.Limit("pinned-host", 1000),
			system.Limit("cuda:0", 1000),
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close(ctx)

	staging, err := sys.Register(ctx, system.Value{Name: "staging", Bytes: 500, At: "pinned-host"})
	if err != nil {
		log.Fatal(err)
	}
	weights, err := sys.Register(ctx, system.Value{Name: "weights", Bytes: 600, Source: "pinned-host",
		Loader: func(_ context.Context, dst []byte) error { clear(dst); return nil }})
	if err != nil {
		log.Fatal(err)
	}

	err = sys.Place(ctx, weights, "cuda:0")
	if err != nil {
		// 1. Capture first: one snapshot and trace, with the failed call.
		ev, cerr := diagnose.Capture(ctx, sys, err, diagnose.Operation{Kind: "place", Handle: weights, Location: "cuda:0"})
		if cerr != nil {
			log.Fatal(cerr)
		}
		// 2. Only then clean up and retry: the temporary buffer needs
		// room at pinned-host.
		if err := sys.Discard(ctx, staging); err != nil {
			log.Fatal(err)
		}
		if err := sys.Place(ctx, weights, "cuda:0"); err != nil {
			log.Fatal(err)
		}
		fmt.Println("retry: placed")

		d := diagnose.DiagnoseEvidence(ev)
		b := d.Budget
		fmt.Println(d.Class)
		fmt.Printf("at %s: current charged %d, new peak %d, budget %d, missing %d\n",
			b.Location, b.CurrentCharged, b.NewPeak, b.BudgetBytes, b.MissingBytes)
		fmt.Println("charge:", b.Charge)
		fmt.Println("captured at the failure:", *d.Capture.AtFailure)
		fmt.Println("first action:", d.FirstAction)
	}
	// Output:
	// retry: placed
	// ResidencyBudgetError
	// at pinned-host: current charged 500, new peak 1100, budget 1000, missing 100
	// charge: temporary reconstruction charge
	// captured at the failure: true
	// first action: reconcile the five byte fields and the missing headroom before touching any budget
}

// The text rendering: each step of the procedure that applies, with what
// was checked, the figures and the verdict. Steps that do not apply to the
// class (here 3, 5, 6 and 7) are left out, each named with the errors it
// is for.
func ExampleDiagnosis_String() {
	ctx := context.Background()
	sys, err := system.Start(ctx, simulated(system.Options{
		ManagerID: "example",
		Locations: []system.LocationConfig{system.NoLimit("pageable-host"), system.Limit("cuda:0", 1000)},
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close(ctx)
	w, err := sys.Register(ctx, system.Value{Name: "w", Bytes: 100, Mode: system.Replicable, At: "pageable-host"})
	if err != nil {
		log.Fatal(err)
	}
	if err := sys.Place(ctx, w, "cuda:0"); err != nil {
		log.Fatal(err)
	}
	lease, err := sys.Acquire(ctx, w, "cuda:0")
	if err != nil {
		log.Fatal(err)
	}
	err = sys.Evict(ctx, w, "cuda:0")
	ev, cerr := diagnose.Capture(ctx, sys, err, diagnose.Operation{Kind: "evict", Handle: w, Location: "cuda:0"})
	if cerr != nil {
		log.Fatal(cerr)
	}
	if err := lease.Release(ctx); err != nil { // cleanup after the capture
		log.Fatal(err)
	}
	fmt.Print(diagnose.DiagnoseEvidence(ev))
	// Output:
	// ResidencyInUseError: residency value "w" at cuda:0 is in use: 1 leases, 0 holds, 0 pending events
	// operation: evict w @cuda:0
	// state: v5, manager example
	//
	// step 1. Capture one state view
	//   - snapshot
	//       state_version:  5
	//       manager_id:     example
	//       locations:      2
	//       live values:    1
	//     => one atomic copy of the state at v5
	//   - trace
	//       transitions:  5
	//       oldest:       v1
	//       newest:       v5
	//     => ends at the snapshot's version: snapshot and trace are one state view
	//   - the error's figures against the snapshot
	//       leases/holds/events:  1/0/0 at the refusal, 1/0/0 now
	//     => the same: the snapshot shows the state that refused the call
	//
	// step 2. Verify the exact endpoints
	//   - endpoint (w, cuda:0)
	//       bytes (fixed charge):  100 B
	//       replica_mode:          replicable
	//       recoverable:           true
	//       has_source:            false
	//       source_location:       none
	//       materializations:      pageable-host resident (100 B; leases 0, holds 0, events 0); cuda:0 resident (100 B; leases 1, holds 0, events 0)
	//     => live value; resident at cuda:0
	//
	// step 3 does not apply to this ResidencyInUseError:
	//   3: only for a charge refused by a location's budget (ResidencyBudgetError, or a cache refusal that carries one)
	//
	// step 4. Check protection before changing placement
	//   - protection of (w, cuda:0) at the refusal
	//       use_count:            1
	//       hold_count:           0
	//       pending_event_count:  0
	//     => any count above zero blocks the removal; the controller would skip this materialization as a victim
	//   - owning lifetimes open in the trace
	//       leases:          lease 1 (taken at v5)
	//       holds:           none
	//       pending events:  none
	//     => release the lease(s) once every reading stream has recorded its event; or defer the removal; never discard or close the runtime to get past unknown readers
	//
	// steps 5–7 do not apply to this ResidencyInUseError:
	//   5: only for the controller's refusals (search limit, stale state, an infeasible plan)
	//   6: only for a decision entered after the state moved on (ResidencyStaleStateError)
	//   7: only for a failed execution (ResidencyPlanExecutionError)
	//
	// step 8. Classify the result
	//   - class
	//       class:    ResidencyInUseError
	//       meaning:  a lease, hold or pending consumer event protects the materialization a removal needed
	//     => first action: end the owning lifetime (release the lease or hold, wait for the event) or remove later
}

// Diagnose a failure from saved replay output (`demo replay --json`): the
// first failed result, with the snapshot and trace after it.
func ExampleDecodeEvidence() {
	f, err := os.Open("testdata/replay.out.jsonl")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	ev, err := diagnose.DecodeEvidence(f, 0)
	if err != nil {
		log.Fatal(err)
	}
	d := diagnose.DiagnoseEvidence(ev)
	fmt.Println(d.Class, system.ErrorClass(ev.Err) == system.ErrorBudget)
	fmt.Println("missing bytes:", d.Budget.MissingBytes)
	// Output:
	// ResidencyBudgetError true
	// missing bytes: 100
}
