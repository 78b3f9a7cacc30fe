package tests

// The sequential models of the system checker (syscheck_test.go), checked
// with porcupine (github.com/anishathalye/porcupine): a history of
// concurrent calls is linearizable when some order of them, each taking
// effect at one instant between its call and its return, is a run of the
// model. Both models are partitioned: one partition per value (the
// residency model) and one per cache key (the cache model), so the check
// grows with the number of values and keys, not with the whole history.
//
// The models say only what docs/semantics.md and docs/cache.md promise:
//   - residency (per value, per location: resident or not, and the count of
//     protections — leases, holds, a scope's leases, consumer events not
//     yet reaped, which protect past their lease's release): acquire and hold
//     succeed only on a resident copy ("it never places"); evict, move away
//     and discard succeed only on an unprotected copy, and a protected one
//     answers InUseError; an Unavailable (endpoint) answer means there is
//     no materialization; the last copy of a value without a source is
//     never evicted (PlanError). A transfer takes effect at its completion;
//     answers "in flight" (UnavailableInFlight) constrain nothing, since a
//     two-phase transfer is visible between its admission and completion.
//   - cache (per key: resident or not, the id of the loaded value, the
//     number of leases): a load while the key is held returns the held
//     value ("one load per key"); a new value for a key has a new, higher
//     id (its loader ran); an entry that is held is never evicted; a
//     failed load leaves nothing behind.
// A call that returned its context's error may or may not have taken
// effect, at any time after its call: its return is "never" and the
// models allow both outcomes.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// scLocs are the checker's locations, in location order.
var scLocs = []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}

func scLocIndex(loc string) int {
	for i, l := range scLocs {
		if l == loc {
			return i
		}
	}
	return -1
}

// Results of a call, as the models see them.
const (
	resOK        = "ok"
	resUnknown   = "unknown"   // the context ended: may or may not have happened
	resEndpoint  = "endpoint"  // UnavailableError, no materialization
	resInFlight  = "inflight"  // UnavailableError, a transition in flight
	resNoSource  = "nosource"  // UnavailableError, nothing to reconstruct from
	resDiscarded = "discarded" // UnavailableError, the handle is retired
	resInUse     = "inuse"     // InUseError
	resPlan      = "plan"      // PlanError (not a PlanExecutionError)
	resInvalid   = "invalid"   // InvalidInputError
	resRefused   = "refused"   // a refusal that changes nothing: budget, an execution failure, busy, a failed load
)

// scClassify maps an error of the public API to a model result.
func scClassify(err error) string {
	var ue *system.UnavailableError
	var pee *system.PlanExecutionError
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return resUnknown
	case errors.Is(err, system.ErrDiscarded):
		return resDiscarded
	case errors.As(err, &pee):
		return resRefused
	case errors.As(err, &ue):
		switch ue.Reason {
		case budget.UnavailableEndpoint:
			return resEndpoint
		case budget.UnavailableInFlight:
			return resInFlight
		case budget.UnavailableSource:
			return resNoSource
		}
		return resRefused
	case errors.As(err, new(*system.InUseError)):
		return resInUse
	case errors.Is(err, system.ErrInvalidInput):
		return resInvalid
	case errors.Is(err, system.ErrPlan):
		return resPlan
	}
	return resRefused
}

// rmEffect is one committed step of an admission on one value: "remove",
// "complete" or "lease" at a location, or "unlease" (a scope's exit).
type rmEffect struct {
	kind string
	loc  int
}

// rmInput is a call on one value (the partition key is val).
type rmInput struct {
	op        string // register, place, copy, move, evict, acquire, release, hold, unhold, discard, admit, exit
	val       string
	loc       int // place, evict, acquire, hold, release, unhold; move and copy: the destination
	from      int // move, copy
	at        int // register: the location, -1 with a source
	exclusive bool
	hasSource bool
	effects   []rmEffect // admit, exit: what the call reported it committed on this value
}

type rmState struct {
	reg, retired bool
	excl, src    bool
	pres         [4]bool
	prot         [4]int
}

func (s rmState) count() int {
	n := 0
	for _, p := range s.pres {
		if p {
			n++
		}
	}
	return n
}

