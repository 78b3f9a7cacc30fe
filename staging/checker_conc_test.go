package staging_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/staging"
)

// The concurrent rounds of the model checker (see checker_test.go):
// several producers share the pipeline's slots, budget and pool rows.

type ckProducer struct {
	r     *ckRound
	id    int
	rng   *rand.Rand
	steps []*ckStep
	tasks []*ckTask
	gates []*ckGate
}

func (r *ckRound) runConcurrent() {
	n := 2 + r.rng.IntN(3)
	var wg sync.WaitGroup
	for i := range n {
		pr := &ckProducer{r: r, id: i, rng: rand.New(rand.NewPCG(r.seed+uint64(i)+1, uint64(i)*7919))}
		wg.Go(pr.run)
	}
	wg.Wait()
	if r.failed() {
		return
	}
	// Drain: every gate open, every pending task submitted, every task done.
	r.openAll()
	r.mu.Lock()
	tasks := append([]*ckTask(nil), r.tasks...)
	r.mu.Unlock()
	for _, t := range tasks {
		if err := r.p.Submit(r.ctx, t.task); err != nil && r.p.Err() == nil {
			r.errf("drain: submit %s: %v", t.name, err)
			return
		}
		r.mu.Lock()
		t.enqueued = true
		r.mu.Unlock()
	}
	for _, t := range tasks {
		ctx, cancel := context.WithTimeout(r.ctx, 20*time.Second)
		_ = t.task.Wait(ctx)
		stuck := ctx.Err() != nil
		cancel()
		if stuck {
			r.errf("drain: task %s (%s) never finished", t.name, t.task.State())
			return
		}
	}
	r.mu.Lock()
	r.observe()
	r.mu.Unlock()
	if r.p.Err() != nil {
		r.poisoned()
		return
	}
	// Every pool row holds the bytes of one of its newest appends: those
	// that no other append of the row followed (started after it ended).
	for k, rs := range r.rows {
		var cands [][]byte
		for i, e := range rs.log {
			newest := true
			for j, f := range rs.log {
				if i != j && e.end < f.start {
					newest = false
					break
				}
			}
			if newest {
				cands = appendUnique(cands, e.data)
			}
		}
		if len(cands) == 0 {
			cands = [][]byte{make([]byte, ckRowBytes)}
		}
		rs.pool = cands
		_ = k
	}
}

func (pr *ckProducer) run() {
	r := pr.r
	defer func() {
		for _, g := range pr.gates {
			g.openOnce()
		}
	}()
	n := 30 + pr.rng.IntN(60)
	for i := 0; i < n && !r.failed() && r.p.Err() == nil; i++ {
		r.mu.Lock()
		r.ops++
		r.mu.Unlock()
		pr.op()
		if v := r.hooks.check(); v != "" {
			r.errf("%s", v)
		}
		st := r.p.Stats()
		if st.CloneBytes > r.cfg.CloneBudgetBytes || st.PeakCloneBytes > r.cfg.CloneBudgetBytes {
			r.errf("clone bytes %d (peak %d) above the budget %d", st.CloneBytes, st.PeakCloneBytes, r.cfg.CloneBudgetBytes)
		}
		if r.devBudget > 0 && r.rt.reserved("cuda:0") > r.devBudget {
			r.errf("device reservations %d above the device budget %d", r.rt.reserved("cuda:0"), r.devBudget)
		}
		r.mu.Lock()
		r.observe()
		r.mu.Unlock()
	}
}

// openOwn opens the producer's freeze events: done before every call that
// may wait, so that producers never wait on each other in a cycle.
func (pr *ckProducer) openOwn() {
	for _, g := range pr.gates {
		g.openOnce()
	}
}

func (pr *ckProducer) logf(format string, args ...any) {
	pr.r.logf("p%d: "+format, append([]any{pr.id}, args...)...)
}

