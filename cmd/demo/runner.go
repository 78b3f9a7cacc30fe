package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/system"
)

// runner holds a replay's runtime and the script-level names.
//
// Names follow the order of checks of docs/semantics.md: a name is a field like any
// other, checked in document order with the rest. A handle name inside a
// plan or request that is not registered is therefore not refused here:
// it goes to the runtime as a handle the runtime does not know (id 0), and
// the runtime's own field checks, in their order, decide which problem of
// the op is reported first. Its message is then put back in the script's
// words ("register it first"). Results name leases, holds, events and
// scopes by their script names, never by the runtime's ids.
type runner struct {
	sys       *system.System
	locations map[string]bool
	handles   map[string]system.Handle
	leases    map[string]*leaseEntry
	holds     map[string]*holdEntry
	events    map[string]*scriptEvent
	decisions map[string]system.Decision
	scopes    map[string]*scopeEntry

	// The runtime's ids and names → the script's words.
	leaseNames map[uint64]string // `lease "L"` or `lease of scope "S"`
	holdNames  map[uint64]string // `hold "H"`
	eventNames map[uint64]string // `event "E"`
	scopeNames map[string]string // "scope-3" → the script's name

	// Per op: handle names sent to the runtime unresolved (id 0), and a
	// replica mode the runtime was given as invalid.
	unresolved []string
	badReplica string

	caches  *cacheState   // the loader caches of the script (cache_ops.go); nil until one is opened
	staging *stagingState // the write pipelines of the script (staging_ops.go); nil until one is used

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

	// Diagnose mode (diagnose.go). explainFirst says whether an op's
	// plan (execute, enter of a plan) is explained before it runs, and
	// explained is that explanation for the op running now. onFail is
	// called with a failed op's error as soon as the op returns, before
	// anything else reaches the runtime.
	explainFirst func(o op) bool
	explained    *system.Explanation
	onFail       func(ctx context.Context, o op, err error)
	// leaseEndpoints: lease id → "value at location", for messages
	// (diagnose.go's scriptMessage).
	leaseEndpoints map[uint64]string
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
}

func newRunner(sys *system.System, locs []locationSpec) *runner {
	r := &runner{
		sys: sys, locations: map[string]bool{},
		handles: map[string]system.Handle{}, leases: map[string]*leaseEntry{},
		holds: map[string]*holdEntry{}, events: map[string]*scriptEvent{},
		decisions: map[string]system.Decision{}, scopes: map[string]*scopeEntry{},
		leaseNames: map[uint64]string{}, holdNames: map[uint64]string{},
		eventNames: map[uint64]string{}, scopeNames: map[string]string{},
		done:    finishedNames{maxCount: maxFinishedNames, maxWeight: maxFinishedBytes},
		doneIDs: finishedIDs{window: minIDWindow},
	}
	for _, l := range locs {
		r.locations[l.name] = true
	}
	return r
}

// run executes one op and builds its result. The state version is read
// after every op that reached the runtime (one round trip, no snapshot
// copy); an op the replay refused itself changed nothing.
func (r *runner) run(ctx context.Context, o op) result {
	res := result{Line: o.line, Op: o.name}
	r.unresolved, r.badReplica, r.explained = r.unresolved[:0], "", nil
	octx, cancel := r.watch.start(ctx)
	reached, err := r.exec(octx, o, &res)
	if r.afterExec != nil {
		r.afterExec()
	}
	if err != nil && context.Cause(octx) == errOpTimeout {
		err = fmt.Errorf("%w: %w", errOpTimeout, err)
	}
	r.watch.stop(cancel)
	if err != nil && r.onFail != nil {
		r.onFail(ctx, o, err)
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
		vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		if v, err := r.sys.StateVersion(vctx); err == nil {
			r.version = v
		}
		cancel()
	}
	res.StateVersion = r.version
	r.sweepDecisions()
	return res
}

// setTraceCapacity keeps the script names of finished lease, hold and
// event ids for as long as a trace of capacity n may show them.
func (r *runner) setTraceCapacity(n int) {
	r.doneIDs.window = max(minIDWindow, n)
}

func invalid(format string, args ...any) error {
	return &system.InvalidInputError{Message: fmt.Sprintf(format, args...)}
}

