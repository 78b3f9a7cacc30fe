package replay

import (
	"context"
	"slices"
	"strings"

	"github.com/residency-go/residency/internal/jsonline"
)

// opHandler is one op of the format: its fields, how its line is read,
// and how it runs. Every op has exactly one handler, in the table ops.
type opHandler struct {
	// required and optional list the op's fields besides "op" and
	// "expect", in document order (the order in which their problems are
	// reported).
	required, optional []string
	// parse reads the op's fields into o; the presence of the required
	// ones was checked. A problem is kept in f.Err.
	parse func(o *Op, f *jsonline.Fields)
	// exec runs the op. reached says whether it got to the runtime
	// (which may then have changed the state version); a result payload
	// goes into res.
	exec func(r *Runner, ctx context.Context, o Op, res *Result) (reached bool, err error)
}

// ops is the table of the format's ops, by name. It is filled once, by
// init (its handlers refer to the runner, whose Run refers to ops).
var ops map[string]opHandler

func init() {
	ops = map[string]opHandler{
		"start": {required: []string{"locations"}, optional: []string{"spill", "trace", "search_state_limit"}, parse: parseStart},

		// Values and their copies (ops_values.go).
		"register": {required: []string{"handle", "bytes"}, optional: []string{"replica", "at", "source"}, parse: parseRegister, exec: (*Runner).execRegister},
		"place":    {required: []string{"handle", "location"}, parse: parseHandleAt, exec: (*Runner).execPlace},
		"evict":    {required: []string{"handle", "location"}, parse: parseHandleAt, exec: (*Runner).execEvict},
		"copy":     {required: []string{"handle", "from", "to"}, parse: parseHandleFromTo, exec: (*Runner).execCopy},
		"move":     {required: []string{"handle", "from", "to"}, parse: parseHandleFromTo, exec: (*Runner).execMove},
		"discard":  {required: []string{"handle"}, parse: parseHandle, exec: (*Runner).execDiscard},

		// Leases, holds and events (ops_leases.go).
		"acquire":        {required: []string{"handle", "location", "as"}, parse: parseHandleAtAs, exec: (*Runner).execAcquire},
		"hold":           {required: []string{"handle", "location", "as"}, parse: parseHandleAtAs, exec: (*Runner).execHold},
		"release":        {required: []string{"lease"}, parse: parseLease, exec: (*Runner).execRelease},
		"record_event":   {required: []string{"lease", "event"}, parse: parseRecordEvent, exec: (*Runner).execRecordEvent},
		"complete_event": {required: []string{"event"}, parse: parseEvent, exec: (*Runner).execCompleteEvent},
		"unhold":         {required: []string{"hold"}, parse: parseHold, exec: (*Runner).execUnhold},

		// Reservations, observation, faults (ops_values.go).
		"reserve":   {required: []string{"location", "bytes", "name"}, parse: parseReserve, exec: (*Runner).execReserve},
		"unreserve": {required: []string{"name"}, parse: parseUnreserve, exec: (*Runner).execUnreserve},
		"snapshot":  {parse: parseNothing, exec: (*Runner).execSnapshot},
		"trace":     {parse: parseNothing, exec: (*Runner).execTrace},
		"fail_next": {required: []string{"kind", "location"}, parse: parseFailNext, exec: (*Runner).execFailNext},

		// Plans, decisions and scopes (ops_plans.go).
		"explain":             {required: []string{"plan"}, parse: parsePlanOp, exec: (*Runner).execExplain},
		"execute":             {required: []string{"plan"}, parse: parsePlanOp, exec: (*Runner).execExecute},
		"decide":              {required: []string{"request", "as"}, parse: parseDecide, exec: (*Runner).execDecide},
		"enter":               {required: []string{"as"}, optional: []string{"decision", "plan", "expected_version"}, parse: parseEnter, exec: (*Runner).execEnter},
		"exit":                {required: []string{"scope"}, parse: parseScope, exec: (*Runner).execExit},
		"release_scope_lease": {required: []string{"scope", "enter"}, parse: parseReleaseScopeLease, exec: (*Runner).execReleaseScopeLease},

		// The loader cache (ops_cache.go).
		"cache_open":    {required: []string{"name", "location"}, optional: []string{"spill"}, parse: parseCacheOpen, exec: (*Runner).execCacheOpen},
		"load":          {required: []string{"cache", "key", "peak", "resident"}, optional: []string{"as"}, parse: parseLoad, exec: (*Runner).execLoad},
		"load_fail":     {required: []string{"cache", "key", "peak", "mode"}, parse: parseLoadFail, exec: (*Runner).execLoad},
		"cache_release": {required: []string{"lease"}, parse: parseCacheRelease, exec: (*Runner).execCacheRelease},
		"cache_pin":     {required: []string{"lease", "as"}, parse: parseCachePin, exec: (*Runner).execCachePin},
		"cache_unpin":   {required: []string{"pin"}, parse: parseCacheUnpin, exec: (*Runner).execCacheUnpin},
		"cache_evict":   {required: []string{"cache", "key"}, parse: parseCacheKey, exec: (*Runner).execCacheEvict},
		"cache_stats":   {required: []string{"cache"}, parse: parseCache, exec: (*Runner).execCacheStats},
		"cache_close":   {required: []string{"cache"}, parse: parseCache, exec: (*Runner).execCacheClose},

		// The device→host write pipeline (ops_staging*.go).
		"staging_start": {required: []string{"name", "device", "slots", "slot_bytes", "keys", "pool_slots", "row_bytes"},
			optional: []string{"claim_timeout_ms", "clone_budget", "eager"}, parse: parseStagingStart, exec: staged(execStagingStart)},
		"stage":         {required: []string{"pipeline", "step", "bytes"}, optional: []string{"fill", "freeze"}, parse: parseStage, exec: staged(execStage)},
		"step_release":  {required: []string{"step"}, parse: parseStep, exec: staged(execStepRelease)},
		"freeze":        {required: []string{"event"}, parse: parseFreeze, exec: staged(execFreeze)},
		"task_open":     {required: []string{"pipeline", "task", "req", "mode"}, optional: []string{"write_n"}, parse: parseTaskOpen, exec: staged(execTaskOpen)},
		"append":        {required: []string{"task", "rows"}, optional: []string{"step", "device_bytes", "fill", "freeze", "no_wait"}, parse: parseAppend, exec: staged(execAppend)},
		"submit":        {required: []string{"tasks"}, parse: parseTasks, exec: staged(execQueueTasks)},
		"prioritize":    {required: []string{"tasks"}, parse: parseTasks, exec: staged(execQueueTasks)},
		"wait":          {required: []string{"task", "until"}, parse: parseWait, exec: staged(execWait)},
		"read_row":      {required: []string{"task", "key", "slot"}, parse: parseReadRow, exec: staged(execReadRow)},
		"read_pool":     {required: []string{"pipeline", "key", "slot"}, parse: parseReadPool, exec: staged(execReadPool)},
		"staging_stats": {required: []string{"pipeline"}, parse: parsePipeline, exec: staged(execStagingStats)},
		"staging_close": {required: []string{"pipeline"}, parse: parsePipeline, exec: staged(execStagingClose)},
	}
}

// OpNames returns the names of the format's ops, sorted.
func OpNames() []string {
	names := make([]string, 0, len(ops))
	for n := range ops {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// opNames returns the known ops, sorted, for messages.
func opNames() string { return strings.Join(OpNames(), ", ") }

// OpFields returns the required and optional fields of op name (besides
// "op" and "expect"), in document order; ok is false for an unknown op.
func OpFields(name string) (required, optional []string, ok bool) {
	h, ok := ops[name]
	return slices.Clone(h.required), slices.Clone(h.optional), ok
}

func parseNothing(*Op, *jsonline.Fields) {}
