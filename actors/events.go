package actors

import (
	"errors"
	"fmt"
	"strings"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// Observer receives the runtime's notable outcomes from the supervisor as
// they happen: package system turns them into rate-bound structured log
// events. Its methods run inside the supervisor's serialized section:
// they must be quick, must not block and must not call the runtime.
type Observer interface {
	// Refused: request (the request message) was answered with err at
	// state version version. Every error reaches it; the observer picks
	// the refusals it reports.
	Refused(request any, err error, version uint64)
	// Evicted: a materialization was evicted (t.Removal is RemovalEvict
	// for an explicit Evict, RemovalReclaim for a plan's reclaim step).
	// kind is the controller's reason when decided (an Admit's victim).
	Evicted(t budget.Transition, kind budget.EvictionKind, decided bool)
	// LoaderFailed: the reconstruction e through a value's loader failed
	// with err; version is the state version when the failure came back.
	LoaderFailed(e budget.Effect, err error, version uint64)
}

// observe passes a reply's error, and a run's evictions, to the observer.
func (s *supervisor) observe(msg any) {
	o := s.eng.obs
	if o == nil {
		return
	}
	var err error
	switch m := msg.(type) {
	case *messages.Reply:
		err = m.Err
	case *messages.HandleReply:
		err = m.Err
	case *messages.LeaseReply:
		err = m.Err
	case *messages.HoldReply:
		err = m.Err
	case *messages.EventReply:
		err = m.Err
	case *messages.DecideReply:
		err = m.Err
	case *messages.RunReply:
		err = m.Err
		s.observeRun(o, m)
	}
	if err != nil {
		o.Refused(s.handling, err, s.ledger.Version())
	}
}

// observeRun reports the reclaim removals of a run's report (or of the
// committed prefix of a failed one), each with its decision's reason when
// the run entered a decision.
func (s *supervisor) observeRun(o Observer, m *messages.RunReply) {
	ts := m.Report.Transitions
	var pe *budget.PlanExecutionError
	if errors.As(m.Err, &pe) {
		ts = pe.PartialReport.Transitions
	}
	for _, t := range ts {
		if t.Kind != "remove" || t.Removal != budget.RemovalReclaim {
			continue
		}
		kind, decided := budget.EvictionOther, false
		if m.Decision != nil {
			for _, e := range m.Decision.Evictions {
				if e.Handle.Name == t.Handle && e.Location == t.Location {
					kind, decided = e.Kind, true
					break
				}
			}
		}
		o.Evicted(t, kind, decided)
	}
}

// observeEvict reports an explicit eviction just committed (its free
// effects in hand).
func (s *supervisor) observeEvict(m *messages.Transition, effects []budget.Effect) {
	if s.eng.obs == nil || len(effects) == 0 {
		return
	}
	s.eng.obs.Evicted(budget.Transition{Version: s.ledger.Version(), Kind: "remove", Handle: m.Handle.Name,
		Location: m.From, Bytes: effects[0].Bytes, Detail: "evict", Removal: budget.RemovalEvict}, budget.EvictionOther, false)
}

// observeTransfer reports a failed reconstruction (a value's loader).
func (s *supervisor) observeTransfer(e budget.Effect, cause error) {
	if s.eng.obs != nil && cause != nil && e.Kind == budget.EffectReconstruct {
		s.eng.obs.LoaderFailed(e, cause, s.ledger.Version())
	}
}

// stepDone runs what follows a ledger step, before its reply is sent
// (both reply paths call it): the AfterLedger hook, the observer, and
// OnRoom — before the reply, so a caller who made room finds its waiters
// woken.
func (s *supervisor) stepDone(reply any) {
	s.afterLedger()
	s.observe(reply)
	s.noteRoom()
}

// afterLedger runs the AfterLedger hook, once per request.
func (s *supervisor) afterLedger() {
	if h := s.eng.hooks.AfterLedger; h != nil && !s.hooked && s.handling != nil {
		s.hooked = true
		h(requestKind(s.handling))
	}
}

// requestKind names a message by its type, without package or pointer.
func requestKind(m any) string {
	k := fmt.Sprintf("%T", m)
	if i := strings.LastIndexByte(k, '.'); i >= 0 {
		k = k[i+1:]
	}
	return k
}

// noteRoom calls Config.OnRoom if the ledger committed a transition that
// may make room since the last call.
func (s *supervisor) noteRoom() {
	if s.eng.onRoom == nil {
		return
	}
	if n := s.ledger.RoomReleases(); n != s.roomSeen {
		s.roomSeen = n
		s.eng.onRoom()
	}
}
