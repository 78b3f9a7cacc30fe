package system

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Structured events: what a serving operator follows in the log. Each is
// one zerolog line at Options.EventLevel on Options.Logger, with an
// "event" field naming its kind and structured fields (location, handle,
// bytes, reason, state_version), rate-bound per kind so that a storm
// cannot flood the log. docs/design.md, "Events", lists them.

// Event kinds (the "event" field).
const (
	EventAdmissionRefused = "admission_refused"
	EventEvicted          = "evicted"
	EventLoaderFailed     = "loader_failed"
	EventStagingFailed    = "staging_failed"
	EventWaitStarted      = "wait_started"
	EventWaitEnded        = "wait_ended"
)

// Outcomes of a wait (the "outcome" field of a wait_ended event).
const (
	WaitAdmitted = "admitted" // admitted (or loaded) after waiting
	WaitCanceled = "canceled" // its context ended first
	WaitClosed   = "closed"   // the runtime closed first
	WaitRefused  = "refused"  // refused for good, or the queue was full
)

// Default rate bound of each event kind (Options.EventsPerSecond,
// Options.EventBurst).
const (
	DefaultEventsPerSecond = 10
	DefaultEventBurst      = 20
)

type eventKind uint8

const (
	evRefused eventKind = iota
	evEvicted
	evLoaderFailed
	evStagingFailed
	evWaitStarted
	evWaitEnded
	numEventKinds
)

var eventNames = [numEventKinds]string{EventAdmissionRefused, EventEvicted, EventLoaderFailed, EventStagingFailed, EventWaitStarted, EventWaitEnded}

// eventLog writes the events: a token bucket per kind (burst tokens,
// refilled at rate a second, by the clock now: no goroutine). An event
// without a token is counted, and the next event of its kind written
// carries the count in its "suppressed" field.
type eventLog struct {
	log   zerolog.Logger
	level zerolog.Level
	rate  float64
	burst float64
	now   func() time.Time

	mu      sync.Mutex
	buckets [numEventKinds]tokenBucket
}

type tokenBucket struct {
	tokens     float64
	last       time.Time
	started    bool
	suppressed uint64
}

func newEventLog(log zerolog.Logger, opts Options) *eventLog {
	l := &eventLog{log: log, level: opts.EventLevel, rate: opts.EventsPerSecond, burst: float64(opts.EventBurst), now: time.Now}
	if l.rate <= 0 {
		l.rate = DefaultEventsPerSecond
	}
	if l.burst <= 0 {
		l.burst = DefaultEventBurst
	}
	return l
}

// start returns the event of kind k to fill and send, or nil when events
// are off at this level or the kind's bucket is empty (then counted).
func (l *eventLog) start(k eventKind) *zerolog.Event {
	if l == nil || l.level < l.log.GetLevel() || l.level < zerolog.GlobalLevel() || l.level == zerolog.Disabled {
		return nil
	}
	l.mu.Lock()
	b := &l.buckets[k]
	now := l.now()
	if !b.started {
		b.tokens, b.last, b.started = l.burst, now, true
	} else if d := now.Sub(b.last); d > 0 {
		b.tokens = min(l.burst, b.tokens+d.Seconds()*l.rate)
		b.last = now
	}
	if b.tokens < 1 {
		b.suppressed++
		l.mu.Unlock()
		return nil
	}
	b.tokens--
	suppressed := b.suppressed
	b.suppressed = 0
	l.mu.Unlock()
	e := l.log.WithLevel(l.level).Str("event", eventNames[k])
	if suppressed > 0 {
		e = e.Uint64("suppressed", suppressed)
	}
	return e
}

// admissionOp names the admission a request message asks for ("" for a
// request that admits nothing: a release, a lookup).
func admissionOp(req any) string {
	switch m := req.(type) {
	case *messages.Register:
		return opNames[opRegister]
	case *messages.Transition:
		if op, ok := transitionOps[m.Kind]; ok {
			return opNames[op]
		}
	case *messages.Reserve:
		return opNames[opReserve]
	case *messages.Execute:
		return opNames[opExecute]
	case *messages.EnterScope:
		return opNames[opEnter]
	case *messages.Admit:
		return opNames[opAdmit]
	case *messages.Acquire:
		return opNames[opAcquire]
	case *messages.Hold:
		return opNames[opHold]
	case *messages.Decide:
		return callNames[callDecide]
	}
	return ""
}

