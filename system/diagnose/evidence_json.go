package diagnose

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/residency-go/residency/internal/jsonerr"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/wire"
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
						d := lastDecide.Decision.System()
						ev.Decision = &d
					}
				}
				if lastExplain != nil && lastExplain.Explanation != nil {
					if _, plan := ev.Err.(*system.PlanError); plan {
						x := lastExplain.Explanation.System()
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
			ev.Snapshot = res.Snapshot.System()
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
	Explanation  *wire.Explanation         `json:"explanation"`
	Decision     *wire.Decision            `json:"decision"`
	Snapshot     *wire.Snapshot            `json:"snapshot"`
	Trace        *[]evidenceTransitionJSON `json:"trace"`
}

// The replay output's records are read in their shapes of package wire,
// which the replay writes them in.

// evidenceTransitionJSON is a transition as evidence may carry it: the
// replay output's transition, and optionally the fields a Transition has
// next to its detail (id, lease, name, failure). The replay output of a
// script writes none of them (its details are the script's words); a
// trace saved from the API does (`demo diagnose --trace`).
type evidenceTransitionJSON struct {
	wire.Transition
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
		x := t.Transition.System()
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

// replayErrorJSON is the replay output's error object: type, message and
// the type's own fields. A plan execution error's cause is an error object
// of the same form; evidence written before causes carried their fields
// has the cause's type and message only.
type replayErrorJSON struct {
	Type                   string            `json:"type"`
	Message                string            `json:"message"`
	Location               *string           `json:"location"`
	BudgetBytes            int64             `json:"budget_bytes"`
	UsedBytes              int64             `json:"used_bytes"`
	ReservedBytes          int64             `json:"reserved_bytes"`
	RequestedBytes         int64             `json:"requested_bytes"`
	Reason                 *string           `json:"reason"`
	RequestName            *string           `json:"request_name"`
	StateLimit             int               `json:"state_limit"`
	ExploredStates         int               `json:"explored_states"`
	Detail                 *string           `json:"detail"`
	ExpectedVersion        *uint64           `json:"expected_version"`
	ActualVersion          uint64            `json:"actual_version"`
	Handle                 *string           `json:"handle"`
	UseCount               int               `json:"use_count"`
	HoldCount              int               `json:"hold_count"`
	PendingEventCount      int               `json:"pending_event_count"`
	Phase                  *string           `json:"phase"`
	FailedAction           *wire.Action      `json:"failed_action"`
	FailedActionIndex      *int              `json:"failed_action_index"`
	FailedReservation      *wire.Reservation `json:"failed_reservation"`
	FailedReservationIndex *int              `json:"failed_reservation_index"`
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

var (
	nullable = wire.Nullable
	str      = wire.Text
)
