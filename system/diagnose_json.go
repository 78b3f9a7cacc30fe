package system

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"

	"github.com/residency-go/residency/internal/jsonerr"
)

// DecodeEvidence reads the JSON-lines output of the replay CLI
// (`go run ./cmd/demo replay --json SCRIPT`) and returns the evidence of
// one failed operation: the result at line (0 means the first failed
// result), with the first "snapshot" result and the first "trace" result
// after it. Put a snapshot and a trace op right after the line you want
// diagnosed, so they capture the state at the failure. For a stale entry
// the latest "decide" result before the line is its Decision; for a plan
// error the latest "explain" result before it is its Explanation.
//
// The replay output writes the script's words: lease, hold and event ids
// are the script's names, and handles carry names only. A plan execution
// error's cause carries its type and message; its fields are read back
// from the message. Errors: malformed JSON or a value of the wrong kind
// (the message names the output line and the field, in JSON's words), a
// line longer than 256 MiB, no such failed result, no snapshot after it.
func DecodeEvidence(r io.Reader, line int) (Evidence, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxEvidenceLine)
	var (
		ev                      Evidence
		failed                  *replayResult
		lastDecide, lastExplain *replayResult
		n                       int
	)
	for sc.Scan() {
		n++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var res replayResult
		if err := json.Unmarshal(b, &res); err != nil {
			return Evidence{}, fmt.Errorf("replay output line %d: %w", n, jsonerr.Words(err))
		}
		if failed == nil {
			switch {
			case !res.OK && res.Error != nil && (line == 0 || res.Line == line):
				r := res
				failed = &r
				ev.Err = res.Error.err()
				ev.Op = Operation{Kind: res.Op}
				if lastDecide != nil && lastDecide.Decision != nil {
					if _, stale := ev.Err.(*StaleStateError); stale || res.Op == "enter" {
						d := lastDecide.Decision.decision()
						ev.Decision = &d
					}
				}
				if lastExplain != nil && lastExplain.Explanation != nil {
					if _, plan := ev.Err.(*PlanError); plan {
						x := lastExplain.Explanation.explanation()
						ev.Explanation = &x
					}
				}
			case res.Op == "decide" && res.OK:
				r := res
				lastDecide = &r
			case res.Op == "explain" && res.OK:
				r := res
				lastExplain = &r
			}
			continue
		}
		if res.Snapshot != nil && ev.Snapshot.ManagerID == "" && ev.Snapshot.Locations == nil {
			ev.Snapshot = res.Snapshot.snapshot()
		}
		if res.Trace != nil && ev.Trace == nil {
			ev.Trace = transitions(*res.Trace)
			if ev.Trace == nil {
				ev.Trace = []Transition{}
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return Evidence{}, fmt.Errorf("replay output line %d is longer than %d MiB, the most one line may hold", n+1, maxEvidenceLine>>20)
		}
		return Evidence{}, err
	}
	if failed == nil {
		if line == 0 {
			return Evidence{}, fmt.Errorf("replay output has no failed result")
		}
		return Evidence{}, fmt.Errorf("replay output has no failed result at line %d", line)
	}
	if ev.Snapshot.Locations == nil {
		return ev, fmt.Errorf("replay output has no snapshot after line %d: add a snapshot op (and a trace op) right after it", failed.Line)
	}
	return ev, nil
}

// maxEvidenceLine bounds one line of replay output that DecodeEvidence
// reads.
const maxEvidenceLine = 256 << 20

type replayResult struct {
	Line         int               `json:"line"`
	Op           string            `json:"op"`
	OK           bool              `json:"ok"`
	StateVersion uint64            `json:"state_version"`
	Error        *replayErrorJSON  `json:"error"`
	Explanation  *explanationJSON  `json:"explanation"`
	Decision     *decisionJSON     `json:"decision"`
	Snapshot     *snapshotJSON     `json:"snapshot"`
	Trace        *[]transitionJSON `json:"trace"`
}

type actionJSON struct {
	Handle   string  `json:"handle"`
	Location string  `json:"location"`
	From     *string `json:"from"`
}

