package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cacheStart: cuda:0 has 10 bytes; a cache "c" is open there (line 2).
const cacheStart = `{"op":"start","locations":{"pageable-host":null,"cuda:0":10}}
{"op":"cache_open","name":"c","location":"cuda:0"}
`

type wantResult struct {
	typ string // "ok" or an error type
	msg string // a fragment of the message ("" for none)
}

// checkResults replays script (expected to exit 0) and checks the results
// of the given lines.
func checkResults(t *testing.T, script string, want map[int]wantResult) map[int]map[string]any {
	t.Helper()
	results, code, errs := replayResults(t, script)
	require.Equal(t, 0, code, errs)
	for line, w := range want {
		res := results[line]
		require.NotNil(t, res, "no result for line %d", line)
		assert.Equal(t, w.typ, errType(res), "line %d: %s", line, errMessage(res))
		assert.Contains(t, errMessage(res), w.msg, "line %d", line)
	}
	return results
}

func version(res map[string]any) int { return int(res["state_version"].(float64)) }

func payload(t *testing.T, res map[string]any, key string) map[string]any {
	t.Helper()
	p, ok := res[key].(map[string]any)
	require.True(t, ok, "no %q in %v", key, res)
	return p
}

// TestCacheOpen: a cache binds its name only on success; the location is
// checked by the runtime; a name is never bound twice.
func TestCacheOpen(t *testing.T) {
	script := `{"op":"start","locations":{"pageable-host":null,"cuda:0":10}}
{"op":"cache_open","name":"c","location":"cuda:9"}
{"op":"cache_open","name":"c","location":"gpu0"}
{"op":"cache_open","name":"c","location":""}
{"op":"cache_open","name":"","location":"cuda:0"}
{"op":"cache_open","name":"c","location":"cuda:0"}
{"op":"cache_open","name":"c","location":"cuda:0"}
{"op":"cache_open","name":"c","location":"cuda:9"}
{"op":"cache_open","name":"host","location":"pageable-host"}
{"op":"load","cache":"host","key":"k","peak":"1TiB","resident":"1TiB"}
{"op":"cache_stats","cache":"host"}
{"op":"load","cache":"nope","key":"k","peak":1,"resident":1}
`
	results := checkResults(t, script, map[int]wantResult{
		2:  {"ResidencyUnavailableError", "cuda:9"},
		3:  {"InvalidInput", "gpu0"},
		4:  {"InvalidInput", "location is required"},
		5:  {"InvalidInput", "a cache name must not be empty"},
		6:  {"ok", ""},
		7:  {"InvalidInput", `duplicate cache name "c"`},
		8:  {"InvalidInput", `duplicate cache name "c"`}, // the name is the first field
		9:  {"ok", ""},
		10: {"ok", ""},
		11: {"ok", ""},
		12: {"InvalidInput", `unknown cache "nope" (open it first with cache_open)`},
	})
	assert.Equal(t, 0, version(results[6]), "opening a cache charges nothing")
	st := payload(t, results[11], "stats")
	assert.Nil(t, st["budget_bytes"], "no budget: null")
	assert.EqualValues(t, int64(1)<<40, st["reserved_bytes"])
}

