package system

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/testhooks"
	"github.com/residency-go/residency/messages"
)

// The types of the ledger, re-exported so that users import one package.
type (
	Handle                = budget.Handle
	ReplicaMode           = budget.ReplicaMode
	Plan                  = budget.Plan
	Action                = budget.Action
	ReservationSpec       = budget.ReservationSpec
	Explanation           = budget.Explanation
	Report                = budget.Report
	Transition            = budget.Transition
	Snapshot              = budget.Snapshot
	Request               = budget.Request
	Requirement           = budget.Requirement
	Decision              = budget.Decision
	Eviction              = budget.Eviction
	LocationConfig        = budget.LocationConfig
	SharedBudget          = budget.SharedBudget
	SharedBudgetRecord    = budget.SharedBudgetRecord
	BudgetError           = budget.BudgetError
	PlanError             = budget.PlanError
	SearchLimitError      = budget.SearchLimitError
	StaleStateError       = budget.StaleStateError
	InUseError            = budget.InUseError
	UnavailableError      = budget.UnavailableError
	PlanExecutionError    = budget.PlanExecutionError
	InvalidInputError     = budget.InvalidInputError
	QueueFullError        = budget.QueueFullError
	WaitersAheadError     = budget.WaitersAheadError
	ChargeBusyError       = budget.ChargeBusyError
	LeaseID               = budget.LeaseID
	EventID               = budget.EventID
	Outstanding           = budget.Outstanding
	Endpoint              = budget.Endpoint
	HoldID                = budget.HoldID
	ActorCrashError       = actors.ActorCrashError
	FatalError            = actors.FatalError
	AllocTimeoutError     = actors.AllocTimeoutError
	ReservationRecord     = budget.ReservationRecord
	MaterializationRecord = budget.MaterializationRecord
	LocationRecord        = budget.LocationRecord
	ValueRecord           = budget.ValueRecord
	MatState              = budget.MatState
	UnavailableReason     = budget.UnavailableReason
	// An effect the runtime carries out, and the key of a device buffer.
	Effect     = budget.Effect
	EffectKind = budget.EffectKind
	BufferKey  = messages.BufferKey
	// The device types a caller meets: a value's loader, a consumer event
	// and a buffer (package cuda).
	Loader = cuda.Loader
	Event  = cuda.Event
	Buffer = cuda.Buffer
)

// Replica modes.
const (
	Exclusive  = budget.Exclusive
	Replicable = budget.Replicable
)

// Materialization states (MaterializationRecord.State).
const (
	Entering = budget.Entering
	Resident = budget.Resident
	Leaving  = budget.Leaving
)

// Reasons of an [*UnavailableError].
const (
	UnavailableEndpoint  = budget.UnavailableEndpoint
	UnavailableLocation  = budget.UnavailableLocation
	UnavailableSource    = budget.UnavailableSource
	UnavailableDiscarded = budget.UnavailableDiscarded
	UnavailableForeign   = budget.UnavailableForeign
	UnavailableInFlight  = budget.UnavailableInFlight
)

// Phases of a [*PlanExecutionError].
const (
	PhaseExecute = budget.PhaseExecute
	PhaseReclaim = budget.PhaseReclaim
	PhaseReserve = budget.PhaseReserve
	PhaseEnter   = budget.PhaseEnter
	PhaseExit    = budget.PhaseExit
)

// Effect kinds.
const (
	EffectInitialize  = budget.EffectInitialize
	EffectCopy        = budget.EffectCopy
	EffectReconstruct = budget.EffectReconstruct
	EffectFree        = budget.EffectFree
)

// Defaults.
const (
	DefaultStateLimit    = budget.DefaultStateLimit
	DefaultTraceCapacity = budget.DefaultTraceCapacity
)

// Error categories (use with errors.Is).
var (
	ErrPlan         = budget.ErrPlan
	ErrInvalidInput = budget.ErrInvalidInput
	ErrDiscarded    = budget.ErrDiscarded
	ErrForeign      = budget.ErrForeign
	// ErrBusy matches refusals about something in use or in flight (an
	// [*InUseError], an [*UnavailableError] with reason
	// UnavailableInFlight, a [*CacheBusyError] when no idle unpinned entry
	// can make room), never a [*BudgetError]: retry once the protection
	// ends.
	ErrBusy = budget.ErrBusy
)

