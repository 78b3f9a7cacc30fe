package tests

// The cancellation stress variant of issue 7: the soft backend's capacity
// at every location equals the location's budget, so the device can never
// hold more bytes than the ledger admitted without an allocation failing
// (*cuda.OutOfMemoryError), and every blocking call of the public API gets a
// context that ends at a random point. Whatever the callers gave up on, the
// runtime must leak nothing: no protection outlives the calls, every
// materialization can be removed, Close reports nothing outstanding and
// every location is back to zero bytes (goroutines: goleak in TestMain).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// cancelBudgets are the budgets of the cancellation stress test; the soft
// backend's capacity is set to the same figures.
var cancelBudgets = map[string]int64{
	"pageable-host": 256 << 10,
	"pinned-host":   96 << 10,
	"cuda:0":        64 << 10,
	"cuda:1":        64 << 10,
}

// Kinds of contexts a blocking call gets.
const (
	cancelCtxLive      = "live"       // never ends
	cancelCtxDone      = "done"       // already done before the call
	cancelCtxAfterSend = "after-send" // live at the pre-send check, done while waiting (endsAfterSend)
	cancelCtxTimeout   = "timeout"    // a real deadline, 1µs to 5ms away
)

var cancelCtxKinds = []string{cancelCtxDone, cancelCtxAfterSend, cancelCtxTimeout}

// oomCountingBackend is the soft backend with every allocation failure for
// lack of capacity counted: with capacity equal to budget, one means the
// device was asked to hold more than the ledger admitted.
type oomCountingBackend struct {
	*soft.Backend
	allocs atomic.Int64
	ooms   atomic.Int64
	mu     sync.Mutex
	first  []string
}

func (b *oomCountingBackend) Allocate(ctx context.Context, loc string, n int64) (cuda.Buffer, error) {
	buf, err := b.Backend.Allocate(ctx, loc, n)
	b.allocs.Add(1)
	var oom *cuda.OutOfMemoryError
	if errors.As(err, &oom) {
		b.ooms.Add(1)
		b.mu.Lock()
		if len(b.first) < 10 {
			b.first = append(b.first, oom.Error())
		}
		b.mu.Unlock()
	}
	return buf, err
}

// cancelTally counts the calls of one worker.
type cancelTally struct {
	calls     map[string]int // by op
	ok        map[string]int // by op
	errs      map[string]int // by error type
	causes    map[string]int // PlanExecutionError causes
	kinds     map[string]int // calls by context kind
	cancelled map[string]int // calls that returned the context's error, by context kind
	survived  map[string]int // calls with an ending context that succeeded anyway, by kind
	abandoned map[string]int // calls that returned the context's error, by op
	invalidOK int            // invalid-input answers the test expects (see each site)
	exitLost  int            // Exit with a done context, whose retry was refused
	ooms      int
	armed     int
	untyped   []string
	failures  []string
}

func newCancelTally() *cancelTally {
	return &cancelTally{calls: map[string]int{}, ok: map[string]int{}, errs: map[string]int{}, causes: map[string]int{},
		kinds: map[string]int{}, cancelled: map[string]int{}, survived: map[string]int{}, abandoned: map[string]int{}}
}

func (t *cancelTally) merge(o *cancelTally) {
	for _, p := range []struct{ dst, src map[string]int }{
		{t.calls, o.calls}, {t.ok, o.ok}, {t.errs, o.errs}, {t.causes, o.causes}, {t.kinds, o.kinds},
		{t.cancelled, o.cancelled}, {t.survived, o.survived}, {t.abandoned, o.abandoned},
	} {
		for k, v := range p.src {
			p.dst[k] += v
		}
	}
	t.invalidOK += o.invalidOK
	t.exitLost += o.exitLost
	t.ooms += o.ooms
	t.armed += o.armed
	t.untyped = append(t.untyped, o.untyped...)
	t.failures = append(t.failures, o.failures...)
}

// What a worker truly holds: only what a call returned to it. A release
// whose caller gave up may or may not have happened: maybe is then set, and
// a later release may find it already released (invalid input).
type cancelLease struct {
	l     *system.Lease
	v     *stressValue
	maybe bool
}

type cancelHold struct {
	h     *system.Hold
	maybe bool
}

type cancelEvent struct {
	id system.EventID
	ev cuda.Event
}