func (a actionJSON) action() Action {
	return Action{Handle: Handle{Name: a.Handle}, Location: a.Location, From: str(a.From)}
}

type reservationJSON struct {
	Name     string `json:"name"`
	Location string `json:"location"`
	Bytes    int64  `json:"bytes"`
}

func (r reservationJSON) spec() ReservationSpec {
	return ReservationSpec{Name: r.Name, Location: r.Location, Bytes: r.Bytes}
}

type transitionJSON struct {
	Version  uint64  `json:"version"`
	Kind     string  `json:"kind"`
	Handle   *string `json:"handle"`
	Location *string `json:"location"`
	Bytes    int64   `json:"bytes"`
	Detail   string  `json:"detail"`
}

func transitions(ts []transitionJSON) []Transition {
	var out []Transition
	for _, t := range ts {
		out = append(out, Transition{Version: t.Version, Kind: t.Kind, Handle: str(t.Handle), Location: str(t.Location), Bytes: t.Bytes, Detail: t.Detail})
	}
	return out
}

type explanationJSON struct {
	Feasible           bool             `json:"feasible"`
	Reason             *string          `json:"reason"`
	PredictedPeakBytes map[string]int64 `json:"predicted_peak_bytes"`
}

func (e explanationJSON) explanation() Explanation {
	return Explanation{Feasible: e.Feasible, Reason: str(e.Reason), PredictedPeakBytes: e.PredictedPeakBytes}
}

type planJSON struct {
	Reclaim      []actionJSON      `json:"reclaim"`
	Reservations []reservationJSON `json:"reservations"`
	Enter        []actionJSON      `json:"enter"`
}

func (p planJSON) plan() Plan {
	var out Plan
	for _, a := range p.Reclaim {
		out.Reclaim = append(out.Reclaim, a.action())
	}
	for _, r := range p.Reservations {
		out.Reservations = append(out.Reservations, r.spec())
	}
	for _, a := range p.Enter {
		out.Enter = append(out.Enter, a.action())
	}
	return out
}

type decisionJSON struct {
	ExpectedStateVersion uint64 `json:"expected_state_version"`
	ExploredStates       int    `json:"explored_states"`
	Evictions            []struct {
		Handle   string `json:"handle"`
		Location string `json:"location"`
		Bytes    int64  `json:"bytes"`
		Reason   string `json:"reason"`
	} `json:"evictions"`
	Plan        planJSON        `json:"plan"`
	Explanation explanationJSON `json:"explanation"`
	Exhaustive  bool            `json:"exhaustive"`
}

func (d decisionJSON) decision() Decision {
	out := Decision{ExpectedStateVersion: d.ExpectedStateVersion, ExploredStates: d.ExploredStates,
		Plan: d.Plan.plan(), Explanation: d.Explanation.explanation(), Exhaustive: d.Exhaustive}
	for _, e := range d.Evictions {
		out.Evictions = append(out.Evictions, Eviction{Handle: Handle{Name: e.Handle}, Location: e.Location, Bytes: e.Bytes, Reason: e.Reason})
	}
	return out
}

type snapshotJSON struct {
	StateVersion uint64 `json:"state_version"`
	ManagerID    string `json:"manager_id"`
	Locations    []struct {
		Location      string `json:"location"`
		BudgetBytes   *int64 `json:"budget_bytes"`
		UsedBytes     int64  `json:"used_bytes"`
		ReservedBytes int64  `json:"reserved_bytes"`
		PeakBytes     int64  `json:"peak_bytes"`
		Reservations  []struct {
			Name  string  `json:"name"`
			Bytes int64   `json:"bytes"`
			Owner *string `json:"owner"`
		} `json:"reservations"`
	} `json:"locations"`
	Values []struct {
		Handle           string  `json:"handle"`
		Bytes            int64   `json:"bytes"`
		ReplicaMode      string  `json:"replica_mode"`
		HasSource        bool    `json:"has_source"`
		SourceLocation   *string `json:"source_location"`
		Recoverable      bool    `json:"recoverable"`
		Materializations []struct {
			Location          string `json:"location"`
			State             string `json:"state"`
			ChargedBytes      int64  `json:"charged_bytes"`
			UseCount          int    `json:"use_count"`
			HoldCount         int    `json:"hold_count"`
			PendingEventCount int    `json:"pending_event_count"`
		} `json:"materializations"`
	} `json:"values"`
}

