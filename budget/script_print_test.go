package budget

// Printing for the data-driven ledger scripts (script_test.go).

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// ---- printing ----------------------------------------------------------------

func (s *scriptRunner) printAdmission(a Admission) {
	switch {
	case a.Pending:
		s.lastAdm = a.ID
		s.printf("admission %d pending", a.ID)
	case len(a.Effects) == 0:
		s.printf("no-op (already resident)")
		return
	default:
		s.printf("committed at once")
	}
	for _, e := range a.Effects {
		s.printf("  effect: %s", e)
	}
}

func (s *scriptRunner) printEffects(what string, effs []Effect) {
	s.printf("%s", what)
	for _, e := range effs {
		s.printf("  effect: %s", e)
	}
}

func (s *scriptRunner) printStep(st Step) {
	s.printf("step %s %d", st.Phase, st.Index)
	if st.Admission.Pending {
		s.printf("  admission %d pending", st.Admission.ID)
	} else if st.Phase == PhaseEnter && len(st.Admission.Effects) == 0 {
		s.printf("  no-op (already resident)")
	}
	for _, e := range st.Admission.Effects {
		s.printf("  effect: %s", e)
	}
}

func (s *scriptRunner) printFinish(rep Report, leases []LeaseID) {
	s.printf("finished: %d transitions", len(rep.Transitions))
	for _, x := range rep.Transitions {
		s.printf("  %s", x)
	}
	for _, id := range leases {
		h, loc, _ := s.c.L.LeaseEndpoint(id)
		s.printf("  lease %d on %s at %s", id, h.Name, loc)
	}
}

func (s *scriptRunner) printPlan(p Plan) {
	for i, a := range p.Reclaim {
		s.printf("  reclaim %d: %s", i, a)
	}
	for i, r := range p.Reservations {
		s.printf("  reserve %d: %s", i, r)
	}
	for i, a := range p.Enter {
		s.printf("  enter %d: %s", i, a)
	}
}

func (s *scriptRunner) printExplanation(ex Explanation, indent string) {
	s.printf("%sfeasible: %v", indent, ex.Feasible)
	if ex.Reason != "" {
		s.printf("%sreason: %s", indent, ex.Reason)
	}
	var locs []string
	for l := range ex.PredictedPeakBytes {
		locs = append(locs, l)
	}
	sort.Slice(locs, func(i, j int) bool { return s.locOrder(locs[i]) < s.locOrder(locs[j]) })
	var parts []string
	for _, l := range locs {
		parts = append(parts, fmt.Sprintf("%s=%d", l, ex.PredictedPeakBytes[l]))
	}
	s.printf("%spredicted peak: %s", indent, strings.Join(parts, " "))
}

func (s *scriptRunner) locOrder(name string) int {
	for i, l := range s.c.L.Locations() {
		if l == name {
			return i
		}
	}
	return 1 << 30
}

func (s *scriptRunner) printSnapshot(snap Snapshot) {
	s.printf("snapshot version %d manager %s", snap.StateVersion, snap.ManagerID)
	for _, l := range snap.Locations {
		budget := "none"
		if l.HasBudget {
			budget = strconv.FormatInt(l.BudgetBytes, 10)
		}
		s.printf("  location %s budget=%s used=%d reserved=%d peak=%d temporary=%d", l.Location, budget, l.UsedBytes, l.ReservedBytes, l.PeakBytes, l.TemporaryBytes)
		for _, r := range l.Reservations {
			s.printf("    reservation %s %d bytes owner=%q", r.Name, r.Bytes, r.Owner)
		}
	}
	for _, v := range snap.Values {
		src := "none"
		if v.HasSource {
			src = v.SourceLocation
		}
		s.printf("  value %s (id %d) %d bytes %s source=%s recoverable=%v", v.Handle.Name, v.Handle.ID, v.Bytes, v.ReplicaMode, src, v.Recoverable)
		for _, m := range v.Materializations {
			s.printf("    at %s %s charged=%d uses=%d holds=%d pending_events=%d", m.Location, m.State, m.ChargedBytes, m.UseCount, m.HoldCount, m.PendingEventCount)
		}
	}
}

var unavailableReasons = map[UnavailableReason]string{
	UnavailableEndpoint: "endpoint", UnavailableLocation: "location", UnavailableSource: "source",
	UnavailableDiscarded: "discarded", UnavailableForeign: "foreign", UnavailableInFlight: "in flight",
}

// printErr prints a typed error with every field of its struct, by
// reflection (so that a new field shows up in the golden output).
func (s *scriptRunner) printErr(err error, indent string) {
	rv := reflect.ValueOf(err)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct || rv.Elem().Type().PkgPath() != reflect.TypeFor[Plan]().PkgPath() {
		s.printf("%serror %T: %v", indent, err, err)
		return
	}
	s.printf("%serror %T", indent, err)
	st := rv.Elem()
	for i := 0; i < st.NumField(); i++ {
		name, f := st.Type().Field(i).Name, st.Field(i)
		if !st.Type().Field(i).IsExported() {
			continue // a caller sees only the exported fields
		}
		if ie, ok := err.(*InvalidInputError); ok && ie.Inactive == LifetimeNone && (name == "Inactive" || name == "ID") {
			continue // shown only when the refusal names an inactive lifetime
		}
		if be, ok := err.(*BudgetError); ok && be.Shared == "" && strings.HasPrefix(name, "Shared") {
			continue // shown only when a shared budget refused
		}
		switch v := f.Interface().(type) {
		case string:
			s.printf("%s  %s: %q", indent, name, v)
		case UnavailableReason:
			s.printf("%s  %s: %d (%s)", indent, name, v, unavailableReasons[v])
		case *Action:
			if v == nil {
				s.printf("%s  %s: nil", indent, name)
			} else {
				to := ""
				if v.To != "" {
					to = fmt.Sprintf(" to=%q", v.To)
				}
				s.printf("%s  %s: handle=%q location=%q from=%q%s", indent, name, v.Handle.Name, v.Location, v.From, to)
			}
		case *ReservationSpec:
			if v == nil {
				s.printf("%s  %s: nil", indent, name)
			} else {
				s.printf("%s  %s: name=%q location=%q bytes=%d", indent, name, v.Name, v.Location, v.Bytes)
			}
		case Report:
			s.printf("%s  %s: %d transitions", indent, name, len(v.Transitions))
			for _, x := range v.Transitions {
				s.printf("%s    %s", indent, x)
			}
		case error:
			s.printf("%s  %s:", indent, name)
			s.printErr(v, indent+"    ")
		default:
			s.printf("%s  %s: %v", indent, name, v)
		}
	}
	s.printf("%s  message: %s", indent, err)
	var cats []string
	for _, c := range []struct {
		name string
		err  error
	}{{"ErrPlan", ErrPlan}, {"ErrInvalidInput", ErrInvalidInput}, {"ErrDiscarded", ErrDiscarded}, {"ErrForeign", ErrForeign}} {
		if errors.Is(err, c.err) {
			cats = append(cats, c.name)
		}
	}
	if len(cats) == 0 {
		cats = []string{"none"}
	}
	s.printf("%s  matches: %s", indent, strings.Join(cats, ", "))
}