// ErrClosed is returned by every call made after Close began.
var ErrClosed = errors.New("residency: system is closed")

// Limit configures a location with a strict budget of bytes.
func Limit(name string, bytes int64) LocationConfig {
	return LocationConfig{Name: name, HasBudget: true, BudgetBytes: bytes}
}

// DeviceLimit configures a device location with a budget sized from what
// the hardware reports: the device's total memory less headroom, and at
// most cap when cap > 0 (see [cuda.DefaultBudget]; info comes from package
// cuda/discover, matched to cuda:N by UUID). The figure is configuration,
// taken once: from then on the runtime admits by its own arithmetic, never
// by NVML. Errors: a malformed name ([*InvalidInputError]), a negative cap
// or headroom, a device with no memory, or a headroom that leaves nothing.
func DeviceLimit(name string, info cuda.DeviceInfo, cap, headroom int64) (LocationConfig, error) {
	if _, err := budget.ParseLocation(name); err != nil {
		return LocationConfig{}, err
	}
	b, err := cuda.DefaultBudget(info, cap, headroom)
	if err != nil {
		return LocationConfig{}, &budget.InvalidInputError{Message: fmt.Sprintf("budget of %s: %v", name, err)}
	}
	return Limit(name, b), nil
}

// NoLimit configures a location without a budget.
func NoLimit(name string) LocationConfig { return LocationConfig{Name: name} }

// Options configures [Start].
type Options struct {
	// ManagerID identifies this runtime; handles carry it. Default: random.
	ManagerID string
	// Locations is the fixed set of locations and their budgets. Required.
	Locations []LocationConfig
	// TraceCapacity is the size of the trace ring (default 1024);
	// DisableTrace turns the trace off.
	TraceCapacity int
	DisableTrace  bool
	// StateLimit is the controller's default search limit (default 100,000).
	StateLimit int
	// Backend carries out allocations and copies at Locations. Required:
	// there is no default, so that a program never runs on simulated
	// devices because an option was forgotten. Open it over the names of
	// Locations (a cluster node's without their node qualification):
	// cu.New (package cuda/cu, build tag cuda) for real GPUs, or
	// [SoftBackend] to simulate every location in Go memory. The System
	// uses it and closes it only with CloseBackend: otherwise close it
	// after [System.Close].
	Backend cuda.Backend
	// CloseBackend makes the System own Backend: [System.Close] closes
	// it last, once every buffer is freed, so that an application closes
	// one thing. When Close leaves a loader running (a
	// [*StillRunningError]), the backend is closed once that loader
	// returns (its buffer freed first) instead.
	CloseBackend bool
	// Logger receives structured logs (the runtime's and protoactor's).
	// Default: none.
	Logger *zerolog.Logger
	// EventLevel is the level of the runtime's structured events on
	// Logger: refused admissions, evictions, loader and staging failures
	// (docs/design.md, "Events"). Default zerolog.DebugLevel (the zero
	// value): a logger at info hides them until the application raises
	// this; zerolog.Disabled turns them off.
	EventLevel zerolog.Level
	// EventsPerSecond and EventBurst bound the events of each kind: a
	// burst of up to EventBurst lines, then EventsPerSecond a second; the
	// next line of a kind counts those left out ("suppressed"). Defaults
	// DefaultEventsPerSecond and DefaultEventBurst.
	EventsPerSecond float64
	EventBurst      int
	// AllocTimeout bounds one physical allocation (default 30s). The
	// location's actor enforces it where the buffer is made: an allocation
	// still running at the deadline fails the transfer with an
	// [*AllocTimeoutError] (matching context.DeadlineExceeded), and a
	// buffer the backend hands back late is freed before the ledger
	// releases the charge, so device bytes never exceed admitted bytes.
	AllocTimeout time.Duration
	// Spill names spill targets, location → target (both configured and
	// different): when the controller's victim is the only resident copy
	// of its value, it is demoted to its location's target instead of
	// dropped, if the target has room or makes it by its own victim
	// order (docs/semantics.md, "Spill"). It
	// sets LocationConfig.SpillTo of the locations it names. Default:
	// none, and every decision is as without spill.
	Spill map[string]string
	// SharedBudgets are figures over groups of locations that draw on one
	// memory (an integrated GPU's cuda:0 and pageable-host): every charge
	// at a member must fit its own budget and its group's figure, the
	// controller makes room for a group from all its members, and
	// Snapshot.SharedBudgets shows each group (docs/semantics.md, "Shared
	// budgets"). Default: none.
	SharedBudgets []SharedBudget
	// MaxWaiters bounds the callers waiting for room at once (Admit and
	// cache loads with a [WaitOption]); one more is refused at once with a
	// [*budget.QueueFullError], errors.Is [ErrBusy]. Default 1024
	// (budget.DefaultMaxWaiters); negative: [*InvalidInputError].
	MaxWaiters int

	// knobs are the project's test knobs (package internal/testhooks):
	// unexported, set only by its tests, through testhooks.With.
	knobs testhooks.Knobs
}

