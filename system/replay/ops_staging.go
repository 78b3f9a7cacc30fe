package replay

import (
	"context"
	"errors"
	"fmt"
	"github.com/residency-go/residency/internal/jsonline"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
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
// until every step copy that does not wait for such an event has landed,
// and, after a failure, until every buffer whose copy can finish is freed.
// The output is then the same on every run, and every task's lifecycle
// transitions since the previous op are listed in "task_transitions".
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
	claimTimeoutMS                                                           int64
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
	if v := f.OptInt("claim_timeout_ms"); v != nil {
		s.claimTimeoutMS = *v
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

// ---- the replay's pipelines, steps, events and tasks, by script name ----

type stagingState struct {
	pipes  map[string]*replayPipe
	steps  map[string]*replayStep
	events map[string]*freezeEvent
	tasks  map[string]*replayTask
	order  []*replayTask // in the order they were opened
	cur    *replayPipe   // the pipeline of the op running now (message words)
}

type replayPipe struct {
	name    string
	device  string
	p       *staging.Pipeline
	eager   bool
	rowB    int64
	closed  bool
	entries []*d2hEntry // the step stream's copies, in order
	clones  []*cloneDep // the clone stream's copies, in order
	devBufs []cuda.Buffer

	mu         sync.Mutex
	byID       map[staging.TaskID]*replayTask
	failedFrom map[staging.TaskID]staging.TaskState // the state a task failed from (OnCommit)
	started    map[staging.TaskID]bool              // copy stages that enqueued what they wait for
}

// d2hEntry is one step's copy on a pipeline's step stream (after its
// freeze event).
type d2hEntry struct {
	freeze *freezeEvent
	step   *replayStep
}

// cloneDep is one device clone on the pipeline's clone stream.
type cloneDep struct {
	index  int
	freeze *freezeEvent
	bytes  int64
}

type replayStep struct {
	name     string
	pipe     *replayPipe
	s        *staging.Step
	entry    *d2hEntry // nil for a leftover-only step
	dev      cuda.Buffer
	released bool
}

type freezeEvent struct {
	ev        *system.ManualEvent
	completed bool
}

type replayTask struct {
	name   string
	pipe   *replayPipe
	t      *staging.Task
	steps  []*replayStep
	clones []*cloneDep
	rows   map[[2]any]bool // (key, slot) of the rows its accepted appends wrote
	last   staging.TaskState
	done   bool // terminal, its waiters woken
	opened bool // "opened" not reported yet
}

func (r *Runner) stagingState() *stagingState {
	if r.staging == nil {
		r.staging = &stagingState{pipes: map[string]*replayPipe{}, steps: map[string]*replayStep{},
			events: map[string]*freezeEvent{}, tasks: map[string]*replayTask{}}
	}
	return r.staging
}

func (ss *stagingState) pipe(name string) (*replayPipe, error) {
	p, ok := ss.pipes[name]
	if !ok {
		return nil, invalid("unknown pipeline %q (start it first with staging_start)", name)
	}
	ss.cur = p
	return p, nil
}

func (ss *stagingState) task(name string) (*replayTask, error) {
	t, ok := ss.tasks[name]
	if !ok {
		return nil, invalid("unknown task %q (open it first with task_open)", name)
	}
	ss.cur = t.pipe
	return t, nil
}

// event returns the freeze event named name, made incomplete on first use.
func (ss *stagingState) event(name string) *freezeEvent {
	if name == "" {
		return nil
	}
	e, ok := ss.events[name]
	if !ok {
		e = &freezeEvent{ev: system.NewManualEvent()}
		ss.events[name] = e
	}
	return e
}

func (e *freezeEvent) pending() bool { return e != nil && !e.completed }

func (e *freezeEvent) cuda() cuda.Event {
	if e == nil {
		return nil
	}
	return e.ev
}

// ---- what can move on its own ----

func (p *replayPipe) cloneBlocked(c *cloneDep) bool {
	for _, o := range p.clones[:c.index+1] {
		if o.freeze.pending() {
			return true
		}
	}
	return false
}

// entryBlocked: a copy on the step stream waits for every copy enqueued
// before it.
func (p *replayPipe) entryBlocked(e *d2hEntry) bool {
	for _, o := range p.entries {
		if o.freeze.pending() {
			return true
		}
		if o == e {
			return false
		}
	}
	return false
}

// copyBlocked says whether t's copy stage, once claimed, waits for a
// freeze event the script has not completed: a step copy it waits for
// (JOIN_NEXT_STEP), or a clone its clone → host copies wait for
// (JOIN_ON_FINISH; those copies have a stream of their own, where only one
// copy stage's copies are at a time).
func (t *replayTask) copyBlocked() bool {
	p := t.pipe
	if t.t.Mode() == staging.JoinNextStep {
		for _, s := range t.steps {
			if s.entry != nil && p.entryBlocked(s.entry) {
				return true
			}
		}
		return false
	}
	for _, c := range t.clones {
		if p.cloneBlocked(c) {
			return true
		}
	}
	return false
}

// started: t's copy stage has enqueued what it waits for.
func (t *replayTask) started() bool {
	t.pipe.mu.Lock()
	defer t.pipe.mu.Unlock()
	return t.pipe.started[t.t.ID()]
}

// stuck says whether t's state can change only through a later op of
// the script. st is its state now.
func (ss *stagingState) stuck(t *replayTask, st staging.TaskState) bool {
	switch st {
	case staging.Pending:
		return t.pipe.p.Err() == nil // a failed pipeline fails its pending tasks
	case staging.Queued:
		for _, o := range ss.order {
			if o.pipe == t.pipe && !o.done && o.t.State() == staging.Copying && o.started() && o.copyBlocked() {
				return true // the copy queue is busy with a blocked copy stage
			}
		}
		return false
	case staging.Copying:
		return t.started() && t.copyBlocked()
	}
	return false
}

// quiet says whether nothing of rp can move without a later op: every task
// done or stuck, and every step copy that waits for no incomplete freeze
// event landed.
func (ss *stagingState) quiet(ctx context.Context, rp *replayPipe) bool {
	for _, t := range ss.order {
		if t.pipe != rp || t.done {
			continue
		}
		switch st := t.t.State(); {
		case st.Terminal():
			_ = t.t.Wait(ctx) // returns once its resources are released
			t.done = ctx.Err() == nil
		case !ss.stuck(t, st):
			return false
		}
	}
	for _, e := range rp.entries {
		if ev := e.step.s.Event(); ev != nil && !ev.Query() && !rp.entryBlocked(e) {
			return false
		}
	}
	return true
}

// pendingFrees is how many buffers of rp wait, after a failure, for a copy
// that cannot finish before a later op: the clones of failed tasks that
// wait for a freeze event, and their clone → host copies if their copy
// stage had started them.
func (ss *stagingState) pendingFrees(rp *replayPipe) int {
	n := 0
	for _, t := range ss.order {
		if t.pipe != rp || t.t.State() != staging.Failed {
			continue
		}
		rp.mu.Lock()
		from, ok := rp.failedFrom[t.t.ID()]
		started := rp.started[t.t.ID()]
		rp.mu.Unlock()
		if !ok && t.last != staging.Failed {
			from = t.last
		}
		if from >= staging.HostReady {
			continue
		}
		for _, c := range t.clones {
			if rp.cloneBlocked(c) {
				n++
				if started {
					n++
				}
			}
		}
	}
	return n
}

// settle waits until every task is done or stuck, every step copy that
// can land has landed, and after a failure every buffer that can be freed
// is (see the top of the file).
func (ss *stagingState) settle(ctx context.Context) error {
	for {
		all := true
		for _, t := range ss.order {
			if t.done {
				continue
			}
			switch st := t.t.State(); {
			case st.Terminal():
				_ = t.t.Wait(ctx) // returns once its resources are released
				if ctx.Err() != nil {
					return ctx.Err()
				}
				t.done = true
			case !ss.stuck(t, st):
				all = false
			}
		}
		for _, rp := range ss.pipes {
			if rp.closed {
				continue
			}
			for _, e := range rp.entries {
				if ev := e.step.s.Event(); ev != nil && !ev.Query() && !rp.entryBlocked(e) {
					all = false // it lands without a later op
				}
			}
			if rp.p.Err() != nil && rp.p.Stats().PendingFrees > ss.pendingFrees(rp) {
				all = false // a failed task's buffer waits for a copy that finishes
			}
		}
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Microsecond):
		}
	}
}

