// Package liveview serves a live view of a running residency runtime
// over HTTP, the way net/http/pprof and expvar serve a process's
// profiles and variables: the application mounts [Handler] on its own
// mux, under a prefix of its choosing,
//
//	view, err := liveview.Handler(sys) // an error only for a nil sys
//	if err != nil { ... }
//	mux.Handle("/debug/residency/", http.StripPrefix("/debug/residency", view))
//
// and the view is at /debug/residency/. The paths below are relative to
// that prefix.
//
//	/              the live page: every location with its used, reserved
//	               and peak bytes against its budget and its named
//	               reservations; every value with its size, replica mode
//	               and materializations (state, leases, holds, pending
//	               events); the loader caches and their entries; the
//	               staging pipelines; the callers waiting for room; the
//	               diagnosis of the last failure; the last transitions of
//	               the trace. It polls snapshot, trace, caches, pipelines,
//	               waiters and diagnose twice a second while it is open.
//	/liveview.js   the page's script and style (liveview.css), which a
//	/liveview.css  page of the application's own may reuse (cmd/demo's
//	               serve page does).
//	/snapshot      the runtime's snapshot (System.Snapshot: one atomic
//	               copy of the state) as JSON.
//	/trace         the runtime's trace ring (System.Trace), oldest first,
//	               as JSON: {"trace": [transition, …]}.
//	/caches        the loader caches given with [WithCache], as JSON:
//	               {"caches": [{"owner": …, "stats": …, "entries": […]}, …]}:
//	               each cache's statistics (Cache.Statistics) in the form
//	               of replay's cache_stats op ([wire.CacheStatsOf]), or
//	               "error" in their place when they could not be read, and
//	               its entries (Cache.Entries), by key: "key", "state"
//	               ("loading" or "ready"), "bytes", "leases", "pins",
//	               "keep_alives", "last_use", "keep_alive_ns" (null: kept
//	               until evicted), "expiry" (null: held, loading or kept
//	               forever), "evict_when_idle"; times are RFC 3339 in UTC.
//	               {"caches": []} without WithCache.
//	/pipelines     the staging pipelines given with [WithPipeline], as
//	               JSON: {"pipelines": [{"pipeline": n, "stats": …}, …]},
//	               n the pipeline's position among those given, stats its
//	               Pipeline.Stats in the form of replay's staging_stats op
//	               ([wire.StagingStats]): slots, free and held; the clone
//	               budget's bytes in use, peak and cap; live tasks per
//	               state ("tasks": PENDING, QUEUED, COPYING, HOST_READY,
//	               zeros included); drops
//	               by reason ("drops"); tasks opened, written and failed;
//	               the failure's message or null. {"pipelines": []}
//	               without WithPipeline.
//	/waiters       the callers waiting for room (System.Waiters: Admit or
//	               a cache's Load with a system.WaitOption), in queue
//	               order, as JSON: {"waiters": [{"name": …, "class": …,
//	               "locations": […], "allow_bypass": …, "since": …,
//	               "tries": …, "eligible": …}, …]}: the request's name or
//	               cache key, its priority class, where it needs room,
//	               whether later waiters may pass it, when it was queued
//	               (RFC 3339 in UTC), the turns it has had, and whether no
//	               waiter ahead holds it up. {"waiters": []} when nobody
//	               waits.
//	/diagnose      the diagnosis (diagnose.DiagnoseEvidence) of the last
//	               failure the application hands the view with
//	               [WithEvidence]: its JSON form (Diagnosis.MarshalJSON),
//	               or with ?format=text its text form (Diagnosis.String);
//	               null (text: a sentence) while there is no failure. Any
//	               other format is 400; without WithEvidence, 404. The
//	               evidence is the application's: nothing is posted here.
//
// # The JSON form
//
// [system.Snapshot] has no JSON form of its own (its states and replica
// modes are Go enums), so /snapshot and /trace use the form the replay
// format already defines for its snapshot and trace ops, in the
// runtime's words: [wire.SnapshotOf] and [wire.TransitionsOf],
// encoded by [wire.Marshal] (docs/replay.md lists the fields). That is
// what `demo replay --json` prints for a snapshot op, so one decoder
// reads both. A snapshot body is exactly
//
//	wire.Marshal(wire.SnapshotOf(snap, nil))
//
// for the snapshot snap at the state version the body names
// ("state_version").
//
// # Cost and safety
//
// The handler is read-only: it answers GET and HEAD and refuses every
// other method with 405 Method Not Allowed; an unknown path is 404. It
// starts no goroutine and polls nothing: each request costs one snapshot
// or one trace (or one statistics call per cache shown): a round trip to
// the runtime's supervisor, the same as the application's own call; a
// cache's entries are read under its lock, a pipeline's counters without
// waiting on its work, the waiters under the wait queue's lock, the evidence by the application's function, and a
// runtime nobody looks at pays nothing. Every link and fetch of the page is relative, so the view
// works under any prefix, and its assets are embedded in the binary: it
// needs nothing from outside. A runtime that is closed answers /snapshot
// with its final snapshot and /trace with 503 Service Unavailable.
//
// The view shows the runtime's state, value names and reservation names
// included: mount it where the application serves its other debugging
// endpoints, not on a public listener.
package liveview
