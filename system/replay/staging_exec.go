package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// The staging ops' exec functions (the table is in ops.go).

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
		ClaimTimeout: s.claimTimeout,
		Keys:         s.keys, PoolSlots: int(s.poolSlots), RowBytes: s.rowBytes,
		CloneBudgetBytes: s.cloneBudget, Eager: s.eager, Serial: true,
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
		return false, &system.UnavailableError{Location: s.device, Detail: "location is not configured", Reason: system.UnavailableLocation}
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
		if st.WaitingStages == 0 || s.claimTimeout > 0 {
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
	switch _, dup := ss.tasks[s.task]; {
	case s.task == "":
		return false, invalid("a task name must not be empty")
	case dup:
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
	t, err := rp.p.Open(ctx, staging.TaskSpec{ReqID: s.req, WriteN: int(s.writeN), Mode: mode, Name: s.task})
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
	// One task at a time, the pipelines settled after each: what a task's
	// copy stage does (a failure above all) happens before the next task
	// is queued, never during.
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
		if err := ss.settle(ctx); err != nil {
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
