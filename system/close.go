package system

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/messages"
)

// RunningOp is an operation the runtime started (a load through a value's
// loader, a copy, an initialization, a demotion's copy, a cache entry's
// drop or demotion) that had not returned when Close stopped waiting.
type RunningOp = actors.RunningOp

// ErrAbandoned is the cause (errors.Is) of a transfer that was still
// running when Close stopped waiting for it: the caller waiting for it
// (Place, Copy, Admit...) receives a [*PlanExecutionError] wrapping it.
var ErrAbandoned = actors.ErrAbandoned

// closeGrace bounds Close's own wind-down after its context ended: the
// runtime's actors answering and stopping (they run no user code, so it
// is normally microseconds); only a backend call that ignores its
// context (an allocation) can use it up.
const closeGrace = time.Second

// StillRunningError is returned by Close when its context ended while
// operations the runtime started were still running. Close canceled
// their context, stopped waiting, failed them in the ledger (the callers
// waiting for them got [ErrAbandoned]) and shut everything else down:
// every location's charges are back to zero and every other buffer is
// freed. What it could not free is listed: the buffers each operation
// still holds (it may still write into them) are freed when the
// operation returns; nothing else is left behind.
type StillRunningError struct {
	// Running lists the operations still running, with the bytes each
	// holds by location.
	Running []RunningOp
	// HeldBytes sums Running's held bytes by location: device memory
	// still allocated when Close returned.
	HeldBytes map[string]int64
	// Cause is Close's context's error.
	Cause error
}

func (e *StillRunningError) Error() string {
	ops := make([]string, len(e.Running))
	for i, op := range e.Running {
		ops[i] = op.String()
	}
	held := "nothing"
	if len(e.HeldBytes) > 0 {
		held = actors.BytesByLocation(e.HeldBytes)
	}
	return fmt.Sprintf("residency: closed with %d operations still running (%s), holding %s until they return: %v",
		len(e.Running), strings.Join(ops, "; "), held, e.Cause)
}

// Unwrap returns Cause (context.DeadlineExceeded or context.Canceled).
func (e *StillRunningError) Unwrap() error { return e.Cause }

// OutstandingError is returned by Close when leases, holds or pending
// consumer events were still outstanding. Close released them anyway; the
// error says what the application forgot.
type OutstandingError struct {
	Outstanding Outstanding
}

func (e *OutstandingError) Error() string {
	o := e.Outstanding
	list := func(eps []Endpoint) string {
		out := make([]string, len(eps))
		for i, x := range eps {
			out[i] = fmt.Sprintf("%s@%s", x.Handle, x.Location)
		}
		sort.Strings(out)
		return fmt.Sprint(out)
	}
	return fmt.Sprintf("residency: closed with %d leases %s, %d holds %s and %d pending events %s still outstanding (released at close)",
		len(o.Leases), list(o.Leases), len(o.Holds), list(o.Holds), len(o.Events), list(o.Events))
}

// closerList is what Close closes before the runtime: the components
// opened on it (loader caches).
type closerList struct {
	mu     sync.Mutex
	seq    uint64
	m      map[uint64]closer
	closed bool
}

type closer struct {
	name string
	fn   func(context.Context) error
}

// CloseError is a component's error from its close at [System.Close]
// (see [System.OnClose]).
type CloseError struct {
	Name string // as registered
	Err  error
}

func (e *CloseError) Error() string { return fmt.Sprintf("residency: closing %s: %v", e.Name, e.Err) }

// Unwrap returns Err.
func (e *CloseError) Unwrap() error { return e.Err }

// OnClose registers close, the Close of a component opened on the
// runtime (a loader cache of package system/cache registers itself), to
// be called by [System.Close] before it
// stops the runtime: components close first, the latest registered
// first, each with Close's context, while the runtime still serves their
// calls. An error is returned by Close as a [*CloseError] naming the
// component (joined with Close's own). unregister removes the
// registration (call it when the component is closed by other means; it
// is idempotent). After Close began, close is not registered and
// unregister does nothing: the runtime refuses the component's calls
// anyway (ErrClosed).
func (s *System) OnClose(name string, close func(ctx context.Context) error) (unregister func()) {
	l := s.closers
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || close == nil {
		return func() {}
	}
	if l.m == nil {
		l.m = map[uint64]closer{}
	}
	l.seq++
	id := l.seq
	l.m[id] = closer{name: name, fn: close}
	// unregister holds the list weakly: a component may keep it in a
	// place the collector treats as a root (a runtime.AddCleanup
	// argument), and a strong reference would keep the list, every
	// registered close function, and whatever those reach (the runtime
	// itself, through a user's closure) alive for ever.
	w := weak.Make(l)
	return func() {
		if l := w.Value(); l != nil {
			l.mu.Lock()
			delete(l.m, id)
			l.mu.Unlock()
		}
	}
}

