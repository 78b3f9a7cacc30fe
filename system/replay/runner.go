package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// opTimeout bounds one op: a runtime that stops answering fails the op
// (type "Error") instead of hanging a user's CI.
const opTimeout = time.Minute

// ManagerID is the manager id of every replay runtime, so that the output
// of a script is the same on every run.
const ManagerID = "replay"

// Runner runs the ops of one script against one runtime, in order, and
// keeps the script's names of what they made. It is not safe for
// concurrent use: one op at a time.
//
// Names follow the order of checks of docs/semantics.md: a name is a field like any
// other, checked in document order with the rest. A handle name inside a
// plan or request that is not registered is therefore not refused here:
// it goes to the runtime as a handle the runtime does not know (id 0), and
// the runtime's own field checks, in their order, decide which problem of
// the op is reported first (an unknown handle "register it first"). Results name leases, holds, events and
// scopes by their script names, never by the runtime's ids.
type Runner struct {
	sys       *system.System
	backend   *truncatingBackend // nil when the caller started the runtime
	locations map[string]bool
	handles   map[string]system.Handle
	leases    map[string]*leaseEntry
	holds     map[string]*holdEntry
	events    map[string]*scriptEvent
	decisions map[string]system.Decision
	scopes    map[string]*scopeEntry

	// The runtime's ids and names → the script's words.
	leaseNames map[uint64]scriptName // `lease "L"` or `lease of scope "S"`
	holdNames  map[uint64]scriptName // `hold "H"`
	eventNames map[uint64]scriptName // `event "E"`
	scopeNames map[string]string     // "scope-3" → the script's name
	resvScopes map[string]string     // reservation → the script name of the entered scope that owns it

	caches  *cacheState   // the loader caches of the script (ops_cache.go); nil until one is opened
	staging *stagingState // the write pipelines of the script (ops_staging.go); nil until one is used

	version uint64 // the state version after the last op
	watch   watchdog

	// Finished names, remembered for a while (names.go): done bounds the
	// script's names, doneIDs the runtime ids' script names; fresh are the
	// decisions made at the current state version.
	done    finishedNames
	doneIDs finishedIDs
	fresh   []string

	// afterExec, when set (tests), runs right after an op returned,
	// before its state version is read.
	afterExec func()

	// hooks (SetHooks); explained is the explanation of the plan of the
	// op running now, when hooks.ExplainFirst asked for it.
	hooks     Hooks
	explained *system.Explanation
	// leaseEndpoints: lease id → "value at location", for the messages
	// of evidence (evidence.go).
	leaseEndpoints map[uint64]string
}

// Hooks let a caller look inside a replay as it runs (demo diagnose
// does). Every hook is optional.
type Hooks struct {
	// ExplainFirst says whether the plan of op o (execute, or enter of a
	// plan) is explained before it runs; Explained then returns that
	// explanation while o runs and in OnFail. Explain changes nothing,
	// not even the state version.
	ExplainFirst func(o Op) bool
	// OnFail is called with a failed op's error as soon as the op
	// returned, before anything else reaches the runtime.
	OnFail func(ctx context.Context, o Op, err error)
}

// Start starts a fresh runtime as the script's start op describes it
// (its locations and budgets, trace capacity and search state limit), on
// simulated devices that keep at most BufferLimit of real memory per
// buffer, and returns a runner for the script's other ops. Close the
// runner when done: it closes the runtime and its devices.
func Start(ctx context.Context, start Op) (*Runner, error) {
	if start.Name != "start" {
		return nil, fmt.Errorf("replay: a runtime starts with a start op, not %q", start.Name)
	}
	opts := system.Options{ManagerID: ManagerID}
	names := make([]string, len(start.locations))
	for i, l := range start.locations {
		names[i] = l.name
		if l.hasBudget {
			opts.Locations = append(opts.Locations, system.Limit(l.name, l.budget))
		} else {
			opts.Locations = append(opts.Locations, system.NoLimit(l.name))
		}
	}
	opts.Spill = start.spill
	if start.trace != nil {
		if *start.trace == 0 {
			opts.DisableTrace = true
		} else {
			opts.TraceCapacity = int(*start.trace)
		}
	}
	if start.stateLimit != nil {
		opts.StateLimit = int(*start.stateLimit)
	}
	backend, err := newBackend(names)
	if err != nil {
		return nil, err
	}
	opts.Backend = backend
	sys, err := system.Start(ctx, opts)
	if err != nil {
		backend.Close()
		return nil, err
	}
	r := newRunner(sys, start.locations)
	r.backend = backend
	if opts.TraceCapacity > 0 {
		r.setTraceCapacity(opts.TraceCapacity)
	}
	return r, nil
}

// System returns the runtime the runner drives.
func (r *Runner) System() *system.System { return r.sys }

