package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// tableWriter prints replay results as a table, one row per op: the same
// facts as --json, condensed for people.
type tableWriter struct {
	tw *tabwriter.Writer
}

func newTableWriter(w io.Writer) *tableWriter {
	t := &tableWriter{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	fmt.Fprintln(t.tw, "LINE\tOP\tRESULT\tVERSION\tEXPECT\tDETAIL")
	return t
}

func (t *tableWriter) write(r *result) error {
	status := "ok"
	if !r.OK {
		status = r.Error.Type
	}
	expect := "-"
	if r.expectation != "" {
		if matches(r.expectation, r) {
			expect = "held"
		} else {
			expect = "FAILED (wanted " + r.expectation + ")"
		}
	}
	_, err := fmt.Fprintf(t.tw, "%d\t%s\t%s\t%d\t%s\t%s\n", r.Line, r.Op, status, r.StateVersion, expect, oneLine(detail(r)))
	return err
}

func (t *tableWriter) flush() error { return t.tw.Flush() }

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\t", " ")), " ")
}

// detail summarizes a result's payload or error in one line.
func detail(r *result) string {
	if !r.OK {
		return r.Error.Message
	}
	switch {
	case r.Explanation != nil:
		return explainText(*r.Explanation)
	case r.Decision != nil:
		d := r.Decision
		var parts []string
		parts = append(parts, fmt.Sprintf("from version %d, explored %d states", d.ExpectedStateVersion, d.ExploredStates))
		if !d.Exhaustive {
			parts = append(parts, "not exhaustive (state limit)")
		}
		for _, e := range d.Evictions {
			parts = append(parts, fmt.Sprintf("evict %s@%s (%s): %s", e.Handle, e.Location, formatBytes(e.Bytes), e.Reason))
		}
		for _, rs := range d.Plan.Reservations {
			parts = append(parts, fmt.Sprintf("reserve %s@%s (%s)", rs.Name, rs.Location, formatBytes(rs.Bytes)))
		}
		for _, a := range d.Plan.Enter {
			parts = append(parts, "enter "+actionText(a))
		}
		parts = append(parts, explainText(d.Explanation))
		return strings.Join(parts, "; ")
	case r.Report != nil:
		return reportText(r.Report.Transitions)
	case r.Snapshot != nil:
		var parts []string
		for _, l := range r.Snapshot.Locations {
			b := "no budget"
			if l.BudgetBytes != nil {
				b = "budget " + formatBytes(*l.BudgetBytes)
			}
			parts = append(parts, fmt.Sprintf("%s used %s reserved %s peak %s (%s)", l.Location,
				formatBytes(l.UsedBytes), formatBytes(l.ReservedBytes), formatBytes(l.PeakBytes), b))
		}
		for _, v := range r.Snapshot.Values {
			var at []string
			for _, m := range v.Materializations {
				s := m.Location
				if m.State != "resident" {
					s += "(" + m.State + ")"
				}
				if n := m.UseCount + m.HoldCount + m.PendingEventCount; n > 0 {
					s += fmt.Sprintf("[uses %d holds %d events %d]", m.UseCount, m.HoldCount, m.PendingEventCount)
				}
				at = append(at, s)
			}
			where := strings.Join(at, ",")
			switch {
			case v.Discarded:
				where = "discarded"
			case where == "":
				where = "nowhere"
			}
			parts = append(parts, fmt.Sprintf("%s@%s", v.Handle, where))
		}
		return strings.Join(parts, "; ")
	case r.Trace != nil:
		return fmt.Sprintf("%d transitions in the ring", len(*r.Trace))
	}
	return ""
}

func actionText(a actionJSON) string {
	s := a.Handle + "@" + a.Location
	if a.From != nil {
		s += " from " + *a.From
	}
	return s
}

func explainText(e explanationJSON) string {
	var peaks []string
	m := e.PredictedPeakBytes
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortLocations(keys)
	for _, k := range keys {
		peaks = append(peaks, fmt.Sprintf("%s %s", k, formatBytes(m[k])))
	}
	peak := "predicted peak " + strings.Join(peaks, ", ")
	if e.Feasible {
		return "feasible, " + peak
	}
	reason := "no reason given"
	if e.Reason != nil {
		reason = *e.Reason
	}
	return "infeasible: " + reason + "; " + peak
}

func reportText(ts []transitionJSON) string {
	var parts []string
	for _, t := range ts {
		s := fmt.Sprintf("v%d %s", t.Version, t.Kind)
		if t.Handle != nil {
			s += " " + *t.Handle
		}
		if t.Location != nil {
			s += "@" + *t.Location
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("%d transitions: %s", len(ts), strings.Join(parts, ", "))
}