// transitions lists every task's lifecycle moves since the last report.
func (ss *stagingState) transitions() []TaskTransition {
	var out []TaskTransition
	for _, t := range ss.order {
		now := t.t.State()
		if t.opened {
			t.opened = false
			out = append(out, TaskTransition{Pipeline: t.pipe.name, Task: t.name, From: nil, To: staging.Pending.String()})
		}
		if now == t.last {
			continue
		}
		target := now
		if now == staging.Failed {
			t.pipe.mu.Lock()
			from, ok := t.pipe.failedFrom[t.t.ID()]
			t.pipe.mu.Unlock()
			target = t.last
			if ok && from > t.last {
				target = from
			}
			t.pipe.mu.Lock()
			t.pipe.failedFrom[t.t.ID()] = target // reported: pendingFrees reads it
			t.pipe.mu.Unlock()
		}
		for s := t.last; s < target; s++ {
			from := s.String()
			out = append(out, TaskTransition{Pipeline: t.pipe.name, Task: t.name, From: &from, To: (s + 1).String()})
		}
		if now == staging.Failed {
			from := target.String()
			tr := TaskTransition{Pipeline: t.pipe.name, Task: t.name, From: &from, To: now.String()}
			if err := t.t.Wait(context.Background()); err != nil {
				tr.Cause = taskWords(t.pipe, err.Error())
			}
			out = append(out, tr)
		}
		t.last = now
	}
	return out
}