// SetHooks sets the runner's hooks; call it before the first op.
func (r *Runner) SetHooks(h Hooks) { r.hooks = h }

// Explained returns the explanation of the plan of the op running now,
// when Hooks.ExplainFirst asked for it (nil otherwise).
func (r *Runner) Explained() *system.Explanation { return r.explained }

// Caches returns the loader caches the script opened and has not closed.
func (r *Runner) Caches() []*cache.Cache {
	if r.caches == nil {
		return nil
	}
	var out []*cache.Cache
	for _, c := range r.caches.caches {
		if !c.closed {
			out = append(out, c.c)
		}
	}
	return out
}

// Close ends the script: its write pipelines first (every freeze event
// still pending is completed, every open pipeline writes what it holds),
// then the runtime, then the simulated devices. A script may end with
// leases, holds, cache leases or pins still taken: Close releases them
// and returns an error that matches *system.OutstandingError (errors.As)
// listing them, in the script's names; that is not a failure of the
// script. Any other error is.
func (r *Runner) Close(ctx context.Context) error {
	r.closeStaging(ctx)
	err := r.closeNote(r.sys.Close(ctx))
	if r.backend != nil {
		r.backend.Close()
	}
	return err
}

// errOpTimeout is the cause of an op stopped by the watchdog.
var errOpTimeout = fmt.Errorf("the op did not finish within %v (the limit of one op)", opTimeout)

// watchdog bounds every op to opTimeout with one timer for the whole
// replay (a timer per op costs more than many ops).
type watchdog struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel context.CancelCauseFunc // of the op running now
}

func (w *watchdog) start(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	octx, cancel := context.WithCancelCause(ctx)
	w.mu.Lock()
	w.cancel = cancel
	if w.timer == nil {
		w.timer = time.AfterFunc(opTimeout, w.fire)
	} else {
		w.timer.Reset(opTimeout)
	}
	w.mu.Unlock()
	return octx, cancel
}

func (w *watchdog) fire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel(errOpTimeout)
	}
}

func (w *watchdog) stop(cancel context.CancelCauseFunc) {
	w.mu.Lock()
	w.timer.Stop()
	w.cancel = nil
	w.mu.Unlock()
	cancel(nil)
}

type leaseEntry struct {
	lease    *system.Lease
	released bool
	pending  int // events recorded on it and not completed yet
}

type holdEntry struct {
	hold     *system.Hold
	released bool
}

type scriptEvent struct {
	ev        *system.ManualEvent
	id        system.EventID
	completed bool
	lease     *leaseEntry // the lease it was recorded on
}

type scopeState int

const (
	scopeFailed scopeState = iota // its entry failed (validation included)
	scopeEntered
	scopeExited
)

type scopeEntry struct {
	scope *system.Scope
	state scopeState
	resv  []string // the runtime names of the reservations it owns while entered
}

func newRunner(sys *system.System, locs []locationSpec) *Runner {
	r := &Runner{
		sys: sys, locations: map[string]bool{},
		handles: map[string]system.Handle{}, leases: map[string]*leaseEntry{},
		holds: map[string]*holdEntry{}, events: map[string]*scriptEvent{},
		decisions: map[string]system.Decision{}, scopes: map[string]*scopeEntry{},
		leaseNames: map[uint64]scriptName{}, holdNames: map[uint64]scriptName{},
		eventNames: map[uint64]scriptName{}, scopeNames: map[string]string{},
		resvScopes: map[string]string{},
		done:       finishedNames{maxCount: maxFinishedNames, maxWeight: maxFinishedBytes},
		doneIDs:    finishedIDs{window: minIDWindow},
	}
	for _, l := range locs {
		r.locations[l.name] = true
	}
	return r
}

// Do runs one op of the script (any op but start, which Start ran) and
// returns its result. A failed op is a result too (OK false, Error set);
// nothing is returned as a Go error. Every op is bounded to one minute: a
// runtime that stops answering fails the op. The result's state version
// is the runtime's after the op; an op the replay refused itself (an
// unknown name, say) changed nothing. When ctx ends during the op, the
// result's Err matches ctx's error and the op may not have finished.
func (r *Runner) Do(ctx context.Context, o Op) Result {
	res := Result{Line: o.Line, Op: o.Name}
	r.explained = nil
	octx, cancel := r.watch.start(ctx)
	var reached bool
	var err error
	if h, ok := ops[o.Name]; ok && h.exec != nil {
		reached, err = h.exec(r, octx, o, &res)
	} else {
		err = fmt.Errorf("op %q cannot run here", o.Name)
	}
	if r.afterExec != nil {
		r.afterExec()
	}
	if err != nil && context.Cause(octx) == errOpTimeout {
		err = fmt.Errorf("%w: %w", errOpTimeout, err)
	}
	r.watch.stop(cancel)
	if err != nil && r.hooks.OnFail != nil {
		r.hooks.OnFail(ctx, o, err)
	}
	if err != nil {
		res.OK, res.err, res.Error = false, err, r.errorObject(err)
		res.Explanation, res.Report, res.Decision, res.Snapshot, res.Trace = nil, nil, nil, nil, nil
		res.Load, res.Evicted, res.Stats, res.Staging = nil, nil, nil, nil
	} else {
		res.OK = true
	}
	switch {
	case res.Snapshot != nil:
		r.version = res.Snapshot.StateVersion
	case reached:
		// Read even when ctx has just ended (Ctrl-C after the op
		// returned): the op's result is printed, and its state version
		// must be the one it left, not the previous op's.
		// Bounded by the watchdog, as the op was (no timer of its own).
		vctx, cancel := r.watch.start(context.WithoutCancel(ctx))
		if v, err := r.sys.StateVersion(vctx); err == nil {
			r.version = v
		}
		r.watch.stop(cancel)
	}
	res.StateVersion = r.version
	r.sweepDecisions()
	return res
}

