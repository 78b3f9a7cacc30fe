package system

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/residency-go/residency/messages"
)

// callStats counts the outcome of every facade call from Start on: the
// facade sees each call's result (the typed error, the decision), so these
// counters are exact. Its zero value is ready; it costs a few atomic adds
// per call (a mutex for the two histograms). [System.CallStats] copies it
// out (package system/metrics exports it to Prometheus).
type callStats struct {
	// admissions[op] counts answered admission calls, refused[op][class]
	// those refused, unanswered[op] those whose answer the caller did not
	// see (its context ended, or the runtime was closed).
	admissions [numOps]atomic.Uint64
	refused    [numOps][numErrorKinds]atomic.Uint64
	unanswered [numOps]atomic.Uint64

	// decisions[call] counts decisions made by Decide (call 0) and Admit
	// (call 1); decisionsRefused the controller's refusals by class;
	// inexhaustive the decisions the state limit cut short after a
	// feasible assignment; searchLimit the SearchLimitErrors.
	decisions        [numCalls]atomic.Uint64
	decisionsRefused [numCalls][numErrorKinds]atomic.Uint64
	inexhaustive     [numCalls]atomic.Uint64
	searchLimit      [numCalls]atomic.Uint64
	// stale counts scope entries refused with a StaleStateError.
	stale atomic.Uint64

	mu sync.Mutex // guards the maps and histograms below
	// evictions[call][kind] counts the victims of decisions made.
	evictions [numCalls]map[EvictionKind]uint64
	// evictedBytes[call] sums their charged bytes.
	evictedBytes [numCalls]uint64
	explored     [numCalls]histogram
	decideTime   histogram // Decide calls, seconds
	admitTime    histogram // Admit calls (decision and entry), seconds
}

// Admission operations (the op label).
const (
	opRegister = iota
	opPlace
	opCopy
	opMove
	opEvict
	opDiscard
	opReserve
	opExecute
	opEnter
	opAdmit
	opAcquire
	opHold
	numOps
)

var opNames = [numOps]string{"register", "place", "copy", "move", "evict", "discard", "reserve", "execute", "enter", "admit", "acquire", "hold"}

// transitionOps maps a direct transition to its op.
var transitionOps = map[messages.TransitionKind]int{
	messages.Place: opPlace, messages.Copy: opCopy, messages.Move: opMove,
	messages.Evict: opEvict, messages.Discard: opDiscard,
}

// Controller calls (the call label of decision metrics).
const (
	callDecide = iota
	callAdmit
	numCalls
)

var callNames = [numCalls]string{"decide", "admit"}

// unseen reports whether err means the caller did not see the runtime's
// answer: ctx ended (the call may still have been carried out) or the
// runtime was closed before the call was sent.
func unseen(ctx context.Context, err error) bool {
	if errors.Is(err, ErrClosed) {
		return true
	}
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		var pe *PlanExecutionError
		return !errors.As(err, &pe)
	}
	return false
}

// admission counts the outcome of one admission call.
func (c *callStats) admission(ctx context.Context, op int, err error) {
	switch {
	case err == nil:
		c.admissions[op].Add(1)
	case unseen(ctx, err):
		c.unanswered[op].Add(1)
	default:
		c.admissions[op].Add(1)
		c.refused[op][ErrorClass(err)].Add(1)
	}
}

// transition counts a direct transition.
func (c *callStats) transition(ctx context.Context, k messages.TransitionKind, err error) {
	if op, ok := transitionOps[k]; ok {
		c.admission(ctx, op, err)
	}
}

// entered counts a scope entry (op enter); a stale refusal also counts as
// stale.
func (c *callStats) entered(ctx context.Context, err error) {
	c.admission(ctx, opEnter, err)
	var se *StaleStateError
	if errors.As(err, &se) {
		c.stale.Add(1)
	}
}

// decided counts a Decide call that started at start; d and err are the
// call's results (read when it returns: use it with defer).
func (c *callStats) decided(ctx context.Context, start time.Time, d *Decision, err *error) {
	elapsed := time.Since(start)
	if unseen(ctx, *err) {
		return
	}
	c.decision(callDecide, *err == nil, d, *err)
	c.mu.Lock()
	c.decideTime.observe(decideSecondsBuckets, elapsed.Seconds())
	c.mu.Unlock()
}

// admitted counts an Admit call that started at start: the admission, and
// the controller's decision or refusal.
func (c *callStats) admitted(ctx context.Context, start time.Time, d *Decision, err *error) {
	elapsed := time.Since(start)
	c.admission(ctx, opAdmit, *err)
	if unseen(ctx, *err) {
		return
	}
	// Admit returns the decision alongside an entry's failure (a
	// *PlanExecutionError); any other error is the controller's refusal.
	var pe *PlanExecutionError
	made := *err == nil || errors.As(*err, &pe)
	c.decision(callAdmit, made, d, *err)
	c.mu.Lock()
	c.admitTime.observe(decideSecondsBuckets, elapsed.Seconds())
	c.mu.Unlock()
}