func unknownHandle(name string) error {
	return invalid("unknown handle %q (register it first)", name)
}

// handle resolves a handle name that is an op's first field.
func (r *runner) handle(name string) (system.Handle, error) {
	h, ok := r.handles[name]
	if !ok {
		return system.Handle{}, unknownHandle(name)
	}
	return h, nil
}

// fieldHandle resolves a handle name inside a plan or request. An unknown
// name becomes a handle the runtime will refuse as unknown when (and only
// if) its field is the first with a problem.
func (r *runner) fieldHandle(name string) system.Handle {
	if h, ok := r.handles[name]; ok {
		return h
	}
	r.unresolved = append(r.unresolved, name)
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
func (r *runner) endpointFieldError(ctx context.Context, h system.Handle, loc string) error {
	_, err := r.sys.Decide(ctx, system.Request{Name: "field check", Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{loc}}}}})
	if err != nil && isFieldError(err) {
		return err
	}
	return nil
}

// exec runs one op; reached says whether it got to the runtime (which may
// then have changed the state version).
func (r *runner) exec(ctx context.Context, o op, res *result) (reached bool, err error) {
	switch o.name {
	case "register":
		var mode system.ReplicaMode
		switch o.replica {
		case "", "exclusive":
			mode = system.Exclusive
		case "replicable":
			mode = system.Replicable
		default:
			// The replica mode is a field after the name and bytes: the
			// runtime checks them in order and refuses this mode.
			mode, r.badReplica = system.ReplicaMode(-1), o.replica
		}
		v := system.Value{Name: o.handle, Bytes: o.bytes, Mode: mode, At: o.at, Source: o.source}
		if o.source != "" {
			v.Loader = deterministicLoader(o.handle)
		} else if o.bytes > 0 && o.bytes <= replayBufferLimit {
			// Values up to the replay's buffer limit start with their
			// deterministic bytes; larger ones start zero-filled, so that a
			// replay never holds more than replayBufferLimit of real memory
			// per buffer (the data of a registration included).
			v.Data = make([]byte, o.bytes)
			fill(o.handle, 0, v.Data)
		}
		h, err := r.sys.Register(ctx, v)
		if err != nil {
			return true, err
		}
		r.handles[o.handle] = h
		return true, nil
	case "place", "evict", "discard", "copy", "move":
		h, err := r.handle(o.handle)
		if err != nil {
			return false, err
		}
		switch o.name {
		case "place":
			return true, r.sys.Place(ctx, h, o.location)
		case "evict":
			return true, r.sys.Evict(ctx, h, o.location)
		case "discard":
			if err := r.sys.Discard(ctx, h); err != nil {
				return true, err
			}
			r.finishHandle(o.handle, uint64(h.ID))
			return true, nil
		case "copy":
			return true, r.sys.Copy(ctx, h, o.from, o.to)
		default:
			return true, r.sys.Move(ctx, h, o.from, o.to)
		}
	case "acquire", "hold":
		// Fields: handle, location, as. The name binds only on success.
		h, err := r.handle(o.handle)
		if err != nil {
			return false, err
		}
		_, dupL := r.leases[o.as]
		_, dupH := r.holds[o.as]
		if o.as == "" || (o.name == "acquire" && dupL) || (o.name == "hold" && dupH) {
			if err := r.endpointFieldError(ctx, h, o.location); err != nil {
				return true, err
			}
			kind := map[string]string{"acquire": "lease", "hold": "hold"}[o.name]
			if o.as == "" {
				return true, invalid("a %s name must not be empty", kind)
			}
			return true, invalid("duplicate %s name %q", kind, o.as)
		}
		if o.name == "acquire" {
			l, err := r.sys.Acquire(ctx, h, o.location)
			if err != nil {
				return true, err
			}
			r.leases[o.as] = &leaseEntry{lease: l}
			r.leaseNames[uint64(l.ID())] = fmt.Sprintf("lease %q", o.as)
			return true, nil
		}
		hd, err := r.sys.Hold(ctx, h, o.location)
		if err != nil {
			return true, err
		}
		r.holds[o.as] = &holdEntry{hold: hd}
		r.holdNames[uint64(hd.ID())] = fmt.Sprintf("hold %q", o.as)
		return true, nil
	case "release":
		e, ok := r.leases[o.lease]
		switch {
		case !ok:
			return false, r.unknownLease(o.lease)
		case e.released:
			return false, invalid("lease %q was already released", o.lease)
		}
		if err := e.lease.Release(ctx); err != nil {
			return true, err
		}
		e.released = true
		r.finishLease(o.lease, e)
		return true, nil
	case "record_event":
		e, ok := r.leases[o.lease]
		switch {
		case !ok:
			return false, invalid("unknown lease %q", o.lease)
		case e.released:
			return false, invalid("cannot record an event on lease %q: it was released", o.lease)
		}
		if _, dup := r.events[o.event]; dup {
			return false, invalid("duplicate event name %q", o.event)
		}
		ev := system.NewManualEvent()
		id, err := e.lease.RecordEvent(ctx, ev)
		if err != nil {
			return true, err
		}
		e.pending++
		r.events[o.event] = &scriptEvent{ev: ev, id: id, lease: e}
		r.eventNames[uint64(id)] = fmt.Sprintf("event %q", o.event)
		return true, nil
	case "complete_event":
		e, ok := r.events[o.event]
		if !ok {
			return false, invalid("unknown event %q", o.event)
		}
		if e.completed {
			return false, invalid("event %q was already completed", o.event)
		}
		e.completed = true
		e.ev.Complete()
		r.finishEvent(o.event, e)
		return true, r.sys.WaitReaped(ctx, e.id)
	case "unhold":
		e, ok := r.holds[o.hold]
		switch {
		case !ok:
			return false, invalid("unknown hold %q", o.hold)
		case e.released:
			return false, invalid("hold %q was already released", o.hold)
		}
		if err := e.hold.Release(ctx); err != nil {
			return true, err
		}
		e.released = true
		r.finishHold(o.hold, e)
		return true, nil
	case "reserve":
		return true, r.sys.Reserve(ctx, o.location, r.cacheResName(o.resName), o.bytes)
	case "unreserve":
		return true, r.sys.Unreserve(ctx, r.cacheResName(o.resName))
	case "explain":
		// Explain never fails on a plan's content: a plan that fails
		// validation (an unknown handle included) is infeasible, with the
		// validation error as its reason.
		ex, err := r.sys.Explain(ctx, r.plan(o.plan))
		if err != nil {
			return true, err
		}
		e := r.toExplanation(ex)
		res.Explanation = &e
		return true, nil
	case "execute":
		p := r.plan(o.plan)
		r.explain(ctx, o, p)
		rep, err := r.sys.Execute(ctx, p)
		if err != nil {
			return true, err
		}
		res.Report = r.toReport(rep)
		return true, nil
	case "decide":
		// Fields: request, then as.
		req := r.request(o.request)
		if _, dup := r.decisions[o.as]; dup || o.as == "" {
			if _, err := r.sys.Decide(ctx, req); err != nil && isFieldError(err) {
				return true, err
			}
			if o.as == "" {
				return true, invalid("a decision name must not be empty")
			}
			return true, invalid("duplicate decision name %q", o.as)
		}
		d, err := r.sys.Decide(ctx, req)
		if err != nil {
			return true, err
		}
		r.decisions[o.as] = d
		r.fresh = append(r.fresh, o.as)
		res.Decision = r.toDecision(d)
		return true, nil
	case "enter":
		// `enter … as S` binds S whatever the outcome: a failed scope is
		// still a scope (exiting it is invalid input), and scopes are
		// single-use.
		if o.as == "" {
			return false, invalid("a scope name must not be empty")
		}
		if _, dup := r.scopes[o.as]; dup {
			return false, invalid("scope %q already exists: a scope is single-use, enter a new one under another name", o.as)
		}
		entry := &scopeEntry{state: scopeFailed}
		r.scopes[o.as] = entry
		defer func() {
			if entry.state == scopeFailed {
				r.finishScope(o.as, entry) // a failed scope only answers for its name
			}
		}()
		var sc *system.Scope
		if o.decision != "" {
			d, ok := r.decisions[o.decision]
			if !ok {
				return false, invalid("unknown decision %q", o.decision)
			}
			sc = r.sys.ScopeFor(d)
		} else if o.expectedVersion != nil {
			p := r.plan(o.plan)
			r.explain(ctx, o, p)
			sc = r.sys.NewScopeExpecting(p, *o.expectedVersion)
		} else {
			p := r.plan(o.plan)
			r.explain(ctx, o, p)
			sc = r.sys.NewScope(p)
		}
		entry.scope = sc
		r.scopeNames[sc.Name()] = o.as
		if err := sc.Enter(ctx); err != nil {
			return true, err
		}
		entry.state = scopeEntered
		for _, id := range sc.Leases() {
			r.leaseNames[uint64(id)] = fmt.Sprintf("lease of scope %q", o.as)
		}
		res.Report = r.toReport(sc.Report())
		return true, nil
	case "exit":
		e, ok := r.scopes[o.scope]
		switch {
		case !ok:
			return false, invalid("unknown scope %q", o.scope)
		case e.state == scopeFailed:
			return false, invalid("scope %q cannot exit: its entry failed, so it holds nothing", o.scope)
		case e.state == scopeExited:
			return false, invalid("scope %q cannot exit: it already exited", o.scope)
		}
		err := e.scope.Exit(ctx)
		var pe *system.PlanExecutionError
		if err == nil || errors.As(err, &pe) {
			e.state = scopeExited // an exit failure is kept; the scope is done
			r.finishScope(o.scope, e)
		}
		return true, err
	case "release_scope_lease":
		// The lease a scope took for one enter action, released by id
		// behind the scope's back (as a tool that keeps lease ids would):
		// the scope's exit then fails in phase exit.
		e, ok := r.scopes[o.scope]
		switch {
		case !ok:
			return false, invalid("unknown scope %q", o.scope)
		case e.state != scopeEntered:
			return false, invalid("scope %q holds no leases: it is not entered", o.scope)
		}
		ids := e.scope.Leases()
		if o.index >= int64(len(ids)) {
			return false, invalid("scope %q has %d enter action(s): no enter %d", o.scope, len(ids), o.index)
		}
		return true, r.sys.ReleaseByID(ctx, ids[o.index])
	case "snapshot":
		s, err := r.sys.Snapshot(ctx)
		if err != nil {
			return true, err
		}
		res.Snapshot = r.toSnapshot(s)
		return true, nil
	case "trace":
		t, err := r.sys.Trace(ctx)
		if err != nil {
			return true, err
		}
		ts := r.toTransitions(t)
		res.Trace = &ts
		return true, nil
	case "fail_next":
		kind, err := cuda.ParseFaultKind(o.kind)
		if err != nil {
			return false, invalid("unknown fault kind %q (use alloc, copy or reconstruct)", o.kind)
		}
		if _, err := cuda.ParseLocationName(o.location); err != nil {
			return false, invalid("malformed location %q", o.location)
		}
		if !r.locations[o.location] {
			return false, &system.UnavailableError{Location: o.location, Detail: "location is not configured"}
		}
		faultsOf(r.sys).Arm(kind, o.location)
		return false, nil
	case "cache_open", "load", "load_fail", "cache_release", "cache_pin", "cache_unpin", "cache_evict", "cache_stats", "cache_close":
		return r.execCache(ctx, o, res)
	}
	if isStagingOp(o.name) {
		return r.execStaging(ctx, o, res)
	}
	return false, fmt.Errorf("op %q is not implemented", o.name)
}