func (pr *ckProducer) op() {
	r := pr.r
	w := map[string]int{"stage": 12, "release": 8, "open": 8, "append": 30, "submit": 10, "prioritize": 6,
		"read_row": 8, "wait": 4, "freeze": 6, "fault": 1}
	if len(pr.tasks) > 10 {
		w["open"] = 0
	}
	switch pickFrom(pr.rng, w) {
	case "stage":
		pr.stage()
	case "release":
		var live []*ckStep
		for _, s := range pr.steps {
			if !s.released {
				live = append(live, s)
			}
		}
		if len(live) == 0 {
			return
		}
		s := live[pr.rng.IntN(len(live))]
		r.mu.Lock()
		s.releasing = true
		r.mu.Unlock()
		if err := s.step.Release(); err != nil {
			r.errf("release %s: %v", s.name, err)
		}
		r.mu.Lock()
		s.released = true
		r.mu.Unlock()
		pr.logf("release %s", s.name)
	case "open":
		mode := staging.JoinNextStep
		if pr.rng.IntN(2) == 0 {
			mode = staging.JoinOnFinish
		}
		task, err := r.p.Open(r.ctx, staging.TaskSpec{ReqID: fmt.Sprint("p", pr.id), WriteN: len(pr.tasks) + 1, Mode: mode})
		if err != nil {
			if !isFailure(err) {
				r.errf("open: %v", err)
			}
			return
		}
		r.mu.Lock()
		t := r.newTask(fmt.Sprintf("p%dt%d", pr.id, len(pr.tasks)), task, mode, pr.id)
		r.mu.Unlock()
		pr.tasks = append(pr.tasks, t)
		pr.logf("open %s %s", t.name, mode)
	case "append":
		if len(pr.tasks) == 0 {
			return
		}
		t := pr.tasks[pr.rng.IntN(len(pr.tasks))]
		if t.mode == staging.JoinNextStep {
			pr.appendStep(t)
		} else {
			pr.appendClone(t)
		}
	case "submit":
		if len(pr.tasks) == 0 {
			return
		}
		t := pr.tasks[pr.rng.IntN(len(pr.tasks))]
		err := r.p.Submit(r.ctx, t.task)
		pr.logf("submit %s: %v", t.name, err)
		if err != nil && !(r.faulted.Load() && (isFailure(err) || injected(err))) {
			r.errf("submit %s: %v", t.name, err)
			return
		}
		r.mu.Lock()
		t.enqueued = true
		r.mu.Unlock()
	case "prioritize":
		r.mu.Lock()
		var ids []staging.TaskID
		for range 1 + pr.rng.IntN(2) {
			if len(r.tasks) > 0 {
				ids = append(ids, r.tasks[pr.rng.IntN(len(r.tasks))].id)
			}
		}
		r.mu.Unlock()
		err := r.p.Prioritize(r.ctx, ids...)
		pr.logf("prioritize %v: %v", ids, err)
		if err != nil && !(r.faulted.Load() && (isFailure(err) || injected(err))) {
			r.errf("prioritize: %v", err)
		}
	case "wait":
		var ts []*ckTask
		r.mu.Lock()
		for _, t := range pr.tasks {
			if t.enqueued && !t.terminal() {
				ts = append(ts, t)
			}
		}
		r.mu.Unlock()
		if len(ts) == 0 {
			return
		}
		t := ts[pr.rng.IntN(len(ts))]
		pr.openOwn()
		ctx, cancel := context.WithTimeout(r.ctx, 20*time.Second)
		err := t.task.Wait(ctx)
		stuck := ctx.Err() != nil
		cancel()
		pr.logf("wait %s: %v", t.name, err)
		switch {
		case stuck && r.ctx.Err() == nil:
			r.errf("wait %s (%s): no progress in 20s", t.name, t.task.State())
		case err != nil && !r.faulted.Load():
			r.errf("wait %s: %v", t.name, err)
		}
	case "read_row":
		pr.readRow()
	case "freeze":
		for _, g := range pr.gates {
			if !g.opened.Load() {
				g.openOnce()
				return
			}
		}
	case "fault":
		already := r.faulted.Swap(true)
		if already {
			return
		}
		kind, loc := cuda.FaultReconstruct, "pinned-host"
		if !r.eager && pr.rng.IntN(2) == 0 {
			kind = cuda.FaultCopy
		}
		pr.logf("fault %s at %s", kind, loc)
		r.rt.be.Faults().Arm(kind, loc)
	}
}

