package staging_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/checkharness"
	"github.com/residency-go/residency/staging"
)

// The randomized model-based checker of the write pipeline.
//
// Each round starts a pipeline with a random configuration (eager or with
// copy queue and committer, 1–4 slots, a small pool so that rows collide, a
// small clone budget, sometimes a device budget below it) and drives it
// with random stage, step release, open, append (both join modes, blocking
// and try-reserve, with freeze events held open), submit, prioritize,
// wait, read, fault and close operations.
//
// Sequential rounds (one producer) keep an exact reference model of the
// seed's rules and compare after every operation: the lifecycle chain;
// the holders of each slot (a slot is handed out again only when no step
// and no unwritten task holds it); the clone budget (bytes held, flushes of
// the oldest deferred task, drops only when the clone does not fit); the
// copy queue's order (front, then high, then low, first in first out;
// prioritize of a task already queued high is a no-op) with the queue held
// at its first claim; pool writes in the order the copy stages finished;
// every pool row holding the bytes of the newest append; reads; poison
// after a failure; everything released after close. The model's figures are
// exact whenever nothing is held (no freeze event open, the queue running);
// in between it checks what is certain and narrows what is not (a task in
// flight may or may not have been written yet).
//
// Concurrent rounds (2–4 producers sharing pool rows, slots and budget)
// check what holds at any moment (the chain, the clone cap, no slot handed
// out while a known holder has it, pool writes in copy order, drops only
// when the clone could not fit, reads of own rows), then drain and check
// every pool row against the newest appends, and close.
//
// Bounded by default; RESIDENCY_SOAK=<duration> runs rounds for that long.
// A failure prints the round's seed; STAGING_CHECKER_SEED=<seed> replays
// that round alone.

const ckRowBytes = 16

// ckTail is how many operations a failure prints.
var ckTail = 40

// ckChecker is TestPipelineModelChecker's seed loop: seeds from the clock,
// RESIDENCY_SOAK to run for a duration, STAGING_CHECKER_SEED to replay one
// (then the failure prints the whole round).
var ckChecker = checkharness.Checker{SeedEnv: "STAGING_CHECKER_SEED", Pattern: "TestPipelineModelChecker", Package: "./staging/", Seeds: 48}

func TestPipelineModelChecker(t *testing.T) {
	if _, ok := ckChecker.Replayed(t); ok {
		ckTail = 1000 // the whole round
	}
	var seqN, concN, ops int
	sum := ckChecker.Loop(t, func(seed uint64) bool {
		r := newCkRound(t, seed)
		r.run()
		ops += r.ops
		if r.conc {
			concN++
		} else {
			seqN++
		}
		if r.err != nil {
			t.Errorf("seed %d: %v\nlast ops:\n%s", seed, r.err, r.tail())
			return false
		}
		return true
	})
	t.Logf("%d sequential and %d concurrent rounds, %d operations: %s", seqN, concN, ops, sum)
}

// ---- the round ----

type ckRow struct {
	key  string
	slot int
}

type ckStep struct {
	name      string
	step      *staging.Step
	slot      int
	data      []byte
	gate      *ckGate
	releasing bool // Release called (or about to be)
	released  bool
	producer  int
}

type ckTask struct {
	name       string
	task       *staging.Task
	id         staging.TaskID
	mode       staging.JoinMode
	producer   int
	chunks     int
	cloneBytes int64             // JOIN_ON_FINISH: clone bytes of its accepted chunks
	slots      map[int]bool      // JOIN_NEXT_STEP: staging slots of its chunks
	rows       map[ckRow][]byte  // the newest bytes of each row it appended
	appendedAt map[ckRow]int64   // concurrent rounds: start tick of its newest append of the row
	lost       map[ckRow]bool    // a later append took the row while it was pending
	maybeLost  map[ckRow]bool    // taken while it was in flight (lost, or written before)
	enqueued   bool              // left PENDING: submit, prioritize or flush
	last       staging.TaskState // last state observed
	hostReady  bool              // observed HOST_READY or later (clone bytes released)
	written    bool
	failed     bool
}

func (t *ckTask) terminal() bool { return t.written || t.failed }

type ckRowState struct {
	owner *ckTask  // the task of the newest accepted append (nil: none pending)
	pool  [][]byte // what the pool row may hold now (one entry: exact)
	log   []ckAppend
}

// ckAppend is one accepted append of a row (concurrent rounds).
type ckAppend struct {
	task       *ckTask
	data       []byte
	start, end int64
}

type ckGate struct {
	*gate
	opened atomic.Bool
}

func (g *ckGate) openOnce() {
	if g != nil && !g.opened.Swap(true) {
		g.open()
	}
}

type ckJob struct {
	task *ckTask
	prio int8
}

type ckRound struct {
	t         *testing.T
	seed      uint64
	rng       *rand.Rand
	conc      bool
	eager     bool
	rt        *ledgerRuntime
	p         *staging.Pipeline
	cfg       staging.Config
	devBudget int64
	ctx       context.Context // the operation's (see timed)
	roundCtx  context.Context
	cancel    context.CancelFunc
	hooks     *ckHooks
	ops       int

	emu    sync.Mutex  // guards oplog and err (taken inside mu too)
	strict atomic.Bool // every error counts, even after a failure
	oplog  []string
	err    error

	mu sync.Mutex // concurrent rounds: guards what follows

	steps   []*ckStep
	tasks   []*ckTask
	byID    map[staging.TaskID]*ckTask
	rows    map[ckRow]*ckRowState
	gates   []*ckGate
	devBufs []cuda.Buffer
	used    int64 // clone bytes the model says are held
	peak    int64
	flushes int64
	drops   map[string]int64
	faulted atomic.Bool // a fault was armed: injected failures may show
	staged  int64

	// the copy queue held at its first claim (sequential, not eager)
	paused    bool
	head      *ckTask
	jobs      []ckJob
	pauseAt   int // index in hooks.claims of the held claim
	bg        *ckBackground
	tick      atomic.Int64
	appending map[*ckTask][]staging.Row // concurrent: rows of appends in flight
	ofActive  atomic.Int64              // concurrent: JOIN_ON_FINISH appends in flight
	ofEpoch   atomic.Int64
}

// ckBackground is a blocking append running while the copy queue is held.
type ckBackground struct {
	t       *ckTask
	n       int64
	rows    []staging.Row
	data    []byte
	flushed []*ckTask
	self    bool // the task itself is flushed: the append is refused
	done    chan error
}

func newCkRound(t *testing.T, seed uint64) *ckRound {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r := &ckRound{t: t, seed: seed, rng: rng, byID: map[staging.TaskID]*ckTask{}, rows: map[ckRow]*ckRowState{},
		drops: map[string]int64{}, pauseAt: -1, appending: map[*ckTask][]staging.Row{}}
	r.conc = rng.IntN(3) == 0
	r.eager = rng.IntN(4) == 0
	r.cfg = staging.Config{
		Name: "ck", Device: "cuda:0", Slots: 1 + rng.IntN(4), SlotBytes: 6 * ckRowBytes,
		Keys: []string{"k", "v"}, PoolSlots: 3 + rng.IntN(4), RowBytes: ckRowBytes,
		CloneBudgetBytes: int64(3+rng.IntN(6)) * ckRowBytes, Eager: r.eager,
	}
	if r.conc && rng.IntN(2) == 0 {
		r.cfg.ClaimTimeout = time.Duration(5+rng.IntN(30)) * time.Millisecond
	}
	if rng.IntN(4) == 0 {
		r.devBudget = r.cfg.CloneBudgetBytes - int64(1+rng.IntN(2))*ckRowBytes
	}
	r.hooks = &ckHooks{claimAt: map[staging.TaskID]int{}, committed: map[staging.TaskID]bool{}, order: !r.eager,
		headClaimed: make(chan staging.TaskID, 1)}
	staging.OnClaim(&r.cfg, r.hooks.onClaim)
	r.cfg.OnCommit = r.hooks.onCommit
	return r
}