func (c *callStats) decision(call int, made bool, d *Decision, err error) {
	if !made {
		c.decisionsRefused[call][ErrorClass(err)].Add(1)
		var sl *SearchLimitError
		if errors.As(err, &sl) {
			c.searchLimit[call].Add(1)
		}
		return
	}
	c.decisions[call].Add(1)
	if !d.Exhaustive {
		c.inexhaustive[call].Add(1)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.explored[call].observe(exploredBuckets, float64(d.ExploredStates))
	for _, e := range d.Evictions {
		if c.evictions[call] == nil {
			c.evictions[call] = map[EvictionKind]uint64{}
		}
		c.evictions[call][e.Kind]++
		c.evictedBytes[call] += uint64(max(e.Bytes, 0))
	}
}

// Histogram buckets: explored states per decision (powers of 4 up to the
// default state limit and beyond), and call latency in seconds (50µs to
// 10s).
var (
	exploredBuckets      = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144}
	decideSecondsBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}
)

// histogram is a cumulative histogram over fixed upper bounds (the caller
// holds the lock and passes the same bounds every time).
type histogram struct {
	count  uint64
	sum    float64
	counts []uint64 // per bucket, not cumulative
}

func (h *histogram) observe(bounds []float64, v float64) {
	if h.counts == nil {
		h.counts = make([]uint64, len(bounds))
	}
	h.count++
	if !math.IsNaN(v) {
		h.sum += v
	}
	for i, b := range bounds {
		if v <= b {
			h.counts[i]++
			return
		}
	}
}

// cumulative returns the buckets as Prometheus wants them: upper bound →
// cumulative count.
func (h *histogram) cumulative(bounds []float64) map[float64]uint64 {
	out := make(map[float64]uint64, len(bounds))
	var acc uint64
	for i, b := range bounds {
		if h.counts != nil {
			acc += h.counts[i]
		}
		out[b] = acc
	}
	return out
}

// CallStats is a copy of the runtime's counts of call outcomes since
// [Start], kept by the facade as each call returns: exact, and
// independent of the trace ring and of when they are read. Package
// system/metrics exports them to Prometheus; docs/metrics.md says what
// each one counts.
type CallStats struct {
	// Ops holds the admission calls, one entry per operation, in a fixed
	// order: register, place, copy, move, evict, discard, reserve,
	// execute, enter, admit, acquire, hold.
	Ops []OpStats
	// Calls holds the controller's calls: decide, then admit.
	Calls []DecisionStats
	// Stale counts scope entries refused because the decision's state
	// version was stale.
	Stale uint64
	// DecideSeconds and AdmitSeconds are the latencies of Decide and Admit
	// calls as their callers saw them.
	DecideSeconds, AdmitSeconds Histogram
}

// OpStats counts the outcomes of one admission operation.
type OpStats struct {
	Op string
	// Answered counts the calls the runtime answered, refusals included;
	// Refused counts those refused, by class (a class never seen is
	// absent). Unanswered counts the calls whose answer the caller did
	// not see (its context ended, or the runtime was closed).
	Answered, Unanswered uint64
	Refused              map[ErrorKind]uint64
}

// DecisionStats counts the outcomes of one controller call.
type DecisionStats struct {
	Call string
	// Decisions counts the decisions made; Inexhaustive those the state
	// limit cut short after a feasible assignment; SearchLimit the
	// refusals with a [*SearchLimitError]; Refused every refusal (no
	// decision) by class.
	Decisions, Inexhaustive, SearchLimit uint64
	Refused                              map[ErrorKind]uint64
	// Evictions counts the decisions' victims by kind; EvictedBytes sums
	// their charged bytes.
	Evictions    map[EvictionKind]uint64
	EvictedBytes uint64
	// ExploredStates is the states each decision's search explored.
	ExploredStates Histogram
}

// Histogram is a cumulative histogram over fixed upper bounds.
type Histogram struct {
	Count uint64
	Sum   float64
	// Buckets maps each upper bound to the number of observations at or
	// below it.
	Buckets map[float64]uint64
}

// CallStats returns a copy of the runtime's counts of call outcomes. It
// sends nothing to the runtime and is safe for concurrent use; after
// Close the counts keep their values.
func (s *System) CallStats() CallStats { return s.stats.read() }

func (c *callStats) read() CallStats {
	refused := func(row *[numErrorKinds]atomic.Uint64) map[ErrorKind]uint64 {
		out := map[ErrorKind]uint64{}
		for k := range row {
			if v := row[k].Load(); v > 0 {
				out[ErrorKind(k)] = v
			}
		}
		return out
	}
	var out CallStats
	for op := range numOps {
		out.Ops = append(out.Ops, OpStats{Op: opNames[op], Answered: c.admissions[op].Load(),
			Unanswered: c.unanswered[op].Load(), Refused: refused(&c.refused[op])})
	}
	for call := range numCalls {
		out.Calls = append(out.Calls, DecisionStats{Call: callNames[call], Decisions: c.decisions[call].Load(),
			Inexhaustive: c.inexhaustive[call].Load(), SearchLimit: c.searchLimit[call].Load(),
			Refused: refused(&c.decisionsRefused[call])})
	}
	out.Stale = c.stale.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	for call := range numCalls {
		d := &out.Calls[call]
		d.Evictions = make(map[EvictionKind]uint64, len(c.evictions[call]))
		for k, v := range c.evictions[call] {
			d.Evictions[k] = v
		}
		d.EvictedBytes = c.evictedBytes[call]
		d.ExploredStates = c.explored[call].read(exploredBuckets)
	}
	out.DecideSeconds = c.decideTime.read(decideSecondsBuckets)
	out.AdmitSeconds = c.admitTime.read(decideSecondsBuckets)
	return out
}

func (h *histogram) read(bounds []float64) Histogram {
	return Histogram{Count: h.count, Sum: h.sum, Buckets: h.cumulative(bounds)}
}