func (pr *ckProducer) stage() {
	r := pr.r
	nRows := pr.rng.IntN(int(r.cfg.SlotBytes/ckRowBytes) + 1)
	var data []byte
	var dev cuda.Buffer
	if nRows > 0 {
		data = make([]byte, nRows*ckRowBytes)
		for i := range data {
			data[i] = byte(pr.rng.Uint32())
		}
		var err error
		if dev, err = r.devBuf(data); err != nil {
			r.errf("device buffer: %v", err)
			return
		}
	}
	var ev cuda.Event
	var g *ckGate
	if !r.eager && dev != nil && pr.rng.IntN(3) == 0 {
		r.mu.Lock()
		g = r.newGate()
		r.mu.Unlock()
		pr.gates = append(pr.gates, g)
		ev = g
	}
	pr.openOwn() // a claim may wait (for a slot, or for the slot's previous copy)
	step, err := r.p.Stage(r.ctx, dev, ev)
	switch {
	case errors.Is(err, staging.ErrNoSlot):
		pr.logf("stage: %v", err)
		if g != nil {
			g.openOnce()
		}
		return
	case err != nil:
		if !(r.faulted.Load() && (isFailure(err) || injected(err))) {
			r.errf("stage: %v", err)
		}
		if g != nil {
			g.openOnce()
		}
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checkSlotFree(step.Slot())
	s := &ckStep{name: fmt.Sprintf("p%ds%d", pr.id, len(pr.steps)), step: step, slot: step.Slot(), data: data, gate: g, producer: pr.id}
	r.steps = append(r.steps, s)
	r.staged++
	pr.steps = append(pr.steps, s)
	r.logf("p%d: stage %s slot %d (%d bytes)", pr.id, s.name, s.slot, len(data))
}

// lostRow: another task appended one of rows after t's append of it began
// (so t may have lost it).
func (r *ckRound) lostRow(t *ckTask, rows []staging.Row) bool {
	for _, row := range rows {
		k := ckRow{row.Key, row.Slot}
		at, ok := t.appendedAt[k]
		if !ok {
			continue
		}
		for _, e := range r.rowState(k).log {
			if e.task != t && e.end > at {
				return true
			}
		}
		for o, rs := range r.appending {
			if o != t && slices.ContainsFunc(rs, func(x staging.Row) bool { return x.Key == row.Key && x.Slot == row.Slot }) {
				return true
			}
		}
	}
	return false
}

// appendStart and appendEnd bracket an append: while it runs, its rows
// may already be taken from other tasks.
func (r *ckRound) appendStart(t *ckTask, rows []staging.Row) {
	r.mu.Lock()
	r.appending[t] = rows
	r.mu.Unlock()
}

func (r *ckRound) appendEnd(t *ckTask) {
	r.mu.Lock()
	delete(r.appending, t)
	r.mu.Unlock()
}

// checkAppend checks an append's outcome; selfFlushable: a blocking clone
// append, whose reserve may flush the task itself (refused QUEUED).
func (pr *ckProducer) checkAppend(t *ckTask, rows []staging.Row, err error, selfFlushable bool) bool {
	r := pr.r
	var ref *staging.AppendRefusedError
	switch {
	case err == nil:
		return true
	case errors.As(err, &ref):
		r.mu.Lock()
		lost := r.lostRow(t, rows)
		r.mu.Unlock()
		if ref.Reassigned && !lost {
			r.errf("append to %s refused for a lost row, but no other task appended any of %v after it", t.name, rows)
		}
		if !ref.Reassigned && ref.State < staging.Copying && !(ref.State == staging.Queued && selfFlushable) {
			r.errf("append to %s refused with state %s", t.name, ref.State)
		}
	case r.faulted.Load() && (isFailure(err) || injected(err)):
	case r.devBudget > 0 && errors.As(err, new(*budget.BudgetError)):
		// a clone above the device budget never fits
	default:
		r.errf("append to %s: %v", t.name, err)
	}
	return false
}

func (pr *ckProducer) appendStep(t *ckTask) {
	r := pr.r
	if len(pr.steps) == 0 {
		return
	}
	s := pr.steps[pr.rng.IntN(len(pr.steps))]
	rows := r.chunkRows(pr.rng, int64(len(s.data)))
	// The rows stay "being appended" until the model has them (claimRows
	// below, under r.mu; deferred calls run last first): a refusal another
	// producer checks in between must see them, in one place or the other.
	r.appendStart(t, rows)
	defer r.appendEnd(t)
	start := r.tick.Add(1)
	err := t.task.Append(r.ctx, staging.Chunk{Step: s.step, Rows: rows})
	end := r.tick.Add(1)
	pr.logf("append %s step %s rows %v: %v", t.name, s.name, rows, err)
	if s.released {
		if err == nil {
			r.errf("append of released step %s accepted", s.name)
		}
		return
	}
	if !pr.checkAppend(t, rows, err, false) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t.chunks++
	t.slots[s.slot] = true
	r.claimRows(t, rows, s.data, start, end)
}

func (pr *ckProducer) appendClone(t *ckTask) {
	r := pr.r
	nRows := 1 + pr.rng.IntN(3)
	n := int64(nRows * ckRowBytes)
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(pr.rng.Uint32())
	}
	rows := r.chunkRows(pr.rng, n)
	noWait := pr.rng.IntN(3) == 0
	dev, err := r.devBuf(data)
	if err != nil {
		r.errf("device buffer: %v", err)
		return
	}
	var ev cuda.Event
	if !r.eager && pr.rng.IntN(3) == 0 {
		r.mu.Lock()
		g := r.newGate()
		r.mu.Unlock()
		pr.gates = append(pr.gates, g)
		ev = g
	}
	if !noWait {
		pr.openOwn() // a blocking reserve waits for others' copies
	}
	// Clone bytes certainly held during the whole append: tasks whose
	// chunks were accepted before it began and that are still before
	// HOST_READY after it ended.
	active := r.ofActive.Add(1) - 1
	defer r.ofActive.Add(-1) // after the model has the append's bytes
	epoch := r.ofEpoch.Add(1)
	// At most this much is held when the append begins (no other append in
	// flight; one that ended before the count above is in the model): the
	// clones of tasks not written then (a task's state reads HOST_READY just
	// before it releases its clones; a failed one releases them when their
	// copies end).
	r.mu.Lock()
	var hi int64
	for _, o := range r.tasks {
		if o.mode == staging.JoinOnFinish && o.cloneBytes > 0 && o.task.State() != staging.Written {
			hi += o.cloneBytes
		}
	}
	r.mu.Unlock()
	r.appendStart(t, rows)
	defer r.appendEnd(t)
	start := r.tick.Add(1)
	err = t.task.Append(r.ctx, staging.Chunk{Device: dev, Freeze: ev, Rows: rows, NoWait: noWait})
	end := r.tick.Add(1)
	alone := active == 0 && r.ofEpoch.Load() == epoch
	pr.logf("append %s clone %d bytes rows %v nowait=%v: %v", t.name, n, rows, noWait, err)
	var drop *staging.DropError
	if errors.As(err, &drop) {
		if !noWait {
			r.errf("a blocking append was dropped: %v", err)
		}
		if alone && drop.Reason == staging.DropBudget && hi+n <= r.cfg.CloneBudgetBytes {
			r.errf("clone of %d bytes dropped for the GPU-byte budget with at most %d of %d held and no other append in flight", n, hi, r.cfg.CloneBudgetBytes)
		}
		return
	}
	if !pr.checkAppend(t, rows, err, !noWait) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t.chunks++
	t.cloneBytes += n
	if !t.hostReady {
		r.used += n
	}
	r.claimRows(t, rows, data, start, end)
}

