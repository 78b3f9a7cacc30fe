// Package actors carries out, on github.com/asynkron/protoactor-go, what
// the ledger of package budget admits. It holds no budget arithmetic.
//
//   - The supervisor actor owns the [budget.Ledger] and serializes every
//     state version. It admits a transition, sends the effects to carry
//     out, and commits completion or failure when the outcome comes back.
//   - One location actor per location allocates and frees buffers through
//     the device backend, in the order the supervisor committed them.
//   - A value actor per value with transfers in flight carries them out,
//     one at a time in admission order: copies, reconstruction (running
//     the value's loader into a temporary buffer at its source location)
//     and initialization. The supervisor gives the value an actor with
//     its first transfer and takes it back when the last one has settled
//     (a few wait idle for the next values, the others stop): an idle
//     value has no actor.
//   - The supervisor watches each recorded consumer event on a goroutine
//     of its own until it completes, and then reaps it.
//
// Public callers (package system) talk to the supervisor with plain-data
// messages from package messages and receive exactly one reply per request.
package actors

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testhooks"
	"github.com/residency-go/residency/messages"
)

// Config configures an [Engine].
type Config struct {
	Ledger     budget.Config
	Backend    cuda.Backend
	Logger     zerolog.Logger
	StateLimit int // controller default; 0 = budget.DefaultStateLimit
	// AllocTimeout bounds one physical allocation: the location actor
	// passes it to the backend as a deadline, and an allocation that
	// returns after it is freed again and fails. 0 = 30s.
	AllocTimeout time.Duration
	// Knobs inject failures; only the project's tests can make them
	// (package internal/testhooks).
	Knobs testhooks.Knobs
	// Observer, if set, receives refusals, evictions and failed
	// reconstructions as they happen (see [Observer]).
	Observer Observer
	// OnRoom, when set, is called by the supervisor after a request whose
	// handling committed a transition that may make room (a removal, an
	// unreserve, a released protection: budget.RoomKind). It runs on the
	// supervisor's goroutine and must not block (package system wakes
	// the callers waiting for room with it).
	OnRoom func()
	// HeldRoom, when set, returns the room the waiters ahead of a call
	// hold: how many of them name each location. For a call of class
	// that is not queued (waiter 0) they are the waiters of its class or
	// higher; for a queued waiter's turn, those ahead of it
	// (budget.WaitQueue.HeldAhead). The supervisor runs the calls that
	// may charge bytes — place, copy, move, register at a location,
	// reserve, an execute, a scope entry (class 0), an admit that does
	// not order itself (its Class and Waiter) — and Decide and Explain
	// (class 0) under budget.Ledger.WithHeld with it. It runs on the
	// supervisor's goroutine and must not wait for the supervisor.
	HeldRoom func(class int, waiter uint64) map[string]int
}

// Engine is a running set of actors around one ledger.
type Engine struct {
	System     *actor.ActorSystem
	Supervisor *actor.PID
	Buffers    *BufferTable

	root         *actor.RootContext
	sup          *supervisor // for direct calls (AcquireDirect)
	backend      cuda.Backend
	log          zerolog.Logger
	hooks        testhooks.Knobs
	obs          Observer
	onRoom       func()
	heldRoom     func(class int, waiter uint64) map[string]int
	stateLimit   int
	allocTimeout time.Duration
	locations    map[string]*actor.PID
	streams      map[string]*lockedStream
	newLoaders   *registry[uint64, cuda.Loader]
	loaders      *registry[uint64, cuda.Loader]
	events       *registry[uint64, cuda.Event]
	demoters     demotionRoutes  // copiers of demotions, by route (demote.go)
	owners       chargeOwners    // owners of offered charges (charges.go)
	watchers     goCount         // event watchers and charge drops (their goroutines)
	ops          opTracker       // operations running user or backend code (shutdown.go)
	valueRunner  *workerPool     // the value actors' dispatcher (workers.go)
	locRunner    *workerPool     // the location actors' dispatcher
	ctx          context.Context // the engine's life: ends at Stop
	cancel       context.CancelFunc
	// opsCtx is the context of every load, copy, initialization,
	// demotion copy and allocation: canceled when a shutdown begins.
	opsCtx    context.Context
	cancelOps context.CancelFunc
	stopOnce  sync.Once
}

