package diagnose

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// String renders the diagnosis as text: the class and message, then each
// step with its findings (what was checked, the figures, the verdict), then
// a failed execution's cause, diagnosed in turn.
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
	for _, s := range steps {
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