// init lets the project's tests outside this package set Options.knobs
// (testhooks.With); nothing else can.
func init() {
	testhooks.Install(func(o any, k testhooks.Knobs) any {
		opts := o.(Options)
		opts.knobs = k
		return opts
	})
}

// System is a running residency runtime. All methods are safe for
// concurrent use. Every blocking call takes a context: when it is done the
// call stops waiting and returns ctx.Err(); a transition already admitted
// still completes or fails inside the runtime (a snapshot shows which), and
// a lease or hold granted to a caller who stopped waiting is released.
type System struct {
	eng   *actors.Engine
	root  *actor.RootContext
	sup   *actor.PID
	slots slotPool
	// releaseLateFn is s.releaseLate, made once: a method value allocates.
	releaseLateFn func(any)
	backend       cuda.Backend
	log           zerolog.Logger
	managerID     string
	events        *eventLog // structured events (events.go)

	closed atomic.Bool
	fatal  atomic.Pointer[FatalError]
	// inflight counts the callers between their closed check and their
	// send: Close waits for it to reach zero.
	inflight atomic.Int64
	// closeMu guards closeDone: nil until the first Close begins, closed
	// when it ends. The first Close writes closeErr, closedOK and final
	// before it closes closeDone; others read them after.
	closeMu   sync.Mutex
	closeDone chan struct{}
	closeErr  error
	closedOK  bool
	final     budget.Snapshot

	scopeSeq  atomic.Uint64
	eventSeq  atomic.Uint64
	loaderSeq atomic.Uint64

	stats callStats // every call's outcome, for Metrics
	room  *waitRoom // callers waiting for room (wait.go)

	owners     ownerNames        // owners of charges: the loader caches (owners.go)
	closers    *closerList       // what Close closes first (close.go); its own allocation (see OnClose)
	ownBackend bool              // Options.CloseBackend
	spill      map[string]string // spill targets, location → target (fixed)
	shared     []SharedBudget    // Options.SharedBudgets (fixed)
}