// readRow reads a row of one of the producer's tasks: its own bytes, or
// the bytes of a later append of the row (which may have written the pool
// since), or ErrNoRow if it never had the row or lost it.
func (pr *ckProducer) readRow() {
	r := pr.r
	if len(pr.tasks) == 0 {
		return
	}
	t := pr.tasks[pr.rng.IntN(len(pr.tasks))]
	r.mu.Lock()
	waits := t.mode == staging.JoinNextStep && !t.enqueued
	var k ckRow
	if len(t.rows) > 0 && pr.rng.IntN(4) != 0 {
		i := pr.rng.IntN(len(t.rows))
		for kk := range t.rows {
			if i == 0 {
				k = kk
				break
			}
			i--
		}
	} else {
		k = ckRow{r.cfg.Keys[pr.rng.IntN(len(r.cfg.Keys))], pr.rng.IntN(r.cfg.PoolSlots)}
	}
	r.mu.Unlock()
	if waits {
		return // it would wait for a pool write nothing asked for
	}
	pr.openOwn()
	ctx, cancel := context.WithTimeout(r.ctx, 20*time.Second)
	got, err := t.task.ReadRow(ctx, k.key, k.slot)
	stuck := ctx.Err() != nil
	cancel()
	pr.logf("read_row %s %v: %x %v", t.name, k, got, err)
	if stuck && r.ctx.Err() == nil {
		r.errf("read_row %s %v: no progress in 20s", t.name, k)
		return
	}
	if err != nil && r.faulted.Load() && (isFailure(err) || injected(err)) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	own, has := t.rows[k]
	at := t.appendedAt[k]
	var later [][]byte
	for _, e := range r.rowState(k).log {
		if e.task != t && e.end > at {
			later = append(later, e.data)
		}
	}
	switch {
	case !has:
		if !errors.Is(err, staging.ErrNoRow) {
			r.errf("read_row %s %v: %x %v; the task never had the row (want ErrNoRow)", t.name, k, got, err)
		}
	case errors.Is(err, staging.ErrNoRow):
		if len(later) == 0 && !r.concurrentAppendPossible() {
			r.errf("read_row %s %v: ErrNoRow, yet the task has the row and no later append took it", t.name, k)
		}
	case err != nil:
		r.errf("read_row %s %v: %v", t.name, k, err)
	case bytes.Equal(got, own) || containsBytes(later, got):
	case r.concurrentAppendPossible():
		// an append of another producer in flight may have written it
	default:
		r.errf("read_row %s %v: %x; want its own bytes %x or a later append's %x", t.name, k, got, own, later)
	}
}

// concurrentAppendPossible: other producers may have appends the log does
// not show yet (accepted, not recorded).
func (r *ckRound) concurrentAppendPossible() bool { return true }