type TaskTransition struct {
	Pipeline string  `json:"pipeline"`
	Task     string  `json:"task"`
	From     *string `json:"from"`
	To       string  `json:"to"`
	Cause    string  `json:"cause,omitempty"`
}

// Staging is the payload of a staging op's result.
type Staging struct {
	Step  *StagedStep   `json:"step,omitempty"`
	Row   *Row          `json:"row,omitempty"`
	State *string       `json:"state,omitempty"`
	Stats *StagingStats `json:"stats,omitempty"`
}

type StagedStep struct {
	Name  string `json:"name"`
	Slot  int    `json:"slot"`
	Bytes int64  `json:"bytes"`
}

// Row is a row read back: its length, and its byte value when every
// byte is the same (rows are filled that way), else null.
type Row struct {
	Key   string `json:"key"`
	Slot  int64  `json:"slot"`
	Bytes int    `json:"bytes"`
	Value *int   `json:"value"`
}

type StagingStats struct {
	Slots            int     `json:"slots"`
	FreeSlots        int     `json:"free_slots"`
	SlotHolders      int     `json:"slot_holders"`
	SlotClaims       int64   `json:"slot_claims"`
	SlotWaits        int64   `json:"slot_waits"`
	CloneBytes       int64   `json:"clone_bytes"`
	CloneBudgetBytes int64   `json:"clone_budget_bytes"`
	PeakCloneBytes   int64   `json:"peak_clone_bytes"`
	Flushes          int64   `json:"flushes"`
	Drops            Object  `json:"drops"`
	Tasks            Object  `json:"tasks"`
	Opened           int64   `json:"opened"`
	Written          int64   `json:"written"`
	Failed           int64   `json:"failed"`
	StepsStaged      int64   `json:"steps_staged"`
	LiveSteps        int64   `json:"live_steps"`
	CommittedBytes   int64   `json:"committed_bytes"`
	Failure          *string `json:"failure"`
}

func (r *Runner) toStagingStats(st staging.Stats) *StagingStats {
	out := &StagingStats{
		Slots: st.Slots, FreeSlots: st.FreeSlots, SlotHolders: st.SlotHolders, SlotClaims: st.SlotClaims, SlotWaits: st.SlotWaits,
		CloneBytes: st.CloneBytes, CloneBudgetBytes: st.CloneBudgetBytes, PeakCloneBytes: st.PeakCloneBytes,
		Flushes: st.Flushes,
		Drops:   Object{{staging.DropBudget, st.Drops[staging.DropBudget]}, {staging.DropLocation, st.Drops[staging.DropLocation]}},
		Opened:  st.Opened, Written: st.Written, Failed: st.Failed, StepsStaged: st.StepsStaged, LiveSteps: st.LiveSteps,
		CommittedBytes: st.CommittedBytes,
	}
	for _, s := range []staging.TaskState{staging.Pending, staging.Queued, staging.Copying, staging.HostReady} {
		out.Tasks = append(out.Tasks, Field{s.String(), st.Tasks[s]})
	}
	if st.Failure != nil {
		out.Failure = nullable(r.message(st.Failure.Error()))
	}
	return out
}

