package staging

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/cuda"
)

// Runtime is what the pipeline needs of the residency runtime: its device
// backend, named reservations, and caps over groups of them.
// *system.System satisfies it.
type Runtime interface {
	Backend() cuda.Backend
	Reserve(ctx context.Context, loc, name string, bytes int64) error
	// ReserveCapped is Reserve for a reservation in the group of the cap
	// capName of capBytes, kept in the runtime's ledger: refused with a
	// *budget.CapError (the group's figures) when the group's bytes plus
	// bytes would exceed the cap, else as Reserve. Unreserve gives the
	// reservation's bytes back to the group. The pipeline's device clones
	// are such a group, "<Name>/clones" of Config.CloneBudgetBytes, and
	// so are their landing buffers, "<Name>/landings" of the same figure.
	ReserveCapped(ctx context.Context, loc, name, capName string, capBytes, bytes int64) error
	Unreserve(ctx context.Context, name string) error
}

// closeRegistrar is a Runtime that closes the components opened on it
// when it closes (package system's System.OnClose): a pipeline registers
// its Close there.
type closeRegistrar interface {
	OnClose(name string, close func(ctx context.Context) error) (unregister func())
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
	// Host is where the CPU block pool is allocated and charged, a host
	// location whose buffers the CPU addresses in place
	// (cuda.HostMemory). Default "pageable-host".
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
	// clones (0: that mode is refused): the cap "<Name>/clones" in the
	// runtime's ledger (Runtime.ReserveCapped). Each clone is a
	// reservation on Device in its group while it lives. The same figure
	// caps their landing buffers at Pinned, "<Name>/landings".
	CloneBudgetBytes int64

	// Eager runs without copy streams, copy queues or committer: a save's
	// device→host copy is synchronous, and Submit runs the task's copy
	// stage and pool write inline (for CPU-only tests and tools).
	Eager bool

	// Serial makes the pipeline do one thing at a time, so that the order
	// of its reservations and releases in the runtime (and so every
	// location's peak) follows from the calls made to it, never from how
	// its goroutines happen to run:
	//
	//   - the copy queue claims a task's copy stage only once the task it
	//     copied before is terminal (written or failed, its landing buffers
	//     and slot holds released), so one task at a time is between its
	//     claim and its end, and its copy stage and pool write overlap no
	//     other task's;
	//   - it claims one only when no blocking Append woken by a task's end
	//     is still looking at the GPU-byte budget;
	//   - a buffer whose free waits for a copy (after a failure: a dropped
	//     device clone, a landing buffer) is held until FreeHeld or Close
	//     frees it, instead of being freed when the copy ends.
	//
	// The replay of package system/replay runs its pipelines this way. It
	// costs the overlap of one task's pool write with the next task's
	// copies. Eager pipelines run inline already: Serial changes nothing
	// there.
	Serial bool

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

	// OnDemotion, if set, is called by the copy queue after each demotion
	// copy it carried out (see [DemotionServer]), with the value's name,
	// its bytes and the copy's outcome, before the runtime learns it. It
	// must not call the pipeline.
	OnDemotion func(value string, bytes int64, err error)
	// DemotionMaxWait bounds how long a demotion waits on the copy queue
	// behind write tasks before the pipeline declines it and the runtime
	// copies it itself (the admission whose plan demotes waits for the
	// copy, so a steady stream of writes must not hold it back): 0 means
	// DefaultDemotionMaxWait; negative, no bound.
	DemotionMaxWait time.Duration

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
	alloc   LocationAllocator // every backend allocation and free (alloc.go)
	log     zerolog.Logger
	sys     *runner // the pipeline's actors: task actors, copy queue, committer
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

	poolMu  sync.RWMutex // guards pool and poolMem, and the bytes of poolMem (pool.go)
	pool    cuda.Buffer  // the CPU block pool: a buffer at cfg.Host; nil once freed
	poolMem []byte       // its host view

	cleanup      sync.WaitGroup // releases waiting for device events
	pendingFrees atomic.Int64   // how many, held ones included (Stats.PendingFrees)
	heldMu       sync.Mutex     // guards held; held while FreeHeld frees
	held         []heldFree     // Serial: the frees that wait for a copy (FreeHeld)

	mu       sync.Mutex // guards the fields below
	tasks    map[TaskID]*Task
	deferred map[TaskID]*Task // JOIN_ON_FINISH tasks still pending with a chunk
	owners   []*Task          // the newest unwritten task of each pool row (by row index, see poolRow)
	steps    map[*Step]struct{}
	cloning  []cuda.Event // the clone copies enqueued, oldest first, from the oldest not done yet (see pruneDone)
	failure  *FailedError
	closing  bool
	active   int           // entries in progress
	idle     chan struct{} // closed when active drops to 0 during close
	counts   counters
	demo     demoteState // the runtime's demotions (demote.go)

	closeOnce sync.Once
	closeErr  error
	// finished is closed when the close has finished (close.go); made
	// by the first Close.
	finished chan struct{}
	// unregister removes the pipeline from its runtime's Close (nil: the
	// runtime closes nothing itself).
	unregister func()
}

type counters struct {
	opened, written, failed int64
	committedBytes          int64
	stepsStaged             int64
}

// New starts a pipeline on rt. It checks cfg, reserves the staging slots
// at cfg.Pinned and the CPU block pool at cfg.Host (a *BudgetError of the
// runtime if they do not fit) — before it allocates anything for them —,
// creates its copy streams on cfg.Device, starts its actors (copy queue,
// committer, location actors when rt is no LocationAllocator), then
// allocates the pool at cfg.Host through that location's actor. Errors:
// ErrConfig for a bad Config (sizes out of range, see MaxSlots and
// MaxPoolRows) and for a pool buffer without a host view
// (cuda.HostMemory: a device location, or a backend whose host buffers
// have none); the runtime's refusals; the backend's refusal of the pool.
// On error nothing is left reserved, allocated or running.
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
	sys, err := startRunner(p)
	if err != nil {
		return fail(err)
	}
	p.sys = sys
	undo = append(undo, sys.Stop)
	// Charged: now allocate the pool, through the host location's actor.
	if err := p.allocatePool(ctx, poolBytes); err != nil {
		return fail(err)
	}
	undo = append(undo, p.freePool)
	p.serveDemotions()
	// A runtime that closes what was opened on it (package system's
	// Close) closes the pipeline first when the application has not.
	if oc, ok := rt.(closeRegistrar); ok {
		p.unregister = oc.OnClose("staging pipeline "+cfg.Name, p.Close)
	}
	p.log.Debug().Int("slots", cfg.Slots).Int64("slot_bytes", cfg.SlotBytes).Int64("pool_bytes", poolBytes).Bool("eager", cfg.Eager).Msg("pipeline started")
	return p, nil
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