// timed runs one operation under a 30 s deadline (a wait that never ends
// fails the round quickly, with the pipeline's figures).
func (r *ckRound) timed(op func()) {
	base := r.ctx
	ctx, cancel := context.WithTimeout(base, 30*time.Second)
	r.ctx = ctx
	defer func() {
		cancel()
		r.ctx = base
	}()
	op()
	if ctx.Err() != nil && base.Err() == nil {
		st := r.p.Stats()
		r.logf("timed out: tasks %v, %d free slots, %d holders, clone bytes %d, flushes %d", st.Tasks, st.FreeSlots, st.SlotHolders, st.CloneBytes, st.Flushes)
		for _, t := range r.tasks {
			r.logf("  task %s %s enqueued=%v clone=%d chunks=%d", t.name, t.task.State(), t.enqueued, t.cloneBytes, t.chunks)
		}
		r.errf("an operation did not return within 30s: tasks %v, %d free slots, %d holders, clone bytes %d, flushes %d", st.Tasks, st.FreeSlots, st.SlotHolders, st.CloneBytes, st.Flushes)
	}
}

func (r *ckRound) errf(format string, args ...any) {
	if !r.strict.Load() && r.p != nil && r.p.Err() != nil {
		// A failure (an armed fault) poisoned the pipeline while the
		// operation ran: poisoned() checks what follows.
		r.logf("after the failure: "+format, args...)
		return
	}
	r.emu.Lock()
	defer r.emu.Unlock()
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *ckRound) failed() bool {
	r.emu.Lock()
	defer r.emu.Unlock()
	return r.err != nil
}

func (r *ckRound) logf(format string, args ...any) {
	r.emu.Lock()
	r.oplog = append(r.oplog, fmt.Sprintf(format, args...))
	r.emu.Unlock()
}

func (r *ckRound) tail() string {
	r.emu.Lock()
	defer r.emu.Unlock()
	from := max(0, len(r.oplog)-ckTail)
	return "  " + strings.Join(r.oplog[from:], "\n  ")
}

func (r *ckRound) run() {
	r.ctx, r.cancel = context.WithTimeout(context.Background(), 2*time.Minute)
	defer r.cancel()
	r.roundCtx = r.ctx
	rt, err := newCkRuntime(r.devBudget)
	if err != nil {
		r.errf("runtime: %v", err)
		return
	}
	r.rt = rt
	defer func() { _ = rt.be.Close() }()
	r.logf("config: conc=%v eager=%v slots=%d pool_slots=%d clone_budget=%d dev_budget=%d claim_timeout=%s",
		r.conc, r.eager, r.cfg.Slots, r.cfg.PoolSlots, r.cfg.CloneBudgetBytes, r.devBudget, r.cfg.ClaimTimeout)
	p, err := staging.New(r.ctx, rt, r.cfg)
	if err != nil {
		r.errf("New: %v", err)
		return
	}
	r.p = p
	defer func() { _ = p.Close(context.Background()) }() // after a failed check: clean up all the same
	if r.conc {
		r.runConcurrent()
	} else {
		r.runSequential()
	}
	if r.failed() {
		r.openAll()
		r.resume()
		return
	}
	r.finish()
}

func newCkRuntime(devBudget int64) (*ledgerRuntime, error) {
	be, err := soft.New(soft.Config{Locations: []string{"pageable-host", "pinned-host", "cuda:0"}})
	if err != nil {
		return nil, err
	}
	cfgs := []budget.LocationConfig{{Name: "pageable-host"}, {Name: "pinned-host"}, {Name: "cuda:0"}}
	if devBudget > 0 {
		cfgs[2] = budget.LocationConfig{Name: "cuda:0", HasBudget: true, BudgetBytes: devBudget}
	}
	led, err := budget.New(budget.Config{ManagerID: "staging-checker", Locations: cfgs})
	if err != nil {
		_ = be.Close()
		return nil, err
	}
	return &ledgerRuntime{be: faulty.Wrap(be, soft.ErrorPrefix), led: led}, nil
}

// ---- hooks: claim and commit order, and holding the copy queue ----

type ckHooks struct {
	mu          sync.Mutex
	claims      []staging.TaskID
	claimAt     map[staging.TaskID]int
	committed   map[staging.TaskID]bool
	order       bool // check that pool writes follow copy order (one committer)
	violation   string
	pauseNext   bool
	resumeCh    chan struct{}
	headClaimed chan staging.TaskID
}

func (h *ckHooks) onClaim(id staging.TaskID) {
	h.mu.Lock()
	if _, dup := h.claimAt[id]; dup && h.violation == "" {
		h.violation = fmt.Sprintf("task %d claimed twice", id)
	}
	h.claimAt[id] = len(h.claims)
	h.claims = append(h.claims, id)
	if !h.pauseNext {
		h.mu.Unlock()
		return
	}
	h.pauseNext = false
	ch := h.resumeCh
	h.mu.Unlock()
	h.headClaimed <- id
	<-ch
}

// onCommit: with one committer, pool writes follow the order in which the
// copy stages finished, which is the order of the claims (one copy queue).
func (h *ckHooks) onCommit(id staging.TaskID, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i, ok := h.claimAt[id]
	if !ok {
		if h.violation == "" {
			h.violation = fmt.Sprintf("task %d committed without a claim", id)
		}
		return
	}
	if h.committed[id] && h.violation == "" {
		h.violation = fmt.Sprintf("task %d committed twice", id)
	}
	h.committed[id] = true
	if !h.order || err != nil { // a failed copy stage is reported by the copy queue
		return
	}
	for _, earlier := range h.claims[:i] {
		if !h.committed[earlier] && h.violation == "" {
			h.violation = fmt.Sprintf("task %d written to the pool before task %d, whose copy stage finished first (claims %v)", id, earlier, h.claims)
		}
	}
}

func (h *ckHooks) check() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.violation
}

func (h *ckHooks) claimsFrom(i int) []staging.TaskID {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i > len(h.claims) {
		return nil
	}
	return slices.Clone(h.claims[i:])
}

// ---- shared helpers ----

func (r *ckRound) randBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.rng.Uint32())
	}
	return b
}

func (r *ckRound) devBuf(data []byte) (cuda.Buffer, error) {
	b, err := r.rt.be.Allocate(r.ctx, "cuda:0", int64(len(data)))
	if err != nil {
		return nil, err
	}
	if err := r.rt.be.Write(r.ctx, b, data); err != nil {
		_ = r.rt.be.Free(b)
		return nil, err
	}
	r.mu.Lock()
	r.devBufs = append(r.devBufs, b)
	r.mu.Unlock()
	return b, nil
}

// chunkRows picks 1–3 rows of a save of size bytes: random keys and pool
// slots (rows collide on purpose, a row may repeat), offsets mostly on row
// boundaries.
func (r *ckRound) chunkRows(rng *rand.Rand, size int64) []staging.Row {
	if size < ckRowBytes {
		return nil
	}
	n := 1 + rng.IntN(3)
	rows := make([]staging.Row, n)
	for i := range rows {
		off := int64(rng.IntN(int(size/ckRowBytes))) * ckRowBytes
		if rng.IntN(5) == 0 {
			off = int64(rng.IntN(int(size - ckRowBytes + 1)))
		}
		rows[i] = staging.Row{Key: r.cfg.Keys[rng.IntN(len(r.cfg.Keys))], Slot: rng.IntN(r.cfg.PoolSlots), Offset: off}
	}
	return rows
}

func rowBytesAt(data []byte, off int64) []byte {
	return slices.Clone(data[off : off+ckRowBytes])
}

func (r *ckRound) rowState(k ckRow) *ckRowState {
	rs := r.rows[k]
	if rs == nil {
		rs = &ckRowState{pool: [][]byte{make([]byte, ckRowBytes)}}
		r.rows[k] = rs
	}
	return rs
}

func injected(err error) bool { return errors.Is(err, cuda.ErrInjectedFault) }

func isFailure(err error) bool {
	var fe *staging.FailedError
	return errors.As(err, &fe)
}