// explain explains p before op o runs it, when diagnose asks for it
// (Explain reads; it changes nothing, not even the state version).
func (r *runner) explain(ctx context.Context, o op, p system.Plan) {
	if r.explainFirst == nil || !r.explainFirst(o) {
		return
	}
	if ex, err := r.sys.Explain(ctx, p); err == nil {
		r.explained = &ex
	}
}

// plan turns a script plan into a runtime plan (see fieldHandle).
func (r *runner) plan(p *planSpec) system.Plan {
	var out system.Plan
	actions := func(in []actionSpec) []system.Action {
		var as []system.Action
		for _, a := range in {
			as = append(as, system.Action{Handle: r.fieldHandle(a.handle), Location: a.location, From: a.from})
		}
		return as
	}
	out.Reclaim = actions(p.reclaim)
	out.Reservations = r.reservations(p.reservations)
	out.Enter = actions(p.enter)
	return out
}

func (r *runner) reservations(in []reservationSpec) []system.ReservationSpec {
	var out []system.ReservationSpec
	for _, rs := range in {
		out = append(out, system.ReservationSpec{Name: r.cacheResName(rs.name), Location: rs.location, Bytes: rs.bytes})
	}
	return out
}

// request turns a script request into a runtime request (see fieldHandle).
func (r *runner) request(q *requestSpec) system.Request {
	out := system.Request{Name: q.name, Reservations: r.reservations(q.reservations)}
	for _, req := range q.requirements {
		out.Requirements = append(out.Requirements, system.Requirement{Handle: r.fieldHandle(req.handle), Tiers: req.tiers})
	}
	return out
}