// setTraceCapacity keeps the script names of finished lease, hold and
// event ids for as long as a trace of capacity n may show them.
func (r *Runner) setTraceCapacity(n int) {
	r.doneIDs.window = max(minIDWindow, n)
}

func invalid(format string, args ...any) error {
	return &system.InvalidInputError{Message: fmt.Sprintf(format, args...)}
}

func unknownHandle(name string) error {
	return invalid("unknown handle %q (register it first)", name)
}

// handle resolves a handle name that is an op's first field.
func (r *Runner) handle(name string) (system.Handle, error) {
	h, ok := r.handles[name]
	if !ok {
		return system.Handle{}, unknownHandle(name)
	}
	return h, nil
}

// fieldHandle resolves a handle name inside a plan or request. An unknown
// name becomes a handle the runtime will refuse as unknown when (and only
// if) its field is the first with a problem.
func (r *Runner) fieldHandle(name string) system.Handle {
	if h, ok := r.handles[name]; ok {
		return h
	}
	return system.Handle{Manager: r.sys.ManagerID(), ID: 0, Name: name}
}

// isFieldError reports whether err is the kind of error a field check
// gives (SEMANTICS: malformed or unknown → invalid input; discarded or
// unconfigured → UnavailableError), as opposed to a rule's refusal.
func isFieldError(err error) bool {
	var ie *system.InvalidInputError
	var ue *system.UnavailableError
	return errors.As(err, &ie) || errors.As(err, &ue)
}

// endpointFieldError checks the fields handle and location of an
// endpoint the way the runtime does, without changing anything: a
// one-requirement decision validates them first (nothing else of a
// decision can be a field error). It is needed only when a later field of
// the op (a duplicate name) is wrong, to report the first problem.
func (r *Runner) endpointFieldError(ctx context.Context, h system.Handle, loc string) error {
	_, err := r.sys.Decide(ctx, system.Request{Name: "field check", Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{loc}}}}})
	if err != nil && isFieldError(err) {
		return err
	}
	return nil
}

// explain explains p before op o runs it, when diagnose asks for it
// (Explain reads; it changes nothing, not even the state version).
func (r *Runner) explain(ctx context.Context, o Op, p system.Plan) {
	if r.hooks.ExplainFirst == nil || !r.hooks.ExplainFirst(o) {
		return
	}
	if ex, err := r.sys.Explain(ctx, p); err == nil {
		r.explained = &ex
	}
}

// plan turns a script plan into a runtime plan (see fieldHandle).
func (r *Runner) plan(p *planSpec) system.Plan {
	var out system.Plan
	actions := func(in []actionSpec) []system.Action {
		var as []system.Action
		for _, a := range in {
			as = append(as, system.Action{Handle: r.fieldHandle(a.handle), Location: a.location, From: a.from, To: a.to})
		}
		return as
	}
	out.Reclaim = actions(p.reclaim)
	out.Reservations = r.reservations(p.reservations)
	out.Enter = actions(p.enter)
	return out
}

func (r *Runner) reservations(in []reservationSpec) []system.ReservationSpec {
	var out []system.ReservationSpec
	for _, rs := range in {
		out = append(out, system.ReservationSpec{Name: rs.name, Location: rs.location, Bytes: rs.bytes})
	}
	return out
}

// request turns a script request into a runtime request (see fieldHandle).
func (r *Runner) request(q *requestSpec) system.Request {
	out := system.Request{Name: q.name, Reservations: r.reservations(q.reservations)}
	if q.mostFree {
		out.TieBreak = system.TieMostFree
	}
	for _, req := range q.requirements {
		out.Requirements = append(out.Requirements, system.Requirement{Handle: r.fieldHandle(req.handle), Tiers: req.tiers})
	}
	return out
}

func isContextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
