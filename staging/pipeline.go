package staging

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/messages"
)

// Identity, lifecycle and rows of write tasks (plain data of package
// messages, re-exported).
type (
	TaskID    = messages.TaskID
	TaskState = messages.TaskState
	JoinMode  = messages.JoinMode
	// Row is one row a task writes: the pool row of (Key, Slot), found at
	// byte Offset of its save's buffer. Every row is Config.RowBytes long.
	Row = messages.StagingRow
)

// Task states and join modes.
const (
	Pending   = messages.TaskPending
	Queued    = messages.TaskQueued
	Copying   = messages.TaskCopying
	HostReady = messages.TaskHostReady
	Written   = messages.TaskWritten
	Failed    = messages.TaskFailed

	JoinNextStep = messages.JoinNextStep
	JoinOnFinish = messages.JoinOnFinish
)

// CanTransition reports whether a task may move from one state to another
// (the next state of the chain, or Failed from a non-terminal state).
func CanTransition(from, to TaskState) bool { return messages.CanTransition(from, to) }

// Runtime is what the pipeline needs of the residency runtime: its device
// backend and named reservations. *system.System satisfies it.
type Runtime interface {
	Backend() cuda.Backend
	Reserve(ctx context.Context, loc, name string, bytes int64) error
	Unreserve(ctx context.Context, name string) error
}

// Config configures a pipeline. Sizes are exact bytes.
type Config struct {
	// Name prefixes the pipeline's reservations in the runtime
	// ("<Name>/slots", "<Name>/pool", "<Name>/clone/<n>", "<Name>/host/<n>").
	// Default "staging". Two pipelines on one runtime need two names.
	Name string
	// Device is the location whose steps are saved, e.g. "cuda:0"
	// (required). Device clones are allocated and charged there.
	Device string
	// Pinned is where staging slots and landing buffers live and are
	// charged. Default "pinned-host".
	Pinned string
	// Host is where the CPU block pool is charged. Default "pageable-host".
	Host string

	// Slots is the number of staging slots (≥ 1) and SlotBytes the size
	// of each (≥ 1): the largest step a save may stage. Their total is
	// reserved at Pinned for the pipeline's life.
	Slots     int
	SlotBytes int64
	// ClaimTimeout bounds the wait for a free slot; 0 or less fails at
	// once when every slot is held.
	ClaimTimeout time.Duration

	// The CPU block pool: one row of RowBytes per (key, slot) for every
	// key of Keys and every slot in [0, PoolSlots). Reserved at Host.
	Keys      []string
	PoolSlots int
	RowBytes  int64

	// CloneBudgetBytes is the GPU-byte budget of JOIN_ON_FINISH device
	// clones (0: that mode is refused). Each clone is a reservation on
	// Device while it lives.
	CloneBudgetBytes int64

	// Eager runs without copy streams, copy queues or committer: a save's
	// device→host copy is synchronous, and Submit runs the task's copy
	// stage and pool write inline (for CPU-only tests and tools).
	Eager bool

	// Logger receives structured logs. Default: none.
	Logger *zerolog.Logger
	// OnCommit, if set, is called after each task's pool write (or failed
	// copy stage) with the task and its outcome, from the committer, before
	// the task's waiters wake. It must not call the pipeline.
	OnCommit func(id TaskID, err error)
	// OnCopyStarted, if set, is called by a task's copy stage once every
	// copy it waits for is enqueued (JOIN_ON_FINISH: its landing buffers
	// are taken and its clone → host copies are on the landing stream;
	// JOIN_NEXT_STEP: at once), before it waits. It must not call the
	// pipeline. (The replay uses it to know what a copy stage waits for.)
	OnCopyStarted func(id TaskID)

	// skipFreezeWait drops the device→host copy's wait on the step's
	// freeze event. Tests only (export_test.go): it exists to show that
	// the ordering is load-bearing.
	skipFreezeWait bool
	// onClaim observes copy-stage claims (tests only, export_test.go).
	onClaim func(TaskID)
}

