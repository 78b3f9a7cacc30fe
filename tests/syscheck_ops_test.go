package tests

// The system checker's workers (syscheck_test.go): random calls on the
// runtime's values, every one recorded for the residency model.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// scValue is a registered value and the bytes it always reads as.
type scValue struct {
	h    system.Handle
	data []byte
	excl bool
	src  bool
}

type scValues struct {
	mu   sync.Mutex
	next atomic.Int64
	list []*scValue
}

func (s *scValues) add(v *scValue) {
	s.mu.Lock()
	s.list = append(s.list, v)
	s.mu.Unlock()
}

func (s *scValues) remove(v *scValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.list {
		if x == v {
			s.list = append(s.list[:i], s.list[i+1:]...)
			return
		}
	}
}

func (s *scValues) pick(r *rand.Rand) *scValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.list) == 0 {
		return nil
	}
	return s.list[r.IntN(len(s.list))]
}

func (s *scValues) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.list)
}

type scHeld struct {
	val, loc string
	pid      int
	lease    *system.Lease
	hold     *system.Hold
}

type scHeldScope struct {
	sc      *system.Scope
	entries []scHeld
}

// scWorker is one goroutine of random calls.
type scWorker struct {
	id     int
	r      *rand.Rand
	rd     *scRound
	calls  int64
	leases []scHeld
	holds  []scHeld
	scopes []scHeldScope
	resv   map[string]bool // name → known to be active (false: maybe)
	cache  []scCacheHeld
	seq    int
}

func (w *scWorker) loc() string { return scLocs[w.r.IntN(len(scLocs))] }

// ctxAny is a context that may end before the call, during it by a short
// deadline, right after its request was sent, or by a cancel from another
// goroutine, or never.
func (w *scWorker) ctxAny() (context.Context, context.CancelFunc) {
	switch n := w.r.IntN(100); {
	case n < 45:
		return context.Background(), func() {}
	case n < 60:
		return cancelDoneCtx, func() {}
	case n < 75:
		return context.WithTimeout(context.Background(), time.Duration(1+w.r.IntN(2000))*time.Microsecond)
	case n < 85:
		return newEndsAfterSend(), func() {} // live when sent, done while it waits
	default:
		ctx, cancel := context.WithCancel(context.Background())
		select {
		case w.rd.cancels <- cancel:
		default:
			cancel()
		}
		return ctx, cancel
	}
}

// ctxSafe never ends during the call: live, or done before it (the call
// then does nothing). Calls that take a protection use it: one granted to
// a caller who gave up is released by the runtime at a time nobody
// observes, which no model can place.
func (w *scWorker) ctxSafe() context.Context {
	if w.r.IntN(100) < 15 {
		return cancelDoneCtx
	}
	return context.Background()
}

// record records a call on one value and returns its result.
func (w *scWorker) record(call int64, in rmInput, err error) string {
	w.calls++
	res := scClassify(err)
	if res == resRefused && err != nil && errorType(err) == "" && !errors.Is(err, system.ErrBusy) {
		w.rd.fail("worker %d: %s of %s: untyped error %T: %v", w.id, in.op, in.val, err, err)
	}
	if res == resInvalid && in.op != "release" && in.op != "unhold" {
		w.rd.fail("worker %d: %s of %s: invalid input: %v", w.id, in.op, in.val, err)
	}
	w.rd.hist.add(w.id, call, in, res, res == resUnknown)
	return res
}

func (w *scWorker) step() {
	sys, h := w.rd.sys, w.rd.hist
	n := w.r.IntN(100)
	if n >= 3 && n < 9 && w.rd.values.size() > 24 {
		n = 9 + w.r.IntN(30)
	}
	v := w.rd.values.pick(w.r)
	if v == nil && n >= 9 && n < 60 {
		n = 3
	}
	switch {
	case n < 3:
		kinds := []cuda.FaultKind{cuda.FaultAlloc, cuda.FaultCopy, cuda.FaultReconstruct}
		k := kinds[w.r.IntN(len(kinds))]
		testsys.Faults(sys).Arm(k, w.loc())
		w.rd.count("arm "+k.String(), nil)
	case n < 9:
		w.register()
	case n < 20:
		ctx, cancel := w.ctxAny()
		in := rmInput{op: "place", val: v.h.Name, loc: scLocIndex(w.loc())}
		call := h.now()
		w.record(call, in, sys.Place(ctx, v.h, scLocs[in.loc]))
		cancel()
	case n < 23:
		ctx, cancel := w.ctxAny()
		in := rmInput{op: "copy", val: v.h.Name, from: scLocIndex(w.loc()), loc: scLocIndex(w.loc())}
		call := h.now()
		w.record(call, in, sys.Copy(ctx, v.h, scLocs[in.from], scLocs[in.loc]))
		cancel()
	case n < 27:
		ctx, cancel := w.ctxAny()
		in := rmInput{op: "move", val: v.h.Name, from: scLocIndex(w.loc()), loc: scLocIndex(w.loc())}
		call := h.now()
		w.record(call, in, sys.Move(ctx, v.h, scLocs[in.from], scLocs[in.loc]))
		cancel()
	case n < 35:
		ctx, cancel := w.ctxAny()
		in := rmInput{op: "evict", val: v.h.Name, loc: scLocIndex(w.loc())}
		call := h.now()
		w.record(call, in, sys.Evict(ctx, v.h, scLocs[in.loc]))
		cancel()
	case n < 37:
		ctx, cancel := w.ctxAny()
		call := h.now()
		if w.record(call, rmInput{op: "discard", val: v.h.Name}, sys.Discard(ctx, v.h)) == resOK {
			w.rd.values.remove(v)
		}
		cancel()
	case n < 47:
		w.acquire(v)
	case n < 52:
		w.hold(v)
	case n < 60:
		w.admit(v)
	case n < 66:
		w.release()
	case n < 72:
		w.reserve()
	default:
		w.rd.cache.step(w)
	}
}