// Start creates the ledger and spawns the supervisor and one actor per
// location. protoactor's own logging is routed through cfg.Logger.
func Start(cfg Config) (*Engine, error) {
	if cfg.Backend == nil {
		return nil, &budget.InvalidInputError{Message: "a device backend is required"}
	}
	led, err := budget.New(cfg.Ledger)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(zerolog.NewSlogHandler(log.With().Str("component", "protoactor").Logger()))
	}))
	eng := &Engine{
		System:       sys,
		Buffers:      newBufferTable(),
		root:         sys.Root,
		backend:      cfg.Backend,
		log:          log,
		hooks:        cfg.Knobs,
		obs:          cfg.Observer,
		onRoom:       cfg.OnRoom,
		heldRoom:     cfg.HeldRoom,
		stateLimit:   cfg.StateLimit,
		allocTimeout: cfg.AllocTimeout,
		locations:    map[string]*actor.PID{},
		streams:      map[string]*lockedStream{},
		newLoaders:   newRegistry[uint64, cuda.Loader](),
		loaders:      newRegistry[uint64, cuda.Loader](),
		events:       newRegistry[uint64, cuda.Event](),
	}
	if eng.stateLimit == 0 {
		eng.stateLimit = budget.DefaultStateLimit
	}
	if eng.allocTimeout == 0 {
		eng.allocTimeout = 30 * time.Second
	}
	eng.ctx, eng.cancel = context.WithCancel(context.Background())
	eng.opsCtx, eng.cancelOps = context.WithCancel(eng.ctx)
	locRoot := actor.NewRootContext(sys, nil).WithGuardian(&locationStrategy{eng: eng})
	eng.locRunner = newWorkerPool(len(led.Locations()))
	for _, loc := range led.Locations() {
		st, err := cfg.Backend.NewStream(loc)
		if err != nil {
			eng.abort()
			return nil, fmt.Errorf("stream for %s: %w", loc, err)
		}
		eng.streams[loc] = &lockedStream{Stream: st}
		l := loc
		pid, err := locRoot.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &locationActor{eng: eng, loc: l} }, actor.WithDispatcher(eng.locRunner)), "location/"+loc)
		if err != nil {
			eng.abort()
			return nil, err
		}
		eng.locations[loc] = pid
	}
	sup := &supervisor{eng: eng, ledger: led, workers: map[uint64]*valueWorker{}, pending: map[budget.AdmissionID]*pendingOp{}, reapers: map[budget.EventID][]*actor.PID{}}
	eng.valueRunner = newWorkerPool(idleActors)
	sup.valueProps = actor.PropsFromProducer(func() actor.Actor { return &valueActor{eng: eng} },
		actor.WithDispatcher(eng.valueRunner))
	// The supervisor runs on a synchronized dispatcher: a sender whose
	// message finds the mailbox idle processes it (and whatever queued
	// behind it) on its own goroutine, instead of protoactor starting a new
	// goroutine per burst. The mailbox still serializes every message, so
	// the ledger stays single-threaded; the hot path (lease acquire and
	// release) saves a goroutine hand-off each way. Its mailbox takes
	// messages a burst at a time (see callerRunsMailbox).
	props := actor.PropsFromProducer(func() actor.Actor { return sup },
		actor.WithMailbox(func() actor.Mailbox {
			mb := &callerRunsMailbox{}
			sup.mailbox = mb
			return mb
		}),
		actor.WithDispatcher(actor.NewSynchronizedDispatcher(throughput)))
	pid, err := sys.Root.SpawnNamed(props, "supervisor")
	if err != nil {
		eng.abort()
		return nil, err
	}
	eng.Supervisor = pid
	eng.sup = sup
	return eng, nil
}

func (e *Engine) abort() {
	e.cancel()
	for _, st := range e.streams {
		_ = st.Close()
	}
	e.System.Shutdown()
	e.locRunner.close(context.Background(), nil)
	e.valueRunner.close(context.Background(), nil)
}

// Root returns the root context for sending to the supervisor.
func (e *Engine) Root() *actor.RootContext { return e.root }

// Backend returns the device backend.
func (e *Engine) Backend() cuda.Backend { return e.backend }

// StoreLoader parks the loader of one registration call under key (unique
// per call, never a value name: two concurrent registrations of one name
// must not see each other's loader). Once a Register message carrying key
// is sent, the supervisor owns the entry: it binds it to the new handle or
// drops it.
func (e *Engine) StoreLoader(key uint64, ld cuda.Loader) { e.newLoaders.put(key, ld) }

// DropLoader removes a parked loader whose Register message was never sent.
func (e *Engine) DropLoader(key uint64) { e.newLoaders.take(key) }