// cancelWorker runs random operations, each blocking call with a context
// that ends at a random point.
type cancelWorker struct {
	id     int
	r      *rand.Rand
	sys    *system.System
	shared *stressShared
	tally  *cancelTally
	stream cuda.Stream // for consumer events recorded on a soft stream

	own      []*stressValue
	lost     []*stressValue // registrations whose caller gave up: maybe registered
	leases   []*cancelLease
	holds    []*cancelHold
	scopes   []*system.Scope
	manual   []*system.ManualEvent // every manual event handed to RecordEvent
	gates    []*system.ManualEvent // gates of the soft stream events
	recorded []cancelEvent         // events recorded (RecordEvent returned their id)
	resv     map[string]bool       // reservation name → certainly active (false: maybe)
	seq      int
}

var cancelDoneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// randomCtx returns a context that ends at a random point (or, unless
// mustEnd, sometimes never).
func (w *cancelWorker) randomCtx(mustEnd bool) (context.Context, string, context.CancelFunc) {
	n := w.r.IntN(100)
	if mustEnd {
		n = 35 + w.r.IntN(65)
	}
	switch {
	case n < 35:
		return context.Background(), cancelCtxLive, func() {}
	case n < 50:
		return cancelDoneCtx, cancelCtxDone, func() {}
	case n < 72:
		return newEndsAfterSend(), cancelCtxAfterSend, func() {}
	default:
		// Log-uniform between 1µs and 5ms: from "expires before the
		// request is sent" to "expires while a transfer is in flight".
		d := time.Duration(math.Exp(math.Log(1e3) + w.r.Float64()*(math.Log(5e6)-math.Log(1e3))))
		ctx, cancel := context.WithTimeout(context.Background(), d)
		return ctx, cancelCtxTimeout, cancel
	}
}

// do runs one blocking call with a random context and records its outcome.
// gaveUp reports that the call returned its context's error: whatever it
// asked for may or may not have happened.
func (w *cancelWorker) do(op string, mustEnd bool, f func(context.Context) error) (kind string, gaveUp bool, err error) {
	ctx, kind, cancel := w.randomCtx(mustEnd)
	defer cancel()
	err = f(ctx)
	return kind, w.record(op, kind, err), err
}

// live runs one blocking call with a context that does not end (the
// clean-up at the end of the run), bounded so that a hang fails the test.
func (w *cancelWorker) live(op string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := f(ctx)
	w.record(op, cancelCtxLive, err)
	if errors.Is(err, context.DeadlineExceeded) {
		w.fail("%s with a live context did not return within 20s", op)
	}
	return err
}

func (w *cancelWorker) record(op, kind string, err error) (gaveUp bool) {
	t := w.tally
	t.calls[op]++
	t.kinds[kind]++
	if err == nil {
		t.ok[op]++
		if kind != cancelCtxLive {
			t.survived[kind]++
		}
		return false
	}
	typ := errorType(err)
	if typ == "" && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		if kind == cancelCtxLive {
			w.fail("%s with a live context returned %v", op, err)
		}
		t.cancelled[kind]++
		t.abandoned[op]++
		return true
	}
	var oom *cuda.OutOfMemoryError
	if errors.As(err, &oom) {
		t.ooms++
		w.fail("%s: the backend ran out of memory, so physical bytes exceeded admitted bytes: %v", op, err)
	}
	if typ == "" {
		t.errs["untyped"]++
		if len(t.untyped) < 20 {
			t.untyped = append(t.untyped, fmt.Sprintf("%s: %T: %v", op, err, err))
		}
		return false
	}
	t.errs[typ]++
	var pe *system.PlanExecutionError
	if errors.As(err, &pe) {
		cause := "untyped"
		switch {
		case errors.Is(pe.Cause, cuda.ErrInjectedFault):
			cause = "injected fault"
		case errors.Is(pe.Cause, cuda.ErrOutOfMemory):
			cause = "out of memory"
		case errorType(pe.Cause) != "":
			cause = errorType(pe.Cause)
		}
		if cause == "untyped" && len(t.untyped) < 20 {
			t.untyped = append(t.untyped, fmt.Sprintf("%s: cause %T: %v", op, pe.Cause, pe.Cause))
		}
		t.causes[cause]++
	}
	return false
}

func (w *cancelWorker) fail(format string, args ...any) {
	if len(w.tally.failures) < 20 {
		w.tally.failures = append(w.tally.failures, fmt.Sprintf("worker %d: ", w.id)+fmt.Sprintf(format, args...))
	}
}