// rmStep returns the states after in with result res (none: illegal).
func rmStep(s rmState, in rmInput, res string) []rmState {
	if in.op == "register" {
		if s.reg || res != resOK {
			return nil
		}
		n := rmState{reg: true, excl: in.exclusive, src: in.hasSource}
		if in.at >= 0 {
			n.pres[in.at] = true
		}
		return []rmState{n}
	}
	if !s.reg {
		return nil
	}
	if s.retired || res == resDiscarded {
		// A release names a lease, hold or event, not the handle: after the
		// discard one is invalid input (its abandoned first try happened).
		releasing := in.op == "release" || in.op == "unhold" || in.op == "reaped"
		if s.retired && (res == resDiscarded || res == resUnknown || (releasing && res == resInvalid)) {
			return []rmState{s}
		}
		return nil
	}
	var ok func() (rmState, bool) // the effect of a success, and whether it is allowed
	var refusal func() bool       // whether res is allowed, for a refusal (state unchanged)
	switch in.op {
	case "place":
		ok = func() (rmState, bool) { return rmPlace(s, in.loc) }
		refusal = func() bool {
			switch res {
			case resInUse:
				return rmPlaceBlocked(s, in.loc)
			case resNoSource:
				// No resident copy and no source. A copy that is the
				// source of a move in flight is Leaving, not Resident
				// (docs/semantics.md, "place, copy, move": "the bytes come
				// from an existing resident materialization … or, if there
				// is none, from reconstruction"), so a value without a
				// source answers this during a move of its only copy.
				return !s.src
			}
			return res != resEndpoint && res != resPlan
		}
	case "copy":
		ok = func() (rmState, bool) {
			n := s
			n.pres[in.loc] = true
			return n, !s.excl && s.pres[in.from]
		}
		refusal = func() bool {
			switch res {
			case resEndpoint:
				return !s.pres[in.from]
			case resPlan:
				return s.excl
			}
			return res != resInUse
		}
	case "move":
		ok = func() (rmState, bool) {
			n := s
			if in.from == in.loc {
				return n, s.pres[in.from]
			}
			n.pres[in.from], n.pres[in.loc] = false, true
			return n, s.pres[in.from] && s.prot[in.from] == 0
		}
		refusal = func() bool {
			switch res {
			case resEndpoint:
				return !s.pres[in.from]
			case resInUse:
				return s.pres[in.from] && s.prot[in.from] > 0
			}
			return true
		}
	case "evict":
		ok = func() (rmState, bool) {
			n := s
			n.pres[in.loc] = false
			return n, s.pres[in.loc] && s.prot[in.loc] == 0 && (s.src || s.count() > 1)
		}
		refusal = func() bool {
			switch res {
			case resEndpoint:
				return !s.pres[in.loc]
			case resInUse:
				return s.pres[in.loc] && s.prot[in.loc] > 0
			case resPlan:
				// The last copy of a value without a source. The source of
				// a move in flight counts as a copy (it was refused before
				// that was fixed: budget TestRule_EvictWhileTheOtherCopyIsAMoveSource).
				return s.pres[in.loc] && s.prot[in.loc] == 0 && !s.src && s.count() == 1
			}
			return res == resInFlight || res == resRefused
		}
	case "acquire", "hold", "event":
		ok = func() (rmState, bool) {
			n := s
			n.prot[in.loc]++
			return n, s.pres[in.loc]
		}
		refusal = func() bool {
			if res == resEndpoint {
				return !s.pres[in.loc]
			}
			return res == resInFlight || res == resRefused || res == resUnknown
		}
		if res == resUnknown { // only contexts done before the call: nothing happened
			return []rmState{s}
		}
	case "release", "unhold", "reaped":
		ok = func() (rmState, bool) {
			n := s
			n.prot[in.loc]--
			return n, s.prot[in.loc] > 0
		}
		refusal = func() bool { return res == resInvalid }
	case "discard":
		ok = func() (rmState, bool) {
			for i := range s.pres {
				if s.pres[i] && s.prot[i] > 0 {
					return s, false
				}
			}
			return rmState{reg: true, retired: true}, true
		}
		refusal = func() bool {
			if res == resInUse {
				for i := range s.pres {
					if s.pres[i] && s.prot[i] > 0 {
						return true
					}
				}
				return false
			}
			return res == resInFlight || res == resRefused
		}
	case "admit", "exit":
		n, good := rmApply(s, in.effects)
		if !good {
			return nil
		}
		return []rmState{n}
	default:
		return nil
	}
	var out []rmState
	if res == resOK || res == resUnknown {
		if n, good := ok(); good {
			out = append(out, n)
		}
	}
	if res == resUnknown || (res != resOK && refusal()) {
		out = append(out, s)
	}
	return out
}

