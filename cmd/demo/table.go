package main

import (
	"bufio"
	"fmt"
	"github.com/residency-go/residency/system/replay"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// tableWriter prints replay results as a table, one row per op, each row
// written out as soon as its op finished: the same facts as --json,
// condensed for people. The columns have fixed widths taken from the
// checked script (its last line number, its longest op name) and from the
// longest result type, so rows line up without waiting for the end.
type tableWriter struct {
	w                             *bufio.Writer
	lineW, opW, resultW, versionW int
}

// tableExpectW is the width of the EXPECT column: "-", "held" or "FAILED".
const tableExpectW = len("FAILED")

func newTableWriter(w io.Writer, info replay.Info) *tableWriter {
	t := &tableWriter{
		w:        bufio.NewWriterSize(w, 16<<10),
		lineW:    max(len("LINE"), len(strconv.Itoa(info.LastLine))),
		opW:      max(len("OP"), info.OpWidth),
		resultW:  len("RESULT"),
		versionW: len("VERSION"),
	}
	for _, typ := range replay.ErrorTypes() {
		t.resultW = max(t.resultW, len(typ))
	}
	t.row("LINE", "OP", "RESULT", "VERSION", "EXPECT", "DETAIL")
	return t
}

func (t *tableWriter) row(line, op, status, version, expect, detail string) {
	pad := func(s string, w int) {
		t.w.WriteString(s)
		for n := utf8.RuneCountInString(s); n < w+2; n++ {
			t.w.WriteByte(' ')
		}
	}
	pad(line, t.lineW)
	pad(op, t.opW)
	pad(status, t.resultW)
	pad(version, t.versionW)
	if detail == "" {
		t.w.WriteString(expect)
	} else {
		pad(expect, tableExpectW)
		t.w.WriteString(detail)
	}
	t.w.WriteByte('\n')
}

func (t *tableWriter) Write(r *replay.Result) error {
	status := "ok"
	if !r.OK {
		status = r.Error.Type
	}
	expect, d := "-", detail(r)
	if r.Expect != "" {
		if replay.Matches(r.Expect, r) {
			expect = "held"
		} else {
			expect = "FAILED"
			want := "wanted " + r.Expect
			if d == "" {
				d = want
			} else {
				d = want + "; " + d
			}
		}
	}
	t.row(strconv.Itoa(r.Line), r.Op, status, strconv.FormatUint(r.StateVersion, 10), expect, oneLine(d))
	return t.w.Flush()
}

func (t *tableWriter) Flush() error { return t.w.Flush() }

// oneLine makes s safe and readable on one table row: control characters
// (a name may hold any) are escaped, runs of spaces collapsed.
func oneLine(s string) string {
	return strings.Join(strings.Fields(escapeText(humanBytes(s))), " ")
}

// budgetFigure finds the byte figures of the runtime's budget messages
// ("used 3145728 + reserved 0 + requested 2097152 > budget 4194304 (short
// by 1048576 bytes)").
// A figure already shown as a size ("used 4 GiB (4294967296)", as the
// table's own details write it) is left alone.
var budgetFigure = regexp.MustCompile(`\b(used|reserved|requested|budget|short by|needs) (-?[0-9]+(?:\.[0-9]+)?)( bytes)?\b( [KMGT]?i?B\b)?`)

// humanBytes shows the byte figures of a runtime message as sizes with
// their exact integers, like every other byte figure of the table.
func humanBytes(s string) string {
	if !strings.Contains(s, "budget") {
		return s
	}
	return budgetFigure.ReplaceAllStringFunc(s, func(m string) string {
		sub := budgetFigure.FindStringSubmatch(m)
		// A fractional figure ("1.5 GiB") or one with a unit is already a
		// size: leave it alone.
		n, err := strconv.ParseInt(sub[2], 10, 64)
		if err != nil || sub[4] != "" {
			return m
		}
		return sub[1] + " " + bytesText(n)
	})
}

// escapeText escapes the control characters of s (C0, DEL, C1, the line
// and paragraph separators, the bidirectional overrides, and invalid
// UTF-8) the way Go quotes strings, leaving everything else as it is, so
// that a name like "a\x1b[2Jb" cannot clear a terminal or forge a row.
func escapeText(s string) string {
	clean := true
	for _, c := range s {
		if c == utf8.RuneError || needsEscape(c) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case needsEscape(c):
			q := strconv.QuoteRuneToASCII(c) // '\n', '\x1b', '\u0085', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func needsEscape(c rune) bool {
	return unicode.IsControl(c) || c == '\u2028' || c == '\u2029' ||
		(c >= '\u202a' && c <= '\u202e') || (c >= '\u2066' && c <= '\u2069')
}

// detail summarizes a result's payload or error in one line.
func detail(r *replay.Result) string {
	if !r.OK {
		msg := r.Error.Message
		if be := budgetDetail(r.Error); be != "" {
			msg = be
		}
		if d, ok := stagingDetail(r); ok {
			msg += "; " + d // the task transitions of a failed staging op
		}
		return msg
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
			parts = append(parts, fmt.Sprintf("evict %s@%s (%s): %s", e.Handle, e.Location, bytesText(e.Bytes), e.Reason))
		}
		for _, rs := range d.Plan.Reservations {
			parts = append(parts, fmt.Sprintf("reserve %s@%s (%s)", rs.Name, rs.Location, bytesText(rs.Bytes)))
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
				b = "budget " + bytesText(*l.BudgetBytes)
			}
			s := fmt.Sprintf("%s used %s reserved %s peak %s (%s)", l.Location,
				bytesText(l.UsedBytes), bytesText(l.ReservedBytes), bytesText(l.PeakBytes), b)
			for i, rs := range l.Reservations {
				if i == 0 {
					s += ": reservations "
				} else {
					s += ", "
				}
				s += rs.Name + " " + bytesText(rs.Bytes)
				if rs.Owner != nil && !strings.HasPrefix(rs.Name, *rs.Owner) {
					s += " of " + *rs.Owner
				}
			}
			parts = append(parts, s)
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
	if d, ok := cacheDetail(r); ok {
		return d
	}
	if d, ok := stagingDetail(r); ok {
		return d
	}
	return ""
}

// budgetDetail renders a BudgetError's figures for people, each byte
// figure as a size and its exact integer.
func budgetDetail(e *replay.Error) string {
	if e == nil || e.Type != "ResidencyBudgetError" {
		return ""
	}
	f := map[string]any{}
	for _, kv := range e.Fields {
		f[kv.Key] = kv.Value
	}
	loc, ok1 := f["location"].(string)
	budget, ok2 := f["budget_bytes"].(int64)
	used, ok3 := f["used_bytes"].(int64)
	reserved, ok4 := f["reserved_bytes"].(int64)
	requested, ok5 := f["requested_bytes"].(int64)
	if !(ok1 && ok2 && ok3 && ok4 && ok5) {
		return ""
	}
	return fmt.Sprintf("budget exceeded at %s: used %s + reserved %s + requested %s > budget %s (short by %s)",
		loc, bytesText(used), bytesText(reserved), bytesText(requested), bytesText(budget),
		bytesText(used+reserved+requested-budget))
}

func actionText(a replay.Action) string {
	s := a.Handle + "@" + a.Location
	if a.From != nil {
		s += " from " + *a.From
	}
	if a.To != nil {
		s += " to " + *a.To
	}
	return s
}

func explainText(e replay.Explanation) string {
	var peaks []string
	m := e.PredictedPeakBytes
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortLocations(keys)
	for _, k := range keys {
		peaks = append(peaks, fmt.Sprintf("%s %s", k, bytesText(m[k])))
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

func reportText(ts []replay.Transition) string {
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

// nullable returns nil (JSON null) for an empty string.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