// observe refreshes the model's view of every task's state and checks the
// lifecycle chain: states only move forward, Written and Failed are final,
// a task nobody enqueued stays PENDING. Caller holds r.mu in concurrent
// rounds (sequential rounds do not need it).
func (r *ckRound) observe() {
	for _, t := range r.tasks {
		if t.terminal() {
			continue
		}
		st := t.task.State()
		switch {
		case st == t.last:
		case t.last == staging.Written || t.last == staging.Failed:
			r.errf("task %s left terminal state %s for %s", t.name, t.last, st)
		case st != staging.Failed && st < t.last:
			r.errf("task %s moved back from %s to %s", t.name, t.last, st)
		}
		if st != staging.Pending && st != staging.Failed && !t.enqueued && !r.conc {
			r.errf("task %s is %s but nothing enqueued it (no submit, prioritize or flush of it)", t.name, st)
		}
		t.last = st
		if st >= staging.HostReady && st != staging.Failed && !t.hostReady {
			t.hostReady = true
			r.used -= t.cloneBytes
		}
		switch st {
		case staging.Written:
			r.applyWrite(t)
		case staging.Failed:
			t.failed = true
			if !t.hostReady {
				t.hostReady = true
				r.used -= t.cloneBytes
			}
			for k := range t.rows {
				if rs := r.rows[k]; rs != nil && rs.owner == t {
					rs.owner = nil
				}
			}
		}
	}
}

// applyWrite records t's pool write: every row it still owns now holds its
// bytes (rows it lost while pending were skipped; rows taken while it was
// in flight were added as candidates then).
func (r *ckRound) applyWrite(t *ckTask) {
	t.written = true
	for k, b := range t.rows {
		rs := r.rowState(k)
		if rs.owner == t {
			rs.pool = [][]byte{b}
			rs.owner = nil
		}
	}
}

// claimRows applies an accepted append's rows: t becomes the owner of each;
// the previous owner loses it (pending: it will skip the row; in flight:
// it may have written it already).
func (r *ckRound) claimRows(t *ckTask, rows []staging.Row, data []byte, start, end int64) {
	for _, row := range rows {
		k := ckRow{row.Key, row.Slot}
		b := rowBytesAt(data, row.Offset)
		rs := r.rowState(k)
		if prev := rs.owner; prev != nil && prev != t && !prev.terminal() {
			if prev.enqueued || r.conc {
				prev.maybeLost[k] = true
				rs.pool = appendUnique(rs.pool, prev.rows[k])
			} else {
				prev.lost[k] = true
			}
		}
		rs.owner = t
		t.rows[k] = b
		t.appendedAt[k] = start
		rs.log = append(rs.log, ckAppend{task: t, data: b, start: start, end: end})
	}
}

func appendUnique(set [][]byte, b []byte) [][]byte {
	for _, x := range set {
		if bytes.Equal(x, b) {
			return set
		}
	}
	return append(set, b)
}

func (r *ckRound) newTask(name string, task *staging.Task, mode staging.JoinMode, producer int) *ckTask {
	t := &ckTask{name: name, task: task, id: task.ID(), mode: mode, producer: producer, slots: map[int]bool{},
		rows: map[ckRow][]byte{}, appendedAt: map[ckRow]int64{}, lost: map[ckRow]bool{}, maybeLost: map[ckRow]bool{}}
	r.tasks = append(r.tasks, t)
	r.byID[t.id] = t
	return t
}

func (r *ckRound) newGate() *ckGate {
	g := &ckGate{gate: newGate()}
	r.gates = append(r.gates, g)
	return g
}

func (r *ckRound) openAll() {
	r.mu.Lock()
	gates := slices.Clone(r.gates)
	r.mu.Unlock()
	for _, g := range gates {
		g.openOnce()
	}
}

func (r *ckRound) gatesOpen() bool {
	for _, g := range r.gates {
		if !g.opened.Load() {
			return false
		}
	}
	return true
}

// quiet: nothing is held, so everything enqueued finishes on its own.
func (r *ckRound) quiet() bool { return !r.paused && r.bg == nil && r.gatesOpen() }

// slotsHeld returns the slots the model says are held and the number of
// holders (every step not released, every unwritten JOIN_NEXT_STEP task
// once per slot of its chunks).
func (r *ckRound) slotsHeld() (map[int]bool, int) {
	held, holders := map[int]bool{}, 0
	for _, s := range r.steps {
		if !s.released {
			held[s.slot] = true
			holders++
		}
	}
	for _, t := range r.tasks {
		if t.terminal() {
			continue
		}
		for s := range t.slots {
			held[s] = true
			holders++
		}
	}
	return held, holders
}

// deferred lists the model's deferred tasks, oldest first: JOIN_ON_FINISH
// tasks still pending with at least one chunk.
func (r *ckRound) deferred() []*ckTask {
	var out []*ckTask
	for _, t := range r.tasks {
		if t.mode == staging.JoinOnFinish && !t.enqueued && !t.terminal() && t.chunks > 0 {
			out = append(out, t)
		}
	}
	return out
}

// inflight is the clone bytes of tasks that left PENDING and have not
// released them yet: they are on their way out.
func (r *ckRound) inflight() int64 {
	var n int64
	for _, t := range r.tasks {
		if t.mode == staging.JoinOnFinish && t.enqueued && !t.hostReady {
			n += t.cloneBytes
		}
	}
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func (r *ckRound) waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
	return true
}

// ---- settling and exact checks (sequential rounds, and the end of every round) ----

// settle waits until every enqueued task is terminal and, when nothing is
// held, every step's copy has landed; then it observes.
func (r *ckRound) settle() {
	if r.quiet() {
		for _, s := range r.steps {
			if ev := s.step.Event(); ev != nil {
				select {
				case <-ev.Done():
				case <-time.After(20 * time.Second):
					r.errf("step %s's copy did not land within 20s although nothing holds it", s.name)
					return
				}
			}
		}
	}
	for _, t := range r.tasks {
		if !t.enqueued && !(r.faulted.Load() && r.p.Err() != nil) {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, 20*time.Second)
		_ = t.task.Wait(ctx)
		stuck := ctx.Err() != nil
		cancel()
		if stuck && r.ctx.Err() == nil {
			r.errf("task %s (%s) did not finish within 20s although nothing holds it", t.name, t.task.State())
			return
		}
	}
	r.observe()
}

type ckExpect struct {
	free, holders           int
	clone                   int64
	flushes                 int64
	drops                   map[string]int64
	pending                 int
	opened, written, failed int64
	live, staged            int64
}

func (r *ckRound) expected() ckExpect {
	held, holders := r.slotsHeld()
	e := ckExpect{free: r.cfg.Slots - len(held), holders: holders, clone: r.used, flushes: r.flushes,
		drops: r.drops, opened: int64(len(r.tasks)), staged: r.staged}
	for _, t := range r.tasks {
		switch {
		case t.written:
			e.written++
		case t.failed:
			e.failed++
		case !t.enqueued:
			e.pending++
		}
	}
	for _, s := range r.steps {
		if !s.released {
			e.live++
		}
	}
	return e
}

func (r *ckRound) statsMatch(e ckExpect, st staging.Stats) string {
	var diffs []string
	add := func(what string, got, want int64) {
		if got != want {
			diffs = append(diffs, fmt.Sprintf("%s %d, model %d", what, got, want))
		}
	}
	add("free slots", int64(st.FreeSlots), int64(e.free))
	add("slot holders", int64(st.SlotHolders), int64(e.holders))
	add("clone bytes", st.CloneBytes, e.clone)
	if !r.conc { // flushes and drops of concurrent producers are not modelled
		add("flushes", st.Flushes, e.flushes)
		add("gpu-budget drops", st.Drops[staging.DropBudget], e.drops[staging.DropBudget])
		add("location drops", st.Drops[staging.DropLocation], e.drops[staging.DropLocation])
	}
	add("pending tasks", int64(st.Tasks[staging.Pending]), int64(e.pending))
	add("opened", st.Opened, e.opened)
	add("written", st.Written, e.written)
	add("failed", st.Failed, e.failed)
	add("live steps", st.LiveSteps, e.live)
	add("steps staged", st.StepsStaged, e.staged)
	if st.PeakCloneBytes > r.cfg.CloneBudgetBytes {
		diffs = append(diffs, fmt.Sprintf("peak clone bytes %d above the budget %d", st.PeakCloneBytes, r.cfg.CloneBudgetBytes))
	}
	if st.PeakCloneBytes < r.peak && !r.conc {
		diffs = append(diffs, fmt.Sprintf("peak clone bytes %d below the model's %d", st.PeakCloneBytes, r.peak))
	}
	return strings.Join(diffs, "; ")
}