// TestCacheLoad: a miss reserves the peak and shrinks to resident (2
// versions, 1 when they are equal); a hit costs nothing and reports the
// bytes of the load; "as" binds a lease only on success; without it the
// lease is released at once.
func TestCacheLoad(t *testing.T) {
	script := cacheStart +
		`{"op":"load","cache":"c","key":"a","peak":6,"resident":4,"as":"A"}
{"op":"load","cache":"c","key":"a","peak":9,"resident":1,"as":"A2"}
{"op":"load","cache":"c","key":"b","peak":3,"resident":3}
{"op":"load","cache":"c","key":"x","peak":"3B","resident":1,"as":"A"}
{"op":"load","cache":"c","key":"x","peak":11,"resident":1,"as":"X"}
{"op":"load","cache":"c","key":"x","peak":4,"resident":4,"as":"X"}
{"op":"load","cache":"c","key":"y","peak":3,"resident":1,"as":"Y"}
{"op":"cache_release","lease":"X"}
{"op":"load","cache":"c","key":"y","peak":3,"resident":1,"as":"Y"}
{"op":"cache_stats","cache":"c"}
{"op":"cache_release","lease":"Z"}
`
	results := checkResults(t, script, map[int]wantResult{
		3:  {"ok", ""},
		4:  {"ok", ""},
		5:  {"ok", ""},
		6:  {"InvalidInput", `duplicate cache lease name "A"`},
		7:  {"ResidencyBudgetError", ""},
		8:  {"ok", ""},
		9:  {"ResidencyCacheBusyError", `key "y"`},
		10: {"ok", ""},
		11: {"ok", ""},
		12: {"ok", ""},
		13: {"InvalidInput", `unknown cache lease "Z"`},
	})
	miss := payload(t, results[3], "load")
	assert.Equal(t, map[string]any{"key": "a", "bytes": 4.0, "hit": false, "lease": "A"}, miss)
	assert.Equal(t, 2, version(results[3]), "reserve 6, shrink to 4")

	hit := payload(t, results[4], "load")
	assert.Equal(t, map[string]any{"key": "a", "bytes": 4.0, "hit": true, "lease": "A2"}, hit, "a hit reports the loaded bytes, not the op's")
	assert.Equal(t, 2, version(results[4]), "a hit costs no version")

	noAs := payload(t, results[5], "load")
	assert.Nil(t, noAs["lease"])
	assert.Contains(t, noAs, "lease", "lease is null, not absent")
	assert.Equal(t, 4, version(results[5]), "peak = resident: one version; the lease released at once offers the idle entry: one more")

	assert.Equal(t, 4, version(results[7]), "a peak above the budget evicts nothing")
	// b (idle, least recently used) was evicted for x; a (leased) was not.
	assert.Equal(t, 7, version(results[8]), "evicting b (2: evicting, released) and loading x at its peak (1)")
	assert.Equal(t, 7, version(results[9]), "a and x leased: nothing to evict, nothing changed")
	// y's name was left free by the refusal; x, released, is evicted for it.
	assert.Equal(t, 12, version(results[11]), "x's release offers it (1); evicting x (2), reserving y's peak (1), shrinking it (1)")
	st := payload(t, results[12], "stats")
	assert.EqualValues(t, 5, st["reserved_bytes"])
	assert.EqualValues(t, 2, st["resources"])
	assert.EqualValues(t, 2, st["evictions"])
	assert.EqualValues(t, 10, st["budget_bytes"])
	assert.EqualValues(t, "cuda:0", st["location"])
	assert.EqualValues(t, 5, st["location_reserved_bytes"])
	assert.EqualValues(t, 0, st["location_used_bytes"])
}