// stepFill writes the deterministic content of a save's device buffer:
// row k (bytes k·rowBytes onward) holds the byte fill+k (mod 256).
func stepFill(n, rowBytes, fill int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(fill + int64(i)/rowBytes)
	}
	return b
}

func toRow(key string, slot int64, b []byte) *Row {
	out := &Row{Key: key, Slot: slot, Bytes: len(b)}
	if len(b) > 0 {
		v := int(b[0])
		for _, c := range b {
			if int(c) != v {
				return out
			}
		}
		out.Value = &v
	}
	return out
}

// deviceBuffer allocates and fills a save's device buffer (the "kernel"
// of the script).
func (r *Runner) deviceBuffer(ctx context.Context, p *replayPipe, loc string, n, fill int64) (cuda.Buffer, error) {
	if n > BufferLimit {
		return nil, invalid("a save holds real bytes: at most %s in a replay, got %s", jsonline.FormatBytes(BufferLimit), jsonline.FormatBytes(n))
	}
	be := r.sys.Backend()
	buf, err := be.Allocate(ctx, loc, n)
	if err != nil {
		return nil, err
	}
	if err := be.Write(ctx, buf, stepFill(n, p.rowB, fill)); err != nil {
		_ = be.Free(buf)
		return nil, err
	}
	p.devBufs = append(p.devBufs, buf)
	return buf, nil
}

// stagingExec runs one staging op with the replay's pipelines.
type stagingExec func(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error)

// staged makes a staging op's handler: every staging op ends with the
// pipelines settled and the task transitions reported, whatever its
// outcome; reached says whether it got to the runtime.
func staged(fn stagingExec) func(r *Runner, ctx context.Context, o Op, res *Result) (bool, error) {
	return func(r *Runner, ctx context.Context, o Op, res *Result) (bool, error) {
		ss := r.stagingState()
		ss.cur = nil
		reached, err := fn(r, ctx, ss, o, res)
		if serr := ss.settle(ctx); serr != nil && err == nil {
			err = serr
		}
		res.TaskTransitions = ss.transitions()
		if err != nil {
			err = ss.asRecord(err)
		}
		return reached || len(ss.pipes) > 0, err
	}
}

// asRecord returns the pipeline's failure record for the failure of the
// task that failed it (Wait and ReadRow return the bare cause to that
// task): every failure of a pipeline reads as StagingFailedError.
func (ss *stagingState) asRecord(err error) error {
	var fe *staging.FailedError
	if ss.cur == nil || errors.As(err, &fe) || isContextError(err) {
		return err
	}
	rec := ss.cur.p.Err()
	if errors.As(rec, &fe) && (err == fe.Err || errors.Is(err, fe.Err)) {
		return rec
	}
	return err
}

func execStagingStart(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	// Fields: name, device, slots, slot_bytes, claim_timeout_ms, keys,
	// pool_slots, row_bytes, clone_budget. The name binds on success.
	switch _, dup := ss.pipes[s.name]; {
	case s.name == "":
		return false, invalid("a pipeline name must not be empty")
	case dup:
		return false, invalid("duplicate pipeline name %q", s.name)
	case s.slotBytes > BufferLimit:
		return false, invalid("slot_bytes %s: a staging slot holds real bytes, at most %s in a replay", jsonline.FormatBytes(s.slotBytes), jsonline.FormatBytes(BufferLimit))
	case s.rowBytes > 0 && s.poolSlots > 0 && int64(len(s.keys))*s.poolSlots > BufferLimit/s.rowBytes:
		return false, invalid("the CPU block pool (%d keys × %d slots × %s) holds real bytes, at most %s in a replay",
			len(s.keys), s.poolSlots, jsonline.FormatBytes(s.rowBytes), jsonline.FormatBytes(BufferLimit))
	}
	rp := &replayPipe{name: s.name, device: s.device, eager: s.eager, rowB: s.rowBytes, byID: map[staging.TaskID]*replayTask{},
		failedFrom: map[staging.TaskID]staging.TaskState{}, started: map[staging.TaskID]bool{}}
	cfg := staging.Config{
		Name: s.name, Device: s.device, Slots: int(s.slots), SlotBytes: s.slotBytes,
		ClaimTimeout: time.Duration(s.claimTimeoutMS) * time.Millisecond,
		Keys:         s.keys, PoolSlots: int(s.poolSlots), RowBytes: s.rowBytes,
		CloneBudgetBytes: s.cloneBudget, Eager: s.eager,
		OnCommit: func(id staging.TaskID, err error) {
			if err == nil {
				return
			}
			rp.mu.Lock()
			if t := rp.byID[id]; t != nil {
				rp.failedFrom[id] = t.t.State() // Copying or HostReady: not failed yet
			}
			rp.mu.Unlock()
		},
		OnCopyStarted: func(id staging.TaskID) {
			rp.mu.Lock()
			rp.started[id] = true
			rp.mu.Unlock()
		},
	}
	if _, err := cuda.ParseLocationName(s.device); err == nil && !r.locations[s.device] {
		return false, &system.UnavailableError{Location: s.device, Detail: "location is not configured"}
	}
	p, err := staging.New(ctx, r.sys, cfg)
	if err != nil {
		return true, err
	}
	rp.p = p
	ss.pipes[s.name] = rp
	return true, nil
}