func (w *scWorker) register() {
	size := 512 * (1 + w.r.IntN(8))
	name := fmt.Sprintf("v%d", w.rd.values.next.Add(1))
	v := &scValue{data: pattern(size, byte(w.r.Uint32())), excl: w.r.IntN(2) == 0}
	spec := system.Value{Name: name, Bytes: int64(size), Mode: system.Replicable}
	if v.excl {
		spec.Mode = system.Exclusive
	}
	in := rmInput{op: "register", val: name, at: -1, exclusive: v.excl}
	if w.r.IntN(3) == 0 {
		spec.At, spec.Data = w.loc(), v.data
		in.at = scLocIndex(spec.At)
	} else {
		spec.Source, spec.Loader = []string{"pageable-host", "pinned-host"}[w.r.IntN(2)], loaderOf(v.data)
		v.src, in.hasSource = true, true
	}
	call := w.rd.hist.now()
	hd, err := w.rd.sys.Register(context.Background(), spec)
	w.calls++
	if err != nil {
		return // no value: nothing to record
	}
	v.h = hd
	w.rd.hist.add(w.id, call, in, resOK, false)
	w.rd.values.add(v)
}

// acquire takes a lease, reads the bytes through it, sometimes records a
// consumer event on it (completed and reaped before the release, so that
// events never protect past the lease here), and keeps it or releases it.
func (w *scWorker) acquire(v *scValue) {
	sys := w.rd.sys
	in := rmInput{op: "acquire", val: v.h.Name, loc: scLocIndex(w.loc())}
	if w.r.IntN(2) == 0 { // place it there first, most of the time with a live context
		ctx, cancel := w.ctxAny()
		call := w.rd.hist.now()
		w.record(call, rmInput{op: "place", val: v.h.Name, loc: in.loc}, sys.Place(ctx, v.h, scLocs[in.loc]))
		cancel()
	}
	call := w.rd.hist.now()
	l, err := sys.Acquire(w.ctxSafe(), v.h, scLocs[in.loc])
	if w.record(call, in, err) != resOK {
		return
	}
	held := scHeld{val: v.h.Name, loc: scLocs[in.loc], lease: l}
	held.pid = w.rd.prot.add(scEndpoint{held.val, held.loc})
	ctx := context.Background()
	got, err := l.Read(ctx)
	if err != nil || string(got) != string(v.data) {
		w.rd.fail("worker %d: read %s at %s through a lease: %v (bytes equal: %v)", w.id, v.h.Name, held.loc, err, string(got) == string(v.data))
	}
	var ev scEvent
	var evPid int
	var evID system.EventID
	if w.r.IntN(3) == 0 {
		ev = newSCEvent(w.r.IntN(3) == 0)
		in := rmInput{op: "event", val: held.val, loc: in.loc}
		call := w.rd.hist.now()
		id, err := l.RecordEvent(ctx, ev)
		if w.record(call, in, err) != resOK {
			w.rd.fail("worker %d: record event on %s: %v", w.id, v.h.Name, err)
			ev = nil
		} else {
			evID, evPid = id, w.rd.prot.add(scEndpoint{held.val, held.loc})
		}
	}
	if ev != nil && w.r.IntN(2) == 0 {
		w.reap(ev, evID, evPid, held) // completed and reaped under the lease
		ev = nil
	}
	if ev != nil || len(w.leases) >= 3 || w.r.IntN(2) == 0 {
		w.releaseOne(held, "release")
		if ev != nil {
			w.reap(ev, evID, evPid, held) // it protects past the release until reaped
		}
		return
	}
	w.leases = append(w.leases, held)
}