// Start starts a runtime on opts.Backend. Errors: invalid options
// ([*InvalidInputError]: no locations, a malformed or duplicate location, a
// budget ≤ 0, a node-qualified location such as `cuda:0@node-b`, which
// only a cluster node can name: see package system/cluster; a negative
// AllocTimeout or MaxWaiters; no Backend, with a message naming the fix).
func Start(ctx context.Context, opts Options) (*System, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := opts.ManagerID
	if id == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		id = "rm-" + hex.EncodeToString(b[:])
	}
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = *opts.Logger
	}
	capTrace := opts.TraceCapacity
	if capTrace == 0 {
		capTrace = budget.DefaultTraceCapacity
	}
	if opts.DisableTrace {
		capTrace = 0
	}
	locs, err := withSpill(opts.Locations, opts.Spill)
	if err != nil {
		return nil, err
	}
	lcfg := budget.Config{ManagerID: id, Locations: locs, TraceCapacity: capTrace, SharedBudgets: opts.SharedBudgets}
	// Validate before creating a backend.
	if _, err := budget.New(lcfg); err != nil {
		return nil, err
	}
	if err := refuseNodeQualified(opts.Locations); err != nil {
		return nil, err
	}
	if !(opts.EventsPerSecond >= 0) || opts.EventBurst < 0 {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("event rate %v a second, burst %d: want ≥ 0 (0: the default)", opts.EventsPerSecond, opts.EventBurst)}
	}
	if opts.AllocTimeout < 0 {
		return nil, &budget.InvalidInputError{Message: fmt.Sprintf("allocation timeout %s is negative", opts.AllocTimeout)}
	}
	room, err := newWaitRoom(opts.MaxWaiters, opts.Locations, opts.SharedBudgets)
	if err != nil {
		return nil, err
	}
	backend := opts.Backend
	if backend == nil {
		return nil, &budget.InvalidInputError{Message: errNoBackend}
	}
	events := newEventLog(log, opts)
	room.events = events
	eng, err := actors.Start(actors.Config{Ledger: lcfg, Backend: backend, Logger: log, StateLimit: opts.StateLimit, AllocTimeout: opts.AllocTimeout, Knobs: opts.knobs, Observer: events, OnRoom: room.signal, HeldRoom: func(class int, waiter uint64) map[string]int { return room.heldRoom(class, budget.WaitID(waiter)) }})
	if err != nil {
		return nil, err
	}
	s := &System{eng: eng, root: eng.Root(), sup: eng.Supervisor, backend: backend, log: log, managerID: id, events: events, room: room, ownBackend: opts.CloseBackend, closers: &closerList{}, shared: slices.Clone(opts.SharedBudgets)}
	for _, lc := range locs {
		if lc.SpillTo != "" {
			if s.spill == nil {
				s.spill = map[string]string{}
			}
			s.spill[lc.Name] = lc.SpillTo
		}
	}
	s.slots.reg = eng.System.ProcessRegistry
	s.slots.stopped = make(chan struct{})
	s.releaseLateFn = s.releaseLate
	log.Info().Str("manager_id", id).Str("backend", backend.Name()).Bool("simulated", cuda.IsSimulated(backend)).Int("locations", len(opts.Locations)).Msg("residency started")
	return s, nil
}

// ManagerID returns the runtime's manager id.
func (s *System) ManagerID() string { return s.managerID }

// SoftBackend opens the soft backend (package cuda/soft) for locs: every
// location simulated in ordinary Go memory, with real bytes, goroutine
// streams and real events; no GPU or driver is touched. It is how a
// program asks for simulated devices by name: pass it as Options.Backend,
// say so in what the program prints, and close it after [System.Close]
// (or set [Options].CloseBackend).
//
// cfg gives the simulated capacities, bandwidth and delay (see
// soft.Config); its Locations are set to the distinct names of locs,
// each without its node (a node's runtime knows its own locations by
// their local names). Errors: a malformed name in locs
// ([*InvalidInputError] naming it); soft.New's, such as no locations or a
// capacity for a location not in locs.
func SoftBackend(locs []LocationConfig, cfg soft.Config) (*soft.Backend, error) {
	if err := malformedLocation(locs); err != nil {
		return nil, err
	}
	cfg.Locations = budget.LocalNames(locs)
	return soft.New(cfg)
}

// errNoBackend is the message of Start's refusal of a nil Backend.
const errNoBackend = "no device backend: set Options.Backend to a backend opened over the locations " +
	"(cu.New of package cuda/cu, build tag cuda, for GPUs; soft.New of package cuda/soft to simulate devices)"

// Backend returns the device backend given in [Options] (for streams and
// events of the caller's own work). [cuda.IsSimulated] tells whether its
// devices are simulated.
func (s *System) Backend() cuda.Backend { return s.backend }