func execStage(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	// Fields: pipeline, step, bytes, fill, freeze.
	rp, err := ss.pipe(s.pipeline)
	if err != nil {
		return false, err
	}
	if _, dup := ss.steps[s.step]; dup {
		return false, invalid("duplicate step name %q", s.step)
	}
	if s.bytes < 0 {
		return false, invalid("bytes must be ≥ 0 (0: a leftover-only save), got %d", s.bytes)
	}
	ev := ss.event(s.freeze)
	if rp.eager && ev.pending() && s.bytes > 0 {
		return false, invalid("pipeline %q is eager: its copy would wait here for freeze event %q forever (complete it first)", s.pipeline, s.freeze)
	}
	var dev cuda.Buffer
	if s.bytes > 0 {
		if dev, err = r.deviceBuffer(ctx, rp, rp.deviceLoc(), s.bytes, s.fill); err != nil {
			return false, err
		}
	}
	var step *staging.Step
	err = ss.watch(ctx, rp, func(ctx context.Context) (err error) {
		step, err = rp.p.Stage(ctx, dev, ev.cuda())
		return err
	}, func(st staging.Stats) string {
		if st.WaitingStages == 0 || s.claimTimeoutMS > 0 {
			return "" // a positive claim timeout ends the wait
		}
		return fmt.Sprintf("staging step %q would wait forever: the free slots' buffers have another size and their last copies wait for freeze event %q (complete it with freeze)", s.step, ss.blockingEvent(rp))
	})
	if err != nil {
		return true, err
	}
	st := &replayStep{name: s.step, pipe: rp, s: step, dev: dev}
	if dev != nil {
		st.entry = &d2hEntry{freeze: ev, step: st}
		rp.entries = append(rp.entries, st.entry)
	}
	ss.steps[s.step] = st
	res.Staging = &Staging{Step: &StagedStep{Name: s.step, Slot: step.Slot(), Bytes: step.Bytes()}}
	return true, nil
}

func execStepRelease(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	st, ok := ss.steps[s.step]
	switch {
	case !ok:
		return false, invalid("unknown step %q", s.step)
	case st.released:
		return false, invalid("step %q was already released", s.step)
	}
	ss.cur = st.pipe
	if err := st.s.Release(); err != nil {
		return true, err
	}
	st.released = true
	return true, nil
}

func execFreeze(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	e, ok := ss.events[s.event]
	switch {
	case !ok:
		return false, invalid("unknown freeze event %q (a stage or append names it first)", s.event)
	case e.completed:
		return false, invalid("freeze event %q was already completed", s.event)
	}
	e.completed = true
	e.ev.Complete()
	return true, nil
}