// expectInvalid accounts for an invalid-input answer the test expects
// (ok), or reports it.
func (w *cancelWorker) expectInvalid(err error, ok bool, what string) {
	if errors.Is(err, system.ErrInvalidInput) && ok {
		w.tally.invalidOK++
		return
	}
	w.fail("%s: %v", what, err)
}

func (w *cancelWorker) name(kind string) string {
	w.seq++
	return fmt.Sprintf("c%02d-%s%d", w.id, kind, w.seq)
}

func (w *cancelWorker) loc() string { return stressLocations[w.r.IntN(len(stressLocations))] }

func (w *cancelWorker) step() {
	sys := w.sys
	n := w.r.IntN(100)
	if n >= 3 && n < 10 && len(w.own) >= 8 {
		n = 12 + w.r.IntN(12) // enough values of our own: place instead
	}
	switch {
	case n < 3: // inject a fault
		kinds := []cuda.FaultKind{cuda.FaultAlloc, cuda.FaultCopy, cuda.FaultReconstruct}
		testsys.Faults(sys).Arm(kinds[w.r.IntN(len(kinds))], w.loc())
		w.tally.armed++
	case n < 10:
		w.register()
	case n < 12: // adopt a registration whose caller gave up
		if len(w.lost) == 0 {
			return
		}
		i := w.r.IntN(len(w.lost))
		v := w.lost[i]
		var h system.Handle
		_, gaveUp, err := w.do("lookup", false, func(ctx context.Context) error {
			var err error
			h, err = sys.Lookup(ctx, v.h.Name)
			return err
		})
		switch {
		case err == nil:
			v.h = h
			w.own = append(w.own, v)
			w.shared.add(v)
			w.lost = append(w.lost[:i], w.lost[i+1:]...)
		case gaveUp:
		default: // never registered (refused, or its initialization failed)
			w.expectInvalid(err, true, "lookup")
			w.lost = append(w.lost[:i], w.lost[i+1:]...)
		}
	case n < 24:
		if v := w.shared.pick(w.r); v != nil {
			at := w.loc()
			w.do("place", false, func(ctx context.Context) error { return sys.Place(ctx, v.h, at) })
		}
	case n < 28:
		if v := w.shared.pick(w.r); v != nil {
			from, to := w.loc(), w.loc()
			w.do("copy", false, func(ctx context.Context) error { return sys.Copy(ctx, v.h, from, to) })
		}
	case n < 32:
		if v := w.shared.pick(w.r); v != nil {
			from, to := w.loc(), w.loc()
			w.do("move", false, func(ctx context.Context) error { return sys.Move(ctx, v.h, from, to) })
		}
	case n < 37:
		if v := w.shared.pick(w.r); v != nil {
			at := w.loc()
			w.do("evict", false, func(ctx context.Context) error { return sys.Evict(ctx, v.h, at) })
		}
	case n < 39: // discard one of ours
		if len(w.own) > 0 {
			i := w.r.IntN(len(w.own))
			v := w.own[i]
			if _, _, err := w.do("discard", false, func(ctx context.Context) error { return sys.Discard(ctx, v.h) }); err == nil {
				w.own = append(w.own[:i], w.own[i+1:]...)
				w.shared.remove(v)
			}
		}
	case n < 48:
		w.acquire()
	case n < 52:
		if len(w.leases) > 0 {
			w.releaseLease(w.r.IntN(len(w.leases)))
		}
	case n < 57:
		w.recordEvent()
	case n < 59: // complete some events (the worker's own work finishing)
		if len(w.manual) > 0 {
			w.manual[w.r.IntN(len(w.manual))].Complete()
		}
		if len(w.gates) > 0 {
			w.gates[w.r.IntN(len(w.gates))].Complete()
		}
	case n < 61: // wait for an event to be reaped (never unbounded while it is incomplete)
		if len(w.recorded) > 0 {
			e := w.recorded[w.r.IntN(len(w.recorded))]
			w.do("wait reaped", !e.ev.Query(), func(ctx context.Context) error { return sys.WaitReaped(ctx, e.id) })
		}
	case n < 67:
		if len(w.holds) > 0 && (len(w.holds) >= 3 || w.r.IntN(2) == 0) {
			w.releaseHold(w.r.IntN(len(w.holds)))
			return
		}
		if v := w.shared.pick(w.r); v != nil {
			at := w.loc()
			var hd *system.Hold
			if _, _, err := w.do("hold", false, func(ctx context.Context) error {
				var err error
				hd, err = sys.Hold(ctx, v.h, at)
				return err
			}); err == nil {
				w.holds = append(w.holds, &cancelHold{h: hd})
			}
		}
	case n < 73:
		if len(w.resv) > 0 && (len(w.resv) >= 3 || w.r.IntN(2) == 0) {
			w.unreserve(w.anyReservation())
			return
		}
		name, at, bytes := w.name("r"), w.loc(), int64(256*(1+w.r.IntN(16)))
		_, gaveUp, err := w.do("reserve", false, func(ctx context.Context) error { return sys.Reserve(ctx, at, name, bytes) })
		if err == nil || gaveUp {
			w.resv[name] = err == nil
		}
	case n < 79: // the atomic decide-and-enter
		req := w.request()
		if req == nil {
			return
		}
		var sc *system.Scope
		if _, _, err := w.do("admit", false, func(ctx context.Context) error {
			var err error
			sc, _, err = sys.Admit(ctx, *req)
			return err
		}); err == nil {
			w.keepOrExit(sc)
		}
	case n < 83: // the two-step path: decide, then enter the decision's scope
		req := w.request()
		if req == nil {
			return
		}
		var d system.Decision
		if _, _, err := w.do("decide", false, func(ctx context.Context) error {
			var err error
			d, err = sys.Decide(ctx, *req)
			return err
		}); err != nil {
			return
		}
		sc := sys.ScopeFor(d)
		if _, _, err := w.do("scope enter", false, sc.Enter); err == nil {
			w.keepOrExit(sc)
		}
	case n < 86: // a scope of our own plan
		if len(w.own) == 0 {
			return
		}
		sc := sys.NewScope(w.plan())
		if _, _, err := w.do("scope enter", false, sc.Enter); err == nil {
			w.keepOrExit(sc)
		}
	case n < 89:
		if len(w.scopes) > 0 {
			i := w.r.IntN(len(w.scopes))
			sc := w.scopes[i]
			w.scopes = append(w.scopes[:i], w.scopes[i+1:]...)
			w.exitScope(sc)
		}
	case n < 93:
		if len(w.own) == 0 {
			return
		}
		plan := w.plan()
		_, gaveUp, err := w.do("execute", false, func(ctx context.Context) error {
			_, err := sys.Execute(ctx, plan)
			return err
		})
		var pe *system.PlanExecutionError
		if err == nil || gaveUp || errors.As(err, &pe) {
			for _, r := range plan.Reservations {
				w.resv[r.Name] = err == nil // after a failed step, admitted or not
			}
		}
	case n < 96: // a read that acquires and releases inside
		if v := w.shared.pick(w.r); v != nil {
			at := w.loc()
			var got []byte
			if _, _, err := w.do("read", false, func(ctx context.Context) error {
				var err error
				got, err = sys.Read(ctx, v.h, at)
				return err
			}); err == nil && string(got) != string(v.data) {
				w.fail("read %s at %s: bytes differ", v.h.Name, at)
			}
		}
	default:
		var s system.Snapshot
		if _, _, err := w.do("snapshot", false, func(ctx context.Context) error {
			var err error
			s, err = sys.Snapshot(ctx)
			return err
		}); err == nil {
			if err := checkInvariants(s); err != nil {
				w.fail("snapshot: %v", err)
			}
		}
	}
}