func (c *Config) normalize() error {
	if c.Name == "" {
		c.Name = "staging"
	}
	if c.Pinned == "" {
		c.Pinned = "pinned-host"
	}
	if c.Host == "" {
		c.Host = "pageable-host"
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Device == "":
		return bad("Device is required")
	case c.Slots < 1:
		return bad("Slots must be at least 1 (got %d)", c.Slots)
	case c.SlotBytes < 1:
		return bad("SlotBytes must be at least 1 (got %d)", c.SlotBytes)
	case len(c.Keys) == 0:
		return bad("Keys must name at least one key")
	case c.PoolSlots < 1:
		return bad("PoolSlots must be at least 1 (got %d)", c.PoolSlots)
	case c.RowBytes < 1:
		return bad("RowBytes must be at least 1 (got %d)", c.RowBytes)
	case c.CloneBudgetBytes < 0:
		return bad("CloneBudgetBytes must not be negative")
	case c.Slots > MaxSlots:
		return bad("Slots must be at most %d (got %d)", MaxSlots, c.Slots)
	case c.SlotBytes > math.MaxInt64/int64(c.Slots):
		return bad("Slots × SlotBytes (%d × %d) overflows 64 bits", c.Slots, c.SlotBytes)
	case int64(c.PoolSlots) > math.MaxInt64/int64(len(c.Keys)) ||
		c.RowBytes > math.MaxInt64/(int64(len(c.Keys))*int64(c.PoolSlots)):
		return bad("the CPU block pool (%d keys × %d slots × %d bytes) overflows 64 bits", len(c.Keys), c.PoolSlots, c.RowBytes)
	case int64(len(c.Keys))*int64(c.PoolSlots) > MaxPoolRows:
		return bad("the CPU block pool must have at most %d rows (got %d keys × %d slots)", MaxPoolRows, len(c.Keys), c.PoolSlots)
	}
	seen := map[string]bool{}
	for _, k := range c.Keys {
		if seen[k] {
			return bad("duplicate key %q", k)
		}
		seen[k] = true
	}
	return nil
}

// Bounds of a Config, checked before anything is reserved or allocated:
// the pipeline keeps a little bookkeeping per slot and per pool row in Go
// memory, which no reservation charges.
const (
	// MaxSlots is the most staging slots a pipeline may have.
	MaxSlots = 1 << 16
	// MaxPoolRows is the most rows (keys × pool slots) its CPU block pool
	// may have.
	MaxPoolRows = 1 << 24
)

// Pipeline is a device→host write pipeline: staging slots, the GPU-byte
// budget of device clones, write tasks, a copy queue and a committer that
// writes the CPU block pool. All methods are safe for concurrent use.
type Pipeline struct {
	cfg     Config
	rt      Runtime
	be      cuda.Backend
	log     zerolog.Logger
	st      *actors.Staging
	slots   *slotPool
	budget  *gpuBudget
	d2h     *lockedStream // steps' device→host copies (nil when eager)
	cloner  *lockedStream // device clones (nil when eager)
	land    *lockedStream // clone → landing buffer copies (nil when eager)
	keys    map[string]int
	hostSeq atomic.Uint64

	// Landing buffers held (bytes), and a channel closed (and replaced)
	// whenever one is released: copy stages waiting for pinned room.
	landMu    sync.Mutex
	landHeld  int64
	landFreed chan struct{}

	poolMu sync.RWMutex // guards pool
	pool   []byte

	cleanup      sync.WaitGroup // releases waiting for device events
	pendingFrees atomic.Int64   // how many (Stats.PendingFrees)

	mu       sync.Mutex // guards the fields below
	tasks    map[TaskID]*Task
	deferred map[TaskID]*Task // JOIN_ON_FINISH tasks still pending with a chunk
	owners   []*Task          // the newest unwritten task of each pool row (by row index, see poolRow)
	steps    map[*Step]struct{}
	failure  *FailedError
	closing  bool
	active   int           // entries in progress
	idle     chan struct{} // closed when active drops to 0 during close
	counts   counters

	closeOnce sync.Once
	closeErr  error
}

type counters struct {
	opened, written, failed int64
	committedBytes          int64
	stepsStaged             int64
}