// StoreEvent parks a device event under key for a RecordEvent message.
// Once the message is sent the supervisor owns the entry (it watches the
// event, or drops it when recording is refused).
func (e *Engine) StoreEvent(key uint64, ev cuda.Event) { e.events.put(key, ev) }

// DropEvent removes a parked event whose RecordEvent was never sent.
func (e *Engine) DropEvent(key uint64) { e.events.take(key) }

// Parked reports the entries waiting in the hand-over tables: loaders of
// registrations not yet bound and events not yet watched. A loader leaves
// the table when the supervisor handles its Register; an event when the
// supervisor handles its RecordEvent (it starts watching it, or drops it
// when recording is refused). Tests check that both return to zero once
// the runtime is quiet.
func (e *Engine) Parked() (loaders, events int) {
	return e.newLoaders.len(), e.events.len()
}

// Bound reports the number of loaders bound to live handles.
func (e *Engine) Bound() int { return e.loaders.len() }

// Stop drains the location actors (so every free sent before has been
// carried out), stops event watchers, the actors and the streams. Call it
// after the supervisor answered Shutdown (or ForceShutdown). Every wait
// ends when ctx does (its error is returned); what was abandoned is then
// still running (see StillRunning), and the buffers that abandoned
// operations hold are freed when they return. Idempotent.
func (e *Engine) Stop(ctx context.Context) error {
	var err error
	e.stopOnce.Do(func() { err = e.stop(ctx) })
	return err
}

func (e *Engine) stop(ctx context.Context) error {
	var err error
	note := func(what string, werr error) {
		if werr != nil && err == nil {
			err = fmt.Errorf("%s: %w", what, werr)
		}
	}
	for loc, pid := range e.locations {
		// A location actor may be inside an allocation of up to the
		// allocation timeout (longer if the backend ignores it).
		note("draining "+loc, e.awaitFuture(ctx, e.root.RequestFuture(pid, &messages.Drain{}, e.allocTimeout+30*time.Second)))
	}
	e.cancel()
	// Value actors stopped lazily may still be terminating; wait for them
	// so that stopping the supervisor does not send them a second Stop (a
	// dead letter).
	note("stopping value actors", e.awaitFuture(ctx, e.root.RequestFuture(e.Supervisor, &awaitQuiet{}, e.allocTimeout+30*time.Second)))
	// Stop the supervisor and its children (the value actors) before
	// waiting for the event watchers: the supervisor starts a watcher
	// (watchers.add) when it records an event, which must not run
	// concurrently with the wait. A value actor of an abandoned operation
	// ends only when the operation returns; so does the supervisor then.
	stopSup := e.root.StopFuture(e.Supervisor)
	if e.ops.stuck(true) == 0 {
		note("stopping the supervisor", e.awaitFuture(ctx, stopSup))
	}
	note("stopping value actors", e.valueRunner.close(ctx, func() int { return e.ops.stuck(true) }))
	note("waiting for watchers", e.watchers.wait(ctx, func() int { return e.ops.stuck(false) }))
	for _, pid := range e.locations {
		note("stopping location actors", e.awaitFuture(ctx, e.root.StopFuture(pid)))
	}
	note("stopping location actors", e.locRunner.close(ctx, nil))
	// Nothing allocates any more. After an orderly shutdown the ledger
	// has freed everything and the table is empty; after a fatal stop
	// (the ledger can no longer be trusted) whatever is left is freed
	// here, so no device memory outlives the runtime. Buffers that
	// abandoned operations hold stay: each is freed when its operation
	// returns.
	if n := e.Buffers.freeAll(e.backend, e.ops.holds); n > 0 {
		e.log.Warn().Int("buffers", n).Msg("freed buffers the ledger did not free (fatal or abandoned stop)")
	}
	for _, st := range e.streams {
		if cerr := st.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	e.System.Shutdown()
	return err
}

// lockedStream is a destination location's copy stream, shared by every
// value actor. A stream reports a failed copy through the first event
// recorded after it, so a copy and the event that reports on it must not
// be interleaved with another actor's: each copy and its Record happen
// under mu, and every event speaks for exactly its own copy.
type lockedStream struct {
	cuda.Stream
	mu sync.Mutex
}

// copyAndRecord enqueues dst←src and records the event that completes
// (with this copy's outcome) once the copy has run.
func (s *lockedStream) copyAndRecord(dst, src cuda.Buffer) (cuda.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.CopyAsync(dst, src); err != nil {
		return nil, err
	}
	return s.Record()
}