func (w *cancelWorker) register() {
	size := 256 * (1 + w.r.IntN(16))
	v := &stressValue{data: pattern(size, byte(w.r.Uint32())), mode: system.Exclusive}
	if w.r.IntN(2) == 0 {
		v.mode = system.Replicable
	}
	spec := system.Value{Name: w.name("v"), Bytes: int64(size), Mode: v.mode}
	if w.r.IntN(2) == 0 {
		spec.At, spec.Data = w.loc(), v.data
	} else {
		spec.Source, spec.Loader = w.loc(), loaderOf(v.data)
	}
	var h system.Handle
	_, gaveUp, err := w.do("register", false, func(ctx context.Context) error {
		var err error
		h, err = w.sys.Register(ctx, spec)
		return err
	})
	switch {
	case err == nil:
		v.h = h
		w.own = append(w.own, v)
		w.shared.add(v)
	case gaveUp:
		v.h.Name = spec.Name
		w.lost = append(w.lost, v)
	}
}

func (w *cancelWorker) acquire() {
	v := w.shared.pick(w.r)
	if v == nil {
		return
	}
	at := w.loc()
	if w.r.IntN(2) == 0 {
		if _, _, err := w.do("place", false, func(ctx context.Context) error { return w.sys.Place(ctx, v.h, at) }); err != nil {
			return
		}
	}
	var l *system.Lease
	if _, _, err := w.do("acquire", false, func(ctx context.Context) error {
		var err error
		l, err = w.sys.Acquire(ctx, v.h, at)
		return err
	}); err != nil {
		return
	}
	if got, err := l.Read(context.Background()); err != nil {
		w.fail("read %s at %s through a lease: %v", v.h.Name, at, err)
	} else if string(got) != string(v.data) {
		w.fail("read %s at %s through a lease: bytes differ", v.h.Name, at)
	}
	w.leases = append(w.leases, &cancelLease{l: l, v: v})
	if len(w.leases) > 3 || w.r.IntN(2) == 0 {
		w.releaseLease(len(w.leases) - 1)
	}
}