// call sends msg (built with a fresh reply slot) to the supervisor and
// waits for the reply. onLate receives a reply that arrives after ctx
// ended (to hand back what it granted).
func (s *System) call(ctx context.Context, build func(*actor.PID) any, onLate func(any)) (any, error) {
	return s.callOwned(ctx, build, onLate, nil)
}

// callOwned is call for a request that hands the runtime something parked
// in a table (a loader, an event): onUnsent runs when the request was
// never sent (closed, stopped, ctx already done), so the caller takes it
// back. Once sent, the supervisor owns it whether or not we still wait.
func (s *System) callOwned(ctx context.Context, build func(*actor.PID) any, onLate func(any), onUnsent func()) (any, error) {
	sl, err := s.sendVia(ctx, func(sl *replySlot) any { return build(sl.pid) })
	if err != nil {
		if onUnsent != nil {
			onUnsent()
		}
		return nil, err
	}
	return s.await(ctx, sl, onLate, false)
}

// sendVia sends the request msg builds for a fresh reply slot to the
// supervisor and returns the slot, unless the call is refused (see
// refusal): nothing is sent then. Close waits for every caller between
// its check and its send (the in-flight count) before it sends the
// shutdown, so a request that passed the check is answered.
func (s *System) sendVia(ctx context.Context, msg func(*replySlot) any) (*replySlot, error) {
	s.inflight.Add(1)
	if err := s.refusal(ctx); err != nil {
		s.inflight.Add(-1)
		return nil, err
	}
	sl := s.slots.get()
	s.root.Send(s.sup, msg(sl))
	s.inflight.Add(-1)
	return sl, nil
}

