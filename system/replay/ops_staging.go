package replay

import (
	"fmt"
	"time"

	"github.com/residency-go/residency/internal/jsonline"
)

// The write pipeline ops of a replay script (package staging: a
// device→host KV-cache offload). They are kept here so that the dispatch
// in script.go, Runner.go and output.go stays a line per hook. Only the
// exported staging API is used.
//
// A pipeline works asynchronously (a copy queue and a committer), so a
// replay settles it after every staging op: it waits until every task has
// either finished (written or failed) or cannot move without a later op of
// the script (a pending task, a copy stage waiting for a freeze event the
// script has not completed, or a task queued behind such a copy stage),
// until every step copy and device clone copy that does not wait for such
// an event has landed, and, after a failure, until every buffer whose copy
// can finish is freed (Pipeline.FreeHeld, once the rest has settled). The
// pipelines run with staging.Config.Serial, and submit and prioritize hand
// over one task at a time, settling after each: every change in the
// runtime then comes in one order, so the output (peaks and the trace
// included) is the same on every run. Every task's lifecycle transitions
// since the previous op are listed in "task_transitions".
//
// What a copy waits for is known exactly: step copies run in order on one
// stream, device clones on another (each after its freeze event), and a
// task's clone → host copies on a third, where only one copy stage runs at
// a time; a copy stage reports when it has enqueued what it waits for
// (Config.OnCopyStarted). A call that would wait for something that can
// only happen after a later op (a blocking append whose budget cannot come
// back, a stage whose only free slots wait for a held copy, a wait or a
// read of a task that cannot move) is refused as invalid input, with what
// it waits for, instead of hanging: the replay watches the pipeline's
// Stats.WaitingAppends and Stats.WaitingStages.
//
// Staging buffers hold real bytes: a slot, a device buffer and the CPU
// block pool each hold at most BufferLimit (1 MiB), checked before
// anything is allocated.

// stagingSpec holds the fields of a staging op.
type stagingSpec struct {
	name, device, pipeline, step, task, req, mode, until, key, freeze, event string
	slots, poolSlots, writeN, slot                                           int64
	slotBytes, rowBytes, cloneBudget, bytes                                  int64
	claimTimeout                                                             time.Duration
	fill                                                                     int64
	keys, tasks                                                              []string
	rows                                                                     []rowSpec
	eager, noWait, hasDevice                                                 bool
}

type rowSpec struct {
	key          string
	slot, offset int64
}

func parseStagingStart(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.name, s.device = f.Str("name"), f.Str("device")
	s.slots, s.slotBytes = f.Int("slots"), f.Bytes("slot_bytes")
	if v := f.OptMillis("claim_timeout_ms", "no wait"); v != nil {
		s.claimTimeout = *v
	}
	s.keys = f.Strings("keys")
	s.poolSlots, s.rowBytes = f.Int("pool_slots"), f.Bytes("row_bytes")
	if f.Obj.Has("clone_budget") {
		s.cloneBudget = f.Bytes("clone_budget")
	}
	s.eager = f.OptBool("eager")
}

func parseStage(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.pipeline, s.step, s.bytes = f.Str("pipeline"), f.Str("step"), f.Bytes("bytes")
	s.fill = readFill(f)
	s.freeze, _ = f.OptStr("freeze")
}

func parseStep(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.step = f.Str("step")
}

func parseFreeze(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.event = f.Str("event")
}

func parseTaskOpen(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.pipeline, s.task, s.req, s.mode = f.Str("pipeline"), f.Str("task"), f.Str("req"), f.Str("mode")
	s.writeN = 1
	if v := f.OptInt("write_n"); v != nil {
		s.writeN = *v
	}
}

func parseAppend(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.task = f.Str("task")
	step, hasStep := f.OptStr("step")
	s.hasDevice = f.Obj.Has("device_bytes")
	switch {
	case hasStep && s.hasDevice:
		f.Fail(fmt.Errorf("give either \"step\" (JOIN_NEXT_STEP) or \"device_bytes\" (JOIN_ON_FINISH), not both"))
	case !hasStep && !s.hasDevice:
		f.Fail(fmt.Errorf("needs \"step\" (JOIN_NEXT_STEP) or \"device_bytes\" (JOIN_ON_FINISH)"))
	case hasStep:
		for _, k := range []string{"fill", "freeze", "no_wait"} {
			if f.Obj.Has(k) {
				f.Fail(fmt.Errorf("field %q goes with \"device_bytes\" (JOIN_ON_FINISH), not with \"step\"", k))
			}
		}
	}
	s.step = step
	if s.hasDevice {
		s.bytes = f.Bytes("device_bytes")
	}
	s.fill = readFill(f)
	s.freeze, _ = f.OptStr("freeze")
	s.noWait = f.OptBool("no_wait")
	s.rows = readRows(f, "rows")
}

func parseTasks(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.tasks = f.Strings("tasks")
}

func parseWait(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.task, s.until = f.Str("task"), f.Str("until")
}

func parseReadRow(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.task, s.key, s.slot = f.Str("task"), f.Str("key"), f.Int("slot")
}

func parseReadPool(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.pipeline, s.key, s.slot = f.Str("pipeline"), f.Str("key"), f.Int("slot")
}

func parsePipeline(o *Op, f *jsonline.Fields) {
	s := &stagingSpec{}
	o.staging = s
	s.pipeline = f.Str("pipeline")
}

// readFill reads the optional "fill" byte (0 to 255).
func readFill(f *jsonline.Fields) int64 {
	v := f.OptInt("fill")
	if v == nil {
		return 0
	}
	if *v < 0 || *v > 255 {
		f.Fail(fmt.Errorf("field %q: a byte value, 0 to 255, got %d", f.Path+"fill", *v))
	}
	return *v
}

func readRows(f *jsonline.Fields, key string) []rowSpec {
	var out []rowSpec
	for _, it := range f.Objects(key) {
		r := rowSpec{key: it.Str("key"), slot: it.Int("slot")}
		if v := it.OptInt("offset"); v != nil {
			r.offset = *v
		}
		f.Done(it, "key", "slot", "offset")
		out = append(out, r)
	}
	return out
}