// rmPlace is the effect of a successful place at loc: already resident,
// or a copy (replicable), or a move from the unprotected resident copy
// (exclusive), or a reconstruction from the source.
func rmPlace(s rmState, loc int) (rmState, bool) {
	if s.pres[loc] {
		return s, true
	}
	n := s
	if s.excl {
		for i := range s.pres {
			if s.pres[i] {
				if s.prot[i] > 0 {
					return s, false
				}
				n.pres[i] = false
			}
		}
	}
	n.pres[loc] = true
	return n, s.count() > 0 || s.src
}

// rmPlaceBlocked: a place at loc may answer InUse only when it would move
// an exclusive value away from a protected copy.
func rmPlaceBlocked(s rmState, loc int) bool {
	if !s.excl || s.pres[loc] {
		return false
	}
	for i := range s.pres {
		if s.pres[i] && s.prot[i] > 0 {
			return true
		}
	}
	return false
}

// rmApply applies an admission's (or exit's) reported steps in order.
func rmApply(s rmState, effects []rmEffect) (rmState, bool) {
	for _, e := range effects {
		switch e.kind {
		case "remove":
			if !s.pres[e.loc] || s.prot[e.loc] > 0 {
				return s, false
			}
			s.pres[e.loc] = false
		case "complete":
			s.pres[e.loc] = true
		case "lease":
			if !s.pres[e.loc] {
				return s, false
			}
			s.prot[e.loc]++
		case "unlease":
			if s.prot[e.loc] == 0 {
				return s, false
			}
			s.prot[e.loc]--
		}
	}
	return s, true
}

// scCacheLoc is the location of the checker's loader cache (cuda:1).
const scCacheLoc = 3

// rmCacheEvictions returns s and, when the loader cache's loads may have
// evicted the value's copy at the cache's location since s (cache
// entries and values share one victim order: a load that needs room
// evicts unprotected values there, never a protected copy and never the
// last copy of a value without a source), s without that copy. Those
// evictions are the cache's, not a call on the value, so they are not in
// the value's history: any op may find them done.
func rmCacheEvictions(s rmState) []rmState {
	if !s.reg || s.retired || !s.pres[scCacheLoc] || s.prot[scCacheLoc] > 0 || (!s.src && s.count() < 2) {
		return []rmState{s}
	}
	n := s
	n.pres[scCacheLoc] = false
	return []rmState{s, n}
}

// residencyModel is the per-value model.
var residencyModel = porcupine.NondeterministicModel{
	Partition: partitionBy(func(in any) string { return in.(rmInput).val }),
	Init:      func() []any { return []any{rmState{}} },
	Step: func(state, input, output any) []any {
		var out []any
		for _, pre := range rmCacheEvictions(state.(rmState)) {
			for _, n := range rmStep(pre, input.(rmInput), output.(string)) {
				out = append(out, n)
			}
		}
		return out
	},
	DescribeOperation: func(input, output any) string {
		in := input.(rmInput)
		if in.op == "register" {
			return fmt.Sprintf("register(%s at %d exclusive %v source %v) → %s", in.val, in.at, in.exclusive, in.hasSource, output)
		}
		return fmt.Sprintf("%s(%s @%d from %d %v) → %s", in.op, in.val, in.loc, in.from, in.effects, output)
	},
}

// cmInput is a call on one cache key.
type cmInput struct {
	op  string // load, release, evict
	key string
	id  int64 // release: the id of the released lease's value
}

// cmOutput: res, and for a successful load the value's id; for evict,
// whether it removed the entry.
type cmOutput struct {
	res     string
	id      int64
	removed bool
}

type cmState struct {
	res     bool
	id      int64 // 0: resident with an id nobody saw (a load whose callers gave up)
	floor   int64 // the highest id seen
	holders int
}