// TestCacheLoadFailures: load_fail and bad resident bytes are rolled back
// (nothing stays charged) and the next load retries.
func TestCacheLoadFailures(t *testing.T) {
	script := cacheStart +
		`{"op":"load_fail","cache":"c","key":"k","peak":5,"mode":"error"}
{"op":"load_fail","cache":"c","key":"k","peak":5,"mode":"panic"}
{"op":"load","cache":"c","key":"k","peak":5,"resident":0,"as":"K"}
{"op":"load","cache":"c","key":"k","peak":5,"resident":-1,"as":"K"}
{"op":"load","cache":"c","key":"k","peak":5,"resident":6,"as":"K"}
{"op":"cache_stats","cache":"c"}
{"op":"load","cache":"c","key":"k","peak":5,"resident":5,"as":"K"}
{"op":"load_fail","cache":"c","key":"k","peak":5,"mode":"error"}
{"op":"load_fail","cache":"c","key":"k","peak":5,"mode":"sometimes"}
`
	results := checkResults(t, script, map[int]wantResult{
		3:  {"ResidencyCacheLoadError", `loading "k" failed`},
		4:  {"ResidencyCacheLoadError", `loader of "k" panicked`},
		5:  {"ResidencyCacheLoadError", "0 resident bytes"},
		6:  {"ResidencyCacheLoadError", "-1 resident bytes"},
		7:  {"ResidencyCacheLoadError", "6 resident bytes"},
		8:  {"ok", ""},
		9:  {"ok", ""},
		10: {"ok", ""}, // a hit: the loader does not run, so it cannot fail
		11: {"InvalidInput", `unknown load_fail mode "sometimes" (use error or panic)`},
	})
	e := results[3]["error"].(map[string]any)
	assert.Equal(t, "k", e["key"])
	assert.Equal(t, "Error", e["cause"].(map[string]any)["type"])
	assert.Nil(t, e["panic"])
	p := results[4]["error"].(map[string]any)
	assert.Nil(t, p["cause"])
	assert.Contains(t, p["panic"], "panicked")
	assert.NotContains(t, results[4]["error"], "stack", "a stack differs from run to run")
	b := results[5]["error"].(map[string]any)
	assert.Equal(t, "InvalidInput", b["cause"].(map[string]any)["type"])
	for line := 3; line <= 7; line++ {
		assert.Equal(t, 2*(line-2), version(results[line]), "line %d: a failed load costs 2 versions", line)
	}
	st := payload(t, results[8], "stats")
	assert.EqualValues(t, 0, st["reserved_bytes"])
	assert.EqualValues(t, 0, st["resources"])
	assert.True(t, payload(t, results[10], "load")["hit"].(bool))
	assert.Nil(t, payload(t, results[10], "load")["lease"])
}

// TestCacheLeasesAndPins: releases, pins, busy evictions, and which op
// releases which kind of lease.
func TestCacheLeasesAndPins(t *testing.T) {
	script := cacheStart +
		`{"op":"register","handle":"v","bytes":1,"at":"cuda:0"}
{"op":"acquire","handle":"v","location":"cuda:0","as":"R"}
{"op":"load","cache":"c","key":"k","peak":2,"resident":2,"as":"K"}
{"op":"cache_evict","cache":"c","key":"k"}
{"op":"cache_pin","lease":"K","as":"P"}
{"op":"cache_pin","lease":"K","as":"P"}
{"op":"cache_pin","lease":"nope","as":"Q"}
{"op":"cache_release","lease":"K"}
{"op":"cache_pin","lease":"K","as":"Q"}
{"op":"cache_evict","cache":"c","key":"k"}
{"op":"cache_unpin","pin":"P"}
{"op":"cache_unpin","pin":"P"}
{"op":"cache_unpin","pin":"nope"}
{"op":"cache_evict","cache":"c","key":"k"}
{"op":"cache_evict","cache":"c","key":"k"}
{"op":"cache_release","lease":"R"}
{"op":"release","lease":"K"}
{"op":"cache_release","lease":"K"}
{"op":"cache_release","lease":"ghost"}
{"op":"release","lease":"ghost"}
`
	results := checkResults(t, script, map[int]wantResult{
		6:  {"ResidencyCacheBusyError", `key "k" at cuda:0 is leased`},
		7:  {"ok", ""},
		8:  {"InvalidInput", `duplicate cache pin name "P"`},
		9:  {"InvalidInput", `unknown cache lease "nope"`},
		10: {"ok", ""},
		11: {"InvalidInput", `cannot pin through cache lease "K": it was released`},
		12: {"ResidencyCacheBusyError", ""},
		13: {"ok", ""},
		14: {"InvalidInput", `cache pin "P" was already released`},
		15: {"InvalidInput", `unknown cache pin "nope"`},
		16: {"ok", ""},
		17: {"ok", ""},
		18: {"InvalidInput", `unknown cache lease "R": it is a lease of acquire, release it with release`},
		19: {"InvalidInput", `unknown lease "K": it is a cache lease, release it with cache_release`},
		20: {"InvalidInput", `cache lease "K" was already released`},
		21: {"InvalidInput", `unknown cache lease "ghost"`},
		22: {"InvalidInput", `unknown lease "ghost"`},
	})
	busy := results[6]["error"].(map[string]any)
	assert.Equal(t, "k", busy["key"])
	assert.Equal(t, "cuda:0", busy["location"])
	assert.Nil(t, busy["refusal"], "an Evict refusal has no budget figures")
	assert.Equal(t, true, results[16]["evicted"])
	assert.Equal(t, version(results[15])+1, version(results[16]), "an eviction is one version")
	assert.Equal(t, false, results[17]["evicted"], "an absent key: false, not an error")
	assert.Contains(t, results[17], "evicted")
	assert.NotContains(t, errMessage(results[22]), "cache lease")
}