// refusal says why a call must not be sent: the runtime stopped on a fatal
// error, it is closed, or ctx is done.
func (s *System) refusal(ctx context.Context) error {
	if f := s.fatal.Load(); f != nil {
		return f
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// await waits for the reply in sl. A FatalReply becomes its error (and
// every later call's). keep: see slotPool.await (on an error the slot is
// never left with the caller).
func (s *System) await(ctx context.Context, sl *replySlot, onLate func(any), keep bool) (any, error) {
	m, err := s.slots.await(ctx, sl, onLate, keep)
	if err != nil {
		return nil, err
	}
	if f, ok := m.(*messages.FatalReply); ok {
		if keep {
			s.slots.put(sl)
		}
		var fe *FatalError
		if errors.As(f.Err, &fe) {
			s.fatal.CompareAndSwap(nil, fe)
		}
		return nil, f.Err
	}
	return m, nil
}

// callErr is call for requests answered by a plain *messages.Reply.
func (s *System) callErr(ctx context.Context, build func(*actor.PID) any) error {
	r, err := s.call(ctx, build, nil)
	if err != nil {
		return err
	}
	return r.(*messages.Reply).Err
}

// Value describes a value to register.
type Value struct {
	// Name is unique among live values; a discarded value's name is free
	// for a new registration (which gets a new handle).
	Name string
	// Bytes is the fixed conservative charge of every materialization.
	Bytes int64
	Mode  ReplicaMode
	// At registers the value resident at this location, initialized with
	// Data (len Bytes; nil means zero bytes).
	At   string
	Data []byte
	// Source registers the value without a materialization; Loader
	// produces its bytes, run into a temporary buffer at Source whenever
	// the value must be reconstructed.
	Source string
	Loader cuda.Loader
}

// Register registers a value. With At it returns once the value is
// resident there. Errors, the first problem in field order: name (empty or
// duplicate: [*InvalidInputError]), bytes ≤ 0, replica mode, both or
// neither of At/Source, the location (malformed: [*InvalidInputError];
// not configured: [*UnavailableError]), then a source without a loader or
// a loader without a source, Data of the wrong length
// ([*InvalidInputError]); then the budget ([*BudgetError]). A refusal
// changes nothing. [*PlanExecutionError] when initialization failed (the
// handle is then retired and the name free again).
func (s *System) Register(ctx context.Context, v Value) (_ Handle, err error) {
	defer func() { s.stats.admission(ctx, opRegister, err) }()
	// The loader is parked under a key of this call alone: a concurrent
	// registration of the same name can never be bound to it.
	var key uint64
	if v.Loader != nil {
		key = s.loaderSeq.Add(1)
		s.eng.StoreLoader(key, v.Loader)
	}
	spec := budget.ValueSpec{Name: v.Name, Bytes: v.Bytes, Mode: v.Mode, At: v.At, Source: v.Source}
	r, err := s.callOwned(ctx, func(p *actor.PID) any {
		return &messages.Register{Spec: spec, Data: v.Data, LoaderKey: key, ReplyTo: p}
	}, nil, func() {
		if key != 0 {
			s.eng.DropLoader(key)
		}
	})
	if err != nil {
		return Handle{}, err
	}
	rep := r.(*messages.HandleReply)
	return rep.Handle, rep.Err
}

// Lookup returns the handle of the live value registered under name. A
// discarded value's name resolves to nothing until it is registered again
// (then to the new handle): [*InvalidInputError] for an unknown name.
func (s *System) Lookup(ctx context.Context, name string) (Handle, error) {
	r, err := s.call(ctx, func(p *actor.PID) any { return &messages.Lookup{Name: name, ReplyTo: p} }, nil)
	if err != nil {
		return Handle{}, err
	}
	rep := r.(*messages.HandleReply)
	return rep.Handle, rep.Err
}

func (s *System) transition(ctx context.Context, m messages.Transition) (err error) {
	defer func() { s.stats.transition(ctx, m.Kind, err) }()
	r, err := s.call(ctx, func(p *actor.PID) any { m.ReplyTo = p; return &m }, nil)
	if err != nil {
		return err
	}
	return r.(*messages.RunReply).Err
}

// Place ensures h is resident at loc and returns when it is (already
// resident: at once). An exclusive value resident elsewhere is moved.
// Errors: see [budget.Ledger.Place]; a failure after admission is a
// [*PlanExecutionError] with phase "execute". Place does not wait for
// room: while earlier callers wait for room at loc, a Place that would
// charge bytes there is refused with a [*WaitersAheadError] (errors.Is
// [ErrBusy]); so are Copy, Move, Register at a location, Reserve,
// Execute and a scope's Enter (docs/semantics.md, "Waiting for room").
// To be queued behind them, use [System.Admit] with a wait option.
func (s *System) Place(ctx context.Context, h Handle, loc string) error {
	return s.transition(ctx, messages.Transition{Kind: messages.Place, Handle: h, To: loc})
}

// Copy copies a replicable value from one location to another.
func (s *System) Copy(ctx context.Context, h Handle, from, to string) error {
	return s.transition(ctx, messages.Transition{Kind: messages.Copy, Handle: h, From: from, To: to})
}

// Move moves h from one location to another (from must be unprotected).
func (s *System) Move(ctx context.Context, h Handle, from, to string) error {
	return s.transition(ctx, messages.Transition{Kind: messages.Move, Handle: h, From: from, To: to})
}

// Evict removes h's materialization at loc. Errors: [*InUseError]
// (protected), [*PlanError] (last copy of a value without a source),
// [*UnavailableError].
func (s *System) Evict(ctx context.Context, h Handle, loc string) error {
	return s.transition(ctx, messages.Transition{Kind: messages.Evict, Handle: h, From: loc})
}

// Discard removes every materialization of h and retires the handle.
func (s *System) Discard(ctx context.Context, h Handle) error {
	return s.transition(ctx, messages.Transition{Kind: messages.Discard, Handle: h})
}

// Reserve admits a named reservation of bytes at loc. It does not wait:
// a reservation that does not fit is a [*BudgetError], and one at a
// location where earlier callers wait for room a [*WaitersAheadError]
// (see [System.Place]).
func (s *System) Reserve(ctx context.Context, loc, name string, bytes int64) (err error) {
	defer func() { s.stats.admission(ctx, opReserve, err) }()
	return s.callErr(ctx, func(p *actor.PID) any {
		return &messages.Reserve{Location: loc, Name: name, Bytes: bytes, ReplyTo: p}
	})
}

// Unreserve releases a named reservation (not one owned by a scope).
func (s *System) Unreserve(ctx context.Context, name string) error {
	return s.callErr(ctx, func(p *actor.PID) any { return &messages.Unreserve{Name: name, ReplyTo: p} })
}

// Explain simulates plan on the current state without changing it. It
// answers as [System.Execute] would: while earlier callers wait for room
// at a location the plan adds bytes to, the plan is infeasible and the
// reason says so (see [System.Place]).
func (s *System) Explain(ctx context.Context, plan Plan) (Explanation, error) {
	r, err := s.call(ctx, func(p *actor.PID) any { return &messages.Explain{Plan: plan, ReplyTo: p} }, nil)
	if err != nil {
		return Explanation{}, err
	}
	return r.(*messages.ExplainReply).Explanation, nil
}

// Decide runs the controller's bounded search for req with the default
// state limit. It changes nothing. It answers as [System.Admit] without a
// wait option would: a decision that adds bytes only where earlier
// callers wait for room is a [*WaitersAheadError].
func (s *System) Decide(ctx context.Context, req Request) (Decision, error) {
	return s.DecideWithLimit(ctx, req, 0)
}

// DecideWithLimit is Decide with an explicit state limit (0 = default).
func (s *System) DecideWithLimit(ctx context.Context, req Request, limit int) (d Decision, err error) {
	defer s.stats.decided(ctx, time.Now(), &d, &err)
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.Decide{Request: req, StateLimit: limit, ReplyTo: p}
	}, nil)
	if err != nil {
		return Decision{}, err
	}
	rep := r.(*messages.DecideReply)
	return rep.Decision, rep.Err
}