// verify compares everything with the model; the pipeline must be quiet
// and settled. Figures that the pipeline releases after the task's waiters
// woke (a clone whose copy had not completed) are polled for a while.
func (r *ckRound) verify() {
	if v := r.hooks.check(); v != "" {
		r.errf("%s", v)
		return
	}
	for _, t := range r.tasks {
		st := t.task.State()
		switch {
		case t.failed || t.written:
		case !t.enqueued && st != staging.Pending:
			r.errf("task %s is %s, the model says PENDING", t.name, st)
		case t.enqueued:
			r.errf("task %s is %s after settling", t.name, st)
		}
	}
	if r.failed() {
		return
	}
	if r.p.Err() != nil {
		return // poisoned: checked by the caller
	}
	e := r.expected()
	var diff string
	ok := r.waitFor(5*time.Second, func() bool {
		diff = r.statsMatch(e, r.p.Stats())
		if diff != "" {
			return false
		}
		diff = r.ledgerMatch(e.clone)
		return diff == ""
	})
	if !ok {
		r.errf("stats: %s", diff)
		return
	}
	r.verifyPool()
	r.verifyOrder()
}

func (r *ckRound) ledgerMatch(clone int64) string {
	want := map[string]int64{
		"cuda:0":        clone,
		"pinned-host":   int64(r.cfg.Slots) * r.cfg.SlotBytes,
		"pageable-host": int64(len(r.cfg.Keys)*r.cfg.PoolSlots) * r.cfg.RowBytes,
	}
	for loc, w := range want {
		if got := r.rt.reserved(loc); got != w {
			return fmt.Sprintf("ledger %s reserved %d, model %d", loc, got, w)
		}
	}
	return ""
}

func (r *ckRound) verifyPool() {
	for _, key := range r.cfg.Keys {
		for slot := range r.cfg.PoolSlots {
			got, err := r.p.ReadPool(key, slot)
			if err != nil {
				r.errf("ReadPool(%s, %d): %v", key, slot, err)
				return
			}
			rs := r.rowState(ckRow{key, slot})
			if !containsBytes(rs.pool, got) {
				r.errf("pool row (%s, %d) holds %x; the model allows %x (newest append by %v)", key, slot, got, rs.pool, ownerName(rs.owner))
				return
			}
			rs.pool = [][]byte{got}
		}
	}
}

func ownerName(t *ckTask) string {
	if t == nil {
		return "none pending"
	}
	return t.name
}

func containsBytes(set [][]byte, b []byte) bool {
	for _, x := range set {
		if bytes.Equal(x, b) {
			return true
		}
	}
	return false
}

// verifyOrder checks the claims made since the copy queue was held: the
// held task, then front, high and low jobs, first in first out within a
// level, each task once.
func (r *ckRound) verifyOrder() {
	if r.pauseAt < 0 {
		return
	}
	from := r.pauseAt
	r.pauseAt = -1
	want := r.expectedOrder()
	// Every job of the window is claimed before anything else may join
	// the queue (the caller let everything held go).
	var got []staging.TaskID
	r.waitFor(10*time.Second, func() bool {
		got = r.hooks.claimsFrom(from)
		return len(got) >= len(want)
	})
	if len(got) > len(want) {
		got = got[:len(want)]
	}
	if !slices.Equal(got, want) {
		r.errf("copy queue order: claims %v, the model's order %v (front, then high, then low)", r.names(got), r.names(want))
	}
}

func (r *ckRound) names(ids []staging.TaskID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		if t := r.byID[id]; t != nil {
			out[i] = t.name
		} else {
			out[i] = fmt.Sprint(id)
		}
	}
	return out
}

func (r *ckRound) expectedOrder() []staging.TaskID {
	var want []staging.TaskID
	seen := map[*ckTask]bool{}
	if r.head != nil {
		want = append(want, r.head.id)
		seen[r.head] = true
	}
	for _, prio := range []int8{2, 1, 0} {
		for _, j := range r.jobs {
			if j.prio == prio && !seen[j.task] {
				seen[j.task] = true
				want = append(want, j.task.id)
			}
		}
	}
	r.head, r.jobs = nil, nil
	return want
}

// ---- the sequential round ----

const (
	prioLow   int8 = 0
	prioHigh  int8 = 1
	prioFront int8 = 2
)

func (r *ckRound) runSequential() {
	r.pauseAt = -1
	n := 40 + r.rng.IntN(80)
	for i := 0; i < n && !r.failed(); i++ {
		r.ops++
		r.timed(r.seqOp)
		if r.failed() {
			return
		}
		if v := r.hooks.check(); v != "" {
			r.errf("%s", v)
			return
		}
		if r.p.Err() != nil {
			r.poisoned()
			return
		}
		if r.quiet() {
			r.settle()
			r.verify()
		} else {
			r.observe()
			r.looseChecks()
		}
	}
}

// looseChecks: what holds while something is held.
func (r *ckRound) looseChecks() {
	st := r.p.Stats()
	if st.CloneBytes > r.cfg.CloneBudgetBytes || st.PeakCloneBytes > r.cfg.CloneBudgetBytes {
		r.errf("clone bytes %d (peak %d) above the budget %d", st.CloneBytes, st.PeakCloneBytes, r.cfg.CloneBudgetBytes)
	}
	if r.devBudget > 0 && r.rt.reserved("cuda:0") > r.devBudget {
		r.errf("device reservations %d above the device budget %d", r.rt.reserved("cuda:0"), r.devBudget)
	}
	if st.Flushes < r.flushes {
		r.errf("flushes %d, the model counted %d already", st.Flushes, r.flushes)
	}
}

func (r *ckRound) pick(w map[string]int) string { return pickFrom(r.rng, w) }