// TestCacheBusyRefusal: a load that finds nothing idle to evict is a
// ResidencyCacheBusyError with the ledger's figures; its "as" stays free.
func TestCacheBusyRefusal(t *testing.T) {
	script := cacheStart +
		`{"op":"register","handle":"v","bytes":3,"at":"cuda:0"}
{"op":"load","cache":"c","key":"a","peak":5,"resident":5,"as":"A"}
{"op":"load","cache":"c","key":"b","peak":4,"resident":4,"as":"B"}
{"op":"cache_release","lease":"A"}
{"op":"load","cache":"c","key":"b","peak":4,"resident":4,"as":"B"}
{"op":"reserve","location":"cuda:0","name":"r","bytes":4}
`
	results := checkResults(t, script, map[int]wantResult{
		5: {"ResidencyCacheBusyError", "nothing idle is left to evict"},
		6: {"ok", ""},
		7: {"ok", ""},
		8: {"ResidencyBudgetError", ""}, // the runtime's reservation never evicts cache entries
	})
	e := results[5]["error"].(map[string]any)
	assert.Equal(t, "b", e["key"])
	assert.Equal(t, map[string]any{"location": "cuda:0", "budget_bytes": 10.0, "used_bytes": 3.0, "reserved_bytes": 5.0, "requested_bytes": 4.0}, e["refusal"])
	assert.Equal(t, version(results[4]), version(results[5]), "nothing to evict: the refusal changed nothing")
	assert.False(t, payload(t, results[7], "load")["hit"].(bool))
}

// TestCacheClose: a closed cache loads and evicts nothing (invalid input,
// in the script's words); its leased entries keep their charge until
// released; it still answers cache_stats.
func TestCacheClose(t *testing.T) {
	script := cacheStart +
		`{"op":"load","cache":"c","key":"held","peak":3,"resident":3,"as":"H"}
{"op":"load","cache":"c","key":"idle","peak":2,"resident":2}
{"op":"cache_close","cache":"c"}
{"op":"cache_stats","cache":"c"}
{"op":"load","cache":"c","key":"idle","peak":2,"resident":2}
{"op":"load_fail","cache":"c","key":"x","peak":2,"mode":"error"}
{"op":"cache_evict","cache":"c","key":"held"}
{"op":"cache_close","cache":"c"}
{"op":"cache_close","cache":"nope"}
{"op":"cache_release","lease":"H"}
{"op":"cache_stats","cache":"c"}
{"op":"cache_open","name":"c","location":"cuda:0"}
`
	results := checkResults(t, script, map[int]wantResult{
		5:  {"ok", ""},
		6:  {"ok", ""},
		7:  {"InvalidInput", `cache "c" is closed`},
		8:  {"InvalidInput", `cache "c" is closed`},
		9:  {"InvalidInput", `cache "c" is closed`},
		10: {"InvalidInput", `cache "c" was already closed`},
		11: {"InvalidInput", `unknown cache "nope"`},
		12: {"ok", ""},
		13: {"ok", ""},
		14: {"InvalidInput", `duplicate cache name "c"`},
	})
	assert.EqualValues(t, 3, payload(t, results[6], "stats")["reserved_bytes"], "the idle entry went at close, the leased one stays")
	assert.Equal(t, version(results[5])+1, version(results[12]), "the last lease of a closed cache's entry releases its charge")
	assert.EqualValues(t, 0, payload(t, results[13], "stats")["reserved_bytes"])
}