// Refused writes an admission_refused event for a refusal by a budget, a
// protection, an unavailable endpoint or the search limit (other errors:
// invalid input, a plan, a failed execution, are the caller's to report).
func (l *eventLog) Refused(req any, err error, version uint64) {
	class, typed := ClassifiedError(err)
	switch class {
	case ErrorBudget, ErrorInUse, ErrorUnavailable, ErrorSearchLimit:
	default:
		return
	}
	op := admissionOp(req)
	if op == "" {
		return
	}
	e := l.start(evRefused)
	if e == nil {
		return
	}
	e = e.Str("op", op).Str("class", class.String()).Uint64("state_version", version)
	switch x := typed.(type) {
	case *BudgetError:
		e = e.Str("reason", "budget").Str("location", x.Location).Int64("bytes", x.RequestedBytes).
			Int64("budget_bytes", x.BudgetBytes).Int64("used_bytes", x.UsedBytes).Int64("reserved_bytes", x.ReservedBytes)
	case *InUseError:
		e = e.Str("reason", "in_use").Str("handle", x.Handle).Str("location", x.Location).
			Int("leases", x.UseCount).Int("holds", x.HoldCount).Int("pending_events", x.PendingEventCount)
	case *UnavailableError:
		e = e.Str("reason", x.Reason.String()).Str("handle", x.Handle).Str("location", x.Location)
	case *SearchLimitError:
		e = e.Str("reason", "search_limit").Str("request", x.RequestName).Int("explored_states", x.ExploredStates).Int("state_limit", x.StateLimit)
	}
	e.Err(err).Msg("admission refused")
}

// Evicted writes an evicted event: reason is the removal's kind, eviction
// the controller's reason for a decided victim.
func (l *eventLog) Evicted(t budget.Transition, kind budget.EvictionKind, decided bool) {
	e := l.start(evEvicted)
	if e == nil {
		return
	}
	e = e.Str("handle", t.Handle).Str("location", t.Location).Int64("bytes", t.Bytes).
		Str("reason", t.Removal.String()).Uint64("state_version", t.Version)
	if decided {
		e = e.Str("eviction", kind.String())
	}
	e.Msg("evicted")
}

// LoaderFailed writes a loader_failed event for a value's loader.
func (l *eventLog) LoaderFailed(eff budget.Effect, err error, version uint64) {
	e := l.start(evLoaderFailed)
	if e == nil {
		return
	}
	e = e.Str("loader", "value").Str("handle", eff.Handle.Name).Str("location", eff.Location).Int64("bytes", eff.Bytes).Uint64("state_version", version)
	if eff.TempAt != "" {
		e = e.Str("temporary_at", eff.TempAt)
	}
	e.Err(err).Msg("reconstruction through the value's loader failed")
}

// cacheLoadFailed writes a loader_failed event for a cache's loader (a
// load refused before its loader ran, or a resize, is not one).
func (l *eventLog) cacheLoadFailed(owner, loc, key string, peak int64, err error) {
	var le *CacheLoadError
	if !errors.As(err, &le) {
		return
	}
	e := l.start(evLoaderFailed)
	if e == nil {
		return
	}
	e.Str("loader", "cache").Str("cache", owner).Str("key", key).Str("location", loc).Int64("bytes", peak).
		Bool("panicked", le.Panic != nil).Err(err).Msg("cache load failed")
}

// ReportStagingFailure writes a staging_failed event: pipeline (its name)
// failed at task on device with err. Package staging calls it on a
// runtime that has it (as *System has) when a pipeline fails, so that the
// failure reaches the application's log at its event level and rate; an
// application's own pipeline may call it too. It sends nothing to the
// runtime and is safe for concurrent use.
func (s *System) ReportStagingFailure(pipeline, device string, task uint64, err error) {
	e := s.events.start(evStagingFailed)
	if e == nil {
		return
	}
	e.Str("pipeline", pipeline).Str("location", device).Uint64("task", task).Err(err).Msg("staging pipeline failed")
}

// waitStarted writes a wait_started event: a caller queued to wait for
// room, queued the queue's length with it.
func (l *eventLog) waitStarted(spec budget.WaitSpec, queued int) {
	e := l.start(evWaitStarted)
	if e == nil {
		return
	}
	e.Str("name", spec.Name).Int("wait_class", spec.Class).Strs("locations", spec.Locations).
		Bool("bypass", spec.AllowBypass).Int("queue_length", queued).Msg("waiting for room")
}

// waitOutcome names how a wait that returned err ended.
func waitOutcome(err error) string {
	switch {
	case err == nil:
		return WaitAdmitted
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return WaitCanceled
	case errors.Is(err, ErrClosed):
		return WaitClosed
	}
	return WaitRefused
}

// waitEnded writes a wait_ended event: the wait of spec ended with err
// after waited and tries turns, queued callers left waiting. A caller
// refused because the queue was full has no wait_started; its wait_ended
// has 0 tries.
func (l *eventLog) waitEnded(spec budget.WaitSpec, err error, waited time.Duration, tries, queued int) {
	e := l.start(evWaitEnded)
	if e == nil {
		return
	}
	outcome := waitOutcome(err)
	e = e.Str("name", spec.Name).Int("wait_class", spec.Class).Strs("locations", spec.Locations).
		Str("outcome", outcome).Float64("waited_ms", float64(waited)/float64(time.Millisecond)).
		Int("tries", tries).Int("queue_length", queued)
	if outcome == WaitRefused {
		class, _ := ClassifiedError(err)
		e = e.Str("class", class.String())
		var qf *budget.QueueFullError
		if errors.As(err, &qf) {
			e = e.Str("reason", "queue_full").Int("max_waiters", qf.MaxWaiters)
		}
	}
	if err != nil {
		e = e.Err(err)
	}
	e.Msg("wait for room ended")
}