func (w *cancelWorker) releaseLease(i int) {
	cl := w.leases[i]
	_, gaveUp, err := w.do("release", false, cl.l.Release)
	if gaveUp {
		cl.maybe = true // sent or not: a later release tells
		return
	}
	if err != nil {
		w.expectInvalid(err, cl.maybe, "release of a lease")
	}
	w.leases = append(w.leases[:i], w.leases[i+1:]...)
}

func (w *cancelWorker) releaseHold(i int) {
	ch := w.holds[i]
	_, gaveUp, err := w.do("unhold", false, ch.h.Release)
	if gaveUp {
		ch.maybe = true
		return
	}
	if err != nil {
		w.expectInvalid(err, ch.maybe, "release of a hold")
	}
	w.holds = append(w.holds[:i], w.holds[i+1:]...)
}

func (w *cancelWorker) anyReservation() string {
	names := make([]string, 0, len(w.resv))
	for n := range w.resv {
		names = append(names, n)
	}
	sort.Strings(names)
	return names[w.r.IntN(len(names))]
}

func (w *cancelWorker) unreserve(name string) {
	_, gaveUp, err := w.do("unreserve", false, func(ctx context.Context) error { return w.sys.Unreserve(ctx, name) })
	if gaveUp {
		w.resv[name] = false
		return
	}
	if err != nil {
		w.expectInvalid(err, !w.resv[name], "unreserve "+name)
	}
	delete(w.resv, name)
}

// recordEvent records a consumer event on a lease we hold: a manual event,
// or an event of a soft stream held back by a gate until we complete it.
func (w *cancelWorker) recordEvent() {
	var cl *cancelLease
	for _, x := range w.leases {
		if !x.maybe {
			cl = x
		}
	}
	if cl == nil || len(w.recorded) > 40 {
		return
	}
	var ev cuda.Event
	if w.r.IntN(2) == 0 {
		me := system.NewManualEvent()
		w.manual = append(w.manual, me)
		ev = me
	} else {
		gate := system.NewManualEvent()
		if err := w.stream.WaitEvent(gate); err != nil {
			w.fail("stream wait: %v", err)
			return
		}
		se, err := w.stream.Record()
		if err != nil {
			w.fail("stream record: %v", err)
			return
		}
		w.gates = append(w.gates, gate)
		ev = se
	}
	var id system.EventID
	if _, _, err := w.do("record event", false, func(ctx context.Context) error {
		var err error
		id, err = cl.l.RecordEvent(ctx, ev)
		return err
	}); err == nil {
		w.recorded = append(w.recorded, cancelEvent{id: id, ev: ev})
	}
}

func (w *cancelWorker) keepOrExit(sc *system.Scope) {
	if len(w.scopes) < 2 && w.r.IntN(2) == 0 {
		w.scopes = append(w.scopes, sc)
		return
	}
	w.exitScope(sc)
}

// exitScope exits an entered scope. If the caller gave up, it retries with
// a live context: either the first exit went through (the retry is invalid
// input: already exited) or it did not (the retry exits).
func (w *cancelWorker) exitScope(sc *system.Scope) {
	kind, gaveUp, err := w.do("scope exit", false, sc.Exit)
	if !gaveUp {
		if err != nil {
			w.fail("exit of %s: %v", sc.Name(), err)
		}
		return
	}
	err = w.live("scope exit (retry)", sc.Exit)
	if err != nil {
		w.expectInvalid(err, true, "retried exit of "+sc.Name())
		if kind == cancelCtxDone {
			// The first exit was refused before anything was sent (its
			// context was done), and the retry is refused too: nobody
			// can release this scope's leases and reservations now.
			w.tally.exitLost++
		}
	}
}