// TestCacheOrderOfChecks: the first problem in field order is reported;
// names are fields; rules come after every field.
func TestCacheOrderOfChecks(t *testing.T) {
	script := cacheStart +
		`{"op":"load","cache":"c","key":"a","peak":5,"resident":5,"as":"A"}
{"op":"load","cache":"nope","key":"","peak":0,"resident":1,"as":"A"}
{"op":"load","cache":"c","key":"","peak":0,"resident":1,"as":"A"}
{"op":"load","cache":"c","key":"x","peak":0,"resident":1,"as":"A"}
{"op":"load","cache":"c","key":"x","peak":99,"resident":1,"as":"A"}
{"op":"load","cache":"c","key":"x","peak":6,"resident":1,"as":"A"}
{"op":"load_fail","cache":"c","key":"","peak":0,"mode":"dunno"}
{"op":"load_fail","cache":"c","key":"x","peak":0,"mode":"dunno"}
{"op":"load_fail","cache":"c","key":"x","peak":1,"mode":"dunno"}
{"op":"cache_evict","cache":"nope","key":""}
{"op":"cache_pin","lease":"nope","as":"P"}
`
	checkResults(t, script, map[int]wantResult{
		3:  {"ok", ""},
		4:  {"InvalidInput", `unknown cache "nope"`},
		5:  {"InvalidInput", "cache key is empty"},
		6:  {"InvalidInput", `cache key "x": peak bytes must be positive, got 0`},
		7:  {"InvalidInput", `duplicate cache lease name "A"`}, // before the budget (a rule)
		8:  {"InvalidInput", `duplicate cache lease name "A"`}, // before the busy refusal (a rule)
		9:  {"InvalidInput", "cache key is empty"},
		10: {"InvalidInput", "peak bytes must be positive"},
		11: {"InvalidInput", `unknown load_fail mode "dunno"`},
		12: {"InvalidInput", `unknown cache "nope"`},
		13: {"InvalidInput", `unknown cache lease "nope"`},
	})
}

// TestCacheSnapshotAndTrace: the cache's charges are reservations in the
// snapshot, owned by the cache and named in the script's words, the same
// from one replay to the next within a process (the runtime numbers its
// caches process-wide).
func TestCacheSnapshotAndTrace(t *testing.T) {
	script := cacheStart +
		`{"op":"register","handle":"v","bytes":2,"at":"cuda:0"}
{"op":"load","cache":"c","key":"k","peak":4,"resident":3,"as":"K"}
{"op":"enter","as":"S","plan":{"reservations":[{"name":"kv","location":"cuda:0","bytes":1}]}}
{"op":"reserve","location":"cuda:0","name":"free","bytes":1}
{"op":"snapshot"}
{"op":"load","cache":"c","key":"more","peak":4,"resident":1,"expect":"ResidencyCacheBusyError"}
{"op":"trace"}
`
	results := checkResults(t, script, map[int]wantResult{7: {"ok", ""}, 8: {"ResidencyCacheBusyError", ""}})
	locs := payload(t, results[7], "snapshot")["locations"].([]any)
	cuda := locs[1].(map[string]any)
	require.Equal(t, "cuda:0", cuda["location"])
	assert.EqualValues(t, 5, cuda["reserved_bytes"])
	assert.Equal(t, []any{
		map[string]any{"name": `cache "c"/k#1`, "bytes": 3.0, "owner": `cache "c"`},
		map[string]any{"name": "kv", "bytes": 1.0, "owner": `scope "S"`},
		map[string]any{"name": "free", "bytes": 1.0},
	}, cuda["reservations"])

	var details []string
	for _, tr := range results[9]["trace"].([]any) {
		details = append(details, tr.(map[string]any)["detail"].(string))
	}
	assert.Contains(t, details, `cache "c"/k#1`)
	assert.Contains(t, details, `cache "c"/k#1: 4 → 3`)

	_, first, _ := replayScript(t, script, true)
	_, second, _ := replayScript(t, script, true)
	assert.Equal(t, first, second, "two replays in one process differ")
	assert.NotContains(t, first, "cache:c#", "a runtime owner name reached the output")

	// The table lists the reservations too.
	code, table, errs := replayScript(t, script, false)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, table, `reservations cache "c"/k#1 3 B, kv 1 B of scope "S", free 1 B`)
}