// words puts a runtime message in the script's words: unknown handles of
// this op, an invalid replica mode, and scopes by their script names.
func (r *runner) words(msg string) string {
	for _, name := range r.unresolved {
		msg = strings.ReplaceAll(msg, fmt.Sprintf("unknown handle %q (id 0)", name), fmt.Sprintf("unknown handle %q (register it first)", name))
	}
	if r.badReplica != "" {
		msg = strings.ReplaceAll(msg, "unknown replica mode -1", fmt.Sprintf("unknown replica mode %q (use exclusive or replicable)", r.badReplica))
	}
	if len(r.scopeNames) > 0 && strings.Contains(msg, "scope-") {
		msg = r.scopeWords(msg)
	}
	if r.caches != nil && strings.Contains(msg, "cache:") {
		msg = r.caches.cacheWords(msg)
	}
	if r.staging != nil {
		msg = r.staging.stagingWords(msg)
	}
	return msg
}

// scopeWords replaces the runtime's scope names ("scope-3", quoted or
// not) with the script's (`scope "S"`).
func (r *runner) scopeWords(msg string) string {
	var b strings.Builder
	for {
		i := strings.Index(msg, "scope-")
		if i < 0 {
			b.WriteString(msg)
			return b.String()
		}
		j := i + len("scope-")
		for j < len(msg) && msg[j] >= '0' && msg[j] <= '9' {
			j++
		}
		name, ok := r.scopeNames[msg[i:j]]
		if !ok || j == i+len("scope-") {
			b.WriteString(msg[:j])
			msg = msg[j:]
			continue
		}
		quoted := i > 0 && msg[i-1] == '"' && j < len(msg) && msg[j] == '"'
		if quoted {
			b.WriteString(msg[:i-1])
			b.WriteString(strconv.Quote(name))
			msg = msg[j+1:]
			continue
		}
		b.WriteString(msg[:i])
		b.WriteString("scope " + strconv.Quote(name))
		msg = msg[j:]
	}
}

// detailWords rewrites a transition's detail: the runtime names leases,
// holds and events by id ("lease 3", "event 2 on lease 3"); the script
// knows them by name.
func (r *runner) detailWords(d string) string {
	id := func(s string) (uint64, bool) {
		n, err := strconv.ParseUint(s, 10, 64)
		return n, err == nil
	}
	switch {
	case strings.HasPrefix(d, "lease "):
		if n, ok := id(d[len("lease "):]); ok {
			if name, ok := r.leaseNames[n]; ok {
				return name
			}
		}
	case strings.HasPrefix(d, "hold "):
		if n, ok := id(d[len("hold "):]); ok {
			if name, ok := r.holdNames[n]; ok {
				return name
			}
		}
	case strings.HasPrefix(d, "event "):
		rest := d[len("event "):]
		ev, lease, on := strings.Cut(rest, " on lease ")
		n, ok := id(ev)
		if !ok {
			break
		}
		evName, ok := r.eventNames[n]
		if !ok {
			break
		}
		if !on {
			return evName
		}
		if m, ok := id(lease); ok {
			if lName, ok := r.leaseNames[m]; ok {
				return evName + " on " + lName
			}
		}
	}
	return r.words(d)
}