func execTaskOpen(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	// Fields: pipeline, task, req, write_n, mode.
	rp, err := ss.pipe(s.pipeline)
	if err != nil {
		return false, err
	}
	if _, dup := ss.tasks[s.task]; dup {
		return false, invalid("duplicate task name %q", s.task)
	}
	var mode staging.JoinMode
	switch s.mode {
	case "next_step":
		mode = staging.JoinNextStep
	case "on_finish":
		mode = staging.JoinOnFinish
	default:
		return false, invalid("unknown join mode %q (use next_step or on_finish)", s.mode)
	}
	t, err := rp.p.Open(ctx, staging.TaskSpec{ReqID: s.req, WriteN: int(s.writeN), Mode: mode})
	if err != nil {
		return true, err
	}
	rt := &replayTask{name: s.task, pipe: rp, t: t, last: staging.Pending, opened: true}
	rp.mu.Lock()
	rp.byID[t.ID()] = rt
	rp.mu.Unlock()
	ss.tasks[s.task] = rt
	ss.order = append(ss.order, rt)
	return true, nil
}

func execAppend(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	// Fields: task, step or device_bytes, fill, freeze, rows, no_wait.
	t, err := ss.task(s.task)
	if err != nil {
		return false, err
	}
	rp := t.pipe
	c := staging.Chunk{NoWait: s.noWait}
	var st *replayStep
	if s.step != "" {
		var ok bool
		if st, ok = ss.steps[s.step]; !ok {
			return false, invalid("unknown step %q", s.step)
		}
		c.Step = st.s
	}
	for _, row := range s.rows {
		c.Rows = append(c.Rows, staging.Row{Key: row.key, Slot: int(row.slot), Offset: row.offset})
	}
	var ev *freezeEvent
	if s.hasDevice {
		if s.bytes <= 0 {
			return false, invalid("device_bytes must be > 0, got %d", s.bytes)
		}
		ev = ss.event(s.freeze)
		if rp.eager && ev.pending() {
			return false, invalid("pipeline %q is eager: its clone would wait here for freeze event %q forever (complete it first)", rp.name, s.freeze)
		}
		if c.Device, err = r.deviceBuffer(ctx, rp, rp.deviceLoc(), s.bytes, s.fill); err != nil {
			return false, err
		}
		c.Freeze = ev.cuda()
	}
	err = ss.watch(ctx, rp, func(ctx context.Context) error { return t.t.Append(ctx, c) }, func(st staging.Stats) string {
		if st.WaitingAppends == 0 {
			return ""
		}
		return fmt.Sprintf("appending to task %q would wait forever: the clone budget is full and the clones that could free it wait for freeze event %q (complete it with freeze)", s.task, ss.blockingEvent(rp))
	})
	if err != nil {
		return true, err
	}
	if st != nil {
		t.steps = append(t.steps, st)
	} else {
		cd := &cloneDep{index: len(rp.clones), freeze: ev, bytes: s.bytes}
		rp.clones = append(rp.clones, cd)
		t.clones = append(t.clones, cd)
	}
	if t.rows == nil {
		t.rows = map[[2]any]bool{}
	}
	for _, row := range s.rows {
		t.rows[[2]any{row.key, row.slot}] = true
	}
	return true, nil
}

func execQueueTasks(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	tasks := make([]*replayTask, 0, len(s.tasks))
	for _, name := range s.tasks {
		t, err := ss.task(name)
		if err != nil {
			return false, err
		}
		tasks = append(tasks, t)
	}
	for _, t := range tasks {
		ss.cur = t.pipe
		var err error
		if o.Name == "submit" {
			err = t.pipe.p.Submit(ctx, t.t)
		} else {
			err = t.pipe.p.Prioritize(ctx, t.t.ID())
		}
		if err != nil {
			return true, err
		}
	}
	return len(tasks) > 0, nil
}

func execWait(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	t, err := ss.task(s.task)
	if err != nil {
		return false, err
	}
	if s.until != "host_ready" && s.until != "written" {
		return false, invalid("unknown wait %q (use host_ready or written)", s.until)
	}
	// The pipelines are settled: what has not happened yet cannot
	// happen without a later op.
	st := t.t.State()
	if !t.done && (s.until == "written" || st < staging.HostReady) && ss.stuck(t, st) {
		return false, invalid("task %q would wait forever: it is %s and %s", s.task, st, ss.why(t, st))
	}
	if s.until == "host_ready" {
		err = t.t.WaitHostReady(ctx)
	} else {
		err = t.t.Wait(ctx)
	}
	if err != nil {
		return true, err
	}
	name := t.t.State().String()
	res.Staging = &Staging{State: &name}
	return true, nil
}