// The names a snapshot shows for a cache's charges
// are accepted as input: unreserve gets the runtime's own answer (only
// the cache releases them), reserve finds the name taken.
func TestCacheChargeNamesAsInput(t *testing.T) {
	script := cacheStart +
		`{"op":"cache_open","name":"m2","location":"cuda:0"}
{"op":"load","cache":"m2","key":"a","peak":2,"resident":2,"as":"A"}
{"op":"snapshot"}
{"op":"unreserve","name":"cache \"m2\"/a#1"}
{"op":"reserve","location":"cuda:0","name":"cache \"m2\"/a#1","bytes":1}
{"op":"enter","as":"S","plan":{"reservations":[{"name":"cache \"m2\"/a#1","location":"cuda:0","bytes":1}]}}
{"op":"unreserve","name":"cache \"nope\"/a#1"}
`
	results := checkResults(t, script, map[int]wantResult{
		5: {"ok", ""},
		6: {"InvalidInput", `reservation cache "m2"/a#1 is a charge of cache "m2"; only the cache releases it`},
		7: {"InvalidInput", `duplicate reservation name cache "m2"/a#1 (already active)`},
		9: {"InvalidInput", `reservation "cache \"nope\"/a#1" is not active`},
	})
	res := payload(t, results[5], "snapshot")["locations"].([]any)[1].(map[string]any)["reservations"].([]any)
	require.Len(t, res, 1)
	assert.Equal(t, `cache "m2"/a#1`, res[0].(map[string]any)["name"])
	assert.Equal(t, version(results[5]), version(results[9]), "nothing changed")
	assert.NotEqual(t, "ok", errType(results[8]), "a scope's plan cannot take a cache's charge name either")
}