// plan is randomPlan (tests/stress_test.go) over our own values.
func (w *cancelWorker) plan() system.Plan {
	return randomPlan(w.r, w.own, w.loc, func() string { return w.name("p") })
}

func (w *cancelWorker) request() *system.Request {
	if len(w.own) == 0 {
		return nil
	}
	return randomRequest(w.r, w.own, w.name("q"), func() []system.ReservationSpec {
		if w.r.IntN(3) == 0 {
			return []system.ReservationSpec{{Name: w.name("qr"), Location: w.loc(), Bytes: int64(256 * (1 + w.r.IntN(4)))}}
		}
		return nil
	})
}

// finish releases everything the worker knows it holds, completes every
// event it handed to the runtime and waits for the recorded ones to be
// reaped, all with live contexts.
func (w *cancelWorker) finish() {
	for _, e := range w.manual {
		e.Complete()
	}
	for _, g := range w.gates {
		g.Complete()
	}
	for _, cl := range w.leases {
		if err := w.live("release", cl.l.Release); err != nil {
			w.expectInvalid(err, cl.maybe, "final release of a lease")
		}
	}
	for _, ch := range w.holds {
		if err := w.live("unhold", ch.h.Release); err != nil {
			w.expectInvalid(err, ch.maybe, "final release of a hold")
		}
	}
	for _, sc := range w.scopes {
		if err := w.live("scope exit", sc.Exit); err != nil {
			w.fail("final exit of %s: %v", sc.Name(), err)
		}
	}
	names := make([]string, 0, len(w.resv))
	for n := range w.resv {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := w.live("unreserve", func(ctx context.Context) error { return w.sys.Unreserve(ctx, n) }); err != nil {
			w.expectInvalid(err, !w.resv[n], "final unreserve of "+n)
		}
	}
	for _, e := range w.recorded {
		if err := w.live("wait reaped", func(ctx context.Context) error { return w.sys.WaitReaped(ctx, e.id) }); err != nil {
			w.fail("event %d completed but not reaped: %v", e.id, err)
		}
	}
	w.leases, w.holds, w.scopes, w.resv = nil, nil, nil, map[string]bool{}
}

// cancelQuiet says why the state is not quiet yet: a materialization in
// flight or protected (a use, hold or pending event), a temporary charge or
// a reservation left.
func cancelQuiet(s system.Snapshot) error {
	for _, v := range s.Values {
		for _, m := range v.Materializations {
			if m.State != system.Resident || m.UseCount != 0 || m.HoldCount != 0 || m.PendingEventCount != 0 {
				return fmt.Errorf("%s at %s: state %s, %d uses, %d holds, %d pending events", v.Handle.Name, m.Location, m.State, m.UseCount, m.HoldCount, m.PendingEventCount)
			}
		}
	}
	for _, l := range s.Locations {
		if l.TemporaryBytes != 0 || l.ReservedBytes != 0 {
			return fmt.Errorf("%s: %d temporary bytes, %d reserved bytes %+v", l.Location, l.TemporaryBytes, l.ReservedBytes, l.Reservations)
		}
	}
	return nil
}

func formatCancelCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	return formatCounts(m)
}

