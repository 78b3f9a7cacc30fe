package diagnose

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/residency-go/residency/internal/planjson"
	"github.com/residency-go/residency/system"
	"io"
	"strconv"
	"strings"

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
// are the script's names, and handles carry names only. A transition
// carrying the optional fields id, lease, name and failure (a trace saved
// from the API by `demo diagnose --trace`) is read by them; one without
// them (every script's output, and older files) gets them from its detail
// (detailNames), its script names becoming the evidence's Names. A plan execution
// error's cause carries its type and message; its fields are read back
// from the message. Errors: malformed JSON or a value of the wrong kind
// (a [*LineError]: the message names the output line and the field, in
// JSON's words), a line longer than 256 MiB (a [*LineError] too), no such
// failed result, no snapshot after it ([ErrNoSnapshot]).
func DecodeEvidence(r io.Reader, line int) (Evidence, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxEvidenceLine)
	names := newDetailNames()
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
			return Evidence{}, &LineError{Line: n, Err: jsonerr.Words(err)}
		}
		if failed == nil {
			switch {
			case !res.OK && res.Error != nil && (line == 0 || res.Line == line):
				r := res
				failed = &r
				ev.Err = res.Error.err(names)
				ev.Op = Operation{Kind: res.Op}
				if lastDecide != nil && lastDecide.Decision != nil {
					if _, stale := ev.Err.(*system.StaleStateError); stale || res.Op == "enter" {
						d := lastDecide.Decision.decision()
						ev.Decision = &d
					}
				}
				if lastExplain != nil && lastExplain.Explanation != nil {
					if _, plan := ev.Err.(*system.PlanError); plan {
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
			ev.Trace = names.transitions(*res.Trace)
			if ev.Trace == nil {
				ev.Trace = []system.Transition{}
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return Evidence{}, &LineError{Line: n + 1, Err: fmt.Errorf("longer than %d MiB, the most one line may hold", maxEvidenceLine>>20)}
		}
		return Evidence{}, err
	}
	if failed == nil {
		if line == 0 {
			return Evidence{}, fmt.Errorf("replay output has no failed result")
		}
		return Evidence{}, fmt.Errorf("replay output has no failed result at line %d", line)
	}
	if len(names.names) > 0 {
		ev.Names = names.names
	}
	if ev.Snapshot.Locations == nil {
		return ev, fmt.Errorf("%w after line %d: add a snapshot op (and a trace op) right after it", ErrNoSnapshot, failed.Line)
	}
	return ev, nil
}

// LineError is DecodeEvidence's error for a line of replay output it
// cannot read: Line is its number (1-based), Err what is wrong with it (in
// JSON's words, naming the field). A caller that assembled the output
// from several files tells by Line which file is at fault.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("replay output line %d: %v", e.Line, e.Err) }

// Unwrap returns Err.
func (e *LineError) Unwrap() error { return e.Err }

// ErrNoSnapshot is DecodeEvidence's error when no snapshot follows the
// failed result (or the snapshot after it has no locations).
var ErrNoSnapshot = errors.New("replay output has no snapshot")

// maxEvidenceLine bounds one line of replay output that DecodeEvidence
// reads.
const maxEvidenceLine = 256 << 20

type replayResult struct {
	Line         int                       `json:"line"`
	Op           string                    `json:"op"`
	OK           bool                      `json:"ok"`
	StateVersion uint64                    `json:"state_version"`
	Error        *replayErrorJSON          `json:"error"`
	Explanation  *explanationJSON          `json:"explanation"`
	Decision     *decisionJSON             `json:"decision"`
	Snapshot     *snapshotJSON             `json:"snapshot"`
	Trace        *[]evidenceTransitionJSON `json:"trace"`
}

// The shapes of the replay output's objects (docs/replay.md), read from
// evidence and written in a diagnosis's JSON form (a plan's: package
// planjson, shared with the replay).

type transitionJSON struct {
	Version  uint64  `json:"version"`
	Kind     string  `json:"kind"`
	Handle   *string `json:"handle"`
	Location *string `json:"location"`
	Bytes    int64   `json:"bytes"`
	Detail   string  `json:"detail"`
}

// toTransitions writes ts as they are (names and details untouched).
func toTransitions(ts []system.Transition) []transitionJSON {
	out := make([]transitionJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, transitionJSON{Version: t.Version, Kind: t.Kind, Handle: nullable(t.Handle),
			Location: nullable(t.Location), Bytes: t.Bytes, Detail: t.Detail})
	}
	return out
}

// evidenceTransitionJSON is a transition as evidence may carry it: the
// replay output's transition, and optionally the fields a Transition has
// next to its detail (id, lease, name, failure). The replay output of a
// script writes none of them (its details are the script's words); a
// trace saved from the API does (`demo diagnose --trace`).
type evidenceTransitionJSON struct {
	transitionJSON
	ID      *uint64 `json:"id,omitempty"`
	Lease   *uint64 `json:"lease,omitempty"`
	Name    *string `json:"name,omitempty"`
	Failure *string `json:"failure,omitempty"`
}

func (t evidenceTransitionJSON) structured() bool {
	return t.ID != nil || t.Lease != nil || t.Name != nil || t.Failure != nil
}

// transitions reads evidence transitions. Those without the structured
// fields (every replay output, and evidence saved before the fields
// existed) get them from their details: see detailNames.
func (n *detailNames) transitions(ts []evidenceTransitionJSON) []system.Transition {
	var out []system.Transition
	for _, t := range ts {
		x := system.Transition{Version: t.Version, Kind: t.Kind, Handle: str(t.Handle), Location: str(t.Location), Bytes: t.Bytes, Detail: t.Detail}
		if t.structured() {
			x.ID, x.Lease, x.Name = deref(t.ID), deref(t.Lease), str(t.Name)
			if t.Failure != nil {
				_ = x.Failure.UnmarshalText([]byte(*t.Failure))
			}
		} else {
			n.fill(&x)
		}
		out = append(out, x)
	}
	return out
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// detailNames recovers a transition's structured fields from its detail,
// for evidence that does not carry them: the replay output of a script,
// and files saved before the fields existed. That text is the only record
// such a file has, so this is the one place the diagnosis reads a detail,
// by the forms docs/replay.md gives: "lease 3", "hold 2", "event 5",
// "event 5 on lease 3" by the runtime's ids, or the same with the
// script's names (`lease "reader"`, `lease of scope "s"`,
// `event "read" on lease "reader"`); a reservation's name; "registration
// failed…" or "transfer failed…". A script's name gets an id of its own
// (from 1<<63 up, clear of the runtime's) and its name in names, which
// becomes the evidence's Names.
type detailNames struct {
	names map[LifetimeRef]string
	byKey map[string]uint64 // kind + "\x00" + the name as written → its id
	next  uint64
}

func newDetailNames() *detailNames {
	return &detailNames{names: map[LifetimeRef]string{}, byKey: map[string]uint64{}, next: 1 << 63}
}

// id is the lifetime a detail's token ("3", `"reader"`, `of scope "s"`)
// names.
func (n *detailNames) id(kind system.LifetimeKind, token string) uint64 {
	if id, err := strconv.ParseUint(token, 10, 64); err == nil && id < 1<<63 {
		return id
	}
	key := kind.String() + "\x00" + token
	if id, ok := n.byKey[key]; ok {
		return id
	}
	id := n.next
	n.next++
	n.byKey[key] = id
	name := token
	if u, err := strconv.Unquote(token); err == nil {
		name = u
	}
	n.names[LifetimeRef{kind, id}] = name
	return id
}

func (n *detailNames) fill(t *system.Transition) {
	d := t.Detail
	switch t.Kind {
	case "acquire", "release":
		t.ID = n.id(system.LifetimeLease, strings.TrimPrefix(d, "lease "))
	case "hold", "unhold":
		t.ID = n.id(system.LifetimeHold, strings.TrimPrefix(d, "hold "))
	case "reap_event":
		t.ID = n.id(system.LifetimeEvent, strings.TrimPrefix(d, "event "))
	case "record_event":
		ev, lease, _ := strings.Cut(d, " on ")
		t.ID = n.id(system.LifetimeEvent, strings.TrimPrefix(ev, "event "))
		t.Lease = n.id(system.LifetimeLease, strings.TrimPrefix(lease, "lease "))
	case "reserve", "unreserve":
		t.Name = d
	case "fail":
		t.Failure = system.FailureTransfer
		if strings.HasPrefix(d, "registration failed") {
			t.Failure = system.FailureRegistration
		}
	}
}

type explanationJSON struct {
	Feasible           bool             `json:"feasible"`
	Reason             *string          `json:"reason"`
	PredictedPeakBytes map[string]int64 `json:"predicted_peak_bytes"`
}

func (e explanationJSON) explanation() system.Explanation {
	return system.Explanation{Feasible: e.Feasible, Reason: str(e.Reason), PredictedPeakBytes: e.PredictedPeakBytes}
}

type evictionJSON struct {
	Handle   string `json:"handle"`
	Location string `json:"location"`
	Bytes    int64  `json:"bytes"`
	Reason   string `json:"reason"`
}

type decisionJSON struct {
	ExpectedStateVersion uint64          `json:"expected_state_version"`
	ExploredStates       int             `json:"explored_states"`
	Evictions            []evictionJSON  `json:"evictions"`
	Plan                 planjson.Plan   `json:"plan"`
	Explanation          explanationJSON `json:"explanation"`
	Exhaustive           bool            `json:"exhaustive"`
}

func (d decisionJSON) decision() system.Decision {
	out := system.Decision{ExpectedStateVersion: d.ExpectedStateVersion, ExploredStates: d.ExploredStates,
		Plan: d.Plan.System(), Explanation: d.Explanation.explanation(), Exhaustive: d.Exhaustive}
	for _, e := range d.Evictions {
		out.Evictions = append(out.Evictions, system.Eviction{Handle: system.Handle{Name: e.Handle}, Location: e.Location, Bytes: e.Bytes, Reason: e.Reason})
	}
	return out
}

type snapshotJSON struct {
	StateVersion uint64 `json:"state_version"`
	ManagerID    string `json:"manager_id"`
	Locations    []struct {
		Location      string                `json:"location"`
		BudgetBytes   *int64                `json:"budget_bytes"`
		UsedBytes     int64                 `json:"used_bytes"`
		ReservedBytes int64                 `json:"reserved_bytes"`
		PeakBytes     int64                 `json:"peak_bytes"`
		Reservations  []snapReservationJSON `json:"reservations"`
	} `json:"locations"`
	Values []struct {
		Handle           string                    `json:"handle"`
		Bytes            int64                     `json:"bytes"`
		ReplicaMode      string                    `json:"replica_mode"`
		HasSource        bool                      `json:"has_source"`
		SourceLocation   *string                   `json:"source_location"`
		Recoverable      bool                      `json:"recoverable"`
		Materializations []snapMaterializationJSON `json:"materializations"`
	} `json:"values"`
}

type snapReservationJSON struct {
	Name  string  `json:"name"`
	Bytes int64   `json:"bytes"`
	Owner *string `json:"owner,omitempty"` // a scope or a cache
}

type snapMaterializationJSON struct {
	Location          string `json:"location"`
	State             string `json:"state"`
	ChargedBytes      int64  `json:"charged_bytes"`
	UseCount          int    `json:"use_count"`
	HoldCount         int    `json:"hold_count"`
	PendingEventCount int    `json:"pending_event_count"`
}

func (s snapshotJSON) snapshot() system.Snapshot {
	out := system.Snapshot{StateVersion: s.StateVersion, ManagerID: s.ManagerID, Locations: []system.LocationRecord{}}
	for _, l := range s.Locations {
		r := system.LocationRecord{Location: l.Location, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes, PeakBytes: l.PeakBytes}
		if l.BudgetBytes != nil {
			r.HasBudget, r.BudgetBytes = true, *l.BudgetBytes
		}
		for _, x := range l.Reservations {
			r.Reservations = append(r.Reservations, system.ReservationRecord{Name: x.Name, Bytes: x.Bytes, Owner: str(x.Owner)})
		}
		out.Locations = append(out.Locations, r)
	}
	for _, v := range s.Values {
		r := system.ValueRecord{Handle: system.Handle{Manager: s.ManagerID, Name: v.Handle}, Bytes: v.Bytes, HasSource: v.HasSource,
			SourceLocation: str(v.SourceLocation), Recoverable: v.Recoverable}
		if v.ReplicaMode == "replicable" {
			r.ReplicaMode = system.Replicable
		}
		for _, m := range v.Materializations {
			st := system.Resident
			switch m.State {
			case "entering":
				st = system.Entering
			case "leaving":
				st = system.Leaving
			}
			r.Materializations = append(r.Materializations, system.MaterializationRecord{Location: m.Location, State: st, ChargedBytes: m.ChargedBytes,
				UseCount: m.UseCount, HoldCount: m.HoldCount, PendingEventCount: m.PendingEventCount})
		}
		out.Values = append(out.Values, r)
	}
	return out
}

// replayErrorJSON is the replay output's error object: type, message and
// the type's own fields. A plan execution error's cause is an error object
// of the same form; evidence written before causes carried their fields
// has the cause's type and message only.
type replayErrorJSON struct {
	Type                   string                `json:"type"`
	Message                string                `json:"message"`
	Location               *string               `json:"location"`
	BudgetBytes            int64                 `json:"budget_bytes"`
	UsedBytes              int64                 `json:"used_bytes"`
	ReservedBytes          int64                 `json:"reserved_bytes"`
	RequestedBytes         int64                 `json:"requested_bytes"`
	Reason                 *string               `json:"reason"`
	RequestName            *string               `json:"request_name"`
	StateLimit             int                   `json:"state_limit"`
	ExploredStates         int                   `json:"explored_states"`
	Detail                 *string               `json:"detail"`
	ExpectedVersion        *uint64               `json:"expected_version"`
	ActualVersion          uint64                `json:"actual_version"`
	Handle                 *string               `json:"handle"`
	UseCount               int                   `json:"use_count"`
	HoldCount              int                   `json:"hold_count"`
	PendingEventCount      int                   `json:"pending_event_count"`
	Phase                  *string               `json:"phase"`
	FailedAction           *planjson.Action      `json:"failed_action"`
	FailedActionIndex      *int                  `json:"failed_action_index"`
	FailedReservation      *planjson.Reservation `json:"failed_reservation"`
	FailedReservationIndex *int                  `json:"failed_reservation_index"`
	PartialReport          *struct {
		Transitions []evidenceTransitionJSON `json:"transitions"`
	} `json:"partial_report"`
	Cause *replayErrorJSON `json:"cause"`
}

// reasonNotRecorded is the reason of an unavailable error read from
// evidence that does not carry one (written before the replay output
// did): the diagnosis names no reason.
const reasonNotRecorded system.UnavailableReason = -1

// err rebuilds the error from its fields. An object without the fields of
// its type (an old file's cause) gives an error of that class carrying
// the message only.
func (e replayErrorJSON) err(names *detailNames) error {
	kind := kindNamed(e.Type)
	switch {
	case kind == system.ErrorBudget && e.Location != nil:
		return &system.BudgetError{Location: *e.Location, BudgetBytes: e.BudgetBytes, UsedBytes: e.UsedBytes, ReservedBytes: e.ReservedBytes, RequestedBytes: e.RequestedBytes}
	case kind == system.ErrorPlan && e.Reason != nil:
		return &system.PlanError{Reason: *e.Reason}
	case kind == system.ErrorSearchLimit && e.RequestName != nil:
		return &system.SearchLimitError{RequestName: *e.RequestName, StateLimit: e.StateLimit, ExploredStates: e.ExploredStates, Detail: str(e.Detail)}
	case kind == system.ErrorStaleState && e.ExpectedVersion != nil:
		return &system.StaleStateError{ExpectedVersion: *e.ExpectedVersion, ActualVersion: e.ActualVersion}
	case kind == system.ErrorInUse && e.Handle != nil:
		return &system.InUseError{Handle: *e.Handle, Location: str(e.Location), UseCount: e.UseCount, HoldCount: e.HoldCount, PendingEventCount: e.PendingEventCount}
	case kind == system.ErrorUnavailable && e.Detail != nil:
		reason := reasonNotRecorded
		if e.Reason != nil {
			if r, ok := system.ParseUnavailableReason(*e.Reason); ok {
				reason = r
			}
		}
		return &system.UnavailableError{Handle: str(e.Handle), Location: str(e.Location), Detail: *e.Detail, Reason: reason}
	case kind == system.ErrorPlanExecution && e.Phase != nil:
		return e.planExecution(names)
	}
	return &replayError{kind: kind, msg: e.Message}
}

func (e replayErrorJSON) planExecution(names *detailNames) *system.PlanExecutionError {
	pe := &system.PlanExecutionError{Phase: *e.Phase, FailedActionIndex: -1, FailedReservationIndex: -1}
	if e.FailedAction != nil {
		a := e.FailedAction.System()
		pe.FailedAction = &a
	}
	if e.FailedActionIndex != nil {
		pe.FailedActionIndex = *e.FailedActionIndex
	}
	if e.FailedReservation != nil {
		r := e.FailedReservation.System()
		pe.FailedReservation = &r
	}
	if e.FailedReservationIndex != nil {
		pe.FailedReservationIndex = *e.FailedReservationIndex
	}
	if e.PartialReport != nil {
		pe.PartialReport.Transitions = names.transitions(e.PartialReport.Transitions)
	}
	if e.Cause != nil {
		pe.Cause = e.Cause.err(names)
	}
	return pe
}

// kindNamed is the class whose name is typ ([system.ErrorKind.String]);
// ErrorOther for a name of no class (the pipeline's errors, say).
func kindNamed(typ string) system.ErrorKind {
	for _, k := range system.ErrorKinds() {
		if k.String() == typ {
			return k
		}
	}
	return system.ErrorOther
}

// replayError is an error read back from replay output whose fields are
// not known: its class and message only.
type replayError struct {
	kind system.ErrorKind
	msg  string
}

func (e *replayError) Error() string { return e.msg }

// ErrorClass is the class the replay output named.
func (e *replayError) ErrorClass() system.ErrorKind { return e.kind }

// nullable returns nil (JSON null) for an empty string.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