// A cache's script name never collides with another
// cache's owner in the output: "x#K" for every K next to "x".
func TestCacheNamesDoNotCollide(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"op":"start","locations":{"pageable-host":null,"cuda:0":"1GiB"}}` + "\n")
	b.WriteString(`{"op":"cache_open","name":"x","location":"cuda:0"}` + "\n")
	b.WriteString(`{"op":"load","cache":"x","key":"k","peak":1,"resident":1}` + "\n")
	const n = 400 // more caches than the process opened before
	for k := 1; k <= n; k++ {
		fmt.Fprintf(&b, `{"op":"cache_open","name":"x#%d","location":"cuda:0"}`+"\n", k)
		fmt.Fprintf(&b, `{"op":"load","cache":"x#%d","key":"k%d","peak":1,"resident":1}`+"\n", k, k)
	}
	b.WriteString(`{"op":"snapshot"}` + "\n")
	results, code, errs := replayResults(t, b.String())
	require.Equal(t, 0, code, errs)
	snap := payload(t, results[4+2*n], "snapshot")["locations"].([]any)[1].(map[string]any)["reservations"].([]any)
	require.Len(t, snap, n+1)
	for _, r := range snap {
		m := r.(map[string]any)
		owner, name := m["owner"].(string), m["name"].(string)
		cache, err := strconv.Unquote(strings.TrimPrefix(owner, "cache "))
		require.NoError(t, err, owner)
		key := "k"
		if cache != "x" {
			key = "k" + strings.TrimPrefix(cache, "x#")
		}
		assert.Equal(t, fmt.Sprintf("cache %q/%s#1", cache, key), name)
	}
}

// One rule for "as": an empty name is invalid
// input wherever a name is bound (load, cache_pin, like cache_open's
// name); leaving "as" out of load releases the lease at once.
func TestCacheEmptyNamesAreRefused(t *testing.T) {
	script := cacheStart +
		`{"op":"load","cache":"c","key":"a","peak":2,"resident":2,"as":""}
{"op":"load","cache":"c","key":"a","peak":2,"resident":2,"as":"A"}
{"op":"cache_pin","lease":"A","as":""}
{"op":"cache_stats","cache":"c"}
{"op":"load_fail","cache":"c","key":"b","peak":2,"mode":"error"}
`
	results := checkResults(t, script, map[int]wantResult{
		3: {"InvalidInput", `a cache lease name must not be empty (leave "as" out to release the lease at once)`},
		4: {"ok", ""},
		5: {"InvalidInput", "a cache pin name must not be empty"},
		6: {"ok", ""},
	})
	assert.Equal(t, 0, version(results[3]), "the refused load did not load")
	assert.False(t, payload(t, results[4], "load")["hit"].(bool))
	assert.EqualValues(t, 1, payload(t, results[6], "stats")["resources"])
}

// TestCacheTable: the table's details of the cache ops.
func TestCacheTable(t *testing.T) {
	script := cacheStart +
		`{"op":"load","cache":"c","key":"k","peak":"4B","resident":3,"as":"K"}
{"op":"load","cache":"c","key":"k","peak":4,"resident":3}
{"op":"cache_release","lease":"K"}
{"op":"cache_evict","cache":"c","key":"k"}
{"op":"cache_evict","cache":"c","key":"k"}
{"op":"cache_stats","cache":"c"}
{"op":"load","cache":"c","key":"big","peak":8,"resident":8,"as":"B"}
{"op":"load","cache":"c","key":"k","peak":4,"resident":3,"expect":"ResidencyCacheBusyError"}
`
	code, out, errs := replayScript(t, script, false)
	require.Equal(t, 0, code, errs)
	for _, want := range []string{
		`loaded "k", 3 B resident, lease "K"`,
		`hit "k", 3 B resident, lease released`,
		"evicted",
		"not cached: nothing evicted",
		"cuda:0 budget 10 B: cache reserved 0 B, 0 resources, 1 evictions; location used 0 B reserved 0 B",
		`key "k" needs 4 B at cuda:0 (budget 10 B, used 0 B, reserved 8 B)`,
	} {
		assert.Contains(t, out, want)
	}
}

// TestCacheExpectations: the cache's error types are expectations like
// any other; a wrong one fails the replay (exit 1).
func TestCacheExpectations(t *testing.T) {
	code, _, errs := replayScript(t, cacheStart+
		`{"op":"load","cache":"c","key":"k","peak":4,"resident":3,"expect":"ResidencyCacheLoadError"}`+"\n", true)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "line 3: load: expected ResidencyCacheLoadError, got ok")

	code, _, errs = replayScript(t, cacheStart+
		`{"op":"load_fail","cache":"c","key":"k","peak":4,"mode":"error","expect":"ResidencyCacheBusyError"}`+"\n", true)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "expected ResidencyCacheBusyError, got ResidencyCacheLoadError")
}

// TestCacheMalformed: a cache op with a missing, unknown or mistyped
// field makes the whole script malformed (exit 2, nothing runs), and the
// message names the line.
func TestCacheMalformed(t *testing.T) {
	tests := []struct{ name, op, want string }{
		{"cache_open without location", `{"op":"cache_open","name":"c"}`, `op "cache_open": needs field "location"`},
		{"cache_open mistyped name", `{"op":"cache_open","name":1,"location":"cuda:0"}`, `field "name": want a string, got a number`},
		{"cache_open with a budget", `{"op":"cache_open","name":"c","location":"cuda:0","bytes":5}`, `unknown field "bytes"`},
		{"load without resident", `{"op":"load","cache":"c","key":"k","peak":1}`, `op "load": needs field "resident"`},
		{"load without peak", `{"op":"load","cache":"c","key":"k","resident":1}`, `needs field "peak"`},
		{"load with a bad byte string", `{"op":"load","cache":"c","key":"k","peak":"12 parsecs","resident":1}`, `field "peak": byte size "12 parsecs": unknown unit "parsecs"`},
		{"load with fractional resident", `{"op":"load","cache":"c","key":"k","peak":2,"resident":1.5}`, `field "resident": 1.5 is not a whole number of bytes`},
		{"load with a boolean peak", `{"op":"load","cache":"c","key":"k","peak":true,"resident":1}`, `field "peak": want an integer or a byte string`},
		{"load with a mistyped as", `{"op":"load","cache":"c","key":"k","peak":1,"resident":1,"as":7}`, `field "as": want a string`},
		{"load with fail", `{"op":"load","cache":"c","key":"k","peak":1,"resident":1,"fail":"error"}`, `unknown field "fail"`},
		{"load with a duplicate key", `{"op":"load","cache":"c","key":"k","key":"j","peak":1,"resident":1}`, `duplicate key "key"`},
		{"load_fail without mode", `{"op":"load_fail","cache":"c","key":"k","peak":1}`, `op "load_fail": needs field "mode"`},
		{"load_fail with resident", `{"op":"load_fail","cache":"c","key":"k","peak":1,"mode":"error","resident":1}`, `unknown field "resident"`},
		{"cache_release with pin", `{"op":"cache_release","pin":"p"}`, `needs field "lease"`},
		{"cache_pin without as", `{"op":"cache_pin","lease":"l"}`, `op "cache_pin": needs field "as"`},
		{"cache_unpin with lease", `{"op":"cache_unpin","lease":"l"}`, `needs field "pin"`},
		{"cache_evict without key", `{"op":"cache_evict","cache":"c"}`, `op "cache_evict": needs field "key"`},
		{"cache_evict with force", `{"op":"cache_evict","cache":"c","key":"k","force":true}`, `unknown field "force"`},
		{"cache_stats mistyped", `{"op":"cache_stats","cache":["c"]}`, `field "cache": want a string, got an array`},
		{"cache_close without cache", `{"op":"cache_close"}`, `op "cache_close": needs field "cache"`},
		{"a cache error type misspelt", `{"op":"cache_close","cache":"c","expect":"CacheBusyError"}`, `"CacheBusyError" is neither "ok" nor an error type`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The bad op is on line 4, after a good cache op: nothing runs.
			script := cacheStart + `{"op":"load","cache":"c","key":"ok","peak":1,"resident":1}` + "\n" + tc.op + "\n" + `{"op":"snapshot"}` + "\n"
			code, out, errs := replayScript(t, script, true)
			assert.Equal(t, 2, code, "stderr: %s", errs)
			assert.Empty(t, out, "a malformed script ran")
			assert.Contains(t, errs, "line 4: ")
			assert.Contains(t, errs, tc.want)
		})
	}
}

// TestReplayDocumentedInREADME: the README points to the format's
// reference (every op is checked against it by TestOpsDocumented).
func TestReplayDocumentedInREADME(t *testing.T) {
	assert.True(t, strings.Contains(readFile(t, "../../README.md"), "docs/replay.md"))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// End to end: a replay whose script leaves a cache
// lease held ends with the note on standard error and exit status 0, and
// an empty name is refused by every op that binds one.
func TestReplayCloseNoteAndEmptyNames(t *testing.T) {
	code, out, errOut := replayScript(t, `{"op":"start","locations":{"cuda:0":"1KiB"}}
{"op":"cache_open","name":"c","location":"cuda:0"}
{"op":"load","cache":"c","key":"k","peak":8,"resident":8,"as":"L"}
{"op":"register","handle":"v","bytes":8,"at":"cuda:0"}
{"op":"acquire","handle":"v","location":"cuda:0","as":"","expect":"InvalidInput"}
{"op":"hold","handle":"v","location":"cuda:0","as":"","expect":"InvalidInput"}
{"op":"decide","request":{"name":"r","requirements":[{"handle":"v","locations":["cuda:0"]}]},"as":"","expect":"InvalidInput"}
{"op":"enter","as":"","plan":{},"expect":"InvalidInput"}
{"op":"cache_pin","lease":"L","as":"","expect":"InvalidInput"}
`, false)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	for _, kind := range []string{"lease", "hold", "decision", "scope"} {
		assert.Contains(t, out, "a "+kind+" name must not be empty")
	}
	assert.Contains(t, errOut, `note: residency: closed with 1 cache lease ["L"] still held (released at close)`)
}
