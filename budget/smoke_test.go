package budget

import (
	"errors"
	"testing"
)

func TestSmoke(t *testing.T) {
	l, err := New(Config{ManagerID: "m1", TraceCapacity: 8, Locations: []LocationConfig{
		{Name: "cuda:0", HasBudget: true, BudgetBytes: 100},
		{Name: "pageable-host"},
		{Name: "pinned-host", HasBudget: true, BudgetBytes: 100},
	}})
	if err != nil {
		t.Fatal(err)
	}
	h, adm, err := l.Register(ValueSpec{Name: "w", Bytes: 60, At: "pageable-host"})
	if err != nil || !adm.Pending {
		t.Fatal(err)
	}
	if _, err := l.Complete(adm.ID); err != nil {
		t.Fatal(err)
	}
	adm, err = l.Place(h, "cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	if l.Version() != 3 {
		t.Fatalf("version %d", l.Version())
	}
	if _, err := l.Complete(adm.ID); err != nil {
		t.Fatal(err)
	}
	if l.Version() != 5 {
		t.Fatalf("version %d", l.Version())
	}
	s := l.Snapshot()
	if r, _ := s.Location("cuda:0"); r.UsedBytes != 60 {
		t.Fatalf("%+v", r)
	}
	if r, _ := s.Location("pageable-host"); r.UsedBytes != 0 {
		t.Fatalf("%+v", r)
	}
	h2, _, err := l.Register(ValueSpec{Name: "x", Bytes: 50, Source: "pinned-host"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Place(h2, "cuda:0")
	var be *BudgetError
	if !errors.As(err, &be) || be.RequestedBytes != 50 || be.UsedBytes != 60 {
		t.Fatalf("%v", err)
	}
	ex := l.Explain(Plan{Reclaim: []Action{{Handle: h, Location: "cuda:0"}}, Enter: []Action{{Handle: h2, Location: "cuda:0"}}})
	if ex.Feasible {
		t.Fatalf("reclaiming the last copy without source must be infeasible: %+v", ex)
	}
	ex = l.Explain(Plan{Enter: []Action{{Handle: h, Location: "pageable-host"}, {Handle: h2, Location: "cuda:0"}}})
	if !ex.Feasible || ex.PredictedPeakBytes["cuda:0"] != 60 || ex.PredictedPeakBytes["pinned-host"] != 50 || ex.PredictedPeakBytes["pageable-host"] != 60 {
		t.Fatalf("%+v", ex)
	}
	if err := l.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	t.Log(l.Trace())
}