// pickFrom draws a key of w with probability proportional to its weight.
func pickFrom(rng *rand.Rand, w map[string]int) string {
	total := 0
	keys := make([]string, 0, len(w))
	for k, v := range w {
		if v > 0 {
			total += v
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	x := rng.IntN(total)
	for _, k := range keys {
		x -= w[k]
		if x < 0 {
			return k
		}
	}
	return keys[0]
}

func (r *ckRound) liveTasks() []*ckTask {
	var out []*ckTask
	for _, t := range r.tasks {
		if !t.terminal() {
			out = append(out, t)
		}
	}
	return out
}

func (r *ckRound) seqOp() {
	w := map[string]int{"stage": 12, "release": 8, "open": 10, "append": 30, "submit": 10, "prioritize": 6,
		"read_row": 8, "read_pool": 4, "wait": 4, "freeze": 6, "fault": 1}
	if !r.eager {
		w["pause"] = 3
		w["resume"] = 3
	}
	if len(r.tasks) > 24 {
		w["open"] = 0
	}
	switch op := r.pick(w); op {
	case "stage":
		r.seqStage()
	case "release":
		var live []*ckStep
		for _, s := range r.steps {
			if !s.released {
				live = append(live, s)
			}
		}
		if len(live) == 0 {
			return
		}
		s := live[r.rng.IntN(len(live))]
		s.releasing = true
		r.logf("release %s (slot %d)", s.name, s.slot)
		if err := s.step.Release(); err != nil {
			r.errf("release %s: %v", s.name, err)
			return
		}
		s.released = true
		if err := s.step.Release(); err == nil {
			r.errf("a second release of %s succeeded", s.name)
		}
	case "open":
		mode := staging.JoinNextStep
		if r.rng.IntN(2) == 0 {
			mode = staging.JoinOnFinish
		}
		task, err := r.p.Open(r.ctx, staging.TaskSpec{ReqID: fmt.Sprint("req-", len(r.tasks)), WriteN: 1, Mode: mode})
		name := fmt.Sprint("t", len(r.tasks))
		r.logf("open %s %s: %v", name, mode, err)
		if err != nil {
			if !(r.faulted.Load() && isFailure(err)) {
				r.errf("open: %v", err)
			}
			return
		}
		r.newTask(name, task, mode, 0)
	case "append":
		live := r.liveTasks()
		if len(live) == 0 {
			return
		}
		t := live[r.rng.IntN(len(live))]
		if r.rng.IntN(5) == 0 { // sometimes a task that is done or in flight
			t = r.tasks[r.rng.IntN(len(r.tasks))]
		}
		if t.mode == staging.JoinNextStep {
			r.seqAppendStep(t)
		} else {
			r.seqAppendClone(t)
		}
	case "submit", "prioritize":
		if len(r.tasks) == 0 {
			return
		}
		var ts []*ckTask
		for range 1 + r.rng.IntN(2) {
			ts = append(ts, r.tasks[r.rng.IntN(len(r.tasks))])
		}
		r.seqEnqueue(op == "prioritize", ts)
	case "read_row":
		r.seqReadRow()
	case "read_pool":
		if !r.quiet() {
			return
		}
		r.settle()
		k := ckRow{r.cfg.Keys[r.rng.IntN(len(r.cfg.Keys))], r.rng.IntN(r.cfg.PoolSlots)}
		got, err := r.p.ReadPool(k.key, k.slot)
		r.logf("read_pool %v: %x %v", k, got, err)
		if err != nil {
			r.errf("ReadPool: %v", err)
			return
		}
		if rs := r.rowState(k); !containsBytes(rs.pool, got) {
			r.errf("ReadPool %v = %x, the model allows %x", k, got, rs.pool)
		}
	case "wait":
		var ts []*ckTask
		for _, t := range r.tasks {
			if t.enqueued && !t.terminal() {
				ts = append(ts, t)
			}
		}
		if len(ts) == 0 {
			return
		}
		t := ts[r.rng.IntN(len(ts))]
		r.openAll()
		r.resume()
		hostOnly := r.rng.IntN(2) == 0
		var err error
		if hostOnly {
			err = t.task.WaitHostReady(r.ctx)
		} else {
			err = t.task.Wait(r.ctx)
		}
		r.logf("wait %s host_ready=%v: %v (%s)", t.name, hostOnly, err, t.task.State())
		if err != nil && !r.faulted.Load() {
			r.errf("wait %s: %v", t.name, err)
		}
		if err == nil && !hostOnly && t.task.State() != staging.Written {
			r.errf("wait %s returned nil with the task %s", t.name, t.task.State())
		}
	case "freeze":
		for _, g := range r.gates {
			if !g.opened.Load() {
				r.logf("freeze")
				g.openOnce()
				return
			}
		}
	case "pause":
		if !r.quiet() {
			return
		}
		r.settle()
		r.verify()
		r.hooks.mu.Lock()
		r.hooks.pauseNext = true
		r.hooks.resumeCh = make(chan struct{})
		r.pauseAt = len(r.hooks.claims)
		r.hooks.mu.Unlock()
		r.paused = true
		r.logf("pause the copy queue at its next claim")
	case "resume":
		r.resume()
	case "fault":
		kinds := []struct {
			kind cuda.FaultKind
			loc  string
		}{{cuda.FaultReconstruct, "pinned-host"}, {cuda.FaultAlloc, "cuda:0"}}
		if !r.eager {
			kinds = append(kinds, struct {
				kind cuda.FaultKind
				loc  string
			}{cuda.FaultCopy, "pinned-host"}, struct {
				kind cuda.FaultKind
				loc  string
			}{cuda.FaultCopy, "cuda:0"})
		}
		k := kinds[r.rng.IntN(len(kinds))]
		r.logf("fault %s at %s", k.kind, k.loc)
		r.faulted.Store(true)
		r.rt.be.Faults().Arm(k.kind, k.loc)
	}
}

// resume lets a held copy queue go on, and finishes a background append.
func (r *ckRound) resume() {
	if !r.paused {
		return
	}
	r.paused = false
	r.hooks.mu.Lock()
	if r.hooks.pauseNext {
		r.hooks.pauseNext = false // never claimed
	}
	ch := r.hooks.resumeCh
	r.hooks.resumeCh = nil
	r.hooks.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	r.logf("resume the copy queue")
	r.openAll()
	defer r.verifyOrder()
	if bg := r.bg; bg != nil {
		r.bg = nil
		var err error
		select {
		case err = <-bg.done:
		case <-time.After(20 * time.Second):
			r.errf("the blocking append to %s did not return within 20s of the queue resuming", bg.t.name)
			return
		}
		r.logf("background append to %s returned: %v", bg.t.name, err)
		exp := ""
		switch {
		case bg.self:
			exp = "self"
		case bg.t.enqueued:
			// Submitted or prioritized while the append waited: its copy
			// stage may have been claimed before the bytes came back.
			exp = "maybe"
		default:
			// A later task may have taken one of the rows while the append
			// waited: the task checks its rows when it accepts the chunk,
			// after the wait.
			exp = r.lostRows(bg.t, bg.rows)
		}
		r.finishCloneAppend(bg.t, bg.n, bg.rows, bg.data, exp, err)
	}
}

func (r *ckRound) seqStage() {
	nRows := r.rng.IntN(int(r.cfg.SlotBytes/ckRowBytes) + 1)
	var data []byte
	var dev cuda.Buffer
	var err error
	if r.rng.IntN(12) == 0 {
		data = r.randBytes(int(r.cfg.SlotBytes) + ckRowBytes) // overflows a slot
	} else if nRows > 0 {
		data = r.randBytes(nRows * ckRowBytes)
	}
	if data != nil {
		if dev, err = r.devBuf(data); err != nil {
			r.logf("stage: device buffer: %v", err)
			if !(r.faulted.Load() && injected(err)) {
				r.errf("device buffer: %v", err)
			}
			return
		}
	}
	// Claiming a slot whose previous copy has not landed waits for that
	// copy when the new step has another size (the slot's buffer is
	// reallocated): let held copies go first then.
	if r.pendingSlotCopy() {
		r.logf("open every freeze event: a free slot's previous copy waits for one")
		r.openAll()
	}
	var g *ckGate
	var ev cuda.Event
	if !r.eager && dev != nil && r.rng.IntN(3) == 0 {
		g = r.newGate()
		ev = g
	}
	held, _ := r.slotsHeld()
	// The lowest free slot when the model is exact: no task in flight (it
	// may have released its slot) and no step copy in flight (a free slot
	// of another size is not ready until its last copy landed).
	copiesInFlight := r.stepCopiesInFlight()
	step, err := r.p.Stage(r.ctx, dev, ev)
	name := fmt.Sprint("s", len(r.steps))
	r.logf("stage %s (%d bytes, gate %v): %v", name, len(data), g != nil, errOr(err, func() string { return fmt.Sprint("slot ", step.Slot()) }))
	if err != nil && g != nil {
		g.openOnce() // never used
	}
	switch {
	case int64(len(data)) > r.cfg.SlotBytes:
		var ov *staging.SlotOverflowError
		if !errors.As(err, &ov) || !errors.Is(err, staging.ErrConfig) {
			r.errf("stage of %d bytes into %d-byte slots: %v, want a SlotOverflowError", len(data), r.cfg.SlotBytes, err)
		}
		return
	case err != nil && r.faulted.Load() && injected(err):
		return
	case errors.Is(err, staging.ErrNoSlot):
		if len(held) < r.cfg.Slots && r.quiet() {
			r.errf("stage found no free slot; the model holds %d of %d", len(held), r.cfg.Slots)
		}
		if len(held) < r.cfg.Slots {
			// a slot the model thinks free must be held by an in-flight task
			if !r.slotMaybeHeld(held) {
				r.errf("stage found no free slot; the model holds %d of %d", len(held), r.cfg.Slots)
			}
		}
		return
	case err != nil:
		r.errf("stage: %v", err)
		return
	}
	slot := step.Slot()
	r.checkSlotFree(slot)
	if r.allSlotHoldersCertain() && !copiesInFlight {
		want := -1
		for i := range r.cfg.Slots {
			if !held[i] {
				want = i
				break
			}
		}
		if slot != want {
			r.errf("stage claimed slot %d; the lowest free slot is %d", slot, want)
		}
	}
	r.steps = append(r.steps, &ckStep{name: name, step: step, slot: slot, data: data, gate: g})
	r.staged++
}

func errOr(err error, ok func() string) string {
	if err != nil {
		return err.Error()
	}
	return ok()
}

// pendingSlotCopy: the copy of some step that no longer holds its slot has
// not landed (it may wait, on the device→host stream, behind a copy that
// waits for a freeze event).
func (r *ckRound) pendingSlotCopy() bool {
	for _, s := range r.steps {
		if ev := s.step.Event(); (s.released || s.releasing) && ev != nil && !ev.Query() {
			return true
		}
	}
	return false
}

// stepCopiesInFlight: some step's copy has not landed.
func (r *ckRound) stepCopiesInFlight() bool {
	for _, s := range r.steps {
		if ev := s.step.Event(); ev != nil && !ev.Query() {
			return true
		}
	}
	return false
}

// slotMaybeHeld: every slot the model thinks free has an in-flight holder
// that the model cannot see (none: the stage was wrongly refused).
func (r *ckRound) slotMaybeHeld(held map[int]bool) bool {
	return !r.quiet()
}

// allSlotHoldersCertain: no JOIN_NEXT_STEP task is in flight.
func (r *ckRound) allSlotHoldersCertain() bool {
	for _, t := range r.tasks {
		if t.mode == staging.JoinNextStep && t.enqueued && !t.terminal() && len(t.slots) > 0 {
			return false
		}
	}
	return true
}

// checkSlotFree: a slot just handed to a new step must have no holder the
// model knows of: no step not released, no unwritten task with a chunk
// in it.
func (r *ckRound) checkSlotFree(slot int) {
	for _, s := range r.steps {
		if s.slot == slot && !s.releasing && !s.released {
			r.errf("slot %d handed to a new step while step %s still holds it", slot, s.name)
		}
	}
	for _, t := range r.tasks {
		if t.terminal() || !t.slots[slot] {
			continue
		}
		if st := t.task.State(); st != staging.Written && st != staging.Failed {
			r.errf("slot %d handed to a new step while task %s (%s), whose chunk views it, is not written", slot, t.name, st)
		}
	}
}

// refusal returns what the model expects of an append to t, before any
// budget: "" (accepted), "state" (refused: the copy stage is claimed),
// "lost" (refused: a row was taken), "maybe" (in flight: accepted if still
// queued, refused if claimed).
func (r *ckRound) refusal(t *ckTask, rows []staging.Row) string {
	if t.terminal() || t == r.head {
		return "state"
	}
	if t.enqueued {
		return "maybe"
	}
	for _, row := range rows {
		k := ckRow{row.Key, row.Slot}
		if t.lost[k] {
			return "lost"
		}
		if t.maybeLost[k] {
			return "maybe"
		}
	}
	return ""
}

// lostRows: "lost" if t certainly lost one of rows to a later task,
// "maybe" if it may have, "" if not.
func (r *ckRound) lostRows(t *ckTask, rows []staging.Row) string {
	exp := ""
	for _, row := range rows {
		k := ckRow{row.Key, row.Slot}
		if t.lost[k] {
			return "lost"
		}
		if t.maybeLost[k] {
			exp = "maybe"
		}
	}
	return exp
}

func (r *ckRound) checkRefused(t *ckTask, exp string, err error) (accepted bool) {
	var ref *staging.AppendRefusedError
	switch {
	case err == nil:
		if exp == "state" || exp == "lost" || exp == "self" {
			r.errf("append to %s accepted; the model refuses it (%s)", t.name, exp)
		}
		return true
	case errors.As(err, &ref):
		switch {
		case exp == "self":
			// The reserve flushed the task itself: QUEUED (eager: the flush
			// ran it to the end).
			if ref.Reassigned || (!r.eager && ref.State != staging.Queued) || (r.eager && !ref.State.Terminal()) {
				r.errf("append to %s, whose reserve flushed the task itself: %v, want a refusal with the state the flush left", t.name, err)
			}
		case exp == "":
			r.errf("append to %s refused (%v); the model accepts it", t.name, err)
		case exp == "lost" && !ref.Reassigned:
			r.errf("append to %s refused for state %s; the model refuses it for a lost row", t.name, ref.State)
		case !ref.Reassigned && ref.State < staging.Copying:
			r.errf("append to %s refused with state %s (before its copy stage was claimed)", t.name, ref.State)
		}
		return false
	case isFailure(err) && r.p.Err() != nil:
		return false
	case r.faulted.Load() && injected(err):
		return false
	}
	r.errf("append to %s: %v", t.name, err)
	return false
}

func (r *ckRound) seqAppendStep(t *ckTask) {
	if len(r.steps) == 0 {
		return
	}
	s := r.steps[r.rng.IntN(len(r.steps))]
	if s.released && r.rng.IntN(3) != 0 {
		return
	}
	rows := r.chunkRows(r.rng, int64(len(s.data)))
	exp := r.refusal(t, rows)
	err := t.task.Append(r.ctx, staging.Chunk{Step: s.step, Rows: rows})
	r.logf("append %s step %s rows %v: %v", t.name, s.name, rows, err)
	if s.released {
		if exp != "state" && !errors.Is(err, staging.ErrStepReleased) {
			var ref *staging.AppendRefusedError
			if !errors.As(err, &ref) || exp == "" {
				r.errf("append of released step %s to %s: %v, want ErrStepReleased", s.name, t.name, err)
			}
		}
		if err == nil {
			r.errf("append of released step %s accepted", s.name)
		}
		return
	}
	if !r.checkRefused(t, exp, err) {
		return
	}
	t.chunks++
	t.slots[s.slot] = true
	tick := r.tick.Add(1)
	r.claimRows(t, rows, s.data, tick, tick)
}

func (r *ckRound) seqAppendClone(t *ckTask) {
	if r.bg != nil {
		return // a blocking append waits first in line: this one would wait behind it
	}
	nRows := 1 + r.rng.IntN(3)
	if r.rng.IntN(15) == 0 {
		nRows = int(r.cfg.CloneBudgetBytes/ckRowBytes) + 1 // larger than the whole budget
	}
	n := int64(nRows * ckRowBytes)
	data := r.randBytes(int(n))
	rows := r.chunkRows(r.rng, n)
	noWait := r.rng.IntN(3) == 0
	var g *ckGate
	if !r.eager && r.rng.IntN(3) == 0 {
		g = r.newGate()
	}
	exp := r.refusal(t, rows)
	if n > r.cfg.CloneBudgetBytes {
		exp = "config"
	}
	// A blocking append that has to flush waits for releases: with the
	// queue held it runs in the background (the model checks the flushes
	// it makes meanwhile); otherwise let everything held go first.
	needs := r.used+n > r.cfg.CloneBudgetBytes || (r.devBudget > 0 && r.used+n > r.devBudget)
	if (exp == "" || exp == "maybe") && !noWait && needs {
		// Only an append the model is sure the task takes: one it may
		// refuse (a row maybe lost, the task queued) is refused before
		// the wait, with no flush to see.
		if exp == "" && r.paused && r.bg == nil && r.devBudget == 0 && r.head != nil && r.gatesOpen() && g == nil && r.rng.IntN(2) == 0 {
			r.backgroundAppend(t, n, data, rows)
			return
		}
		if !r.quiet() {
			r.logf("a blocking append may flush: open every freeze event and settle")
			r.openAll()
			r.resume()
			r.settle()
			r.verify()
			if r.failed() || r.p.Err() != nil {
				return
			}
			exp = r.refusal(t, rows)
		}
	}
	if exp == "" || exp == "maybe" {
		// In flight tasks may or may not have released their clones yet.
		if !r.quiet() {
			r.observe()
		}
	}
	dev, err := r.devBuf(data)
	if err != nil {
		r.logf("append: device buffer: %v", err)
		if !(r.faulted.Load() && injected(err)) {
			r.errf("device buffer: %v", err)
		}
		return
	}
	var ev cuda.Event
	if g != nil {
		ev = g
	}
	// The budget outcome.
	usedHi, usedLo := r.heldUpper(), r.pendingCloneBytes()
	fitsCap := func(u int64) bool { return u+n <= r.cfg.CloneBudgetBytes }
	fitsLoc := func(u int64) bool { return r.devBudget == 0 || u+n <= r.devBudget }
	var flushed []*ckTask
	self := false
	if exp == "" && !noWait && r.quiet() {
		flushed, self = r.simulateFlush(t, n)
	}
	// A clone larger than the device location's budget never fits: a
	// blocking append flushes every deferred task, then returns the
	// location's refusal.
	tooBig := r.devBudget > 0 && n > r.devBudget && !noWait && exp == "" && !self
	for _, f := range flushed {
		f.enqueued = true
		r.flushes++
	}
	err = t.task.Append(r.ctx, staging.Chunk{Device: dev, Freeze: ev, Rows: rows, NoWait: noWait})
	r.logf("append %s clone %d bytes rows %v nowait=%v gate=%v (model used %d..%d, flushes %v): %v", t.name, n, rows, noWait, g != nil, usedLo, usedHi, r.names(ids(flushed)), err)
	if exp == "config" {
		if !errors.Is(err, staging.ErrConfig) {
			r.errf("clone of %d bytes above the budget %d: %v, want ErrConfig", n, r.cfg.CloneBudgetBytes, err)
		}
		return
	}
	if tooBig {
		var be *budget.BudgetError
		if !errors.As(err, &be) {
			r.errf("a blocking clone of %d bytes above the device budget %d: %v, want the location's BudgetError", n, r.devBudget, err)
		}
		r.observe()
		return
	}
	var drop *staging.DropError
	if errors.As(err, &drop) {
		switch {
		case !noWait:
			r.errf("a blocking append was dropped: %v", err)
		case (exp == "state" || exp == "lost"):
			r.errf("append to %s dropped (%v); the model refuses it first (%s): nothing reserved for a refused append", t.name, err, exp)
		case drop.Reason == staging.DropBudget && fitsCap(usedHi):
			r.errf("clone of %d bytes dropped for the GPU-byte budget, yet it fits (%d of %d held)", n, usedHi, r.cfg.CloneBudgetBytes)
		case drop.Reason == staging.DropLocation && (fitsLoc(usedHi) || !fitsCap(usedLo)):
			r.errf("clone of %d bytes dropped for the location, with %d..%d held (device budget %d, clone budget %d)", n, usedLo, usedHi, r.devBudget, r.cfg.CloneBudgetBytes)
		}
		r.drops[drop.Reason]++
		return
	}
	if err == nil && noWait && (!fitsCap(usedLo) || !fitsLoc(usedLo)) {
		r.errf("try-reserve of %d bytes accepted with at least %d of %d held (device budget %d)", n, usedLo, r.cfg.CloneBudgetBytes, r.devBudget)
	}
	if err != nil && injected(err) && r.faulted.Load() {
		return // the clone's allocation failed: the flushes before it stay
	}
	if self && exp == "" {
		exp = "self"
	}
	r.finishCloneAppend(t, n, rows, data, exp, err)
}

func ids(ts []*ckTask) []staging.TaskID {
	out := make([]staging.TaskID, len(ts))
	for i, t := range ts {
		out[i] = t.id
	}
	return out
}

// heldUpper: clone bytes that may be held: tasks not written yet (a task
// reads HOST_READY just before it releases its clones).
func (r *ckRound) heldUpper() int64 {
	n := r.used
	for _, t := range r.tasks {
		if t.mode == staging.JoinOnFinish && t.hostReady && !t.written && t.task.State() != staging.Written {
			n += t.cloneBytes
		}
	}
	return n
}

// pendingCloneBytes: clone bytes certainly held (tasks not enqueued).
func (r *ckRound) pendingCloneBytes() int64 {
	var n int64
	for _, t := range r.tasks {
		if t.mode == staging.JoinOnFinish && !t.enqueued && !t.terminal() {
			n += t.cloneBytes
		}
	}
	return n
}

func (r *ckRound) finishCloneAppend(t *ckTask, n int64, rows []staging.Row, data []byte, exp string, err error) {
	if !r.checkRefused(t, exp, err) {
		r.observe()
		return
	}
	t.chunks++
	// The rows first: a task this append flushed may have been written
	// before or after the append took them.
	tick := r.tick.Add(1)
	r.claimRows(t, rows, data, tick, tick)
	// Then the flushed tasks, which released their clones before this
	// append's bytes were admitted.
	r.observe()
	t.cloneBytes += n
	if !t.hostReady {
		r.used += n
	}
	r.peak = max(r.peak, r.used)
}

// simulateFlush returns the deferred tasks a blocking append of n bytes to
// t flushes, oldest first, and whether t itself is one of them. The budget
// flushes only what the bytes on their way out do not cover; a location
// that refuses flushes one task at a time.
func (r *ckRound) simulateFlush(t *ckTask, n int64) ([]*ckTask, bool) {
	used, inflight := r.used, r.inflight()
	var out []*ckTask
	self := false
	for _, d := range r.deferred() {
		capShort := used-inflight+n > r.cfg.CloneBudgetBytes
		locShort := r.devBudget > 0 && used-inflight+n > r.devBudget
		if !capShort && !locShort {
			break
		}
		out = append(out, d)
		inflight += d.cloneBytes
		if d == t {
			self = true // the reserve stops there: the append is refused
			break
		}
	}
	return out, self
}

// backgroundAppend runs a blocking append whose flushes wait behind the
// held copy queue; the flushed tasks join the queue's high level now.
func (r *ckRound) backgroundAppend(t *ckTask, n int64, data []byte, rows []staging.Row) {
	flushed, self := r.simulateFlush(t, n)
	if len(flushed) == 0 {
		return // it would wait for tasks in flight only: nothing to see
	}
	dev, err := r.devBuf(data)
	if err != nil {
		if !(r.faulted.Load() && injected(err)) {
			r.errf("device buffer: %v", err)
		}
		return
	}
	bg := &ckBackground{t: t, n: n, rows: rows, data: data, flushed: flushed, self: self, done: make(chan error, 1)}
	before := r.p.Stats().Flushes
	ctx := r.roundCtx // it outlives this operation
	go func() { bg.done <- t.task.Append(ctx, staging.Chunk{Device: dev, Rows: rows}) }()
	r.bg = bg
	for _, f := range flushed {
		f.enqueued = true
		r.flushes++
		r.enqueueJob(f, prioHigh)
	}
	r.logf("background append %s clone %d bytes rows %v: model flushes %v", t.name, n, rows, r.names(ids(flushed)))
	ok := r.waitFor(5*time.Second, func() bool {
		if r.p.Stats().Flushes < before+int64(len(flushed)) {
			return false
		}
		for _, f := range flushed {
			if f.task.State() == staging.Pending {
				return false
			}
		}
		return true
	})
	if !ok {
		st := make([]string, len(flushed))
		for i, f := range flushed {
			st[i] = f.name + " " + f.task.State().String()
		}
		r.errf("blocking append of %d bytes: the model flushes %v, the pipeline made %d flushes", n, st, r.p.Stats().Flushes-before)
	}
}

// enqueueJob records a task joining the held copy queue.
func (r *ckRound) enqueueJob(t *ckTask, prio int8) {
	if !r.paused {
		return
	}
	if r.head == nil {
		r.head = t
		select {
		case <-r.hooks.headClaimed:
		case <-time.After(10 * time.Second):
			r.errf("the copy queue did not claim %s, the first task queued", t.name)
		}
		return
	}
	r.jobs = append(r.jobs, ckJob{task: t, prio: prio})
}

// jobPrio is the priority of a task's newest job in the held queue.
func (r *ckRound) jobPrio(t *ckTask) (int8, bool) {
	p, ok := int8(-1), false
	for _, j := range r.jobs {
		if j.task == t && j.prio > p {
			p, ok = j.prio, true
		}
	}
	return p, ok
}

func (r *ckRound) seqEnqueue(prioritize bool, ts []*ckTask) {
	var err error
	ids := make([]staging.TaskID, len(ts))
	for i, t := range ts {
		ids[i] = t.id
	}
	// What the model expects, task by task, in call order.
	type move struct {
		t    *ckTask
		prio int8
	}
	var moves []move
	seen := map[*ckTask]bool{}
	for _, t := range ts {
		switch {
		case t.terminal():
		case !t.enqueued && !seen[t]:
			prio := prioLow
			if prioritize {
				prio = prioFront
			}
			moves = append(moves, move{t, prio})
			seen[t] = true
		case prioritize && r.paused && t != r.head:
			if p, ok := r.jobPrio(t); ok && p == prioLow {
				moves = append(moves, move{t, prioFront})
			}
		}
	}
	if prioritize {
		err = r.p.Prioritize(r.ctx, ids...)
	} else {
		err = r.p.Submit(r.ctx, r.handles(ts)...)
	}
	r.logf("%s %v: %v", map[bool]string{true: "prioritize", false: "submit"}[prioritize], r.names(ids), err)
	if err != nil && !(r.faulted.Load() && (injected(err) || isFailure(err))) {
		r.errf("enqueue: %v", err)
		return
	}
	for _, m := range moves {
		m.t.enqueued = true
		r.enqueueJob(m.t, m.prio)
	}
}

func (r *ckRound) handles(ts []*ckTask) []*staging.Task {
	out := make([]*staging.Task, len(ts))
	for i, t := range ts {
		out[i] = t.task
	}
	return out
}

// seqReadRow reads a row of a task at a quiet moment: the task's own bytes
// while it is pending (JOIN_ON_FINISH), the pool once it is written,
// ErrNoRow for a row it does not have (or lost before its write).
func (r *ckRound) seqReadRow() {
	if len(r.tasks) == 0 || !r.quiet() {
		return
	}
	r.settle()
	t := r.tasks[r.rng.IntN(len(r.tasks))]
	if t.mode == staging.JoinNextStep && !t.terminal() {
		return // waits for its pool write, which nothing has asked for
	}
	var k ckRow
	if len(t.rows) > 0 && r.rng.IntN(4) != 0 {
		keys := make([]ckRow, 0, len(t.rows))
		for k := range t.rows {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b ckRow) int {
			if c := strings.Compare(a.key, b.key); c != 0 {
				return c
			}
			return a.slot - b.slot
		})
		k = keys[r.rng.IntN(len(keys))]
	} else {
		k = ckRow{r.cfg.Keys[r.rng.IntN(len(r.cfg.Keys))], r.rng.IntN(r.cfg.PoolSlots)}
	}
	got, err := t.task.ReadRow(r.ctx, k.key, k.slot)
	r.logf("read_row %s %v: %x %v", t.name, k, got, err)
	if err != nil && r.faulted.Load() && (injected(err) || isFailure(err)) {
		return
	}
	_, has := t.rows[k]
	switch {
	case t.failed:
		if err == nil {
			r.errf("read_row of failed task %s returned bytes", t.name)
		}
	case !has || t.lost[k]:
		if !errors.Is(err, staging.ErrNoRow) {
			r.errf("read_row %s %v: %x %v; the task does not have the row (want ErrNoRow)", t.name, k, got, err)
		}
	case !t.terminal():
		if err != nil || !bytes.Equal(got, t.rows[k]) {
			r.errf("read_row %s %v: %x %v; want its newest bytes %x", t.name, k, got, err, t.rows[k])
		}
	case t.maybeLost[k] && errors.Is(err, staging.ErrNoRow):
	default:
		if err != nil || !containsBytes(r.rowState(k).pool, got) {
			r.errf("read_row of written task %s %v: %x %v; the pool row may hold %x", t.name, k, got, err, r.rowState(k).pool)
		}
	}
}

// ---- poison ----

// poisoned checks the rules after a failure: the record names a failed
// task; every pending task fails with it; every later entry returns it;
// every waiter returns.
func (r *ckRound) poisoned() {
	r.strict.Store(true)
	rec := r.p.Err()
	var fe *staging.FailedError
	if !errors.As(rec, &fe) {
		r.errf("the failure record is %T %v, want *FailedError", rec, rec)
		return
	}
	if !r.faulted.Load() {
		r.errf("the pipeline failed with no fault armed: %v", rec)
		return
	}
	r.logf("poisoned: %v", rec)
	r.openAll()
	r.resume()
	for _, t := range r.tasks {
		ctx, cancel := context.WithTimeout(r.ctx, 20*time.Second)
		err := t.task.Wait(ctx)
		stuck := ctx.Err() != nil
		cancel()
		if stuck {
			r.errf("after the failure, task %s (%s) never finished", t.name, t.task.State())
			return
		}
		if !t.enqueued && t.chunks >= 0 && t.task.State() != staging.Failed && t.id != fe.Task {
			r.errf("pending task %s is %s after the pipeline failed, want FAILED", t.name, t.task.State())
		}
		if t.id == fe.Task && err == nil {
			r.errf("the failed task %s waits without error", t.name)
		}
	}
	r.observe()
	if t := r.byID[fe.Task]; t == nil || !t.failed {
		r.errf("the failure record names task %d, which is not FAILED", fe.Task)
	}
	want := func(what string, err error) {
		if !errors.As(err, &fe) {
			r.errf("%s after the failure: %v, want the failure record", what, err)
		}
	}
	_, err := r.p.Stage(r.ctx, nil, nil)
	want("Stage", err)
	_, err = r.p.Open(r.ctx, staging.TaskSpec{Mode: staging.JoinNextStep})
	want("Open", err)
	if len(r.tasks) > 0 {
		t := r.tasks[0]
		want("Submit", r.p.Submit(r.ctx, t.task))
		want("Prioritize", r.p.Prioritize(r.ctx, t.id))
		_, err = t.task.ReadRow(r.ctx, "k", 0)
		want("ReadRow", err)
	}
	_, err = r.p.ReadPool("k", 0)
	want("ReadPool", err)
	ok := r.waitFor(5*time.Second, func() bool { return r.p.Stats().CloneBytes == 0 })
	if !ok {
		r.errf("after the failure every task is done, yet %d clone bytes are held", r.p.Stats().CloneBytes)
	}
}

// ---- the end of a round: close and check that everything is released ----

func (r *ckRound) finish() {
	r.strict.Store(true)
	r.openAll()
	r.resume()
	r.settle()
	if r.p.Err() == nil {
		r.verify()
	}
	if r.failed() {
		return
	}
	// Sometimes leave pending tasks and live steps to Close.
	if r.rng.IntN(2) == 0 {
		for _, s := range r.steps {
			if !s.released {
				s.releasing = true
				_ = s.step.Release()
				s.released = true
			}
		}
	}
	poisoned := r.p.Err() != nil
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	if err := r.p.Close(ctx); err != nil {
		r.errf("Close: %v", err)
		return
	}
	for _, t := range r.tasks {
		st := t.task.State()
		switch {
		case st == staging.Written:
		case st == staging.Failed && (poisoned || r.faulted.Load()):
		default:
			r.errf("after Close task %s is %s", t.name, st)
		}
	}
	st := r.p.Stats()
	if st.FreeSlots != r.cfg.Slots || st.SlotHolders != 0 || st.CloneBytes != 0 || st.LiveSteps != 0 {
		r.errf("after Close: %d of %d slots free, %d holders, %d clone bytes, %d live steps", st.FreeSlots, r.cfg.Slots, st.SlotHolders, st.CloneBytes, st.LiveSteps)
	}
	for s, n := range st.Tasks {
		if n != 0 {
			r.errf("after Close %d tasks are %s", n, s)
		}
	}
	for _, loc := range []string{"pageable-host", "pinned-host", "cuda:0"} {
		if got := r.rt.reserved(loc); got != 0 {
			r.errf("after Close %d bytes are still reserved at %s", got, loc)
		}
	}
	if _, err := r.p.Stage(r.ctx, nil, nil); !errors.Is(err, staging.ErrClosed) {
		r.errf("Stage after Close: %v, want ErrClosed", err)
	}
	if _, err := r.p.ReadPool("k", 0); !errors.Is(err, staging.ErrClosed) {
		r.errf("ReadPool after Close: %v, want ErrClosed", err)
	}
	r.mu.Lock()
	bufs := r.devBufs
	r.devBufs = nil
	r.mu.Unlock()
	for _, b := range bufs {
		_ = r.rt.be.Free(b)
	}
	for _, loc := range []string{"pageable-host", "pinned-host", "cuda:0"} {
		mi, err := r.rt.be.MemInfo(loc)
		if err != nil || mi.UsedBytes != 0 {
			r.errf("after Close the backend holds %d bytes at %s (%v)", mi.UsedBytes, loc, err)
		}
	}
	if v := r.hooks.check(); v != "" {
		r.errf("%s", v)
	}
}