// reap completes a recorded consumer event (as failed, for some) and
// waits until the runtime reaped it: its protection ends somewhere
// between the completion and the reply.
func (w *scWorker) reap(ev scEvent, id system.EventID, pid int, held scHeld) {
	w.rd.prot.remove(pid)
	call := w.rd.hist.now()
	ev.complete()
	err := w.rd.sys.WaitReaped(context.Background(), id)
	if w.record(call, rmInput{op: "reaped", val: held.val, loc: scLocIndex(held.loc)}, err) != resOK {
		w.rd.fail("worker %d: wait reaped %d: %v", w.id, id, err)
	}
}

// scEvent is a consumer event the worker completes; a failed one reports
// an error when done (a stream's failure), and must be reaped all the same.
type scEvent interface {
	cuda.Event
	complete()
}

type scManualEvent struct{ *system.ManualEvent }

func (e scManualEvent) complete() { e.Complete() }

type scFailedEvent struct{ *stGate }

func (e scFailedEvent) complete()  { e.open() }
func (e scFailedEvent) Err() error { return errors.New("syscheck: the consumer stream failed") }

func newSCEvent(failed bool) scEvent {
	if failed {
		return scFailedEvent{newStGate()}
	}
	return scManualEvent{system.NewManualEvent()}
}

func (w *scWorker) hold(v *scValue) {
	in := rmInput{op: "hold", val: v.h.Name, loc: scLocIndex(w.loc())}
	call := w.rd.hist.now()
	hd, err := w.rd.sys.Hold(w.ctxSafe(), v.h, scLocs[in.loc])
	if w.record(call, in, err) != resOK {
		return
	}
	held := scHeld{val: v.h.Name, loc: scLocs[in.loc], hold: hd}
	held.pid = w.rd.prot.add(scEndpoint{held.val, held.loc})
	w.holds = append(w.holds, held)
}

// releaseOne lets a lease or hold go; a release whose context ended is
// retried with a live one (ok, or invalid input if the first happened).
func (w *scWorker) releaseOne(x scHeld, op string) {
	w.rd.prot.remove(x.pid)
	rel := func(ctx context.Context) error {
		if x.lease != nil {
			return x.lease.Release(ctx)
		}
		return x.hold.Release(ctx)
	}
	in := rmInput{op: op, val: x.val, loc: scLocIndex(x.loc)}
	ctx, cancel := w.ctxAny()
	defer cancel()
	retry := false
	for {
		call := w.rd.hist.now()
		res := w.record(call, in, rel(ctx))
		switch res {
		case resOK:
			return
		case resUnknown:
			if !retry {
				ctx, retry = context.Background(), true
				continue
			}
		case resInvalid:
			if retry {
				return // the first, abandoned release happened
			}
		}
		w.rd.fail("worker %d: %s of %s at %s: %s", w.id, op, x.val, x.loc, res)
		return
	}
}

func (w *scWorker) release() {
	switch {
	case len(w.leases) > 0 && w.r.IntN(2) == 0:
		i := w.r.IntN(len(w.leases))
		x := w.leases[i]
		w.leases = append(w.leases[:i], w.leases[i+1:]...)
		w.releaseOne(x, "release")
	case len(w.holds) > 0 && w.r.IntN(2) == 0:
		i := w.r.IntN(len(w.holds))
		x := w.holds[i]
		w.holds = append(w.holds[:i], w.holds[i+1:]...)
		w.releaseOne(x, "unhold")
	case len(w.scopes) > 0:
		i := w.r.IntN(len(w.scopes))
		x := w.scopes[i]
		w.scopes = append(w.scopes[:i], w.scopes[i+1:]...)
		w.exit(x)
	}
}

func (w *scWorker) reserve() {
	sys := w.rd.sys
	if w.resv == nil {
		w.resv = map[string]bool{}
	}
	for name := range w.resv {
		if len(w.resv) < 3 && w.r.IntN(2) == 0 {
			break
		}
		ctx, cancel := w.ctxAny()
		err := sys.Unreserve(ctx, name)
		cancel()
		w.calls++
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			err = sys.Unreserve(context.Background(), name)
			if errors.Is(err, system.ErrInvalidInput) {
				err = nil // the abandoned one happened
			}
		}
		if err != nil && (w.resv[name] || !errors.Is(err, system.ErrInvalidInput)) {
			w.rd.fail("worker %d: unreserve %s: %v", w.id, name, err)
		}
		delete(w.resv, name)
		return
	}
	w.seq++
	name := fmt.Sprintf("w%d-r%d", w.id, w.seq)
	ctx, cancel := w.ctxAny()
	err := sys.Reserve(ctx, w.loc(), name, int64(256*(1+w.r.IntN(16))))
	cancel()
	w.calls++
	w.rd.count("reserve", err)
	switch scClassify(err) {
	case resOK:
		w.resv[name] = true
	case resUnknown:
		w.resv[name] = false
	}
}