func execReadRow(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	t, err := ss.task(s.task)
	if err != nil {
		return false, err
	}
	st := t.t.State()
	switch {
	case t.done, !t.rows[[2]any{s.key, s.slot}]: // done, or a row it never had: no wait
	case t.t.Mode() == staging.JoinNextStep && ss.stuck(t, st):
		return false, invalid("reading task %q would wait forever for its pool write: it is %s and %s", s.task, st, ss.why(t, st))
	case st < staging.HostReady && t.cloneWaits():
		return false, invalid("reading task %q would wait forever: its device clone waits for freeze event %q (complete it with freeze)", s.task, ss.blockingEvent(t.pipe))
	}
	b, err := t.t.ReadRow(ctx, s.key, int(s.slot))
	if err != nil {
		return true, err
	}
	res.Staging = &Staging{Row: toRow(s.key, s.slot, b)}
	return true, nil
}

func execReadPool(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	rp, err := ss.pipe(s.pipeline)
	if err != nil {
		return false, err
	}
	b, err := rp.p.ReadPool(s.key, int(s.slot))
	if err != nil {
		return true, err
	}
	res.Staging = &Staging{Row: toRow(s.key, s.slot, b)}
	return true, nil
}

func execStagingStats(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	rp, err := ss.pipe(s.pipeline)
	if err != nil {
		return false, err
	}
	res.Staging = &Staging{Stats: r.toStagingStats(rp.p.Stats())}
	return false, nil
}

func execStagingClose(r *Runner, ctx context.Context, ss *stagingState, o Op, res *Result) (bool, error) {
	s := o.staging
	rp, err := ss.pipe(s.pipeline)
	if err != nil {
		return false, err
	}
	if rp.closed {
		return false, invalid("pipeline %q was already closed", s.pipeline)
	}
	if ev := ss.blockingEvent(rp); ev != "" {
		return false, invalid("closing pipeline %q would wait forever: freeze event %q is not complete (complete it first with freeze)", s.pipeline, ev)
	}
	rp.closed = true
	return true, rp.close(ctx, r.sys.Backend())
}

// watch runs call, which may wait for the pipeline, and returns its error.
// When the pipeline is quiet (nothing moves without a later op) and
// forever says the call waits all the same (from the pipeline's Stats),
// the call can never return: it is cancelled and refused as invalid input
// with forever's words.
func (ss *stagingState) watch(ctx context.Context, rp *replayPipe, call func(context.Context) error, forever func(staging.Stats) string) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(cctx) }()
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return <-done
		case <-time.After(100 * time.Microsecond):
		}
		if why := forever(rp.p.Stats()); why != "" && ss.quiet(ctx, rp) {
			// Quiet, and the call still waits with nothing on its way.
			if why = forever(rp.p.Stats()); why != "" {
				cancel()
				<-done
				return invalid("%s", why)
			}
		}
	}
}

// cloneWaits: reading a JOIN_ON_FINISH task's row waits for its clone.
func (t *replayTask) cloneWaits() bool {
	if t.t.Mode() != staging.JoinOnFinish {
		return false
	}
	for _, c := range t.clones {
		if t.pipe.cloneBlocked(c) {
			return true
		}
	}
	return false
}

// why says what a stuck task waits for.
func (ss *stagingState) why(t *replayTask, st staging.TaskState) string {
	switch st {
	case staging.Pending:
		return "nothing submits it (submit or prioritize it first)"
	case staging.Queued:
		return "the copy queue is busy with a copy stage that waits for a freeze event (complete it with freeze)"
	}
	if ev := ss.blockingEvent(t.pipe); ev != "" {
		return fmt.Sprintf("its copy waits for freeze event %q (complete it with freeze)", ev)
	}
	return "its copy waits for a freeze event (complete it with freeze)"
}

// blockingEvent names the first incomplete freeze event the pipeline's
// copies wait for ("" when none).
func (ss *stagingState) blockingEvent(rp *replayPipe) string {
	names := make([]string, 0, len(ss.events))
	for n := range ss.events {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := ss.events[n]
		if !e.pending() {
			continue
		}
		for _, en := range rp.entries {
			if en.freeze == e {
				return n
			}
		}
		for _, c := range rp.clones {
			if c.freeze == e {
				return n
			}
		}
	}
	return ""
}

func (rp *replayPipe) deviceLoc() string { return rp.device }