// New starts a pipeline on rt. It checks cfg, reserves the staging slots
// at cfg.Pinned and the CPU block pool at cfg.Host (a *BudgetError of the
// runtime if they do not fit) — before it allocates anything for them —,
// then allocates the pool, creates its copy streams on cfg.Device and
// starts its actors. Errors: ErrConfig for a bad Config (sizes out of
// range, see MaxSlots and MaxPoolRows); the runtime's refusals; a pool the
// Go runtime cannot allocate. On error nothing is left reserved or
// running.
func New(ctx context.Context, rt Runtime, cfg Config) (*Pipeline, error) {
	if rt == nil {
		return nil, fmt.Errorf("%w: a runtime is required", ErrConfig)
	}
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	p := &Pipeline{
		cfg: cfg, rt: rt, be: rt.Backend(), log: zerolog.Nop(), keys: map[string]int{},
		tasks: map[TaskID]*Task{}, deferred: map[TaskID]*Task{}, steps: map[*Step]struct{}{},
		landFreed: make(chan struct{}),
	}
	if cfg.Logger != nil {
		p.log = cfg.Logger.With().Str("component", "staging").Str("pipeline", cfg.Name).Logger()
	}
	for i, k := range cfg.Keys {
		p.keys[k] = i
	}
	gb, err := newGPUBudget(rt, cfg.Device, cfg.Name, cfg.CloneBudgetBytes)
	if err != nil {
		return nil, err
	}
	gb.flush = p.flushOldest
	p.budget = gb

	var undo []func()
	fail := func(err error) (*Pipeline, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, err
	}
	if err := rt.Reserve(ctx, cfg.Pinned, cfg.Name+"/slots", int64(cfg.Slots)*cfg.SlotBytes); err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = rt.Unreserve(context.Background(), cfg.Name+"/slots") })
	poolBytes := int64(len(cfg.Keys)) * int64(cfg.PoolSlots) * cfg.RowBytes
	if err := rt.Reserve(ctx, cfg.Host, cfg.Name+"/pool", poolBytes); err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = rt.Unreserve(context.Background(), cfg.Name+"/pool") })
	// Charged: now allocate.
	pool, ok := makeBytes(poolBytes)
	if !ok {
		return fail(fmt.Errorf("%w: a CPU block pool of %d bytes cannot be allocated", ErrConfig, poolBytes))
	}
	p.pool = pool
	p.slots = newSlotPool(cfg.Slots)
	p.owners = make([]*Task, len(cfg.Keys)*cfg.PoolSlots)
	if !cfg.Eager {
		for _, s := range []**lockedStream{&p.d2h, &p.cloner, &p.land} {
			st, err := p.be.NewStream(cfg.Device)
			if err != nil {
				return fail(err)
			}
			*s = &lockedStream{Stream: st}
			undo = append(undo, func() { _ = st.Close() })
		}
	}
	var onCommit func(*actors.StagingTask, error)
	if cfg.OnCommit != nil {
		onCommit = func(t *actors.StagingTask, err error) { cfg.OnCommit(t.ID, err) }
	}
	var onClaim func(*actors.StagingTask)
	if cfg.onClaim != nil {
		onClaim = func(t *actors.StagingTask) { cfg.onClaim(t.ID) }
	}
	st, err := actors.StartStaging(actors.StagingConfig{Env: (*env)(p), Eager: cfg.Eager, Logger: p.log, OnCommit: onCommit, OnClaim: onClaim})
	if err != nil {
		return fail(err)
	}
	p.st = st
	p.log.Debug().Int("slots", cfg.Slots).Int64("slot_bytes", cfg.SlotBytes).Int64("pool_bytes", poolBytes).Bool("eager", cfg.Eager).Msg("pipeline started")
	return p, nil
}

// makeBytes returns make([]byte, n), or false when the Go runtime refuses
// the length.
func makeBytes(n int64) (b []byte, ok bool) {
	defer func() {
		if recover() != nil {
			b, ok = nil, false
		}
	}()
	return make([]byte, n), true
}

// enter admits one entry of the pipeline: ErrClosed after Close began, the
// failure record once a task failed. Every successful enter is paired with
// exit.
func (p *Pipeline) enter() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return ErrClosed
	}
	if p.failure != nil {
		return p.failure
	}
	p.active++
	return nil
}

func (p *Pipeline) exit() {
	p.mu.Lock()
	p.active--
	if p.active == 0 && p.idle != nil {
		close(p.idle)
		p.idle = nil
	}
	p.mu.Unlock()
}

// Err returns the pipeline's failure record (a *FailedError), or nil.
func (p *Pipeline) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failure == nil {
		return nil
	}
	return p.failure
}

// ---- steps ----

// Step is one whole step staged in a slot by [Pipeline.Stage]. The step
// holds its slot until Release; each JOIN_NEXT_STEP task whose chunk names
// the step holds it too, until its pool write.
type Step struct {
	p        *Pipeline
	slot     int
	buf      cuda.Buffer
	ev       cuda.Event
	bytes    int64
	released atomic.Bool
}

// Slot returns the index of the step's staging slot.
func (s *Step) Slot() int { return s.slot }

// Bytes returns the size of the step's device→host copy (0 for a
// leftover-only step).
func (s *Step) Bytes() int64 { return s.bytes }

// Event returns the event of the step's device→host copy (nil for a
// leftover-only step). Reuse the step's device buffer only after it.
func (s *Step) Event() cuda.Event { return s.ev }

// Release drops the step's hold on its slot (call it when the step is
// materialized or discarded). The slot is free again once every task bound
// to it has been written too. A second Release returns an error.
func (s *Step) Release() error {
	if s.released.Swap(true) {
		return fmt.Errorf("staging: step in slot %d released twice", s.slot)
	}
	s.p.mu.Lock()
	delete(s.p.steps, s)
	s.p.mu.Unlock()
	return s.p.slots.release(s.slot, holder{step: s})
}

