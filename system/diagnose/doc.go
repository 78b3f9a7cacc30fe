// Package diagnose explains a failed call into the runtime (package
// system) from the evidence of the failure: the error, the call, and the
// snapshot and trace taken right after it.
//
// Take the evidence with [Capture] as soon as the call returns, before
// any cleanup (releasing a lease, exiting a scope, retrying), and run
// [DiagnoseEvidence] on it:
//
//	err := sys.Place(ctx, weights, "cuda:0")
//	if err != nil {
//		ev, _ := diagnose.Capture(ctx, sys, err, diagnose.Operation{Kind: "place", Handle: weights, Location: "cuda:0"})
//		log.Print(diagnose.DiagnoseEvidence(ev))
//	}
//
// The [Diagnosis] holds the error's class ([system.ErrorClass]), the
// steps of the procedure that apply to it with the figures they found
// (state view, endpoints, budget arithmetic, protections, the
// controller's evidence, a stale decision's gap, a partial execution),
// and the first thing to do. String renders it as text, MarshalJSON as
// one JSON object.
//
// [DecodeEvidence] reads the evidence back from the replay CLI's JSON
// output (`demo replay --json`), from fields only. Diagnosis is a pure
// function of its input: it reads no runtime and changes nothing; the
// package uses the public API of package system alone. docs/diagnose.md
// walks through each class.
package diagnose