func cmStep(s cmState, in cmInput, out cmOutput) []cmState {
	switch in.op {
	case "load":
		var next []cmState
		if out.res == resOK || out.res == resUnknown {
			next = append(next, cmLoad(s, out)...)
		}
		if out.res != resOK {
			if out.res == resUnknown {
				next = append(next, s)
				if !s.res || s.holders == 0 { // loaded (or reloaded) for callers who gave up, kept idle
					next = append(next, cmState{res: true, floor: s.floor})
				}
			} else if !(s.res && s.holders > 0) { // a held key is a hit: it never fails
				next = append(next, cmState{floor: s.floor, id: 0})
				if s.res {
					next = append(next, s)
				}
			}
		}
		return next
	case "release":
		if out.res != resOK || !s.res || s.holders == 0 || (s.id != 0 && s.id != in.id) {
			return nil
		}
		s.holders--
		s.id = in.id
		return []cmState{s}
	case "evict":
		switch {
		case out.res == resOK && out.removed: // it was resident and nothing held it
			if !s.res || s.holders > 0 {
				return nil
			}
			return []cmState{{floor: s.floor}}
		case out.res == resOK: // absent (maybe evicted for room just before)
			if s.res && s.holders > 0 {
				return nil
			}
			return []cmState{{floor: s.floor}}
		case out.res == resRefused: // busy: held, or loading
			if s.res && s.holders == 0 {
				// Idle: it was evicted for room meanwhile (any load of
				// another key may) and is loading again.
				return []cmState{{floor: s.floor}}
			}
			return []cmState{s}
		case out.res == resUnknown:
			if s.res && s.holders == 0 {
				return []cmState{s, {floor: s.floor}}
			}
			return []cmState{s}
		}
	}
	return nil
}

// cmLoad: the states after a load that returned id out.id (or, unknown,
// none): a hit on the held or idle value, or a new value (a higher id)
// when nothing held the old one.
func cmLoad(s cmState, out cmOutput) []cmState {
	if out.res == resUnknown {
		return nil
	}
	var next []cmState
	if s.res && (s.id == out.id || (s.id == 0 && out.id > s.floor)) {
		n := s
		n.id, n.holders = out.id, s.holders+1
		n.floor = max(s.floor, out.id)
		next = append(next, n)
	}
	if (!s.res || s.holders == 0) && out.id > s.floor && out.id != s.id {
		next = append(next, cmState{res: true, id: out.id, floor: out.id, holders: 1})
	}
	return next
}

var cacheModel = porcupine.NondeterministicModel{
	Partition: partitionBy(func(in any) string { return in.(cmInput).key }),
	Init:      func() []any { return []any{cmState{}} },
	Step: func(state, input, output any) []any {
		var out []any
		for _, n := range cmStep(state.(cmState), input.(cmInput), output.(cmOutput)) {
			out = append(out, n)
		}
		return out
	},
	DescribeOperation: func(input, output any) string {
		return fmt.Sprintf("%+v → %+v", input, output)
	},
}

func partitionBy(key func(any) string) func([]porcupine.Operation) [][]porcupine.Operation {
	return func(h []porcupine.Operation) [][]porcupine.Operation {
		idx := map[string]int{}
		var out [][]porcupine.Operation
		for _, op := range h {
			k := key(op.Input)
			i, ok := idx[k]
			if !ok {
				i = len(out)
				idx[k] = i
				out = append(out, nil)
			}
			out[i] = append(out[i], op)
		}
		return out
	}
}

// scHistory records calls: their call and return instants (nanoseconds
// since the history began, monotonic), input and output. A call whose
// outcome is unknown returns "never".
type scHistory struct {
	mu    sync.Mutex
	began time.Time
	ops   []porcupine.Operation
	never int64
}

func newHistory() *scHistory {
	return &scHistory{began: time.Now(), never: math.MaxInt64 / 2}
}

func (h *scHistory) now() int64 { return time.Since(h.began).Nanoseconds() }

// add records one call of client (a worker id).
func (h *scHistory) add(client int, call int64, in, out any, unknown bool) {
	ret := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if unknown {
		h.never++
		ret = h.never
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// results counts the recorded calls by operation and result.
func (h *scHistory) results() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for _, op := range h.ops {
		var k string
		switch in := op.Input.(type) {
		case rmInput:
			k = in.op + "=" + op.Output.(string)
		case cmInput:
			o := op.Output.(cmOutput)
			k = in.op + "=" + o.res
			if in.op == "evict" && o.removed {
				k += "(removed)"
			}
		}
		out[k]++
	}
	return out
}

func (h *scHistory) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// check runs porcupine on the history; Unknown (timed out) is returned as
// such, not as a failure.
func (h *scHistory) check(m porcupine.NondeterministicModel, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	return porcupine.CheckOperationsVerbose(m.ToModel(), ops, timeout)
}