// Stage claims a staging slot for one step and launches ONE device→host
// copy of the whole of dev into it, on the pipeline's copy stream, ordered
// after freeze (the event after which the step's rows are final; nil: no
// wait). A nil dev is a leftover-only save: it still takes a slot, and
// copies nothing. Stage returns once the copy is enqueued, not landed.
//
// A full pool waits for a slot to be released (see Step.Release) up to
// Config.ClaimTimeout (0 or less: not at all) or ctx: *SlotTimeoutError.
// A free slot whose buffer has another size than dev, and whose last copy
// has not landed, is not ready (its buffer cannot be reallocated yet): the
// lowest ready free slot is taken; when free slots exist but none is
// ready, the claim waits for one to become ready, up to ClaimTimeout when
// it is positive, else under ctx only (that copy may wait for its step's
// freeze event).
// A dev larger than a slot is a configuration error: *SlotOverflowError.
// In eager mode the copy runs here, synchronously, after waiting freeze.
func (p *Pipeline) Stage(ctx context.Context, dev cuda.Buffer, freeze cuda.Event) (*Step, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	s := &Step{p: p}
	if dev != nil {
		s.bytes = dev.Size()
		if s.bytes > p.cfg.SlotBytes {
			return nil, &SlotOverflowError{StepBytes: s.bytes, SlotBytes: p.cfg.SlotBytes}
		}
	}
	// A slot whose buffer has another size is reallocated, which waits for
	// its last copy to land: prefer a slot ready for this step.
	var ready func(*slot) bool
	if dev != nil {
		ready = func(sl *slot) bool {
			return sl.buf == nil || sl.buf.Size() == s.bytes || sl.last == nil || sl.last.Query()
		}
	}
	i, err := p.slots.claim(ctx, holder{step: s}, p.cfg.ClaimTimeout, ready)
	if err != nil {
		return nil, err
	}
	s.slot = i
	if dev != nil {
		if err := p.launchStep(ctx, s, dev, freeze); err != nil {
			_ = p.slots.release(i, holder{step: s})
			return nil, err
		}
	}
	p.mu.Lock()
	p.steps[s] = struct{}{}
	p.counts.stepsStaged++
	p.mu.Unlock()
	return s, nil
}

// launchStep sizes the slot's pinned buffer to the step (the backend copies
// whole buffers) and enqueues the step's device→host copy.
func (p *Pipeline) launchStep(ctx context.Context, s *Step, dev cuda.Buffer, freeze cuda.Event) error {
	sl := p.slots.slots[s.slot] // ours alone: we just claimed it free
	if sl.buf == nil || sl.buf.Size() != s.bytes {
		if sl.buf != nil {
			if sl.last != nil {
				_ = sl.last.Wait(ctx)
			}
			_ = p.be.Free(sl.buf)
			sl.buf, sl.last = nil, nil
		}
		buf, err := p.be.Allocate(ctx, p.cfg.Pinned, s.bytes)
		if err != nil {
			return err
		}
		sl.buf = buf
	}
	s.buf = sl.buf
	if p.cfg.Eager {
		if err := p.syncCopy(ctx, sl.buf, dev, freeze); err != nil {
			return err
		}
		s.ev = doneEvent{}
	} else {
		var wait cuda.Event
		if !p.cfg.skipFreezeWait {
			wait = freeze
		}
		ev, err := p.d2h.copyAfter(sl.buf, dev, wait)
		if err != nil {
			return err
		}
		s.ev = ev
	}
	sl.last = s.ev
	return nil
}

// syncCopy is the eager device→host (or device→device) copy: wait for
// after, then move the bytes through the backend synchronously.
func (p *Pipeline) syncCopy(ctx context.Context, dst, src cuda.Buffer, after cuda.Event) error {
	if after != nil && !p.cfg.skipFreezeWait {
		if err := after.Wait(ctx); err != nil {
			return err
		}
	}
	b, err := p.be.Read(ctx, src)
	if err != nil {
		return err
	}
	return p.be.Write(ctx, dst, b)
}

// ---- tasks ----

// TaskSpec is the identity of a write: the request it belongs to and the
// how-many-th time that request opened a write.
type TaskSpec struct {
	ReqID  string
	WriteN int
	Mode   JoinMode
}

// Task is one write task: rows of (slot, key) for one request, in one join
// mode, possibly over several keys and several saves. Its state machine
// lives in its actor.
type Task struct {
	p *Pipeline
	t *actors.StagingTask

	// Guarded by p.mu. Rows are pool row indexes (see poolRow).
	has   map[int]struct{} // rows its accepted chunks write
	lost  map[int]struct{} // rows a later append took before its pool write
	clone int64            // bytes of its device clones not released yet
	left  bool             // it left Pending (its clones are on their way out)
}

// ID returns the task id.
func (t *Task) ID() TaskID { return t.t.ID }

// ReqID returns the request the write belongs to.
func (t *Task) ReqID() string { return t.t.ReqID }

