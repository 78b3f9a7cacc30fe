package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/diagnose"
	"github.com/residency-go/residency/system/replay"
)

const script = `{"op":"start","locations":{"pageable-host":null,"cuda:0":"1GiB"}}
{"op":"register","handle":"w","bytes":"600MiB","at":"pageable-host"}
{"op":"place","handle":"w","location":"cuda:0","expect":"ok"}
{"op":"register","handle":"kv","bytes":"600MiB","at":"cuda:0","expect":"ResidencyBudgetError"}
`

// Run checks a script, runs it and writes one JSON line per op.
func ExampleRun() {
	sum, err := replay.Run(context.Background(), strings.NewReader(script), os.Stdout, replay.Options{})
	fmt.Println(sum.Ops, "ops,", len(sum.Failed), "failed expectations, error:", err)
	// Output:
	// {"line":1,"op":"start","ok":true,"state_version":0}
	// {"line":2,"op":"register","ok":true,"state_version":2}
	// {"line":3,"op":"place","ok":true,"state_version":5}
	// {"line":4,"op":"register","ok":false,"state_version":5,"error":{"type":"ResidencyBudgetError","message":"residency budget exceeded at cuda:0: used 629145600 + reserved 0 + requested 629145600 > budget 1073741824 (short by 184549376 bytes)","location":"cuda:0","budget_bytes":1073741824,"used_bytes":629145600,"reserved_bytes":0,"requested_bytes":629145600}}
	// 4 ops, 0 failed expectations, error: <nil>
}

// Start, Do and Close run a script op by op.
func ExampleStart() {
	ctx := context.Background()
	ops, err := replay.Parse(strings.NewReader(script))
	if err != nil {
		panic(err)
	}
	r, err := replay.Start(ctx, ops[0])
	if err != nil {
		panic(err)
	}
	for _, o := range ops[1:] {
		res := r.Do(ctx, o)
		fmt.Println(res.Line, res.Op, res.OK, replay.Matches(o.Expect, &res))
	}
	fmt.Println(r.Close(ctx))
	// Output:
	// 2 register true false
	// 3 place true true
	// 4 register false true
	// <nil>
}

// A malformed script is refused whole, with the line at fault.
func ExampleParse() {
	_, err := replay.Parse(strings.NewReader(`{"op":"start","locations":{"cuda:0":null}}
{"op":"place","handle":"a","location":"cuda:0","handle":"b"}
`))
	var se *replay.ScriptError
	fmt.Println(errors.As(err, &se), se.Line)
	fmt.Println(err)
	// Output:
	// true 2
	// line 2: malformed JSON: column 48: duplicate key "handle" in one object (each key may appear once)
}

// Check reads a whole script without running it.
func ExampleCheck() {
	info, err := replay.Check(context.Background(), strings.NewReader(script), nil)
	fmt.Println(info.Ops, info.LastLine, info.OpWidth, err)
	// Output: 4 4 8 <nil>
}

// A Reader reads a script one op at a time.
func ExampleNewReader() {
	sr := replay.NewReader(context.Background(), strings.NewReader(script), nil)
	for {
		o, ok, err := sr.Next()
		if err != nil || !ok {
			break
		}
		fmt.Printf("%d %s %q\n", o.Line, o.Name, o.Expect)
	}
	// Output:
	// 1 start ""
	// 2 register ""
	// 3 place "ok"
	// 4 register "ResidencyBudgetError"
}

// Hooks and Evidence give a failure's evidence in the script's words
// (what `demo diagnose` prints a diagnosis of).
func ExampleRunner_Evidence() {
	ctx := context.Background()
	ops, _ := replay.Parse(strings.NewReader(script))
	r, _ := replay.Start(ctx, ops[0])
	defer r.Close(ctx)
	r.SetHooks(replay.Hooks{OnFail: func(ctx context.Context, o replay.Op, err error) {
		ev, cerr := diagnose.Capture(ctx, r.System(), err, r.Operation(o))
		if cerr != nil {
			panic(cerr)
		}
		ev = r.Evidence(o, ev)
		fmt.Printf("line %d: %s at version %d\n", o.Line, o.Name, ev.Snapshot.StateVersion)
	}})
	for _, o := range ops[1:] {
		r.Do(ctx, o)
	}
	// Output: line 4: register at version 5
}

// JSONWriter writes results as `demo replay --json` does.
func ExampleNewJSONWriter() {
	w := replay.NewJSONWriter(os.Stdout)
	_ = w.Write(&replay.Result{Line: 7, Op: "snapshot", OK: true, StateVersion: 3})
	// Output: {"line":7,"op":"snapshot","ok":true,"state_version":3}
}

// The ops and error types of the format.
func ExampleOpFields() {
	required, optional, ok := replay.OpFields("register")
	fmt.Println(required, optional, ok)
	fmt.Println(len(replay.OpNames()) > 40, replay.ErrorTypes()[0])
	// Output:
	// [handle bytes] [replica at source] true
	// true ResidencyBudgetError
}

// ErrorOf and Marshal give an error the contract's JSON form.
func ExampleErrorOf() {
	b, _ := replay.Marshal(replay.ErrorOf(&system.StaleStateError{ExpectedVersion: 3, ActualVersion: 5}))
	fmt.Println(string(b))
	// Output: {"type":"ResidencyStaleStateError","message":"residency stale state: expected version 3, actual 5","expected_version":3,"actual_version":5}
}

// Fill gives a value's deterministic bytes, the same at any offset.
func ExampleFill() {
	whole, part := make([]byte, 16), make([]byte, 8)
	replay.Fill("weights", 0, whole)
	replay.Fill("weights", 8, part)
	fmt.Println(bytes.Equal(whole[8:], part))
	// Output: true
}

// SortLocations orders locations as snapshots do.
func ExampleSortLocations() {
	l := []string{"cuda:10", "pinned-host", "cuda:2", "pageable-host"}
	replay.SortLocations(l)
	fmt.Println(l)
	// Output: [pageable-host pinned-host cuda:2 cuda:10]
}
