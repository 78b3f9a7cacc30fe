package diagnose

import (
	"fmt"
	"math"
	"math/big"
	"strings"

	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system"
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
	return fmt.Sprintf("%s %s (%s; leases %d, holds %d, events %d)", m.Location, m.State, jsonline.BytesText(m.ChargedBytes), m.UseCount, m.HoldCount, m.PendingEventCount)
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
		case t.Kind == "fail" && t.Failure == system.FailureRegistration:
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
	return jsonline.BytesText(lr.BudgetBytes)
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
			rs[i] = r.Name + " " + jsonline.BytesText(r.Bytes)
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