// WriteN returns the how-many-th write of its request this is.
func (t *Task) WriteN() int { return t.t.WriteN }

// Mode returns the task's join mode.
func (t *Task) Mode() JoinMode { return t.t.Mode }

// State returns the task's state as its actor last published it.
func (t *Task) State() TaskState { return t.t.State() }

// WaitHostReady waits until the task's rows are in host memory (the copy
// stage finished: JOIN_NEXT_STEP waited the step's copy, JOIN_ON_FINISH
// copied its clone) or the task failed (its failure is returned). It does
// not wait for the pool write.
func (t *Task) WaitHostReady(ctx context.Context) error {
	select {
	case <-t.t.HostReady():
		if t.t.State() == Failed {
			<-t.t.Done()
			return t.t.Err()
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wait waits until the task is written to the CPU block pool (nil) or
// failed (its failure).
func (t *Task) Wait(ctx context.Context) error {
	select {
	case <-t.t.Done():
		return t.t.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Open registers a new write task, Pending, with no rows.
func (p *Pipeline) Open(ctx context.Context, spec TaskSpec) (*Task, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	if spec.Mode != JoinNextStep && spec.Mode != JoinOnFinish {
		return nil, fmt.Errorf("%w: unknown join mode %d", ErrConfig, spec.Mode)
	}
	if spec.Mode == JoinOnFinish && p.cfg.CloneBudgetBytes == 0 {
		return nil, fmt.Errorf("%w: JOIN_ON_FINISH needs CloneBudgetBytes > 0", ErrConfig)
	}
	at, err := p.st.NewTask(spec.ReqID, spec.WriteN, spec.Mode)
	if err != nil {
		return nil, err
	}
	t := &Task{p: p, t: at, has: map[int]struct{}{}, lost: map[int]struct{}{}}
	p.mu.Lock()
	p.tasks[at.ID] = t
	p.counts.opened++
	failure := p.failure // published while the task was being made
	p.mu.Unlock()
	if failure != nil {
		p.st.Fail(at, failure)
		return nil, failure
	}
	return t, nil
}

// Chunk is what one save adds to a task.
type Chunk struct {
	// Rows are the rows of this save, each RowBytes at its Offset.
	Rows []Row
	// Step (JOIN_NEXT_STEP): the staged step whose slot holds the rows.
	// The task is bound to the step's slot until its pool write.
	Step *Step
	// Device and Freeze (JOIN_ON_FINISH): the device buffer holding the
	// rows and the event after which they are final. The whole buffer is
	// cloned on the device (pass a buffer of just these rows to keep the
	// clone small); the clone is charged to the GPU-byte budget.
	Device cuda.Buffer
	Freeze cuda.Event
	// NoWait (JOIN_ON_FINISH): try-reserve. A full budget drops the chunk
	// at once with a *DropError instead of flushing and waiting.
	NoWait bool
}

// Append adds one save's rows to the task. It refuses (an
// *AppendRefusedError, nothing changed, nothing reserved) once the task's
// copy stage is claimed, and when the task already lost one of the
// chunk's rows to a later task: open a fresh task then. A row another
// unwritten task wrote before is taken from it (that task's pool write
// will skip it).
//
// JOIN_ON_FINISH: reserves the clone's bytes first (blocking: budget
// pressure flushes the oldest deferred tasks and waits; see Chunk.NoWait),
// then clones Device on the device after Freeze, once the task has taken
// the chunk. The task stays Pending.
func (t *Task) Append(ctx context.Context, c Chunk) error {
	p := t.p
	if err := p.enter(); err != nil {
		return err
	}
	defer p.exit()
	if err := p.checkChunk(t, c); err != nil {
		return err
	}
	if t.Mode() == JoinNextStep && c.Step.released.Load() {
		return ErrStepReleased
	}
	// What the task would refuse anyway is refused before any slot, byte
	// of budget or copy is taken for it.
	if err := p.refusal(t, c.Rows); err != nil {
		return err
	}
	ch := &actors.StagingChunk{Rows: slices.Clone(c.Rows)}
	if t.Mode() == JoinNextStep {
		ch.Slot, ch.SlotBuf, ch.StepEvent, ch.Step = c.Step.slot, c.Step.buf, c.Step.ev, c.Step
	} else if err := p.cloneChunk(ctx, t, ch, c); err != nil {
		return err
	}
	// The task's actor answers at once; a context ending here must not
	// leave the chunk in the task while this call undoes it.
	if err := p.st.Append(context.Background(), t.t, ch); err != nil {
		if ch.Clone != nil {
			p.dropClone(ch) // its copy never started (or, eager, is done)
		}
		if failure := p.Err(); failure != nil {
			return failure // the pipeline failed meanwhile (and failed the task)
		}
		return err
	}
	if t.Mode() == JoinOnFinish {
		p.budget.poke() // a deferred task appeared: waiting reserves may flush it
	}
	return nil
}

// refusal returns the *AppendRefusedError the task would answer rows with
// now (its copy stage is claimed, or it lost one of the rows), nil if it
// may take them. The task's actor decides in the end.
func (p *Pipeline) refusal(t *Task, rows []Row) error {
	switch st := t.State(); {
	case st == Failed:
		if failure := p.Err(); failure != nil {
			return failure // the pipeline failed (and failed the task)
		}
		<-t.t.Done()
		return t.t.Err() // failed by Close
	case st >= Copying:
		return &AppendRefusedError{Task: t.ID(), State: st}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range rows {
		if _, lost := t.lost[p.poolRow(p.keys[r.Key], r.Slot)]; lost {
			return &AppendRefusedError{Task: t.ID(), State: t.State(), Reassigned: true}
		}
	}
	return nil
}

func (p *Pipeline) checkChunk(t *Task, c Chunk) error {
	var size int64
	switch t.Mode() {
	case JoinNextStep:
		if c.Step == nil || c.Device != nil {
			return fmt.Errorf("%w: a JOIN_NEXT_STEP chunk names its Step (and no Device)", ErrConfig)
		}
		if c.Step.p != p {
			return fmt.Errorf("%w: the step belongs to another pipeline", ErrConfig)
		}
		size = c.Step.bytes
	case JoinOnFinish:
		if c.Device == nil || c.Step != nil {
			return fmt.Errorf("%w: a JOIN_ON_FINISH chunk names its Device buffer (and no Step)", ErrConfig)
		}
		if c.Device.Location() != p.cfg.Device {
			return fmt.Errorf("%w: the chunk's buffer is at %s, the pipeline's device is %s", ErrConfig, c.Device.Location(), p.cfg.Device)
		}
		size = c.Device.Size()
		if size > p.cfg.CloneBudgetBytes {
			return fmt.Errorf("%w: a device clone of %d bytes exceeds the whole GPU-byte budget (%d)", ErrConfig, size, p.cfg.CloneBudgetBytes)
		}
	}
	for _, r := range c.Rows {
		if _, ok := p.keys[r.Key]; !ok {
			return fmt.Errorf("%w: unknown key %q", ErrConfig, r.Key)
		}
		if r.Slot < 0 || r.Slot >= p.cfg.PoolSlots {
			return fmt.Errorf("%w: pool slot %d out of range [0, %d)", ErrConfig, r.Slot, p.cfg.PoolSlots)
		}
		if r.Offset < 0 || r.Offset+p.cfg.RowBytes > size {
			return fmt.Errorf("%w: row (%s, %d) at offset %d does not fit in the save's %d bytes", ErrConfig, r.Key, r.Slot, r.Offset, size)
		}
	}
	return nil
}

// cloneChunk reserves the clone's GPU bytes and allocates the clone. In
// eager mode it copies c.Device into it here (after c.Freeze); otherwise
// the copy is started on the clone stream when the task takes the chunk
// (env.Accept), so that a refused chunk never started one.
func (p *Pipeline) cloneChunk(ctx context.Context, t *Task, ch *actors.StagingChunk, c Chunk) error {
	n := c.Device.Size()
	tk, err := p.budget.reserve(ctx, n, !c.NoWait, t.ID())
	if errors.Is(err, errSelfFlushed) {
		// Making room flushed this very task: the chunk goes to a fresh
		// task. Its state is the one the flush left it in: QUEUED (eager:
		// the flush ran its copy and pool write).
		st := Queued
		if p.cfg.Eager {
			if st = t.State(); st == Failed {
				return p.refusal(t, c.Rows)
			}
		}
		return &AppendRefusedError{Task: t.ID(), State: st}
	}
	if err != nil {
		return err
	}
	// The reserve may have waited (and flushed this very task).
	if err := p.refusal(t, c.Rows); err != nil {
		_ = p.budget.release(context.Background(), tk)
		return err
	}
	clone, err := p.be.Allocate(ctx, p.cfg.Device, n)
	if err != nil {
		_ = p.budget.release(context.Background(), tk)
		return err
	}
	ch.Clone, ch.Ticket = clone, tk
	if p.cfg.Eager {
		if err := p.syncCopy(ctx, clone, c.Device, c.Freeze); err != nil {
			ch.Clone = nil
			_ = p.be.Free(clone)
			_ = p.budget.release(context.Background(), tk)
			return err
		}
		ch.CloneEvent = doneEvent{}
		return nil
	}
	ch.Src = c.Device
	if !p.cfg.skipFreezeWait {
		ch.Freeze = c.Freeze
	}
	return nil
}

// Submit hands tasks to the copy path: each Pending task becomes Queued on
// the low-priority copy queue (a JOIN_ON_FINISH task is submitted when its
// request finishes or is aborted). In eager mode the copy stage and the
// pool write run here, inline, and Submit returns the first failure.
func (p *Pipeline) Submit(ctx context.Context, tasks ...*Task) error {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.exit()
	return p.queue(ctx, messages.PriorityLow, tasks...)
}

func (p *Pipeline) queue(ctx context.Context, prio int8, tasks ...*Task) error {
	for _, t := range tasks {
		if t.p != p {
			return fmt.Errorf("%w: task %d belongs to another pipeline", ErrConfig, t.ID())
		}
		err := p.st.Enqueue(ctx, t.t, prio) // Pending → Queued leaves the deferred set (env.Queued)
		if err == nil && p.cfg.Eager {
			err = p.st.RunInline(ctx, t.t)
		}
		if err != nil {
			if failure := p.Err(); failure != nil && ctx.Err() == nil {
				return failure // a failed task: the pipeline's record
			}
			return err
		}
	}
	return nil
}

// Prioritize moves tasks to the front of the copy queue: a Pending task
// becomes Queued there, a task Queued at low priority (Submit) moves up
// (its old place becomes a harmless duplicate); a task already queued high
// (a budget flush) or at the front, or whose copy stage is claimed, or
// done, is left alone. Unknown ids are ignored.
func (p *Pipeline) Prioritize(ctx context.Context, ids ...TaskID) error {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.exit()
	for _, id := range ids {
		p.mu.Lock()
		t := p.tasks[id]
		p.mu.Unlock()
		if t == nil {
			continue
		}
		if err := p.queue(ctx, messages.PriorityFront, t); err != nil {
			return err
		}
	}
	return nil
}

// flushOldest escalates the deferred task with the oldest enqueue time to
// the high-priority queue (GPU-byte budget pressure) and returns it. False
// when none is left.
func (p *Pipeline) flushOldest() (TaskID, bool) {
	p.mu.Lock()
	var oldest *Task
	for _, t := range p.deferred {
		if oldest == nil || t.t.Seq < oldest.t.Seq {
			oldest = t
		}
	}
	if oldest != nil {
		delete(p.deferred, oldest.ID())
	}
	p.mu.Unlock()
	if oldest == nil {
		return 0, false
	}
	p.log.Debug().Uint64("task", uint64(oldest.ID())).Msg("GPU-byte budget pressure: flushing the oldest deferred task")
	ctx := p.st.Context()
	if err := p.st.Enqueue(ctx, oldest.t, messages.PriorityHigh); err == nil && p.cfg.Eager {
		_ = p.st.RunInline(ctx, oldest.t)
	}
	return oldest.ID(), true
}

// ---- reads ----

// ReadRow returns a copy of the task's row (key, slot). ErrNoRow when no
// chunk of the task wrote the row, or a later task took it before this
// task's pool write. For a JOIN_ON_FINISH task not yet written it reads the
// host rows its copy stage landed, or the device clone (after the clone's
// event) while that copy has not landed; once the task is written, and
// always for a JOIN_NEXT_STEP task (after waiting for its pool write), it
// reads the CPU block pool — which a later task may have written since.
// The task's failure if it failed.
func (t *Task) ReadRow(ctx context.Context, key string, slot int) ([]byte, error) {
	p := t.p
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	k, err := p.rowIndex(key, slot)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	_, has := t.has[k]
	_, lost := t.lost[k]
	p.mu.Unlock()
	if !has || lost {
		return nil, ErrNoRow
	}
	if t.Mode() == JoinNextStep {
		if err := t.Wait(ctx); err != nil {
			return nil, err
		}
		return p.readPool(key, slot)
	}
	for {
		src, err := p.st.Source(ctx, t.t, key, slot)
		if err != nil {
			return nil, err
		}
		switch {
		case src.State == Written:
			return p.readPool(key, slot)
		case src.State == Failed:
			<-t.t.Done()
			return nil, t.t.Err()
		case !src.Found:
			return nil, ErrNoRow
		}
		if src.Event != nil {
			if err := src.Event.Wait(ctx); err != nil {
				return nil, err
			}
		}
		out, err := p.readRange(ctx, src.Buf, src.Offset, src.OnDevice)
		if errors.Is(err, cuda.ErrFreed) {
			continue // the copy landed (or the pool write finished) meanwhile: look again
		}
		return out, err
	}
}

// readRange copies RowBytes at off from buf: a device clone through the
// backend, a host buffer through a view of its bytes.
func (p *Pipeline) readRange(ctx context.Context, buf cuda.Buffer, off int64, onDevice bool) ([]byte, error) {
	n := p.cfg.RowBytes
	if onDevice {
		b, err := p.be.Read(ctx, buf)
		if err != nil {
			return nil, err
		}
		return b[off : off+n : off+n], nil
	}
	out := make([]byte, n)
	err := p.hostView(ctx, buf, func(b []byte) { copy(out, b[off:off+n]) })
	return out, err
}

// ReadPool returns a copy of the CPU block pool's row (key, slot): what the
// committer wrote there last (zeros if nothing yet).
func (p *Pipeline) ReadPool(key string, slot int) ([]byte, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	return p.readPool(key, slot)
}

func (p *Pipeline) readPool(key string, slot int) ([]byte, error) {
	off, err := p.poolOffset(key, slot)
	if err != nil {
		return nil, err
	}
	out := make([]byte, p.cfg.RowBytes)
	p.poolMu.RLock()
	copy(out, p.pool[off:])
	p.poolMu.RUnlock()
	return out, nil
}

func (p *Pipeline) poolOffset(key string, slot int) (int64, error) {
	k, err := p.rowIndex(key, slot)
	if err != nil {
		return 0, err
	}
	return int64(k) * p.cfg.RowBytes, nil
}

// rowIndex is the pool row of (key, slot), checked.
func (p *Pipeline) rowIndex(key string, slot int) (int, error) {
	ki, ok := p.keys[key]
	if !ok {
		return 0, fmt.Errorf("%w: unknown key %q", ErrConfig, key)
	}
	if slot < 0 || slot >= p.cfg.PoolSlots {
		return 0, fmt.Errorf("%w: pool slot %d out of range [0, %d)", ErrConfig, slot, p.cfg.PoolSlots)
	}
	return p.poolRow(ki, slot), nil
}

// poolRow is the index of the pool row of (key index ki, slot): rows are
// laid out key by key, slot by slot.
func (p *Pipeline) poolRow(ki, slot int) int { return ki*p.cfg.PoolSlots + slot }

// ---- stats ----

// Stats is a snapshot of the pipeline's counters.
type Stats struct {
	Slots, FreeSlots, SlotHolders int
	SlotClaims, SlotWaits         int64 // claims, and claims that had to wait
	// CloneBytes is the GPU-byte budget in use by device clones, of
	// CloneBudgetBytes; PeakCloneBytes the most that clones held at once
	// (a save dropped or refused never counts).
	CloneBytes, CloneBudgetBytes, PeakCloneBytes int64
	// Flushes counts deferred tasks escalated by budget pressure; Drops
	// counts try-reserves that failed at once, by reason (DropBudget,
	// DropLocation).
	Flushes int64
	Drops   map[string]int64
	// WaitingAppends counts blocking appends asleep in the GPU-byte budget:
	// waiting for clone bytes to come back, with no wake-up on its way.
	// WaitingStages counts stages asleep waiting for a slot (to be freed,
	// or ready) with nothing they wait for having happened yet.
	WaitingAppends, WaitingStages int
	// PendingFrees counts buffers (device clones, landing buffers) that
	// wait for a copy to finish before they are freed and their bytes
	// released: after a failure, the clones and landings of copies still
	// in flight.
	PendingFrees int
	// Tasks counts live tasks by state; Opened, Written and Failed count
	// every task so far.
	Tasks                   map[TaskState]int
	Opened, Written, Failed int64
	StepsStaged, LiveSteps  int64
	// CommittedBytes counts the bytes the committer wrote to the pool.
	CommittedBytes int64
	// Failure is the failure record (nil while healthy).
	Failure error
}

// Stats returns a snapshot of the pipeline's counters. It never blocks on
// the pipeline's work and works after Close.
func (p *Pipeline) Stats() Stats {
	ss, bs := p.slots.state(), p.budget.state()
	st := Stats{
		Slots: p.cfg.Slots, FreeSlots: ss.free, SlotHolders: ss.holders, SlotClaims: ss.claims, SlotWaits: ss.waits,
		CloneBytes: bs.used, CloneBudgetBytes: p.cfg.CloneBudgetBytes, PeakCloneBytes: bs.peak,
		Flushes: bs.flushes, Drops: bs.drops, WaitingAppends: bs.asleep, WaitingStages: ss.asleep,
		PendingFrees: int(p.pendingFrees.Load()), Tasks: map[TaskState]int{},
	}
	p.mu.Lock()
	for _, t := range p.tasks {
		st.Tasks[t.State()]++
	}
	st.Opened, st.Written, st.Failed = p.counts.opened, p.counts.written, p.counts.failed
	st.StepsStaged, st.LiveSteps = p.counts.stepsStaged, int64(len(p.steps))
	st.CommittedBytes = p.counts.committedBytes
	if p.failure != nil {
		st.Failure = p.failure
	}
	p.mu.Unlock()
	return st
}