// closeComponents closes the registered components, the latest first.
func (s *System) closeComponents(ctx context.Context) error {
	l := s.closers
	l.mu.Lock()
	l.closed = true
	ids := make([]uint64, 0, len(l.m))
	for id := range l.m {
		ids = append(ids, id)
	}
	m := l.m
	l.m = nil
	l.mu.Unlock()
	sort.Slice(ids, func(i, j int) bool { return ids[i] > ids[j] })
	var errs []error
	for _, id := range ids {
		c := m[id]
		if err := c.fn(ctx); err != nil {
			errs = append(errs, &CloseError{Name: c.name, Err: err})
		}
	}
	return errors.Join(errs...)
}

// Close shuts the runtime down, in this order:
//
//  1. Components opened on it and registered with [System.OnClose] —
//     loader caches (package system/cache) and staging pipelines
//     (package staging) that their application has not closed — are
//     closed, the latest first, with ctx, while the runtime still serves
//     their calls. A pipeline whose copies wait for a freeze event the
//     application never fires stops waiting about a second after ctx
//     ends (a *staging.CloseIncompleteError among Close's errors names
//     what it left running).
//  2. New calls get ErrClosed at once; callers waiting for room return
//     ErrClosed.
//  3. The context of every operation the runtime started — loads through
//     values' loaders, copies, initializations, demotion copies,
//     allocations — is canceled, and Close waits for them to settle
//     (callers waiting for them get their outcome), until ctx ends.
//  4. When ctx ends first, Close stops waiting: what is still in flight
//     fails with [ErrAbandoned] (its callers are answered), and the
//     buffers an operation still running holds are not freed (it may
//     still write into them) but reported in a [*StillRunningError] and
//     freed when the operation returns. Close then returns within about
//     a second of ctx's end (closeGrace: the runtime's own actors
//     stopping), with that error, or, when everything it abandoned has
//     returned meanwhile, an error matching both ctx.Err() and
//     [ErrAbandoned].
//  5. Outstanding leases, holds and pending events are reported (an
//     [*OutstandingError]) and released; every materialization is freed,
//     so every location is back to zero bytes charged; actors and streams
//     stop.
//  6. With [Options].CloseBackend the backend is closed last (once the
//     operations of a [*StillRunningError] have returned, if any).
//
// A loader that ignores its context keeps running on its goroutine (and
// the runtime goroutine waiting for it) until it returns; nothing else the
// runtime started is left running after Close returns. The errors of the
// steps (a [*CloseError] per component, a [*StillRunningError], an
// [*OutstandingError]) are joined (errors.As finds each). Idempotent:
// later calls return the first result. A call made while the first is
// under way waits for its result until its own ctx ends (then it returns
// ctx.Err()); one made from a component's close function (step 1) with
// the context that function was given returns at once with an
// [*InvalidInputError], since it would wait for itself. After a fatal
// stop Close frees every device buffer and returns the [*FatalError].
func (s *System) Close(ctx context.Context) error {
	s.closeMu.Lock()
	if done := s.closeDone; done != nil {
		s.closeMu.Unlock()
		if ctx.Value(closingKey{}) == s {
			return &InvalidInputError{Message: "System.Close called from a component's close with the context it was given: it would wait for itself"}
		}
		select {
		case <-done:
			return s.closeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.closeDone = make(chan struct{})
	s.closeMu.Unlock()
	defer close(s.closeDone)
	return s.close(ctx)
}

// closingKey marks the context Close hands to the components' close
// functions (its value is the System).
type closingKey struct{}

// awaitClose waits, until ctx ends, for a Close under way to finish (at
// once when none is).
func (s *System) awaitClose(ctx context.Context) error {
	s.closeMu.Lock()
	done := s.closeDone
	s.closeMu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close is the first Close: the steps above.
func (s *System) close(ctx context.Context) error {
	compErr := s.closeComponents(context.WithValue(ctx, closingKey{}, s))
	s.closed.Store(true)
	s.room.close() // every caller waiting for room returns ErrClosed
	for s.inflight.Load() > 0 {
		// A caller is between its closed check and its send: a few
		// instructions. Yield until it has sent.
		if err := ctx.Err(); err != nil {
			break
		}
		runtimeGosched()
	}
	r, stopCtx, forced, err := s.shutdown(ctx)
	defer stopCtx.cancel()
	var fe *FatalError
	if errors.As(err, &fe) {
		// The ledger cannot be trusted: nothing to report from it. Stop
		// the actors; Engine.Stop frees every buffer still allocated.
		s.closeErr = joinErrors(compErr, fe)
		_ = s.eng.Stop(stopCtx.ctx)
		s.finishClose()
		s.log.Error().Err(fe).Msg("residency closed after a fatal stop")
		return s.closeErr
	}
	if err != nil {
		stopErr := s.eng.Stop(stopCtx.ctx)
		s.finishClose()
		s.closeErr = joinErrors(compErr, fmt.Errorf("residency: close: the runtime did not answer its shutdown: %w", err), stopErr)
		return s.closeErr
	}
	rep := r.(*messages.ShutdownReply)
	s.final, s.closedOK = rep.Final, true
	stopErr := s.eng.Stop(stopCtx.ctx)
	var running error
	if r := s.stillRunning(ctx); r != nil {
		running, stopErr = r, nil // stopErr's cause, reported by r
	} else if forced {
		running = fmt.Errorf("residency: close stopped waiting at its deadline (%w); what the runtime had in flight failed (%w) and has returned since", ctx.Err(), ErrAbandoned)
	}
	s.finishClose()
	var outErr error
	if !rep.Outstanding.Empty() {
		outErr = &OutstandingError{Outstanding: rep.Outstanding}
	}
	s.closeErr = joinErrors(compErr, running, stopErr, rep.Err, outErr)
	s.log.Info().Uint64("state_version", rep.Final.StateVersion).Bool("outstanding", !rep.Outstanding.Empty()).Int("still_running", len(s.eng.StillRunning())).Msg("residency closed")
	return s.closeErr
}

// graceCtx is the context of Close's wind-down.
type graceCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// shutdown asks the supervisor to shut down and waits for its reply
// until ctx ends; then it forces the shutdown (actors.ForceShutdown,
// forced true) and waits for that reply for closeGrace. It returns the
// reply and the context for stopping the engine: closeGrace past ctx's
// end.
func (s *System) shutdown(ctx context.Context) (_ any, _ graceCtx, forced bool, _ error) {
	sl := s.slots.get()
	s.root.Send(s.sup, &messages.Shutdown{ReplyTo: sl.pid})
	r, err := s.await(ctx, sl, nil, false)
	if err == nil || ctx.Err() == nil {
		return r, graceAfter(ctx), false, err
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeGrace)
	sl = s.slots.get()
	s.root.Send(s.sup, &actors.ForceShutdown{ReplyTo: sl.pid})
	r, err = s.await(gctx, sl, nil, false)
	return r, graceCtx{gctx, cancel}, true, err
}

// graceAfter returns a context that ends closeGrace after ctx does: the
// runtime's own actors stopping (they run no user code) are waited for a
// little past Close's deadline.
func graceAfter(ctx context.Context) graceCtx {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(closeGrace, cancel) })
	return graceCtx{gctx, func() { stop(); cancel() }}
}

// stillRunning reports what Close left running, nil when nothing is.
func (s *System) stillRunning(ctx context.Context) *StillRunningError {
	ops := s.eng.StillRunning()
	if len(ops) == 0 {
		return nil
	}
	e := &StillRunningError{Running: ops, HeldBytes: map[string]int64{}, Cause: ctx.Err()}
	if e.Cause == nil {
		e.Cause = context.DeadlineExceeded
	}
	for _, op := range ops {
		for loc, n := range op.HeldBytes {
			e.HeldBytes[loc] += n
		}
	}
	return e
}

// finishClose releases the callers still waiting for a reply (ErrClosed:
// none will come) and closes an owned backend: now, or once the
// operations left running have returned.
func (s *System) finishClose() {
	s.slots.stop()
	s.slots.drain()
	if !s.ownBackend {
		return
	}
	s.eng.WhenIdle(func() {
		if err := s.backend.Close(); err != nil {
			s.log.Error().Err(err).Msg("closing the backend failed")
		}
	})
}

// joinErrors joins the non-nil errors; one alone is returned as it is.
func joinErrors(errs ...error) error {
	var nonNil []error
	for _, e := range errs {
		if e != nil {
			nonNil = append(nonNil, e)
		}
	}
	switch len(nonNil) {
	case 0:
		return nil
	case 1:
		return nonNil[0]
	}
	return errors.Join(nonNil...)
}