// TestStressCancel: workers doing random operations, every blocking call
// with a context that ends at a random point (already done, right after the
// request was sent, or a deadline of microseconds to milliseconds), faults
// injected now and then, on a soft backend whose capacity equals the
// budgets and whose copies take time. A checker takes snapshots all along.
// At the end nothing may be left: no protection, every materialization
// removable, Close without outstanding items, zero bytes everywhere.
func TestStressCancel(t *testing.T) {
	workers, opsPer, minSnapshots := 16, 800, 200
	if testing.Short() {
		workers, opsPer, minSnapshots = 8, 150, 20
	}
	ctx := context.Background()
	var locs []system.LocationConfig
	for _, l := range stressLocations {
		locs = append(locs, system.Limit(l, cancelBudgets[l]))
	}
	sb, err := soft.New(soft.Config{Locations: stressLocations, Capacity: cancelBudgets, BandwidthBytesPerSec: 8 << 20})
	require.NoError(t, err)
	backend := &oomCountingBackend{Backend: sb}
	defer backend.Close()
	for _, l := range stressLocations {
		mi, err := backend.MemInfo(l)
		require.NoError(t, err)
		require.Equal(t, cancelBudgets[l], mi.TotalBytes, "%s: capacity equals budget", l)
	}
	sys, err := system.Start(ctx, system.Options{Locations: locs, Backend: faulty.Wrap(backend, soft.ErrorPrefix), TraceCapacity: 256})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sys.Close(context.Background()) })
	began := time.Now()

	// The checker: every snapshot consistent, no location's device above
	// its budget, versions never going back; it counts the snapshots that
	// catch a transfer in flight.
	var workersDone atomic.Bool
	checkResult := make(chan error, 1)
	var snapshots, inFlight atomic.Int64
	go func() {
		var last uint64
		for {
			running := !workersDone.Load()
			s, err := sys.Snapshot(ctx)
			if err != nil {
				checkResult <- fmt.Errorf("snapshot: %w", err)
				return
			}
			snapshots.Add(1)
			if s.StateVersion < last {
				checkResult <- fmt.Errorf("state version went back from %d to %d", last, s.StateVersion)
				return
			}
			last = s.StateVersion
			if err := checkInvariants(s); err != nil {
				checkResult <- err
				return
			}
			for _, l := range stressLocations {
				mi, err := backend.MemInfo(l)
				if err == nil && mi.UsedBytes > cancelBudgets[l] {
					err = fmt.Errorf("the device holds %d bytes, budget %d", mi.UsedBytes, cancelBudgets[l])
				}
				if err != nil {
					checkResult <- fmt.Errorf("%s: %w", l, err)
					return
				}
			}
		flight:
			for _, v := range s.Values {
				for _, m := range v.Materializations {
					if m.State != system.Resident {
						inFlight.Add(1)
						break flight
					}
				}
			}
			if !running {
				checkResult <- nil
				return
			}
		}
	}()

	seed := uint64(time.Now().UnixNano())
	t.Logf("stress cancel: seed %d", seed)
	shared := &stressShared{}
	ws := make([]*cancelWorker, workers)
	var wg sync.WaitGroup
	for g := range ws {
		st, err := backend.NewStream("cuda:0")
		require.NoError(t, err)
		w := &cancelWorker{id: g, r: rand.New(rand.NewPCG(seed, uint64(g))), sys: sys, shared: shared,
			tally: newCancelTally(), stream: st, resv: map[string]bool{}}
		ws[g] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range opsPer {
				w.step()
			}
			w.finish()
		}()
	}
	wg.Wait()
	workersDone.Store(true)
	checkErr := <-checkResult
	ran := time.Since(began)
	for _, w := range ws {
		require.NoError(t, w.stream.Close(), "worker %d: its stream", w.id)
	}

	total := newCancelTally()
	for _, w := range ws {
		total.merge(w.tally)
	}
	t.Logf("stress cancel: %d workers × %d ops in %v; %d snapshots checked, %d with a transfer in flight; %d allocations, %d faults armed",
		workers, opsPer, ran.Round(time.Millisecond), snapshots.Load(), inFlight.Load(), backend.allocs.Load(), total.armed)
	t.Logf("stress cancel: calls by op: %s", formatCancelCounts(total.calls))
	t.Logf("stress cancel: successes by op: %s", formatCancelCounts(total.ok))
	t.Logf("stress cancel: calls by context: %s", formatCancelCounts(total.kinds))
	t.Logf("stress cancel: gave up (returned the context's error) by context: %s; by op: %s", formatCancelCounts(total.cancelled), formatCancelCounts(total.abandoned))
	t.Logf("stress cancel: succeeded although their context ended: %s", formatCancelCounts(total.survived))
	t.Logf("stress cancel: errors by type: %s; plan execution causes: %s; expected invalid input %d", formatCancelCounts(total.errs), formatCancelCounts(total.causes), total.invalidOK)

	require.NoError(t, checkErr, "snapshot checker")
	for _, f := range total.failures {
		t.Error(f)
	}
	for _, u := range total.untyped {
		t.Errorf("untyped error: %s", u)
	}
	assert.Zero(t, backend.ooms.Load(), "out-of-memory errors from the backend (physical above admitted): %v", backend.first)
	assert.Zero(t, total.ooms, "out-of-memory errors returned to callers")
	assert.Equal(t, total.invalidOK, total.errs["InvalidInputError"], "every invalid-input answer must be one the test expects")
	assert.Zero(t, total.exitLost, "Scope.Exit with a done context marked the scope exited without releasing it (see TestStressCancelScopeExitWithDoneContext)")
	assert.GreaterOrEqual(t, snapshots.Load(), int64(minSnapshots), "snapshots checked while the workers ran")
	assert.Positive(t, inFlight.Load(), "no snapshot caught a transfer in flight")
	for _, k := range cancelCtxKinds {
		assert.Positive(t, total.cancelled[k], "no call gave up with a %s context: the test exercised nothing", k)
	}
	if !testing.Short() {
		for op := range total.calls {
			if op != "scope exit (retry)" {
				assert.Positive(t, total.abandoned[op], "no %s call gave up: its cancellations were not exercised", op)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every worker stopped and released what it knew of; every event is
	// complete. What abandoned calls took must be handed back by the
	// runtime itself: wait for a state without any protection.
	testsys.Faults(sys).Reset()
	waitUntil(t, sys, "no protection, transfer, temporary charge or reservation left", cancelQuiet)

	// Every materialization is removable: discard half the values, and
	// evict all but one materialization of the others (Close frees those).
	s := snapshot(t, sys)
	discarded, evicted, live := 0, 0, 0
	for _, v := range s.Values {
		live++
		if live%2 == 0 {
			require.NoError(t, sys.Discard(ctx, v.Handle), "discard %s", v.Handle.Name)
			discarded++
			continue
		}
		for _, m := range v.Materializations[:max(0, len(v.Materializations)-1)] {
			require.NoError(t, sys.Evict(ctx, v.Handle, m.Location), "evict %s at %s", v.Handle.Name, m.Location)
			evicted++
		}
	}
	left := snapshot(t, sys)
	require.NoError(t, cancelQuiet(left))
	kept := 0
	for _, v := range left.Values {
		assert.LessOrEqual(t, len(v.Materializations), 1, "%s", v.Handle.Name)
		kept += len(v.Materializations)
	}
	t.Logf("stress cancel: at the end %d live values: %d discarded, %d materializations evicted, %d left for Close", live, discarded, evicted, kept)

	require.NoError(t, sys.Close(ctx), "close: nothing may be outstanding")
	final, err := sys.Snapshot(ctx)
	require.NoError(t, err)
	require.NoError(t, checkInvariants(final))
	for _, l := range final.Locations {
		assert.Zero(t, l.UsedBytes+l.ReservedBytes+l.TemporaryBytes, "%s after close: %+v", l.Location, l)
	}
	for _, l := range stressLocations {
		assert.Zero(t, backendUsed(t, backend, l), "%s: the device still holds bytes after close", l)
	}
	assert.Zero(t, backend.ooms.Load(), "out-of-memory errors from the backend: %v", backend.first)
	require.NoError(t, backend.Close())
	t.Logf("stress cancel: total %v", time.Since(began).Round(time.Millisecond))
}

// Scope.Exit with a context that is already done returns the context's
// error without sending anything, yet marks the scope exited: a retry is
// refused as invalid input, and the scope's leases and reservations stay
// until Close (which reports the leases as outstanding). The caller can
// never release them.
func TestStressCancelScopeExitWithDoneContext(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1<<20)})
	h := register(t, sys, system.Value{Name: "v", Bytes: 1024, Source: "pageable-host", Loader: loaderOf(pattern(1024, 1))})
	sc := sys.NewScope(system.Plan{
		Reservations: []system.ReservationSpec{{Name: "scratch", Location: "cuda:0", Bytes: 100}},
		Enter:        []system.Action{{Handle: h, Location: "cuda:0"}},
	})
	require.NoError(t, sc.Enter(ctx))
	require.ErrorIs(t, sc.Exit(cancelDoneCtx), context.Canceled)
	// Either the exit happened anyway (a retry is invalid input) or it
	// did not (a retry exits): in both cases nothing may stay protected.
	if err := sc.Exit(ctx); err != nil {
		require.ErrorIs(t, err, system.ErrInvalidInput)
	}
	// Both calls were made by this goroutine before the snapshot's
	// request: the snapshot sees whatever they did.
	s := snapshot(t, sys)
	assert.Zero(t, mats(t, s, "v")["cuda:0"].UseCount, "v at cuda:0 is still leased by a scope nobody can exit")
	assert.Zero(t, loc(t, s, "cuda:0").ReservedBytes, "the scope's reservation is still active")
	require.NoError(t, sys.Evict(ctx, h, "cuda:0"))
	require.NoError(t, sys.Close(ctx), "nothing outstanding at close")
}
