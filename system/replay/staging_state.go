package replay

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// The replay's pipelines, steps, events and tasks, and what can move on
// its own (see ops_staging.go).

// ---- the replay's pipelines, steps, events and tasks, by script name ----

type stagingState struct {
	pipes  map[string]*replayPipe
	steps  map[string]*replayStep
	events map[string]*freezeEvent
	tasks  map[string]*replayTask
	order  []*replayTask // in the order they were opened
	cur    *replayPipe   // the pipeline of the op running now (asRecord)
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

// blockedClones is how many of p's device clone copies wait for a freeze
// event the script has not completed (the clone stream runs them in
// order: those from the first such event on).
func (p *replayPipe) blockedClones() int {
	for i, c := range p.clones {
		if c.freeze.pending() {
			return len(p.clones) - i
		}
	}
	return 0
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
			if rp.p.Stats().CloneCopies > rp.blockedClones() {
				all = false // a device clone lands without a later op
			}
		}
		if all {
			// Nothing else moves: the buffers held for a copy that has
			// completed are freed now, pipeline by pipeline in the order
			// of their names.
			for _, rp := range ss.openPipes() {
				rp.p.FreeHeld()
				if rp.p.Err() != nil && rp.p.Stats().PendingFrees > ss.pendingFrees(rp) {
					all = false // a failed task's buffer waits for a copy that finishes
				}
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

// openPipes returns the pipelines not closed, by name.
func (ss *stagingState) openPipes() []*replayPipe {
	out := make([]*replayPipe, 0, len(ss.pipes))
	for _, rp := range ss.pipes {
		if !rp.closed {
			out = append(out, rp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
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
				tr.Cause = err.Error()
			}
			out = append(out, tr)
		}
		t.last = now
	}
	return out
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
