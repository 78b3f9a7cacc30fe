package system

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/residency-go/residency/messages"
)

// callStats counts the outcome of every facade call from Start on: the
// facade sees each call's result (the typed error, the decision), so these
// counters are exact. Its zero value is ready; it costs a few atomic adds
// per call (a mutex for the two histograms). [Metrics] exports it.
type callStats struct {
	// admissions[op] counts answered admission calls, refused[op][class]
	// those refused, unanswered[op] those whose answer the caller did not
	// see (its context ended, or the runtime was closed).
	admissions [numOps]atomic.Uint64
	refused    [numOps][numClasses]atomic.Uint64
	unanswered [numOps]atomic.Uint64

	// decisions[call] counts decisions made by Decide (call 0) and Admit
	// (call 1); decisionsRefused the controller's refusals by class;
	// inexhaustive the decisions the state limit cut short after a
	// feasible assignment; searchLimit the SearchLimitErrors.
	decisions        [numCalls]atomic.Uint64
	decisionsRefused [numCalls][numClasses]atomic.Uint64
	inexhaustive     [numCalls]atomic.Uint64
	searchLimit      [numCalls]atomic.Uint64
	// stale counts scope entries refused with a StaleStateError.
	stale atomic.Uint64

	mu sync.Mutex // guards the maps and histograms below
	// evictions[call][reason] counts the victims of decisions made.
	evictions [numCalls]map[string]uint64
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

// Error classes (the class label): the seven-error taxonomy of Diagnose,
// InvalidInput, and Error for anything else.
var classNames = [...]string{
	"ResidencyBudgetError", "ResidencyPlanError", "ResidencySearchLimitError",
	"ResidencyStaleStateError", "ResidencyInUseError", "ResidencyUnavailableError",
	"ResidencyPlanExecutionError", "InvalidInput", "Error",
}

const numClasses = len(classNames)

func classIndex(err error) int {
	c, _ := classify(err)
	for i, n := range classNames {
		if n == c {
			return i
		}
	}
	return numClasses - 1
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
		c.refused[op][classIndex(err)].Add(1)
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
		c.decisionsRefused[call][classIndex(err)].Add(1)
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
			c.evictions[call] = map[string]uint64{}
		}
		c.evictions[call][EvictionReasonClass(e.Reason)]++
		c.evictedBytes[call] += uint64(max(e.Bytes, 0))
	}
}

// EvictionReasonClass is the reason label of a decision's eviction: the
// kind of reason, without its figures. The controller picks victims by
// priority ("priority H=… among the lowest at …"): "lowest_priority".
// Any other reason reads "other".
func EvictionReasonClass(reason string) string {
	if strings.HasPrefix(reason, "priority ") {
		return "lowest_priority"
	}
	return "other"
}

// RemovalReason is the reason label of a "remove" transition: its detail
// in snake case ("evict", "reclaim", "move_source", "discard",
// "shutdown"), or "other".
func RemovalReason(detail string) string {
	switch {
	case detail == "evict", detail == "reclaim", detail == "discard", detail == "shutdown":
		return detail
	case strings.HasPrefix(detail, "move source"):
		return "move_source"
	}
	return "other"
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