func (s snapshotJSON) snapshot() Snapshot {
	out := Snapshot{StateVersion: s.StateVersion, ManagerID: s.ManagerID, Locations: []LocationRecord{}}
	for _, l := range s.Locations {
		r := LocationRecord{Location: l.Location, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes, PeakBytes: l.PeakBytes}
		if l.BudgetBytes != nil {
			r.HasBudget, r.BudgetBytes = true, *l.BudgetBytes
		}
		for _, x := range l.Reservations {
			r.Reservations = append(r.Reservations, ReservationRecord{Name: x.Name, Bytes: x.Bytes, Owner: str(x.Owner)})
		}
		out.Locations = append(out.Locations, r)
	}
	for _, v := range s.Values {
		r := ValueRecord{Handle: Handle{Manager: s.ManagerID, Name: v.Handle}, Bytes: v.Bytes, HasSource: v.HasSource,
			SourceLocation: str(v.SourceLocation), Recoverable: v.Recoverable}
		if v.ReplicaMode == "replicable" {
			r.ReplicaMode = Replicable
		}
		for _, m := range v.Materializations {
			st := Resident
			switch m.State {
			case "entering":
				st = Entering
			case "leaving":
				st = Leaving
			}
			r.Materializations = append(r.Materializations, MaterializationRecord{Location: m.Location, State: st, ChargedBytes: m.ChargedBytes,
				UseCount: m.UseCount, HoldCount: m.HoldCount, PendingEventCount: m.PendingEventCount})
		}
		out.Values = append(out.Values, r)
	}
	return out
}