// close closes the pipeline and frees the script's device buffers.
func (rp *replayPipe) close(ctx context.Context, be cuda.Backend) error {
	err := rp.p.Close(ctx)
	for _, b := range rp.devBufs {
		_ = be.Free(b)
	}
	rp.devBufs = nil
	return err
}

// closeStaging ends the script's pipelines before the runtime closes:
// every freeze event still pending is completed, then every open
// pipeline is closed (it writes what it holds).
func (r *Runner) closeStaging(ctx context.Context) {
	if r.staging == nil {
		return
	}
	for _, e := range r.staging.events {
		if !e.completed {
			e.completed = true
			e.ev.Complete()
		}
	}
	for _, rp := range r.staging.pipes {
		if !rp.closed {
			rp.closed = true
			_ = rp.close(ctx, r.sys.Backend())
		}
	}
}

// stagingWords puts the pipeline's task ids ("task 3") in the script's
// words (`task "t1"`), for the pipeline of the op running now.
func (ss *stagingState) stagingWords(msg string) string { return taskWords(ss.cur, msg) }

// taskWords puts rp's task ids in msg in the script's words.
func taskWords(rp *replayPipe, msg string) string {
	if rp == nil || !strings.Contains(msg, "task ") {
		return msg
	}
	var b strings.Builder
	for {
		i := strings.Index(msg, "task ")
		if i < 0 {
			b.WriteString(msg)
			return b.String()
		}
		j := i + len("task ")
		for j < len(msg) && msg[j] >= '0' && msg[j] <= '9' {
			j++
		}
		n, err := strconv.ParseUint(msg[i+len("task "):j], 10, 64)
		rp.mu.Lock()
		t := rp.byID[staging.TaskID(n)]
		rp.mu.Unlock()
		if err != nil || t == nil {
			b.WriteString(msg[:j])
			msg = msg[j:]
			continue
		}
		b.WriteString(msg[:i])
		b.WriteString("task " + strconv.Quote(t.name))
		msg = msg[j:]
	}
}

// taskName is the script's name of a task of the op's pipeline.
func (ss *stagingState) taskName(id staging.TaskID) any {
	if ss == nil || ss.cur == nil {
		return uint64(id)
	}
	ss.cur.mu.Lock()
	defer ss.cur.mu.Unlock()
	if t := ss.cur.byID[id]; t != nil {
		return t.name
	}
	return uint64(id)
}

// classifyStaging names the pipeline's error types (see classify).
func classifyStaging(e error) (string, bool) {
	switch e.(type) {
	case *staging.FailedError:
		return "StagingFailedError", true
	case *staging.DropError:
		return "StagingDropError", true
	case *staging.AppendRefusedError:
		return "StagingAppendRefusedError", true
	case *staging.SlotTimeoutError:
		return "StagingSlotTimeoutError", true
	case *staging.SlotOverflowError:
		return "StagingSlotOverflowError", true
	}
	switch e {
	case staging.ErrConfig:
		return "StagingConfigError", true
	case staging.ErrClosed:
		return "StagingClosedError", true
	case staging.ErrNoRow:
		return "StagingNoRowError", true
	case staging.ErrStepReleased:
		return "StagingStepReleasedError", true
	}
	return "", false
}

// stagingErrorFields are the JSON fields of the pipeline's errors.
func (r *Runner) stagingErrorFields(e error) []Field {
	cause := func(err error) any {
		if err == nil {
			return nil
		}
		typ, _ := classify(err)
		return Object{{"type", typ}, {"message", r.message(err.Error())}}
	}
	switch x := e.(type) {
	case *staging.FailedError:
		return []Field{{"task", r.staging.taskName(x.Task)}, {"cause", cause(x.Err)}}
	case *staging.DropError:
		return []Field{{"reason", x.Reason}, {"requested_bytes", x.Requested}, {"cause", cause(x.Err)}}
	case *staging.AppendRefusedError:
		return []Field{{"task", r.staging.taskName(x.Task)}, {"state", x.State.String()}, {"reassigned", x.Reassigned}}
	case *staging.SlotTimeoutError:
		return []Field{{"slots", x.Slots}, {"timeout_ms", x.Timeout.Milliseconds()}}
	case *staging.SlotOverflowError:
		return []Field{{"step_bytes", x.StepBytes}, {"slot_bytes", x.SlotBytes}}
	}
	return nil
}
