package diagnose

import (
	"fmt"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/system"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// Operation names the call that failed: its kind and the endpoint pair
// (value, location) it needed. Every field is optional; the more is known,
// the more precise the diagnosis (the kind of charge a [*BudgetError]
// refused, for one, depends on the call's destination).
type Operation struct {
	// Kind is the call: "register", "place", "copy", "move", "evict",
	// "discard", "acquire", "hold", "reserve", "execute", "enter", "exit",
	// "admit", "decide" or "explain".
	Kind string
	// Handle is the value. Only Name is needed; when Manager is set it is
	// checked against the snapshot's manager.
	Handle system.Handle
	// Location is the destination (place, copy, move, register), the
	// location acted on (evict, acquire, hold) or reserved at (reserve).
	Location string
	// From is the source of a copy or move, or an enter action's From.
	From string
	// Reservation and Bytes describe a reservation (reserve).
	Reservation string
	Bytes       int64
}

func (o Operation) String() string {
	var b strings.Builder
	b.WriteString(o.Kind)
	if b.Len() == 0 {
		b.WriteString("operation")
	}
	if o.Handle.Name != "" {
		b.WriteString(" " + o.Handle.Name)
	}
	if o.Reservation != "" {
		fmt.Fprintf(&b, " %q (%d bytes)", o.Reservation, o.Bytes)
	}
	switch {
	case o.From != "" && o.Location != "":
		fmt.Fprintf(&b, " %s→%s", o.From, o.Location)
	case o.Location != "":
		b.WriteString(" @" + o.Location)
	}
	return b.String()
}

// Evidence is everything a diagnosis reads: the error, the call that
// failed, and the state captured at the failure. Capture it before any
// cleanup (releasing leases, exiting scopes, retrying): afterwards the
// snapshot no longer shows the state that refused the call. Use
// [System.Capture] right after the failing call returns.
type Evidence struct {
	Err error
	// Op is the call that failed (optional).
	Op Operation
	// Snapshot and Trace are the state view taken at the failure.
	Snapshot system.Snapshot
	Trace    []system.Transition
	// Decision is the controller decision whose scope failed, for a stale
	// scope entry or a failed entry of a decided plan (optional).
	Decision *system.Decision
	// Plan is the plan that failed, for Execute or a scope (optional; a
	// Decision carries its own).
	Plan *system.Plan
	// Explanation is System.Explain of the plan that failed (optional).
	Explanation *system.Explanation
	// Devices are NVML observations of the device locations (optional;
	// cuda:N → the device, from package cuda/discover matched by UUID).
	// They are shown as diagnostics next to a budget refusal at that
	// location, never used as admission evidence: the runtime admits by
	// its budget, whatever the device reports free.
	Devices map[string]cuda.DeviceInfo
}

// plan is the failed plan: Plan, else the decision's.
func (ev Evidence) plan() *system.Plan {
	switch {
	case ev.Plan != nil:
		return ev.Plan
	case ev.Decision != nil:
		return &ev.Decision.Plan
	}
	return nil
}

func planEndpoints(p *system.Plan) [][2]string {
	if p == nil {
		return nil
	}
	var eps [][2]string
	for _, a := range p.Reclaim {
		eps = append(eps, [2]string{a.Handle.Name, a.Location})
	}
	for _, a := range p.Enter {
		eps = append(eps, [2]string{a.Handle.Name, a.Location})
	}
	return eps
}

// ChargeKind says what a refused charge was for.
type ChargeKind string

// The kinds of charge a [*BudgetError] can refuse.
const (
	ChargeUnknown         ChargeKind = "unknown"
	ChargeMaterialization ChargeKind = "materialization"
	ChargeReservation     ChargeKind = "reservation"
	ChargeTemporary       ChargeKind = "temporary reconstruction charge"
)

// Diagnosis is the result of [Diagnose]: the error's class, the steps of
// the diagnosis procedure that apply to it with the figures they found, and
// the first thing to do. The typed fields hold the same figures for
// programs; Steps hold them as text. A field that does not apply to the
// class is nil.
type Diagnosis struct {
	// Class is the name of the error's class, [system.ErrorClass] of it
	// ("ResidencyBudgetError", …, "InvalidInput" for bad input, "Error"
	// for anything else: a device failure, a context error); "" when
	// there is no error.
	Class       string
	Message     string
	Meaning     string
	FirstAction string
	Op          Operation

	StateVersion uint64
	ManagerID    string

	Steps []DiagnosisStep

	Capture    CaptureCheck
	Endpoints  []EndpointState
	Budget     *BudgetArithmetic
	Protection *ProtectionOwners
	Search     *SearchEvidence
	Stale      *StaleRange
	Execution  *ExecutionOutcome
}

// DiagnosisStep is one step of the procedure as it applied.
type DiagnosisStep struct {
	Number   int
	Title    string
	Findings []Finding
}

// Finding is one check of a step: what was checked, the figures read or
// computed, and the verdict.
type Finding struct {
	What    string
	Figures []Figure
	Verdict string
}

// Figure is one named figure of a finding.
type Figure struct {
	Name  string
	Value string
}

// CaptureCheck says whether the snapshot and trace form one state view
// taken at the failure.
type CaptureCheck struct {
	StateVersion uint64
	// TraceOldest and TraceNewest are the versions of the trace's ends
	// (0 when the trace is empty).
	TraceOldest, TraceNewest uint64
	// OneView: the trace ends at the snapshot's version (unknown, false,
	// when the trace is empty).
	OneView bool
	// AtFailure: the snapshot still shows the figures the error reported.
	// Nil when the error carries nothing to compare.
	AtFailure *bool
	// Differences lists what changed since the failure.
	Differences []string
}

// EndpointState is a (value, location) pair a failed call needed and the
// value's state in the snapshot.
type EndpointState struct {
	Value    string
	Location string
	// Live: the value is in the snapshot. Otherwise Gone says what the
	// trace shows about it ("" when nothing).
	Live             bool
	Gone             string
	Bytes            int64
	ReplicaMode      system.ReplicaMode
	Recoverable      bool
	HasSource        bool
	SourceLocation   string
	Materializations []system.MaterializationRecord
	// AtLocation is the materialization at Location, if any.
	AtLocation *system.MaterializationRecord
}

// BudgetArithmetic is the admission arithmetic of a [*BudgetError].
type BudgetArithmetic struct {
	Location                                              string
	BudgetBytes, UsedBytes, ReservedBytes, RequestedBytes int64
	// CurrentCharged is UsedBytes+ReservedBytes; NewPeak adds
	// RequestedBytes; MissingBytes is NewPeak−BudgetBytes. Each is
	// worked out exactly and saturated to the int64 range (only figures
	// no runtime reports, from edited evidence, reach it; the diagnosis
	// text shows the exact sums).
	CurrentCharged, NewPeak, MissingBytes int64
	Charge                                ChargeKind
	// ChargeReason says how Charge was worked out.
	ChargeReason string
	// Now is the location's record in the snapshot.
	Now *system.LocationRecord
}

// Lifetime is one lease, hold or pending event found in the trace.
type Lifetime struct {
	Kind string // "lease", "hold" or "event"
	// ID is the id as the trace writes it: the runtime's number, or the
	// name a replay script gave it.
	ID string
	// Version is when it was taken (acquire, hold, record_event).
	Version uint64
	// Lease is the lease an event was recorded on.
	Lease string
}

func (t Lifetime) String() string {
	if t.Kind == "event" {
		return fmt.Sprintf("event %s (recorded on lease %s at v%d)", t.ID, t.Lease, t.Version)
	}
	return fmt.Sprintf("%s %s (taken at v%d)", t.Kind, t.ID, t.Version)
}

// ProtectionOwners is an [*InUseError]'s counts and the lifetimes the
// trace shows owning them.
type ProtectionOwners struct {
	Value, Location                        string
	UseCount, HoldCount, PendingEventCount int
	// Leases, Holds and Events are open in the trace (taken, not yet
	// released or reaped) at the endpoint, oldest first.
	Leases, Holds, Events []Lifetime
	// Complete: the trace reaches back to version 1, so the lists hold
	// every open lifetime.
	Complete bool
	// Now is the materialization in the snapshot (nil if gone).
	Now *system.MaterializationRecord
}

// SearchEvidence is the controller's evidence: from a decision, an
// explanation and/or a [*SearchLimitError].
type SearchEvidence struct {
	RequestName          string
	StateLimit           int // SearchLimitError only
	ExploredStates       int
	Exhaustive           bool
	ExpectedStateVersion uint64
	Detail               string
	Evictions            []system.Eviction
	Plan                 *system.Plan
	Feasible             bool
	Reason               string
	// PredictedPeaks lists the predicted peak per location, in the
	// snapshot's location order.
	PredictedPeaks []LocationBytes
}

// LocationBytes is a figure of bytes at one location.
type LocationBytes struct {
	Location string
	Bytes    int64
}

// StaleRange is a [*StaleStateError]'s version gap and what the trace
// shows of it.
type StaleRange struct {
	ExpectedVersion, ActualVersion uint64
	// Intervening lists the transitions of versions Expected+1…Actual the
	// trace still holds, oldest first.
	Intervening []system.Transition
	// Covered: the trace holds every one of them.
	Covered bool
	// Missing counts the versions of the range the trace no longer holds.
	Missing uint64
}

// ExecutionOutcome is a [*PlanExecutionError]'s committed prefix sorted by
// what became of it, and its cause diagnosed.
type ExecutionOutcome struct {
	Phase                  string
	FailedAction           *system.Action
	FailedActionIndex      int
	FailedReservation      *system.ReservationSpec
	FailedReservationIndex int
	Committed              []system.Transition
	// Kept lists the committed effects that were not rolled back and
	// still hold, in words; Cleaned lists what the failure's cleanup
	// undid; FailedStep what the failed step itself left (nothing is
	// charged for it any more).
	Kept, Cleaned, FailedStep []string
	Cause                     *Diagnosis
}

// Diagnose runs the diagnosis procedure for err on the state view snap and
// trace, captured at the failure. It is Diagnose of [Evidence] without the
// optional parts; see [DiagnoseEvidence].
func Diagnose(err error, snap system.Snapshot, trace []system.Transition) Diagnosis {
	return DiagnoseEvidence(Evidence{Err: err, Snapshot: snap, Trace: trace})
}

// DiagnoseEvidence runs every step of the diagnosis procedure that applies
// to the class of ev.Err and fills it with the evidence's figures:
//
//  1. the state view: snapshot version, trace range, whether the two form
//     one view and whether the snapshot still shows the failure;
//  2. each endpoint the call needed: the value's materializations, replica
//     mode, recoverability and source;
//  3. budget arithmetic: current charged, new peak, missing headroom and
//     the kind of the refused charge;
//  4. protections: the counts and the leases, holds and events owning them;
//  5. the controller's evidence: explored states, limit, evictions, peaks;
//  6. a stale decision: the transitions between the two versions;
//  7. a failed execution: phase, failed step, committed prefix, what was
//     not rolled back, and the cause, itself diagnosed;
//  8. the class and the first corrective action.
//
// It is a pure function of its input: it reads no runtime and changes
// nothing. A nil error gives a diagnosis of class "" with no steps.
func DiagnoseEvidence(ev Evidence) Diagnosis {
	return diagnose(ev, false)
}

type classInfo struct{ meaning, action string }

// classes are the meaning and the first action of each class.
var classes = map[system.ErrorKind]classInfo{
	system.ErrorBudget: {
		"a direct materialization, reservation or temporary reconstruction charge would take one location past its strict budget",
		"reconcile the five byte fields and the missing headroom before touching any budget"},
	system.ErrorPlan: {
		"a plan or request is invalid or infeasible on the current state; none of its actions began",
		"read the explanation, then check endpoints, ownership, budgets and protections"},
	system.ErrorSearchLimit: {
		"the controller's search hit its deterministic state bound; whether a placement exists is unknown",
		"keep the search evidence; simplify the tiers, or raise the bound only with a reason"},
	system.ErrorStaleState: {
		"the state changed after the decision was made; its expected version is no longer current",
		"find the change that intervened, and decide again if the request still stands"},
	system.ErrorInUse: {
		"a lease, hold or pending consumer event protects the materialization a removal needed",
		"end the owning lifetime (release the lease or hold, wait for the event) or remove later"},
	system.ErrorUnavailable: {
		"the call needs an endpoint, location or source that is not there",
		"establish the exact endpoint (place it, enter a scope, Admit) or a valid reconstruction path"},
	system.ErrorPlanExecution: {
		"execution failed after preflight succeeded; a prefix may be committed and is not rolled back",
		"read the phase, the failed step and its index, the partial report and the cause, then capture a fresh snapshot and continue from it"},
	system.ErrorInvalidInput: {
		"malformed or unknown input (a name, a size, a double release); nothing changed",
		"fix the call's arguments; the state needs no repair"},
	system.ErrorCacheBusy: {
		"a loader cache found its location's budget short and nothing of its own idle to evict, or an entry to evict in use",
		"wait for leases, pins and keepalives of the cache to end, or make room at the location by other means"},
	system.ErrorCacheLoad: {
		"a loader cache's loader failed, panicked or reported a resident size out of bounds; its reservation was released",
		"read the cause; the next load of the key runs the loader again"},
	system.ErrorOther: {
		"not one of the runtime's structured errors (a device failure, a context that ended, a stopped runtime)",
		"read the message; the runtime's own figures do not explain it"},
}

type diag struct {
	ev     Evidence
	d      *Diagnosis
	nested bool
}

func diagnose(ev Evidence, nested bool) Diagnosis {
	d := Diagnosis{Op: ev.Op, StateVersion: ev.Snapshot.StateVersion, ManagerID: ev.Snapshot.ManagerID}
	if ev.Err == nil {
		return d
	}
	class, e := system.ClassifiedError(ev.Err)
	d.Class, d.Message = class.String(), ev.Err.Error()
	d.Meaning, d.FirstAction = classes[class].meaning, classes[class].action
	g := &diag{ev: ev, d: &d, nested: nested}
	if !nested {
		g.capture(e)
	}
	switch x := e.(type) {
	case *system.BudgetError:
		g.endpoints(g.opEndpoints())
		g.budget(x)
	case *system.PlanError:
		g.endpoints(append(g.opEndpoints(), planEndpoints(ev.plan())...))
		g.locations()
		g.protected()
		g.search(nil)
	case *system.SearchLimitError:
		g.search(x)
	case *system.StaleStateError:
		g.search(nil)
		g.stale(x)
	case *system.InUseError:
		g.endpoints([][2]string{{x.Handle, x.Location}})
		g.protection(x)
	case *system.UnavailableError:
		loc := x.Location
		if loc == "" && x.Handle == ev.Op.Handle.Name {
			loc = ev.Op.Location
		}
		g.endpoints([][2]string{{x.Handle, loc}})
		g.unavailable(x)
	case *system.PlanExecutionError:
		var eps [][2]string
		if a := x.FailedAction; a != nil {
			eps = append(eps, [2]string{a.Handle.Name, a.Location})
			if a.From != "" {
				eps = append(eps, [2]string{a.Handle.Name, a.From})
			}
		}
		g.endpoints(eps)
		g.execution(x)
	case *system.CacheBusyError:
		if x.Refusal != nil {
			g.budget(x.Refusal)
		}
	}
	g.classify(class)
	return d
}

func (g *diag) add(number int, title string, fs ...Finding) {
	for i := range g.d.Steps {
		if g.d.Steps[i].Number == number {
			g.d.Steps[i].Findings = append(g.d.Steps[i].Findings, fs...)
			return
		}
	}
	g.d.Steps = append(g.d.Steps, DiagnosisStep{Number: number, Title: title, Findings: fs})
}

func fig(name string, v any) Figure { return Figure{Name: name, Value: fmt.Sprint(v)} }

func bytesFig(name string, n int64) Figure { return Figure{Name: name, Value: fmt.Sprintf("%d B", n)} }

const (
	stepCapture   = "Capture one state view"
	stepEndpoint  = "Verify the exact endpoints"
	stepBudget    = "Reconcile the budget arithmetic"
	stepProtect   = "Check protection before changing placement"
	stepDecision  = "Inspect the controller's evidence"
	stepStale     = "Treat stale state as a concurrency result"
	stepExecution = "Recover from a partial execution; assume no rollback"
	stepClassify  = "Classify the result"
)

// ---- step 1 ----------------------------------------------------------------

func traceEnds(tr []system.Transition) (uint64, uint64) {
	if len(tr) == 0 {
		return 0, 0
	}
	return tr[0].Version, tr[len(tr)-1].Version
}

func (g *diag) capture(e error) {
	s := g.ev.Snapshot
	c := &g.d.Capture
	c.StateVersion = s.StateVersion
	c.TraceOldest, c.TraceNewest = traceEnds(g.ev.Trace)
	snapF := Finding{What: "snapshot", Figures: []Figure{
		fig("state_version", s.StateVersion), fig("manager_id", s.ManagerID),
		fig("locations", len(s.Locations)), fig("live values", len(s.Values)),
	}, Verdict: fmt.Sprintf("one atomic copy of the state at v%d", s.StateVersion)}
	trF := Finding{What: "trace"}
	switch {
	case len(g.ev.Trace) == 0:
		trF.Figures = []Figure{fig("transitions", 0)}
		trF.Verdict = "empty: the trace is disabled (or nothing was committed); the steps below rest on the snapshot alone"
	default:
		trF.Figures = []Figure{fig("transitions", len(g.ev.Trace)), fig("oldest", fmt.Sprintf("v%d", c.TraceOldest)), fig("newest", fmt.Sprintf("v%d", c.TraceNewest))}
		switch {
		case c.TraceNewest == s.StateVersion:
			c.OneView = true
			trF.Verdict = "ends at the snapshot's version: snapshot and trace are one state view"
		case c.TraceNewest > s.StateVersion:
			trF.Verdict = fmt.Sprintf("runs %d versions past the snapshot: it was taken after further changes, so the two are not one state view", c.TraceNewest-s.StateVersion)
		default:
			trF.Verdict = fmt.Sprintf("stops %d versions short of the snapshot: it was taken earlier, so the two are not one state view", s.StateVersion-c.TraceNewest)
		}
		if c.TraceOldest > 1 {
			trF.Verdict += fmt.Sprintf("; the ring no longer holds v1–v%d", c.TraceOldest-1)
		}
	}
	g.add(1, stepCapture, snapF, trF)
	if f, ok := g.atFailure(e); ok {
		g.add(1, stepCapture, f)
	}
}

// atFailure compares what the error reported with the snapshot.
func (g *diag) atFailure(e error) (Finding, bool) {
	s := g.ev.Snapshot
	c := &g.d.Capture
	var diffs []string
	f := Finding{What: "the error's figures against the snapshot"}
	switch x := e.(type) {
	case *system.BudgetError:
		lr, ok := s.Location(x.Location)
		if !ok {
			return f, false
		}
		f.Figures = []Figure{
			Figure{Name: "used_bytes", Value: fmt.Sprintf("%d at the refusal, %d now", x.UsedBytes, lr.UsedBytes)},
			Figure{Name: "reserved_bytes", Value: fmt.Sprintf("%d at the refusal, %d now", x.ReservedBytes, lr.ReservedBytes)},
		}
		if lr.UsedBytes != x.UsedBytes {
			diffs = append(diffs, fmt.Sprintf("used bytes at %s: %d → %d", x.Location, x.UsedBytes, lr.UsedBytes))
		}
		if lr.ReservedBytes != x.ReservedBytes {
			diffs = append(diffs, fmt.Sprintf("reserved bytes at %s: %d → %d", x.Location, x.ReservedBytes, lr.ReservedBytes))
		}
	case *system.InUseError:
		m := matAt(s, x.Handle, x.Location)
		now := "materialization gone"
		if m != nil {
			now = fmt.Sprintf("%d/%d/%d", m.UseCount, m.HoldCount, m.PendingEventCount)
		}
		f.Figures = []Figure{{Name: "leases/holds/events", Value: fmt.Sprintf("%d/%d/%d at the refusal, %s now", x.UseCount, x.HoldCount, x.PendingEventCount, now)}}
		if m == nil || m.UseCount != x.UseCount || m.HoldCount != x.HoldCount || m.PendingEventCount != x.PendingEventCount {
			diffs = append(diffs, fmt.Sprintf("protection of %s at %s: %d/%d/%d → %s", x.Handle, x.Location, x.UseCount, x.HoldCount, x.PendingEventCount, now))
		}
	case *system.StaleStateError:
		f.Figures = []Figure{{Name: "state_version", Value: fmt.Sprintf("%d at the refusal, %d in the snapshot", x.ActualVersion, s.StateVersion)}}
		if s.StateVersion != x.ActualVersion {
			diffs = append(diffs, fmt.Sprintf("state version %d → %d", x.ActualVersion, s.StateVersion))
		}
	case *system.PlanExecutionError:
		ts := x.PartialReport.Transitions
		if len(ts) == 0 {
			return f, false
		}
		last := ts[len(ts)-1].Version
		f.Figures = []Figure{{Name: "last committed transition", Value: fmt.Sprintf("v%d; snapshot at v%d", last, s.StateVersion)}}
		if s.StateVersion != last {
			diffs = append(diffs, fmt.Sprintf("%d more versions committed after the failure", s.StateVersion-last))
		}
	default:
		return f, false
	}
	at := len(diffs) == 0
	c.AtFailure, c.Differences = &at, diffs
	if at {
		f.Verdict = "the same: the snapshot shows the state that refused the call"
	} else {
		f.Verdict = "changed since the failure (" + strings.Join(diffs, "; ") + "): the state moved on (cleanup or other callers); the steps below use the error's own figures where it has them — capture before cleanup next time"
	}
	return f, true
}

// ---- step 2 ----------------------------------------------------------------

func matAt(s system.Snapshot, value, loc string) *system.MaterializationRecord {
	v, ok := s.Value(value)
	if !ok {
		return nil
	}
	for i := range v.Materializations {
		if v.Materializations[i].Location == loc {
			m := v.Materializations[i]
			return &m
		}
	}
	return nil
}

func (g *diag) opEndpoints() [][2]string {
	o := g.ev.Op
	if o.Handle.Name == "" {
		return nil
	}
	eps := [][2]string{{o.Handle.Name, o.Location}}
	if o.From != "" {
		eps = append(eps, [2]string{o.Handle.Name, o.From})
	}
	return eps
}

func matString(m system.MaterializationRecord) string {
	return fmt.Sprintf("%s %s (%d B; leases %d, holds %d, events %d)", m.Location, m.State, m.ChargedBytes, m.UseCount, m.HoldCount, m.PendingEventCount)
}

// goneFromTrace says what the trace shows of a value absent from the
// snapshot: its discard or its failed registration.
func goneFromTrace(tr []system.Transition, name string) string {
	for i := len(tr) - 1; i >= 0; i-- {
		t := tr[i]
		if t.Handle != name {
			continue
		}
		switch {
		case t.Kind == "discard":
			return fmt.Sprintf("discarded at v%d", t.Version)
		case t.Kind == "fail" && strings.Contains(t.Detail, "registration failed"):
			return fmt.Sprintf("its registration failed at v%d", t.Version)
		}
	}
	return ""
}

func (g *diag) endpoints(eps [][2]string) {
	s := g.ev.Snapshot
	seen := map[string]bool{}
	for _, ep := range eps {
		name, loc := ep[0], ep[1]
		if name == "" {
			if loc != "" {
				g.locationFinding(loc)
			}
			continue
		}
		key := name + "\x00" + loc
		if seen[key] {
			continue
		}
		seen[key] = true
		st := EndpointState{Value: name, Location: loc}
		f := Finding{What: fmt.Sprintf("endpoint (%s, %s)", name, orDash(loc))}
		if m := g.ev.Op.Handle.Manager; m != "" && name == g.ev.Op.Handle.Name && m != s.ManagerID {
			f.Figures = append(f.Figures, fig("handle manager", m), fig("snapshot manager", s.ManagerID))
			f.Verdict = "the handle belongs to another manager: this runtime cannot act on it"
			g.d.Endpoints = append(g.d.Endpoints, st)
			g.add(2, stepEndpoint, f)
			continue
		}
		v, ok := s.Value(name)
		if !ok {
			st.Gone = goneFromTrace(g.ev.Trace, name)
			why := st.Gone
			if why == "" {
				why = "never registered, or its removal is older than the trace"
			}
			f.Figures = append(f.Figures, fig("in snapshot", "no"))
			f.Verdict = "not a live value: " + why
			g.d.Endpoints = append(g.d.Endpoints, st)
			g.add(2, stepEndpoint, f)
			continue
		}
		st.Live, st.Bytes, st.ReplicaMode, st.Recoverable = true, v.Bytes, v.ReplicaMode, v.Recoverable
		st.HasSource, st.SourceLocation, st.Materializations = v.HasSource, v.SourceLocation, v.Materializations
		mats := "none"
		if len(v.Materializations) > 0 {
			ms := make([]string, len(v.Materializations))
			for i, m := range v.Materializations {
				ms[i] = matString(m)
				if m.Location == loc {
					mm := m
					st.AtLocation = &mm
				}
			}
			mats = strings.Join(ms, "; ")
		}
		src := "none"
		if v.HasSource {
			src = v.SourceLocation
		}
		f.Figures = append(f.Figures, bytesFig("bytes (fixed charge)", v.Bytes), fig("replica_mode", v.ReplicaMode),
			fig("recoverable", v.Recoverable), fig("has_source", v.HasSource), fig("source_location", src), fig("materializations", mats))
		var vs []string
		switch {
		case loc == "":
		case st.AtLocation == nil:
			vs = append(vs, fmt.Sprintf("no materialization at %s", loc))
		case st.AtLocation.State != system.Resident:
			vs = append(vs, fmt.Sprintf("%s at %s: a transition is in flight", st.AtLocation.State, loc))
		default:
			vs = append(vs, fmt.Sprintf("resident at %s", loc))
		}
		if loc != "" {
			if _, ok := s.Location(loc); !ok {
				vs = append(vs, fmt.Sprintf("%s is not a configured location", loc))
			}
		}
		if !v.Recoverable {
			vs = append(vs, "not recoverable: no resident copy and no source")
		} else if len(v.Materializations) == 0 {
			vs = append(vs, "recoverable only by reconstruction at "+v.SourceLocation)
		}
		f.Verdict = "live value; " + strings.Join(vs, "; ")
		f.Verdict = strings.TrimSuffix(f.Verdict, "; ")
		g.d.Endpoints = append(g.d.Endpoints, st)
		g.add(2, stepEndpoint, f)
	}
}

func (g *diag) locationFinding(loc string) {
	f := Finding{What: "location " + loc}
	if lr, ok := g.ev.Snapshot.Location(loc); ok {
		f.Figures = locFigures(lr)
		f.Verdict = "configured"
	} else {
		f.Verdict = "not a configured location of this runtime"
	}
	g.add(2, stepEndpoint, f)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func budgetString(lr system.LocationRecord) string {
	if !lr.HasBudget {
		return "none"
	}
	return fmt.Sprintf("%d B", lr.BudgetBytes)
}

func locFigures(lr system.LocationRecord) []Figure {
	fs := []Figure{{Name: "budget_bytes", Value: budgetString(lr)}, bytesFig("used_bytes", lr.UsedBytes)}
	if lr.TemporaryBytes > 0 {
		fs = append(fs, bytesFig("of which temporary reconstruction", lr.TemporaryBytes))
	}
	fs = append(fs, bytesFig("reserved_bytes", lr.ReservedBytes))
	if len(lr.Reservations) > 0 {
		rs := make([]string, len(lr.Reservations))
		for i, r := range lr.Reservations {
			rs[i] = fmt.Sprintf("%s %d B", r.Name, r.Bytes)
			if r.Owner != "" {
				rs[i] += " (owner " + r.Owner + ")"
			}
		}
		fs = append(fs, fig("reservations", strings.Join(rs, ", ")))
	}
	fs = append(fs, bytesFig("peak_bytes", lr.PeakBytes))
	if lr.HasBudget {
		fs = append(fs, Figure{Name: "headroom", Value: bigDiff(lr.BudgetBytes, lr.UsedBytes, lr.ReservedBytes).String() + " B"})
	}
	return fs
}

// Byte figures of evidence read from a file may hold any int64: their
// sums and differences are worked out exactly, never wrapped around.

// bigDiff is a − b₁ − b₂ − …, exactly.
func bigDiff(a int64, bs ...int64) *big.Int {
	r := big.NewInt(a)
	for _, b := range bs {
		r.Sub(r, big.NewInt(b))
	}
	return r
}

// sat64 is n saturated to the int64 range; ok is false when it did not fit.
func sat64(n *big.Int) (v int64, ok bool) {
	switch {
	case n.IsInt64():
		return n.Int64(), true
	case n.Sign() > 0:
		return math.MaxInt64, false
	default:
		return math.MinInt64, false
	}
}

func (g *diag) unavailable(x *system.UnavailableError) {
	f := Finding{What: "why the endpoint is unavailable", Figures: []Figure{fig("detail", x.Detail)}}
	switch x.Reason {
	case system.UnavailableEndpoint:
		f.Figures = append(f.Figures, fig("reason", "no resident materialization"))
		f.Verdict = "acquire and the other direct calls never place a missing value: establish the endpoint first (Place, a scope, or Admit)"
	case system.UnavailableLocation:
		f.Figures = append(f.Figures, fig("reason", "location not configured"))
		f.Verdict = "the location set is fixed at Start: use a configured location"
	case system.UnavailableSource:
		f.Figures = append(f.Figures, fig("reason", "no resident copy and no source"))
		f.Verdict = "nothing can rebuild the value: it needs a resident copy or a source with a loader"
	case system.UnavailableDiscarded:
		f.Figures = append(f.Figures, fig("reason", "handle discarded"))
		f.Verdict = "a discarded handle answers this forever; register the value again (a new handle)"
	case system.UnavailableForeign:
		f.Figures = append(f.Figures, fig("reason", "handle of another manager"))
		f.Verdict = "use a handle of this runtime"
	case system.UnavailableInFlight:
		f.Figures = append(f.Figures, fig("reason", "transition in flight"))
		f.Verdict = "busy, not absent: retry once the transition in flight settles (errors.Is ErrBusy)"
	}
	g.add(2, stepEndpoint, f)
}

// ---- step 3 ----------------------------------------------------------------

func (g *diag) budget(x *system.BudgetError) {
	b := &BudgetArithmetic{Location: x.Location, BudgetBytes: x.BudgetBytes, UsedBytes: x.UsedBytes, ReservedBytes: x.ReservedBytes, RequestedBytes: x.RequestedBytes}
	cur := new(big.Int).Add(big.NewInt(x.UsedBytes), big.NewInt(x.ReservedBytes))
	peak := new(big.Int).Add(cur, big.NewInt(x.RequestedBytes))
	miss := new(big.Int).Sub(peak, big.NewInt(x.BudgetBytes))
	var ok1, ok2, ok3 bool
	b.CurrentCharged, ok1 = sat64(cur)
	b.NewPeak, ok2 = sat64(peak)
	b.MissingBytes, ok3 = sat64(miss)
	verdict := fmt.Sprintf("refused: %s is %s bytes short", x.Location, miss)
	if !ok1 || !ok2 || !ok3 {
		verdict += " (these sums are beyond the int64 range: no runtime reports such figures; the evidence was edited or is corrupt)"
	}
	b.Charge, b.ChargeReason = g.chargeKind(x)
	if lr, ok := g.ev.Snapshot.Location(x.Location); ok {
		b.Now = &lr
	}
	g.d.Budget = b
	g.add(3, stepBudget,
		Finding{What: "the refusal's five fields", Figures: []Figure{
			fig("location", x.Location), bytesFig("budget_bytes", x.BudgetBytes), bytesFig("used_bytes", x.UsedBytes),
			bytesFig("reserved_bytes", x.ReservedBytes), bytesFig("requested_bytes", x.RequestedBytes)}},
		Finding{What: "admission at " + x.Location, Figures: []Figure{
			{Name: "current charged", Value: fmt.Sprintf("used + reserved = %d + %d = %s B", x.UsedBytes, x.ReservedBytes, cur)},
			{Name: "new peak", Value: fmt.Sprintf("current charged + requested = %s + %d = %s B", cur, x.RequestedBytes, peak)},
			{Name: "admissible", Value: fmt.Sprintf("new peak %s <= budget %d: %t", peak, x.BudgetBytes, peak.Cmp(big.NewInt(x.BudgetBytes)) <= 0)},
			{Name: "missing headroom", Value: fmt.Sprintf("new peak − budget = %s − %d = %s B", peak, x.BudgetBytes, miss)},
		}, Verdict: verdict},
		Finding{What: "what the requested charge is", Figures: []Figure{fig("kind", b.Charge)}, Verdict: b.ChargeReason},
	)
	if b.Now != nil {
		f := Finding{What: x.Location + " in the snapshot", Figures: locFigures(*b.Now)}
		head := bigDiff(b.Now.BudgetBytes, b.Now.UsedBytes, b.Now.ReservedBytes)
		if req := big.NewInt(x.RequestedBytes); head.Cmp(req) >= 0 {
			f.Verdict = fmt.Sprintf("now %s bytes free, enough for the %d requested: the state changed after the refusal", head, x.RequestedBytes)
			if g.nested {
				f.Verdict += " (the failed run's cleanup, or calls after it)"
			}
		} else {
			f.Verdict = fmt.Sprintf("now %s bytes free: still %s short of the %d requested", head, new(big.Int).Sub(req, head), x.RequestedBytes)
		}
		g.add(3, stepBudget, f)
	}
	if dev, ok := g.ev.Devices[x.Location]; ok {
		f := Finding{What: "NVML observation of " + x.Location + " (diagnostic, not admission evidence)", Figures: []Figure{
			fig("device", dev.Name), fig("uuid", dev.UUID), bytesFig("total", dev.TotalBytes), bytesFig("free", dev.FreeBytes), bytesFig("used", dev.UsedBytes)}}
		switch {
		case x.BudgetBytes > dev.TotalBytes:
			f.Verdict = fmt.Sprintf("the budget (%d B) is above the device's total memory (%d B): the configuration promises bytes the device does not have", x.BudgetBytes, dev.TotalBytes)
		case dev.FreeBytes >= x.RequestedBytes:
			f.Verdict = fmt.Sprintf("the device reports %d B free, but admission is by the budget, which is short: raise the budget or free charges, not the device", dev.FreeBytes)
		default:
			f.Verdict = fmt.Sprintf("the device itself reports only %d B free (other processes or driver reservations): raising the budget would not help", dev.FreeBytes)
		}
		g.add(3, stepBudget, f)
	}
}

// chargeKind works out what the refused charge was for: the operation when
// known, otherwise the snapshot's candidates.
func (g *diag) chargeKind(x *system.BudgetError) (ChargeKind, string) {
	o, s := g.ev.Op, g.ev.Snapshot
	if o.Kind == "reserve" || o.Reservation != "" {
		return ChargeReservation, fmt.Sprintf("the call reserved %d bytes at %s as a named reservation; reservations and materializations share the budget", x.RequestedBytes, x.Location)
	}
	if o.Handle.Name != "" && o.Location != "" {
		v, live := s.Value(o.Handle.Name)
		switch {
		case x.Location == o.Location:
			why := fmt.Sprintf("%s is the destination of %s: a new materialization charged the value's fixed %d bytes from admission on", x.Location, o.Handle.Name, x.RequestedBytes)
			if live && len(v.Materializations) > 0 {
				why += fmt.Sprintf("; its copy at %s stays charged too until the transfer completes (overlap), but that charge is at %s, not here", v.Materializations[0].Location, v.Materializations[0].Location)
			} else if live && v.HasSource && v.SourceLocation != x.Location {
				why += fmt.Sprintf("; the reconstruction's temporary buffer at %s is a separate charge there", v.SourceLocation)
			}
			return ChargeMaterialization, why
		case live && v.HasSource && v.SourceLocation == x.Location:
			return ChargeTemporary, fmt.Sprintf("%s is %s's source location and the destination is %s: a reconstruction loads the value into a temporary buffer of %d bytes at %s before copying it to %s. Raising %s's budget does not help; %s needs the headroom",
				x.Location, o.Handle.Name, o.Location, x.RequestedBytes, x.Location, o.Location, o.Location, x.Location)
		}
		return ChargeUnknown, fmt.Sprintf("%s is neither the destination %s nor the value's source location", x.Location, o.Location)
	}
	// No operation given: list the snapshot's candidates.
	var temp, mat []string
	for _, v := range s.Values {
		if v.Bytes != x.RequestedBytes {
			continue
		}
		if v.HasSource && v.SourceLocation == x.Location && !hasResident(v) {
			temp = append(temp, v.Handle.Name)
		}
		if matAt(s, v.Handle.Name, x.Location) == nil {
			mat = append(mat, v.Handle.Name)
		}
	}
	why := "the error does not say which call it refused; give Evidence.Op."
	if len(temp) > 0 {
		why += fmt.Sprintf(" A temporary reconstruction charge fits %s (source %s, no resident copy).", strings.Join(temp, ", "), x.Location)
	}
	if len(mat) > 0 {
		why += fmt.Sprintf(" A new materialization at %s fits %s.", x.Location, strings.Join(mat, ", "))
	}
	if len(temp) == 0 && len(mat) == 0 {
		why += fmt.Sprintf(" No live value charges %d bytes: most likely a reservation.", x.RequestedBytes)
	}
	return ChargeUnknown, why
}

func hasResident(v system.ValueRecord) bool {
	for _, m := range v.Materializations {
		if m.State == system.Resident {
			return true
		}
	}
	return false
}

// locations lists every budgeted location's figures (a plan error).
func (g *diag) locations() {
	for _, lr := range g.ev.Snapshot.Locations {
		if !lr.HasBudget {
			continue
		}
		f := Finding{What: lr.Location, Figures: locFigures(lr)}
		if p, ok := g.ev.peaks()[lr.Location]; ok {
			f.Figures = append(f.Figures, bytesFig("predicted peak", p))
			if p > lr.BudgetBytes {
				f.Verdict = fmt.Sprintf("the plan's predicted peak is %d bytes over the budget", p-lr.BudgetBytes)
			} else if g.ev.infeasible() {
				f.Verdict = "the predicted peak up to the refused step fits; the refused step itself does not (see the explanation's reason)"
			} else {
				f.Verdict = "the predicted peak fits"
			}
		}
		g.add(3, stepBudget, f)
	}
}

// infeasible reports an explanation that stopped at a refused step: its
// predicted peaks cover only the steps before it.
func (ev Evidence) infeasible() bool {
	return ev.Explanation != nil && !ev.Explanation.Feasible
}

func (ev Evidence) peaks() map[string]int64 {
	switch {
	case ev.Explanation != nil:
		return ev.Explanation.PredictedPeakBytes
	case ev.Decision != nil:
		return ev.Decision.Explanation.PredictedPeakBytes
	}
	return nil
}

// ---- step 4 ----------------------------------------------------------------

// openLifetimes replays the trace for one endpoint: the leases, holds and
// events taken and not yet ended. Details are "lease 3", "hold 2",
// "event 5 on lease 3" as the runtime writes them, or the bare names a
// replay script gave ("reader", "ev on reader").
func openLifetimes(tr []system.Transition, value, loc string) (leases, holds, events []Lifetime) {
	type key struct{ kind, id string }
	open := map[key]Lifetime{}
	var order []key
	for _, t := range tr {
		if t.Handle != value {
			continue
		}
		if t.Kind == "discard" {
			open, order = map[key]Lifetime{}, nil
			continue
		}
		if t.Location != loc {
			continue
		}
		switch t.Kind {
		case "acquire", "release":
			k := key{"lease", lifetimeID(t.Detail, "lease ")}
			if t.Kind == "acquire" {
				open[k] = Lifetime{Kind: "lease", ID: k.id, Version: t.Version}
				order = append(order, k)
			} else {
				delete(open, k)
			}
		case "hold", "unhold":
			k := key{"hold", lifetimeID(t.Detail, "hold ")}
			if t.Kind == "hold" {
				open[k] = Lifetime{Kind: "hold", ID: k.id, Version: t.Version}
				order = append(order, k)
			} else {
				delete(open, k)
			}
		case "record_event":
			ev, lease, _ := strings.Cut(t.Detail, " on ")
			k := key{"event", lifetimeID(ev, "event ")}
			open[k] = Lifetime{Kind: "event", ID: k.id, Version: t.Version, Lease: lifetimeID(lease, "lease ")}
			order = append(order, k)
		case "reap_event":
			delete(open, key{"event", lifetimeID(t.Detail, "event ")})
		}
	}
	for _, k := range order {
		lt, ok := open[k]
		if !ok {
			continue
		}
		delete(open, k)
		switch k.kind {
		case "lease":
			leases = append(leases, lt)
		case "hold":
			holds = append(holds, lt)
		default:
			events = append(events, lt)
		}
	}
	return leases, holds, events
}

// lifetimeID is the id in a trace detail: "lease 3" → "3"; the replay
// CLI's `lease "reader"` → "reader".
func lifetimeID(detail, prefix string) string {
	id := strings.TrimPrefix(detail, prefix)
	if u, err := strconv.Unquote(id); err == nil {
		return u
	}
	return id
}

func lifetimes(ls []Lifetime) string {
	if len(ls) == 0 {
		return "none"
	}
	ss := make([]string, len(ls))
	for i, l := range ls {
		ss[i] = l.String()
	}
	return strings.Join(ss, ", ")
}

func (g *diag) protection(x *system.InUseError) {
	p := &ProtectionOwners{Value: x.Handle, Location: x.Location, UseCount: x.UseCount, HoldCount: x.HoldCount, PendingEventCount: x.PendingEventCount}
	p.Leases, p.Holds, p.Events = openLifetimes(g.ev.Trace, x.Handle, x.Location)
	oldest, _ := traceEnds(g.ev.Trace)
	p.Complete = oldest == 1
	p.Now = matAt(g.ev.Snapshot, x.Handle, x.Location)
	g.d.Protection = p
	g.add(4, stepProtect, Finding{What: fmt.Sprintf("protection of (%s, %s) at the refusal", x.Handle, x.Location), Figures: []Figure{
		fig("use_count", x.UseCount), fig("hold_count", x.HoldCount), fig("pending_event_count", x.PendingEventCount)},
		Verdict: "any count above zero blocks the removal; the controller would skip this materialization as a victim"})
	f := Finding{What: "owning lifetimes open in the trace", Figures: []Figure{
		fig("leases", lifetimes(p.Leases)), fig("holds", lifetimes(p.Holds)), fig("pending events", lifetimes(p.Events))}}
	var todo []string
	if len(p.Leases) > 0 {
		todo = append(todo, "release the lease(s) once every reading stream has recorded its event")
	}
	if len(p.Holds) > 0 {
		todo = append(todo, "release the hold(s) if obsolete")
	}
	if len(p.Events) > 0 {
		todo = append(todo, "wait for the consumer stream(s) (WaitReaped) if the removal must happen now")
	}
	todo = append(todo, "or defer the removal; never discard or close the runtime to get past unknown readers")
	f.Verdict = strings.Join(todo, "; ")
	if n := len(p.Leases) + len(p.Holds) + len(p.Events); n != x.UseCount+x.HoldCount+x.PendingEventCount {
		if p.Complete {
			f.Verdict = fmt.Sprintf("the trace shows %d open lifetimes where the refusal counted %d: they changed after it. ", n, x.UseCount+x.HoldCount+x.PendingEventCount) + f.Verdict
		} else {
			f.Verdict = fmt.Sprintf("the trace starts at v%d and shows %d of the %d protections; the others were taken before it. ", oldest, n, x.UseCount+x.HoldCount+x.PendingEventCount) + f.Verdict
		}
	}
	g.add(4, stepProtect, f)
}

// protected lists protected materializations (a plan error: the controller
// and plans cannot remove them).
func (g *diag) protected() {
	var ps []string
	for _, v := range g.ev.Snapshot.Values {
		for _, m := range v.Materializations {
			if m.UseCount+m.HoldCount+m.PendingEventCount > 0 {
				ps = append(ps, v.Handle.Name+" at "+matString(m))
			}
		}
	}
	f := Finding{What: "protected materializations in the snapshot"}
	if len(ps) == 0 {
		f.Verdict = "none: protection does not explain the refusal"
	} else {
		f.Figures = []Figure{fig("protected", strings.Join(ps, "; "))}
		f.Verdict = "none of these can be reclaimed or chosen as a victim until its lifetimes end"
	}
	g.add(4, stepProtect, f)
}

// ---- step 5 ----------------------------------------------------------------

func (g *diag) orderedPeaks(m map[string]int64) []LocationBytes {
	var out []LocationBytes
	done := map[string]bool{}
	for _, lr := range g.ev.Snapshot.Locations {
		if b, ok := m[lr.Location]; ok {
			out = append(out, LocationBytes{lr.Location, b})
			done[lr.Location] = true
		}
	}
	var rest []string
	for k := range m {
		if !done[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		out = append(out, LocationBytes{k, m[k]})
	}
	return out
}

func actions(as []system.Action) string {
	if len(as) == 0 {
		return "none"
	}
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = a.String()
	}
	return strings.Join(ss, ", ")
}

func reservations(rs []system.ReservationSpec) string {
	if len(rs) == 0 {
		return "none"
	}
	ss := make([]string, len(rs))
	for i, r := range rs {
		ss[i] = r.String()
	}
	return strings.Join(ss, ", ")
}

func (g *diag) search(x *system.SearchLimitError) {
	d, ex := g.ev.Decision, g.ev.Explanation
	if x == nil && d == nil && ex == nil {
		return
	}
	se := &SearchEvidence{}
	g.d.Search = se
	if x != nil {
		se.RequestName, se.StateLimit, se.ExploredStates, se.Detail = x.RequestName, x.StateLimit, x.ExploredStates, x.Detail
		g.add(5, stepDecision, Finding{What: "search limit of request " + x.RequestName, Figures: []Figure{
			fig("request_name", x.RequestName), fig("state_limit", x.StateLimit), fig("explored_states", x.ExploredStates), fig("detail", x.Detail)},
			Verdict: fmt.Sprintf("inconclusive: the search evaluated %d assignment(s), its bound, without finding a feasible one; this is not a proof that none exists. Simplify the request's tiers, or raise the state limit only once the request and its fallbacks are meant to be that wide", x.ExploredStates)})
	}
	if d != nil {
		se.RequestName, se.ExploredStates, se.Exhaustive = d.RequestName, d.ExploredStates, d.Exhaustive
		se.ExpectedStateVersion, se.Evictions = d.ExpectedStateVersion, d.Evictions
		p := d.Plan
		se.Plan = &p
		se.Feasible, se.Reason = d.Explanation.Feasible, d.Explanation.Reason
		se.PredictedPeaks = g.orderedPeaks(d.Explanation.PredictedPeakBytes)
		f := Finding{What: "decision for request " + d.RequestName, Figures: []Figure{
			fig("expected_state_version", d.ExpectedStateVersion), fig("explored_states", d.ExploredStates), fig("exhaustive", d.Exhaustive),
			fig("plan.reclaim", actions(p.Reclaim)), fig("plan.reservations", reservations(p.Reservations)), fig("plan.enter", actions(p.Enter))}}
		for i, e := range d.Evictions {
			f.Figures = append(f.Figures, Figure{Name: fmt.Sprintf("eviction %d", i), Value: fmt.Sprintf("%s at %s, %d B: %s", e.Handle.Name, e.Location, e.Bytes, e.Reason)})
		}
		f.Verdict = "explored_states counts search work, not evictions; each eviction names the location it frees, its bytes and why it was chosen"
		if !d.Exhaustive {
			f.Verdict += "; the search was cut short by its limit after a feasible assignment, so this is the best one seen, not necessarily the best"
		}
		g.add(5, stepDecision, f)
		g.add(5, stepDecision, g.peakFinding("predicted peaks of the decision's plan", se.PredictedPeaks))
	}
	if ex != nil {
		se.Feasible, se.Reason = ex.Feasible, ex.Reason
		se.PredictedPeaks = g.orderedPeaks(ex.PredictedPeakBytes)
		f := Finding{What: "explanation of the plan", Figures: []Figure{fig("feasible", ex.Feasible), fig("reason", orDash(ex.Reason))}}
		if ex.Feasible {
			f.Verdict = "feasible on the state it was explained on"
		} else {
			f.Verdict = "infeasible: " + ex.Reason
		}
		pf := g.peakFinding("predicted peaks of the plan", se.PredictedPeaks)
		if !ex.Feasible && !strings.HasPrefix(pf.Verdict, "over budget") {
			pf.Verdict = "within budget up to the refused step; the peaks do not include the step that was refused"
		}
		g.add(5, stepDecision, f, pf)
	}
}

func (g *diag) peakFinding(what string, peaks []LocationBytes) Finding {
	f := Finding{What: what}
	var over []string
	for _, p := range peaks {
		lr, ok := g.ev.Snapshot.Location(p.Location)
		v := fmt.Sprintf("%d B", p.Bytes)
		if ok && lr.HasBudget {
			v += fmt.Sprintf(" of budget %d B", lr.BudgetBytes)
			if p.Bytes > lr.BudgetBytes {
				over = append(over, p.Location)
			}
		}
		f.Figures = append(f.Figures, Figure{Name: p.Location, Value: v})
	}
	if len(over) > 0 {
		f.Verdict = "over budget at " + strings.Join(over, ", ")
	} else {
		f.Verdict = "every predicted peak is within its budget (reclaim before reservations, overlap and temporary charges included)"
	}
	return f
}

// ---- step 6 ----------------------------------------------------------------

func (g *diag) stale(x *system.StaleStateError) {
	st := &StaleRange{ExpectedVersion: x.ExpectedVersion, ActualVersion: x.ActualVersion}
	for _, t := range g.ev.Trace {
		if t.Version > x.ExpectedVersion && t.Version <= x.ActualVersion {
			st.Intervening = append(st.Intervening, t)
		}
	}
	var gap uint64
	if x.ActualVersion > x.ExpectedVersion {
		gap = x.ActualVersion - x.ExpectedVersion
	}
	st.Missing = gap - uint64(len(st.Intervening))
	st.Covered = st.Missing == 0
	g.d.Stale = st
	g.add(6, stepStale, Finding{What: "version gap", Figures: []Figure{
		fig("expected_version", x.ExpectedVersion), fig("actual_version", x.ActualVersion), fig("intervening transitions", gap)},
		Verdict: "detected before any reclaim, reservation or entry: the stale scope changed nothing"})
	// Mark the transitions that touch the decision's plan.
	touch := map[string]bool{}
	p := g.ev.plan()
	if p != nil {
		for _, a := range append(append([]system.Action(nil), p.Reclaim...), p.Enter...) {
			touch[a.Handle.Name] = true
			touch["@"+a.Location] = true
		}
		for _, r := range p.Reservations {
			touch["@"+r.Location] = true
		}
	}
	f := Finding{What: fmt.Sprintf("transitions v%d–v%d in the trace", x.ExpectedVersion+1, x.ActualVersion)}
	var touched int
	for _, t := range st.Intervening {
		v := transitionText(t)
		if touch[t.Handle] || touch["@"+t.Location] {
			v += "   ← touches the plan"
			touched++
		}
		f.Figures = append(f.Figures, Figure{Name: fmt.Sprintf("v%d", t.Version), Value: v})
	}
	oldest, newest := traceEnds(g.ev.Trace)
	switch {
	case st.Covered:
		f.Verdict = fmt.Sprintf("covered: the trace holds all %d; these are the changes (ownership, placement, reservation, protection or event reaping) the decision did not see", gap)
	case len(g.ev.Trace) == 0:
		f.Verdict = "not covered: the trace is empty (disabled); the intervening changes cannot be named"
	default:
		f.Verdict = fmt.Sprintf("not covered: the trace holds v%d–v%d (a ring of %d) and has dropped %d of the %d; raise the trace capacity to keep them", oldest, newest, len(g.ev.Trace), st.Missing, gap)
	}
	if p != nil {
		switch touched {
		case 0:
			f.Verdict += "; none touches a value or location of the plan"
		case 1:
			f.Verdict += "; 1 of them touches a value or location of the plan: its victims, room or endpoints may no longer be what the decision assumed"
		default:
			f.Verdict += fmt.Sprintf("; %d of them touch a value or location of the plan: its victims, room or endpoints may no longer be what the decision assumed", touched)
		}
	}
	g.add(6, stepStale, f, Finding{What: "what to do",
		Verdict: "if the request still stands, decide again and review the new evidence (victims and peaks may differ); do not retry the old decision blindly. Under concurrent callers, Admit decides and enters in one step and is never stale"})
}

// ---- step 7 ----------------------------------------------------------------

func (g *diag) execution(x *system.PlanExecutionError) {
	o := &ExecutionOutcome{Phase: x.Phase, FailedAction: x.FailedAction, FailedActionIndex: x.FailedActionIndex,
		FailedReservation: x.FailedReservation, FailedReservationIndex: x.FailedReservationIndex, Committed: x.PartialReport.Transitions}
	g.d.Execution = o
	f := Finding{What: "where it failed", Figures: []Figure{fig("phase", x.Phase)}}
	switch {
	case x.FailedAction != nil:
		f.Figures = append(f.Figures, fig("failed_action", x.FailedAction.String()), fig("failed_action_index", x.FailedActionIndex))
	case x.FailedReservation != nil:
		f.Figures = append(f.Figures, fig("failed_reservation", x.FailedReservation.String()), fig("failed_reservation_index", x.FailedReservationIndex))
	default:
		f.Figures = append(f.Figures, fig("failed step", "none named"))
	}
	f.Verdict = phaseMeaning(x.Phase)
	g.add(7, stepExecution, f)

	rep := Finding{What: "partial report (committed transitions)"}
	if len(o.Committed) == 0 {
		rep.Verdict = "nothing was committed"
	}
	for _, t := range o.Committed {
		rep.Figures = append(rep.Figures, Figure{Name: fmt.Sprintf("v%d", t.Version), Value: transitionText(t)})
	}
	g.add(7, stepExecution, rep)

	o.Kept, o.Cleaned, o.FailedStep = g.sortCommitted(x)
	kept := Finding{What: "not rolled back (still in effect)"}
	for _, k := range o.Kept {
		kept.Figures = append(kept.Figures, Figure{Name: "kept", Value: k})
	}
	for _, c := range o.Cleaned {
		kept.Figures = append(kept.Figures, Figure{Name: "undone by cleanup", Value: c})
	}
	for _, c := range o.FailedStep {
		kept.Figures = append(kept.Figures, Figure{Name: "failed step", Value: c})
	}
	if len(o.Kept) == 0 {
		kept.Verdict = "nothing of the committed prefix remains in effect"
	} else {
		kept.Verdict = fmt.Sprintf("%d committed effect(s) stay: continue from the state the snapshot shows, not from the plan's starting state", len(o.Kept))
	}
	if x.Phase == system.PhaseEnter || x.Phase == system.PhaseReclaim || x.Phase == system.PhaseReserve {
		kept.Verdict += "; the failed scope cannot be entered again and holds no lease"
	}
	g.add(7, stepExecution, kept)

	if f, ok := g.interleaved(o.Committed); ok {
		g.add(7, stepExecution, f)
	}
	if x.Phase == system.PhaseExit && x.Cause != nil {
		if f, ok := g.leaseEnded(x.Cause); ok {
			g.add(7, stepExecution, f)
		}
	}

	cf := Finding{What: "cause"}
	if x.Cause == nil {
		cf.Verdict = "no cause recorded"
	} else {
		op := Operation{Kind: x.Phase}
		if a := x.FailedAction; a != nil {
			op.Handle, op.Location, op.From = a.Handle, a.Location, a.From
		}
		if r := x.FailedReservation; r != nil {
			op.Kind, op.Reservation, op.Location, op.Bytes = "reserve", r.Name, r.Location, r.Bytes
		}
		sub := g.ev
		sub.Err, sub.Op = x.Cause, op
		cd := diagnose(sub, true)
		o.Cause = &cd
		cf.Figures = []Figure{fig("class", cd.Class), fig("message", cd.Message)}
		if system.ErrorClass(x.Cause) == system.ErrorOther {
			cf.Verdict = "not a structured residency error: the device or the loader failed the step; the runtime released the step's charges"
		} else {
			cf.Verdict = "diagnosed below, with the figures it had at the failure"
		}
	}
	g.add(7, stepExecution, cf)
}

func phaseMeaning(p string) string {
	switch p {
	case system.PhaseExecute:
		return "a direct transition or a plan run without a scope failed after admission; reservations it admitted stay active (release them by name)"
	case system.PhaseReclaim:
		return "a scope entry failed while removing victims; removals already done stay done"
	case system.PhaseReserve:
		return "a scope entry failed admitting a reservation; the scope's earlier reservations were released, the reclaims stay"
	case system.PhaseEnter:
		return "a scope entry failed entering an endpoint; earlier enters and reclaims stay, the scope's reservations were released"
	case system.PhaseExit:
		return "a scope's exit could not release everything; what it did release stays released"
	}
	return "unknown phase"
}

// sortCommitted sorts the partial report into what stays, what the
// failure's cleanup undid, and what the failed step left.
func (g *diag) sortCommitted(x *system.PlanExecutionError) (kept, cleaned, failed []string) {
	ts := x.PartialReport.Transitions
	used := make([]bool, len(ts))
	find := func(from int, match func(system.Transition) bool) int {
		for j := from; j < len(ts); j++ {
			if !used[j] && match(ts[j]) {
				return j
			}
		}
		return -1
	}
	now := func(value, loc string) string {
		if m := matAt(g.ev.Snapshot, value, loc); m != nil {
			return fmt.Sprintf("snapshot: %s at %s", m.State, loc)
		}
		return fmt.Sprintf("snapshot: not at %s", loc)
	}
	for i, t := range ts {
		if used[i] {
			continue
		}
		used[i] = true
		switch t.Kind {
		case "remove":
			kept = append(kept, fmt.Sprintf("%s removed from %s, %d B freed (%s; %s)", t.Handle, t.Location, t.Bytes, t.Detail, now(t.Handle, t.Location)))
		case "admit":
			j := find(i+1, func(u system.Transition) bool {
				return u.Handle == t.Handle && u.Location == t.Location && (u.Kind == "complete" || u.Kind == "fail")
			})
			switch {
			case j < 0:
				kept = append(kept, fmt.Sprintf("%s admitted at %s, %d B charged, not settled in the report (%s)", t.Handle, t.Location, t.Bytes, now(t.Handle, t.Location)))
			case ts[j].Kind == "complete":
				used[j] = true
				kept = append(kept, fmt.Sprintf("%s entered %s, %d B charged (%s; %s)", t.Handle, t.Location, t.Bytes, t.Detail, now(t.Handle, t.Location)))
			default:
				used[j] = true
				failed = append(failed, fmt.Sprintf("%s into %s admitted at v%d, failed at v%d: its %d B (and any temporary charge) were released", t.Handle, t.Location, t.Version, ts[j].Version, t.Bytes))
			}
		case "fail":
			failed = append(failed, fmt.Sprintf("%s into %s failed: its charge was released", t.Handle, t.Location))
		case "reserve":
			j := find(i+1, func(u system.Transition) bool { return u.Kind == "unreserve" && u.Detail == t.Detail })
			if j >= 0 {
				used[j] = true
				cleaned = append(cleaned, fmt.Sprintf("reservation %s (%d B at %s) admitted at v%d, released at v%d", t.Detail, t.Bytes, t.Location, t.Version, ts[j].Version))
			} else {
				kept = append(kept, fmt.Sprintf("reservation %s: %d B at %s, still active (release it by name)", t.Detail, t.Bytes, t.Location))
			}
		case "unreserve":
			kept = append(kept, fmt.Sprintf("reservation %s (%d B at %s) released", t.Detail, t.Bytes, t.Location))
		case "acquire":
			j := find(i+1, func(u system.Transition) bool { return u.Kind == "release" && u.Detail == t.Detail })
			if j >= 0 {
				used[j] = true
				cleaned = append(cleaned, fmt.Sprintf("%s of %s at %s taken at v%d, released at v%d", t.Detail, t.Handle, t.Location, t.Version, ts[j].Version))
			} else {
				kept = append(kept, fmt.Sprintf("%s on %s at %s, still held", t.Detail, t.Handle, t.Location))
			}
		case "release":
			kept = append(kept, fmt.Sprintf("%s on %s at %s released", t.Detail, t.Handle, t.Location))
		case "complete":
			kept = append(kept, fmt.Sprintf("%s completed at %s (%s)", t.Handle, t.Location, now(t.Handle, t.Location)))
		default:
			kept = append(kept, t.String())
		}
	}
	return kept, cleaned, failed
}

// ---- step 8 ----------------------------------------------------------------

func (g *diag) classify(class system.ErrorKind) {
	f := Finding{What: "class", Figures: []Figure{fig("class", class), fig("meaning", g.d.Meaning)},
		Verdict: "first action: " + g.d.FirstAction}
	switch class {
	case system.ErrorSearchLimit, system.ErrorStaleState:
		f.Verdict += " (a special case of ResidencyPlanError: handle it before the general case)"
	case system.ErrorPlanExecution:
		f.Verdict += " (a sibling of ResidencyPlanError, not a case of it: a partial state always needs analysis)"
	}
	g.add(8, stepClassify, f)
}

// transitionText is a transition without its version (figures name it).
func transitionText(t system.Transition) string {
	return strings.TrimPrefix(t.String(), fmt.Sprintf("v%d ", t.Version))
}

// interleaved lists the trace's transitions since the run's first commit
// that are not the run's own: other callers' commits between its steps (or
// after the failure, when the evidence was captured late).
func (g *diag) interleaved(committed []system.Transition) (Finding, bool) {
	if len(committed) == 0 || len(g.ev.Trace) == 0 {
		return Finding{}, false
	}
	own := map[uint64]bool{}
	for _, t := range committed {
		own[t.Version] = true
	}
	f := Finding{What: "other transitions since the run's first commit"}
	for _, t := range g.ev.Trace {
		if t.Version > committed[0].Version && !own[t.Version] {
			f.Figures = append(f.Figures, Figure{Name: fmt.Sprintf("v%d", t.Version), Value: transitionText(t)})
		}
	}
	if len(f.Figures) == 0 {
		return f, false
	}
	f.Verdict = "committed by other callers between the run's steps (or after the failure): look here for what made a step fail that its preflight admitted"
	return f, true
}

// leaseEnded finds, for an exit that could not release a lease, where the
// trace shows that lease already released.
func (g *diag) leaseEnded(cause error) (Finding, bool) {
	var id uint64
	msg := cause.Error()
	i := strings.Index(msg, "lease ")
	if i < 0 {
		return Finding{}, false
	}
	if _, err := fmt.Sscanf(msg[i:], "lease %d is not active", &id); err != nil {
		return Finding{}, false
	}
	detail := fmt.Sprintf("lease %d", id)
	f := Finding{What: "the lease the exit could not release"}
	for _, t := range g.ev.Trace {
		if t.Detail == detail && (t.Kind == "acquire" || t.Kind == "release") {
			f.Figures = append(f.Figures, Figure{Name: fmt.Sprintf("v%d", t.Version), Value: transitionText(t)})
		}
	}
	switch {
	case len(f.Figures) == 0:
		f.Verdict = fmt.Sprintf("%s is not in the trace: it ended before the trace's oldest transition", detail)
	default:
		f.Verdict = fmt.Sprintf("%s was released outside the scope (by id, or by Close) before the exit: the scope's copy of it was stale; nothing is left to release", detail)
	}
	return f, true
}