// replayErrorJSON is the replay output's error object: type, message and
// the type's own fields.
type replayErrorJSON struct {
	Type                   string           `json:"type"`
	Message                string           `json:"message"`
	Location               *string          `json:"location"`
	BudgetBytes            int64            `json:"budget_bytes"`
	UsedBytes              int64            `json:"used_bytes"`
	ReservedBytes          int64            `json:"reserved_bytes"`
	RequestedBytes         int64            `json:"requested_bytes"`
	Reason                 string           `json:"reason"`
	RequestName            string           `json:"request_name"`
	StateLimit             int              `json:"state_limit"`
	ExploredStates         int              `json:"explored_states"`
	Detail                 *string          `json:"detail"`
	ExpectedVersion        uint64           `json:"expected_version"`
	ActualVersion          uint64           `json:"actual_version"`
	Handle                 *string          `json:"handle"`
	UseCount               int              `json:"use_count"`
	HoldCount              int              `json:"hold_count"`
	PendingEventCount      int              `json:"pending_event_count"`
	Phase                  string           `json:"phase"`
	FailedAction           *actionJSON      `json:"failed_action"`
	FailedActionIndex      *int             `json:"failed_action_index"`
	FailedReservation      *reservationJSON `json:"failed_reservation"`
	FailedReservationIndex *int             `json:"failed_reservation_index"`
	PartialReport          *struct {
		Transitions []transitionJSON `json:"transitions"`
	} `json:"partial_report"`
	Cause *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"cause"`
}

func (e replayErrorJSON) err() error {
	switch e.Type {
	case "ResidencyBudgetError":
		return &BudgetError{Location: str(e.Location), BudgetBytes: e.BudgetBytes, UsedBytes: e.UsedBytes, ReservedBytes: e.ReservedBytes, RequestedBytes: e.RequestedBytes}
	case "ResidencyPlanError":
		return &PlanError{Reason: e.Reason}
	case "ResidencySearchLimitError":
		return &SearchLimitError{RequestName: e.RequestName, StateLimit: e.StateLimit, ExploredStates: e.ExploredStates, Detail: str(e.Detail)}
	case "ResidencyStaleStateError":
		return &StaleStateError{ExpectedVersion: e.ExpectedVersion, ActualVersion: e.ActualVersion}
	case "ResidencyInUseError":
		return &InUseError{Handle: str(e.Handle), Location: str(e.Location), UseCount: e.UseCount, HoldCount: e.HoldCount, PendingEventCount: e.PendingEventCount}
	case "ResidencyUnavailableError":
		return &UnavailableError{Handle: str(e.Handle), Location: str(e.Location), Detail: str(e.Detail), Reason: unavailableReason(str(e.Detail))}
	case "ResidencyPlanExecutionError":
		pe := &PlanExecutionError{Phase: e.Phase, FailedActionIndex: -1, FailedReservationIndex: -1}
		if e.FailedAction != nil {
			a := e.FailedAction.action()
			pe.FailedAction = &a
		}
		if e.FailedActionIndex != nil {
			pe.FailedActionIndex = *e.FailedActionIndex
		}
		if e.FailedReservation != nil {
			r := e.FailedReservation.spec()
			pe.FailedReservation = &r
		}
		if e.FailedReservationIndex != nil {
			pe.FailedReservationIndex = *e.FailedReservationIndex
		}
		if e.PartialReport != nil {
			pe.PartialReport.Transitions = transitions(e.PartialReport.Transitions)
		}
		if e.Cause != nil {
			pe.Cause = causeFromMessage(e.Cause.Type, e.Cause.Message)
		}
		return pe
	case "InvalidInput":
		return &InvalidInputError{Message: trimPrefix(e.Message, "residency invalid input: ")}
	}
	return &replayError{class: e.Type, msg: e.Message}
}

// replayError is an error read back from replay output whose fields are
// not known: its class and message only.
type replayError struct{ class, msg string }

func (e *replayError) Error() string { return e.msg }

var (
	budgetMsg = regexp.MustCompile(`^residency budget exceeded at (\S+): used (\d+) \+ reserved (\d+) \+ requested (\d+) > budget (\d+)`)
	inUseMsg  = regexp.MustCompile(`^residency value "(.*)" at (\S+) is in use: (\d+) leases, (\d+) holds, (\d+) pending events$`)
	staleMsg  = regexp.MustCompile(`^residency stale state: expected version (\d+), actual (\d+)$`)
)

// causeFromMessage rebuilds a cause from its type and message: the
// messages of budget, in-use and stale errors carry all their fields.
func causeFromMessage(typ, msg string) error {
	num := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	switch typ {
	case "ResidencyBudgetError":
		if m := budgetMsg.FindStringSubmatch(msg); m != nil {
			return &BudgetError{Location: m[1], UsedBytes: num(m[2]), ReservedBytes: num(m[3]), RequestedBytes: num(m[4]), BudgetBytes: num(m[5])}
		}
	case "ResidencyInUseError":
		if m := inUseMsg.FindStringSubmatch(msg); m != nil {
			return &InUseError{Handle: m[1], Location: m[2], UseCount: int(num(m[3])), HoldCount: int(num(m[4])), PendingEventCount: int(num(m[5]))}
		}
	case "ResidencyStaleStateError":
		if m := staleMsg.FindStringSubmatch(msg); m != nil {
			return &StaleStateError{ExpectedVersion: uint64(num(m[1])), ActualVersion: uint64(num(m[2]))}
		}
	case "InvalidInput":
		return &InvalidInputError{Message: trimPrefix(msg, "residency invalid input: ")}
	}
	return &replayError{class: typ, msg: msg}
}

func unavailableReason(detail string) UnavailableReason {
	switch {
	case detail == "value was discarded":
		return UnavailableDiscarded
	case detail == "location is not configured":
		return UnavailableLocation
	case regexp.MustCompile(`in flight|not resident|is entering|is leaving`).MatchString(detail):
		return UnavailableInFlight
	case regexp.MustCompile(`no source`).MatchString(detail):
		return UnavailableSource
	case regexp.MustCompile(`foreign`).MatchString(detail):
		return UnavailableForeign
	}
	return UnavailableEndpoint
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func trimPrefix(s, p string) string {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}