// admit asks for v (and maybe another value) on a device, with a scope
// reservation now and then, and records on every value its report names
// what the admission committed there.
func (w *scWorker) admit(v *scValue) {
	w.seq++
	req := system.Request{Name: fmt.Sprintf("w%d-q%d", w.id, w.seq)}
	tiers := [][]string{{"cuda:1"}, {"cuda:0"}}
	if w.r.IntN(2) == 0 {
		tiers = [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}
	}
	req.Requirements = []system.Requirement{{Handle: v.h, Tiers: tiers}}
	if o := w.rd.values.pick(w.r); o != nil && o != v && w.r.IntN(3) == 0 {
		req.Requirements = append(req.Requirements, system.Requirement{Handle: o.h, Tiers: tiers})
	}
	if w.r.IntN(4) == 0 {
		req.Reservations = []system.ReservationSpec{{Name: req.Name + "-r", Location: "cuda:1", Bytes: 1024}}
	}
	call := w.rd.hist.now()
	limit := 0 // the default
	if w.r.IntN(5) == 0 {
		limit = 1 + w.r.IntN(3) // a SearchLimitError now and then
	}
	sc, _, err := w.rd.sys.AdmitWithLimit(w.ctxSafe(), req, limit)
	w.calls++
	w.rd.count("admit", err)
	var report system.Report
	var pee *system.PlanExecutionError
	switch {
	case err == nil:
		report = sc.Report()
	case errors.As(err, &pee):
		report = pee.PartialReport
	case errorType(err) == "" && !errors.Is(err, context.Canceled):
		w.rd.fail("worker %d: admit %s: untyped error %T: %v", w.id, req.Name, err, err)
	}
	effects := map[string][]rmEffect{}
	var held []scHeld
	for _, x := range report.Transitions {
		kind := map[string]string{"remove": "remove", "complete": "complete", "acquire": "lease"}[x.Kind]
		if kind == "" {
			continue
		}
		effects[x.Handle] = append(effects[x.Handle], rmEffect{kind: kind, loc: scLocIndex(x.Location)})
		if kind == "lease" {
			held = append(held, scHeld{val: x.Handle, loc: x.Location})
		}
	}
	// The admission commits its steps one at a time (docs/semantics.md,
	// "Scopes": reclaim, reserve, enter step by step, then the leases):
	// each is a call of its own on its value, within the admission's.
	for val, eff := range effects {
		for _, e := range eff {
			w.rd.hist.add(w.id, call, rmInput{op: "admit", val: val, effects: []rmEffect{e}}, resOK, false)
		}
	}
	if err != nil {
		return
	}
	for i := range held {
		held[i].pid = w.rd.prot.add(scEndpoint{held[i].val, held[i].loc})
	}
	x := scHeldScope{sc: sc, entries: held}
	if len(w.scopes) < 2 && w.r.IntN(2) == 0 {
		w.scopes = append(w.scopes, x)
		return
	}
	w.exit(x)
}

func (w *scWorker) exit(x scHeldScope) {
	effects := map[string][]rmEffect{}
	for _, e := range x.entries {
		w.rd.prot.remove(e.pid)
		effects[e.val] = append(effects[e.val], rmEffect{kind: "unlease", loc: scLocIndex(e.loc)})
	}
	call := w.rd.hist.now()
	err := x.sc.Exit(context.Background())
	w.calls++
	if err != nil {
		w.rd.fail("worker %d: exit %s: %v", w.id, x.sc.Name(), err)
		return
	}
	for val, eff := range effects {
		for _, e := range eff {
			w.rd.hist.add(w.id, call, rmInput{op: "exit", val: val, effects: []rmEffect{e}}, resOK, false)
		}
	}
}

// finish lets go of everything the worker holds.
func (w *scWorker) finish() {
	for _, x := range w.leases {
		w.releaseOne(x, "release")
	}
	for _, x := range w.holds {
		w.releaseOne(x, "unhold")
	}
	for _, x := range w.scopes {
		w.exit(x)
	}
	for name, sure := range w.resv {
		err := w.rd.sys.Unreserve(context.Background(), name)
		if err != nil && (sure || !errors.Is(err, system.ErrInvalidInput)) {
			w.rd.fail("worker %d: final unreserve %s: %v", w.id, name, err)
		}
	}
	w.rd.cache.finish(w)
	w.leases, w.holds, w.scopes, w.resv = nil, nil, nil, nil
}