// Execute runs plan without a scope: preflight (PlanError, nothing
// changed), then reclaim → reservations → enter. Its reservations stay
// active (release them with Unreserve). A failure after preflight is a
// [*PlanExecutionError] with phase "execute"; committed steps stay.
func (s *System) Execute(ctx context.Context, plan Plan) (_ Report, err error) {
	defer func() { s.stats.admission(ctx, opExecute, err) }()
	r, err := s.call(ctx, func(p *actor.PID) any { return &messages.Execute{Plan: plan, ReplyTo: p} }, nil)
	if err != nil {
		return Report{}, err
	}
	rep := r.(*messages.RunReply)
	return rep.Report, rep.Err
}

// Snapshot returns one atomic, tensor-free copy of the state. After Close
// it returns the final snapshot taken at shutdown.
func (s *System) Snapshot(ctx context.Context) (Snapshot, error) {
	if s.closed.Load() {
		if err := s.awaitClose(ctx); err != nil {
			return Snapshot{}, err
		}
		if s.closedOK {
			return s.final, nil
		}
		if f := s.fatal.Load(); f != nil {
			return Snapshot{}, f
		}
		return Snapshot{}, ErrClosed
	}
	r, err := s.call(ctx, func(p *actor.PID) any { return &messages.Snapshot{ReplyTo: p} }, nil)
	if err != nil {
		return Snapshot{}, err
	}
	return r.(*messages.SnapshotReply).Frozen.Snapshot(), nil
}

// StateVersion returns the current state version: the number of committed
// mutations so far. It costs one round trip to the supervisor and copies
// nothing (use it instead of Snapshot when only the version is needed).
// After Close it returns the final snapshot's version.
func (s *System) StateVersion(ctx context.Context) (uint64, error) {
	if s.closed.Load() {
		snap, err := s.Snapshot(ctx)
		return snap.StateVersion, err
	}
	r, err := s.call(ctx, func(p *actor.PID) any { return &messages.StateVersion{ReplyTo: p} }, nil)
	if err != nil {
		return 0, err
	}
	return r.(*messages.Reply).Version, nil
}

// Trace returns the trace ring, oldest first.
func (s *System) Trace(ctx context.Context) ([]Transition, error) {
	r, err := s.call(ctx, func(p *actor.PID) any { return &messages.Trace{ReplyTo: p} }, nil)
	if err != nil {
		return nil, err
	}
	return r.(*messages.TraceReply).Trace, nil
}
