package diagnose

import (
	"fmt"
	"strings"

	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system"
)

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

// bytesFig is a byte figure as replay prints one: the size for people
// and, from 1 KiB on, the exact figure beside it ("26 GiB (27917287424)").
func bytesFig(name string, n int64) Figure { return Figure{Name: name, Value: jsonline.BytesText(n)} }

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
