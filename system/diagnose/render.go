package diagnose

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// String renders the diagnosis as text: the class and message, then each
// step with its findings (what was checked, the figures, the verdict), then
// a failed execution's cause, diagnosed in turn. Where the numbers skip
// (1, 2, 3, 8), a line names the steps left out and the errors each is
// for. Byte figures read as replay prints them: the size for people, and
// from 1 KiB on the exact figure beside it ("26 GiB (27917287424)").
func (d Diagnosis) String() string {
	var b strings.Builder
	d.render(&b, "")
	return b.String()
}

// Render writes [Diagnosis.String] to w.
func (d Diagnosis) Render(w io.Writer) error {
	_, err := io.WriteString(w, d.String())
	return err
}

func (d Diagnosis) render(b *strings.Builder, in string) {
	if d.Class == "" {
		b.WriteString(in + "no error\n")
		return
	}
	fmt.Fprintf(b, "%s%s: %s\n", in, d.Class, d.Message)
	if d.Op.Kind != "" || d.Op.Handle.Name != "" || d.Op.Location != "" {
		fmt.Fprintf(b, "%soperation: %s\n", in, d.Op)
	}
	fmt.Fprintf(b, "%sstate: v%d, manager %s\n", in, d.StateVersion, d.ManagerID)
	steps := append([]DiagnosisStep(nil), d.Steps...)
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].Number < steps[j].Number })
	next := 1
	for _, s := range steps {
		if s.Number > next {
			renderSkipped(b, in, d.Class, next, s.Number-1)
		}
		next = max(next, s.Number+1)
		fmt.Fprintf(b, "\n%sstep %d. %s\n", in, s.Number, s.Title)
		for _, f := range s.Findings {
			fmt.Fprintf(b, "%s  - %s\n", in, f.What)
			w := 0
			for _, x := range f.Figures {
				if len(x.Name) > w {
					w = len(x.Name)
				}
			}
			for _, x := range f.Figures {
				fmt.Fprintf(b, "%s      %-*s  %s\n", in, w+1, x.Name+":", x.Value)
			}
			if f.Verdict != "" {
				fmt.Fprintf(b, "%s    => %s\n", in, f.Verdict)
			}
		}
	}
	if e := d.Execution; e != nil && e.Cause != nil {
		fmt.Fprintf(b, "\n%scause of the failed execution, diagnosed:\n", in)
		e.Cause.render(b, in+"    ")
	}
}

// stepScopes say when each step of the procedure applies: the text names
// the steps a diagnosis leaves out, and why, so that a gap in the numbers
// (1, 2, 3, 8) is never a silent one.
var stepScopes = [...]string{
	1: "the state view is captured once, for the error the caller saw; a cause shares it",
	2: "only for a call with endpoints (a value at a location)",
	3: "only for a charge refused by a location's budget (ResidencyBudgetError, or a cache refusal that carries one)",
	4: "only for a removal refused by a lease, hold or pending event (ResidencyInUseError), or a plan refused on protection",
	5: "only for the controller's refusals (search limit, stale state, an infeasible plan)",
	6: "only for a decision entered after the state moved on (ResidencyStaleStateError)",
	7: "only for a failed execution (ResidencyPlanExecutionError)",
	8: "every error is classified",
}

// renderSkipped writes why steps from..to do not apply to a diagnosis of
// class: one line for the range, then each step's scope.
func renderSkipped(b *strings.Builder, in, class string, from, to int) {
	if from == to {
		fmt.Fprintf(b, "\n%sstep %d does not apply to this %s:\n", in, from, class)
	} else {
		fmt.Fprintf(b, "\n%ssteps %d–%d do not apply to this %s:\n", in, from, to, class)
	}
	for n := from; n <= to; n++ {
		scope := "not part of the procedure"
		if n < len(stepScopes) {
			scope = stepScopes[n]
		}
		fmt.Fprintf(b, "%s  %d: %s\n", in, n, scope)
	}
}
