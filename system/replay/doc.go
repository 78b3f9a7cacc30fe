// Package replay is the replay script format as a library: a JSON-lines
// script of operations run against a fresh residency runtime, one result
// per operation. `demo replay` (cmd/demo) is its command line; this
// package is what it calls, and what a program or a test calls to run a
// script itself. docs/replay.md is the full reference of the ops, their
// fields and their results.
//
// # A script
//
// One op per line, a JSON object; blank lines and lines starting with #
// are ignored. The first op is start, which fixes the locations and
// their budgets:
//
//	{"op":"start","locations":{"pageable-host":null,"cuda:0":"80GiB"}}
//	{"op":"register","handle":"weights","bytes":"70GiB","at":"pageable-host"}
//	{"op":"place","handle":"weights","location":"cuda:0","expect":"ok"}
//	{"op":"snapshot"}
//
// An op may state what it expects: "ok" or an error type (ErrorTypes).
// Unknown ops and fields, duplicate keys and mistyped fields are errors,
// so a typo cannot pass silently. Byte fields take an integer or a size
// with a unit ("40GiB", "1.5MB").
//
// # Running one
//
// Run does it all: it checks the whole script (a script malformed
// anywhere runs nothing and returns a *ScriptError naming the line),
// starts a runtime on simulated devices, runs every op and writes one
// JSON line per op, the output of `demo replay --json`. Failed
// expectations are reported in the Summary, not as errors.
//
// To drive a script step by step (a progress bar, a view of the runtime
// between ops, a diagnosis at the failure), read its ops with a Reader
// (or Parse), start the runtime with Start(ctx, firstOp), run each other
// op with Runner.Do, and Close the runner. Hooks let a caller explain an
// op's plan before it runs and see a failure before anything else
// reaches the runtime (Runner.Evidence then gives the failure's evidence
// in the script's words).
//
// # Results
//
// A Result is {line, op, ok, state_version} and at most one payload: an
// error (Error: type, message and the error type's own fields), an
// explanation, a report, a decision, a snapshot, a trace, a load, a cache
// eviction or statistics, a staging payload, and the write pipeline's
// task transitions. Field order is the contract's; Marshal and
// JSONWriter write it without HTML escaping and with terminal control
// characters escaped. Results name handles, leases, holds, events,
// scopes, caches and tasks by their script names, never by the runtime's
// ids, so the output of a script is the same on every run.
//
// # Ops
//
// Each op has one handler in a table (ops.go): its required and optional
// fields, a function that reads its line and one that runs it. OpNames
// and OpFields list them. The handlers are grouped by concern:
// ops_values.go (register, place, copy, move, evict, discard, reserve,
// unreserve, snapshot, trace, fail_next), ops_leases.go (acquire, hold,
// release, record_event, complete_event, unhold), ops_plans.go (explain,
// execute, decide, enter, exit, release_scope_lease), ops_cache.go (the
// loader cache) and staging_exec.go (the device→host write pipeline of
// package staging).
//
// # Memory
//
// The runtime accounts every byte exactly, but every buffer keeps at most
// BufferLimit (1 MiB) of real memory, so a script about 80 GiB GPUs runs
// on a laptop. A value registered resident holds Fill's deterministic
// bytes when it is at most BufferLimit; a value with a source is loaded
// by Loader. A Runner's memory follows what is alive in the runtime, not
// the length of the script.
//
// A Runner is not safe for concurrent use: one op at a time.
package replay
