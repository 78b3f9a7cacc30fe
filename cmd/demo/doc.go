// Command demo shows the residency runtime at work and replays operation
// scripts against it.
//
// Usage:
//
//	go run ./cmd/demo                          # the embedded scenario (make demo)
//	go run ./cmd/demo replay FILE              # a script, as a table
//	go run ./cmd/demo replay --json FILE       # a script, one JSON object per op
//	go run ./cmd/demo replay FILE --json       # the same: flags may follow FILE
//	go run ./cmd/demo diagnose FILE            # why the script's first failed op failed
//	go run ./cmd/demo diagnose --line N FILE   # why the op at line N failed
//	go run ./cmd/demo diagnose --json FILE     # the same, as one JSON object
//	go run ./cmd/demo diagnose --error E.json --snapshot S.json --trace T.json
//	go run ./cmd/demo serve                    # a live page of a runtime at work
//	go run ./cmd/demo offload                  # a real LLM serving trace through the KV offload pipeline
//	go run ./cmd/demo cluster-demo             # etcd and three node processes: copies, a placement, a crash, in numbered steps
//	go run ./cmd/demo node --name N ...        # one cluster node as a process (docs/cluster.md)
//	go run ./cmd/demo help
//
// Everything runs on the soft backend: pinned-host and cuda:N are simulated
// in ordinary Go memory, with real bytes, goroutine streams and events. No
// GPU is needed or used, and no timing printed says anything about real
// hardware.
//
// # The scenario
//
// Without arguments, demo runs a short story on two simulated GPUs with
// budgets scaled down (1 MiB stands for 1 GiB): it registers four models
// (one resident at registration with its bytes, three with loaders), places
// them, shows that a lease and then a recorded consumer event protect a
// model from eviction (ResidencyInUseError with its counts), shows a
// budget refusal with its five byte fields, asks the controller for a
// decision that needs an eviction and enters a scope for it, injects a
// copy fault and shows the ResidencyPlanExecutionError with its partial
// report, reads every model back to check its bytes, and ends with a
// snapshot table and Close. It takes well under a second.
//
// # The offload run
//
// demo offload [--trace FILE] [--bytes-per-token N] [--speed X] [--limit N]
// [--json] replays an LLM serving trace (TIMESTAMP, ContextTokens,
// GeneratedTokens per request; default data/AzureLLMInferenceTrace_conv.csv,
// CC BY 4.0, see data/README.md, built into the command so that it runs
// from any directory) through a staging pipeline on the soft
// backend (a simulation, and the output says so). Each request's KV bytes,
// (ContextTokens + GeneratedTokens) × N (64 by default, standing for 512 KiB
// per token of a 7B fp16 model; budgets scaled alike), are saved in blocks
// of 16 tokens as JOIN_ON_FINISH writes (the prompt's blocks at arrival,
// blocking; the generated ones at finish, as a try-reserve), arrivals on a
// clock compressed X times (600). It reports the bytes offloaded and
// dropped, tasks, budget flushes, drops by reason, queue depths sampled
// every 10 s of trace time, and budget violations (used + reserved > budget
// at any location in any sample). A request with more KV than one request
// may hold (the clone budget) is refused and counted, as a server would,
// not started. The trace is read one line at a time: a line longer than
// 4 KiB, a token count beyond 2^31−1, --speed that is not a finite number
// > 0 and --limit < 0 are refused, and so is a replay that would span more
// than 366 days of trace time (a wrong timestamp) or make the run wait more
// than 24 hours (raise --speed or lower --limit). While it waits for the
// trace's arrivals it prints its progress on standard error, every 5 s.
// Exit status 1 for a violation or a
// failed task, 2 for bad flags or an unreadable trace. docs/staging.md has
// more.
//
// # The live view
//
// demo serve runs a script against a runtime one op at a time, slowed down
// so that a person can watch (--delay, 800ms by default), and serves
// over HTTP on 127.0.0.1:8080 (--addr; port 0 picks a free one):
//
//	/          the live page: one bar per location (used, reserved, budget,
//	           peak mark), the values with their materializations and
//	           protections, the last decisions with their evictions and
//	           reasons, the last ops and transitions; it polls the JSON
//	           endpoints below every half second
//	/metrics   Prometheus metrics (metrics.NewMetrics; docs/metrics.md)
//	/snapshot  the snapshot, as replay --json prints it
//	/trace     {"trace": [...]}: the trace ring, oldest first
//	/activity  the script's progress, its last ops and decisions
//	/healthz   "ok" while the runtime runs
//
// The script is the embedded scenario (cmd/demo/web/scenario.jsonl: the
// story of the scenario above, as replay ops) or --script FILE (the replay
// format; - for standard input). When it ends, serve keeps serving the
// final state until Ctrl-C or SIGTERM (both stop it alike, "demo serve:
// stopped"), then closes the runtime. Exit status: 0 once stopped when
// every expectation of the script held, 1 when one failed (or the server
// stopped on its own), 2 for bad flags, a malformed script or an address
// it cannot listen on.
//
// # Replay scripts
//
// demo replay FILE runs a JSON-lines script against a fresh runtime and
// prints one result per op as each op finishes. Use it for capacity
// what-ifs ("do these models fit on these GPUs with this much KV cache?")
// and as a regression test of budgets in CI: give ops an "expect" and the
// command fails when one does not hold. testdata/capacity-whatif.jsonl is
// a sample to copy. FILE may be - for standard input. docs/replay.md is
// the full reference of the format; this is its summary. In CI, build the
// command (go build -o bin/demo ./cmd/demo) and run bin/demo: go run
// reports every non-zero exit status of the program as 1.
//
// One JSON object per line (at most 1 MiB, nested at most 32 levels, each
// key once per object); blank lines and lines starting with # are
// skipped, and a leading UTF-8 byte order mark is ignored. The first op
// is start:
//
//	{"op":"start","locations":{"pageable-host":null,"cuda:0":"80GiB"},"trace":1024,"search_state_limit":100000}
//
// locations maps each location (pageable-host, pinned-host, cuda:N) to its
// budget, or null for none; trace is the trace ring's capacity (0 turns
// the trace off) and search_state_limit the controller's default limit,
// both optional. spill (optional) maps a location to its spill target,
// "spill":{"cuda:0":"pinned-host"}: a victim that is its value's only
// copy is then demoted there instead of dropped, when it fits (both ends
// configured and different, or the runtime refuses the start: exit
// status 2). A plan's reclaim action may carry "to", a demotion; a
// decision shows "to" on its demoted evictions and their reclaims. Byte fields take an integer or a string: "512B", "1.5MB",
// "40GiB" (KB, MB, GB, TB are decimal; KiB, MiB, GiB, TiB binary; any
// case).
//
// The ops and their fields (all required unless marked optional):
//
//	register       handle, bytes, replica (optional: exclusive or replicable), and at or source
//	place          handle, location
//	copy, move     handle, from, to
//	evict          handle, location
//	discard        handle
//	acquire        handle, location, as          take a lease named as
//	release        lease
//	record_event   lease, event                  a consumer event named event, pending until completed
//	complete_event event                         returns once the runtime has reaped it
//	hold           handle, location, as
//	unhold         hold
//	reserve        location, bytes, name
//	unreserve      name
//	explain        plan
//	execute        plan
//	decide         request, as                   keep the decision under as
//	enter          as, and decision or plan (with optional expected_version)
//	exit           scope
//	release_scope_lease  scope, enter            release by id the lease the scope took for
//	                                             its enter action number enter (from 0), behind
//	                                             its back: its exit then fails in phase exit
//	snapshot, trace
//	fail_next      kind (alloc, copy or reconstruct), location   inject a fault
//
// and for the loader cache (cache.New, cache.Load):
//
//	cache_open     name, location                open a cache
//	load           cache, key, peak, resident, as (optional)   a lease named as
//	load_fail      cache, key, peak, mode (error or panic)     a failing loader
//	cache_release  lease
//	cache_pin      lease, as                     a pin named as
//	cache_unpin    pin
//	cache_evict    cache, key
//	cache_stats    cache
//	cache_close    cache
//
// and for the device→host write pipeline (package staging; docs/replay.md,
// "The write pipeline"):
//
//	staging_start  name, device, slots, slot_bytes, claim_timeout_ms (optional), keys,
//	               pool_slots, row_bytes, clone_budget (optional), eager (optional)
//	stage          pipeline, step, bytes (0: leftover-only), fill, freeze (optional)
//	step_release   step
//	freeze         event                         complete a freeze event
//	task_open      pipeline, task, req, write_n (optional), mode (next_step or on_finish)
//	append         task, step or device_bytes (with fill, freeze, no_wait), rows [{key, slot, offset}]
//	submit         tasks
//	prioritize     tasks
//	wait           task, until (host_ready or written)
//	read_row       task, key, slot
//	read_pool      pipeline, key, slot
//	staging_stats  pipeline
//	staging_close  pipeline
//
// After every staging op the replay waits until each task is done or
// cannot move without a later op, and lists each task's lifecycle moves
// in "task_transitions"; an op that would wait forever (for a freeze event
// never completed) is invalid input. Row k of a save holds the byte fill+k.
// Staging buffers hold real bytes: at most 1 MiB each. Its errors are
// StagingConfigError, StagingSlotOverflowError, StagingSlotTimeoutError,
// StagingDropError, StagingAppendRefusedError, StagingFailedError,
// StagingNoRowError, StagingStepReleasedError and StagingClosedError.
//
// A cached value stands for its bytes: the loader reports the script's
// resident figure (0 or less, or above peak, fails the load). A load
// without as releases its lease at once; a hit runs no loader. Cache
// leases and pins have their own names (release is for acquire's). A
// cache's charges are reservations at its location, shown by snapshot and
// trace as cache "NAME"/KEY#N and owned by cache "NAME"; a script may
// name them so (unreserve of one is refused: only the cache releases it).
// An empty as is invalid input.
//
// A value registered with at is resident there at once; one registered
// with source is reconstructed by a deterministic loader through that
// location whenever it must be placed, so every replay produces the same
// bytes. Handles, leases, holds, events, decisions and scopes are named in
// the script; using a name that does not exist is an InvalidInput result.
// A name is a field like any other: when an op has several problems, the
// first in document order is reported (an unconfigured location in an
// earlier enter action before an unknown handle in a later one). "enter
// … as S" binds S whatever the outcome (a failed scope cannot be exited
// or entered again); "acquire"/"hold" names bind only on success. explain
// never fails on a plan's content: a plan with an unknown handle is
// infeasible, with the validation message as its reason. Results name
// leases, holds, events and scopes by their script names.
//
// A plan is {"reclaim":[{handle,location}], "reservations":[{name,location,
// bytes}], "enter":[{handle,location,from}]} (from optional; a missing list
// is empty). A request is {"name", "requirements":[{"handle","locations"}],
// "reservations"}: each element of locations is a tier in preference
// order, a location or an array of equally preferred locations, as in
// ["cuda:0","pinned-host"] or [["cuda:0","cuda:1"],"pinned-host"].
//
// Any op may carry "expect": "ok" or an error type name. An expected
// ResidencyPlanError also accepts ResidencySearchLimitError and
// ResidencyStaleStateError.
//
// # Output
//
// With --json, each op prints {"line", "op", "ok", "state_version", ...}:
// line is the physical line of the script, state_version the state version
// right after the op. A failed op adds "error": {"type", "message", and the
// error's fields in snake_case}:
//
//	ResidencyBudgetError         location, budget_bytes, used_bytes, reserved_bytes, requested_bytes
//	ResidencyPlanError           reason
//	ResidencySearchLimitError    request_name, state_limit, explored_states, detail
//	ResidencyStaleStateError     expected_version, actual_version
//	ResidencyInUseError          handle, location, use_count, hold_count, pending_event_count
//	ResidencyUnavailableError    handle, location, detail (null when not relevant)
//	ResidencyPlanExecutionError  phase, failed_action, failed_action_index, failed_reservation,
//	                             failed_reservation_index, partial_report, cause {type, message}
//	ResidencyCacheBusyError      key, location, refusal (budget figures, or null)
//	ResidencyCacheLoadError      key, cause {type, message} (or null), panic (or null)
//	InvalidInput                 (the message only)
//	Error                        anything else, such as an op that ran out of time
//
// explain adds "explanation" {feasible, reason, predicted_peak_bytes};
// execute and enter add "report" {transitions}; decide adds "decision"
// {expected_state_version, explored_states, evictions, plan, explanation,
// exhaustive}; snapshot adds "snapshot"; trace adds "trace"; load adds
// "load" {key, bytes, hit, lease}; cache_evict adds "evicted";
// cache_stats adds "stats" {location, budget_bytes, reserved_bytes,
// resources, evictions, location_used_bytes, location_reserved_bytes}. Without --json
// the same results are printed as a table, one row per op, each row as
// soon as its op finished; byte figures show the size and the exact
// integer ("26 GiB (27917287424)"), and control characters in names are
// escaped (in JSON too). A failed expectation is also reported on
// standard error.
//
// The runtime's own rules (what each op costs in state versions, when it
// is refused) are those of docs/semantics.md; the scripts in testdata, with
// their .golden outputs, show each of them.
//
// # Exit status
//
//	0  every op ran and every expectation held
//	1  an expectation failed (everything is still printed)
//	2  the script is malformed: bad JSON (a duplicate key included), an
//	   unknown op, a missing, unknown or mistyped field (a fractional or
//	   too large integer), both or neither of at and source, a first op
//	   that is not start, a bad start, a line over 1 MiB. The whole
//	   script is checked before anything runs, and the message names the
//	   line.
//	130  interrupted (Ctrl-C or SIGTERM): the replay stops at once, runs nothing more
//	   and says on standard error how many ops finished (also while the
//	   script is read, or FILE is a FIFO no writer opened yet).
//
// These are the statuses of the built command; go run turns every
// non-zero one into 1.
//
// On a terminal, a replay that runs longer than a second shows a progress
// bar (ops done of the script's, rate, time left) on standard error,
// cleared before each row and at the end. There is none with --json, nor
// when standard error is not a terminal (redirected, piped, in CI): then
// no bar byte is written.
//
// Values that are well formed but wrong (bytes ≤ 0, a malformed location
// inside an op, an unknown replica mode or fault kind) are not malformed
// scripts: they are InvalidInput results, like any refusal of the runtime.
//
// Replays keep at most 1 MiB of real memory per buffer, so scripts with
// budgets and models of tens of GiB run anywhere; the accounting is exact
// whatever the sizes. (A value registered with "at" holds its
// deterministic bytes up to 1 MiB and starts zero-filled beyond.) The
// script is read twice, once to check it and once to run it (standard
// input, or any script that is not a regular file, through an unlinked
// temporary file of at most 1 GiB), so memory does not grow with the
// number of lines; nor does it with the number of names: the replay keeps
// a name while what it names is alive, and only the latest 4,096 finished
// ones (docs/replay.md, "Limits").
//
// # Diagnose
//
// demo diagnose FILE runs a replay script, printing nothing, up to its
// first op whose result is an error (whatever its "expect" says), or with
// --line N up to the op at line N (failures before it are run past). Right
// when that op returns, before anything else runs, it captures a snapshot
// and the trace with diagnose.Capture and diagnoses them with
// diagnose.DiagnoseEvidence (docs/diagnose.md): the failed call (its kind
// and endpoint, from the script's fields), the decision of an "enter" of a
// decided scope, and the plan of an "execute" or an "enter" of a plan with
// its explanation (the plan is explained, which changes nothing, just
// before it runs). Everything is in the script's words, as in replay
// output: leases, holds, events and scopes by their script names (a
// scope's lease with its endpoint, in a message), never the runtime's ids.
// The ops after it do not run.
//
// The text is the diagnosis of system.Diagnosis.String after a line that
// names the script line. With --json it is one object:
//
//	{"line": N, "op": "place", "diagnosis": {"class", "message", "meaning",
//	 "first_action", "operation", "state_version", "manager_id", "capture",
//	 "steps", "endpoints", "budget", "protection", "search", "stale",
//	 "execution"}}
//
// with snake_case keys, every key always present, null for a part that
// does not apply to the class, and execution.cause a diagnosis of the same
// form; system/diagnose/diagnosis_json.go lists every field. A long script shows the
// progress bar of replay while it runs (not with --json).
//
// demo diagnose --error E.json --snapshot S.json [--trace T.json]
// [--decision D.json] [--explanation X.json] diagnoses evidence saved
// earlier: E is the replay output's error object {"type", "message",
// fields…} or a whole result line with one (its op names the call); S is
// the replay output's snapshot (bare or in its result line) or a
// system.Snapshot as encoding/json writes it; T likewise the trace array
// or a []system.Transition; D and X a decide or explain result (or their
// objects). They are read by diagnose.DecodeEvidence, as replay --json
// output is. The replay output's decision does not carry its request's
// name, so the diagnosis cannot show it.
//
// Exit status of diagnose: 0 when a diagnosis was printed; 1 when there
// was nothing to diagnose (no op failed, the op at line N succeeded), the
// capture failed or the output could not be written; 2 for bad arguments
// (--line 0 among them: a line number is ≥ 1), a malformed script, a line
// N that is not an op, or evidence that cannot be read; 130 when
// interrupted.
package main
