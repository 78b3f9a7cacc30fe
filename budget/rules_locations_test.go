package budget

// Rule tests of docs/semantics.md, "Locations and budgets". Every call goes
// through the checked harness (rules_test.go).
//
// rule → test
//
// Locations
//   names pageable-host, pinned-host, cuda:N, @node; else bad input naming
//   the string, nothing changes         → TestRule_LocationNames,
//                                          TestRule_MalformedLocationIsInvalidInputAndChangesNothing
//   fixed set; well formed but not configured → Unavailable
//                                        → TestRule_UnconfiguredLocationIsUnavailable
//   (ledger choice) location order       → TestRule_LocationOrder
//   (DESIGN) bad start configuration     → TestRule_NewRejectsBadConfiguration
//   used = charges incl. entering and temporary
//                                        → TestRule_UsedBytesIncludeEnteringAndTemporaryCharges
//   reserved = active reservations       → TestRule_ReservedBytesAreActiveReservations
//   peak = highest used + reserved       → TestRule_PeakIsHighestUsedPlusReserved
//   admission used+reserved+requested <= budget; absent = no limit
//                                        → TestRule_AdmissionBoundary, TestRule_NoBudgetMeansNoLimit,
//                                          TestRule_AdmissionIsExactIntegerArithmetic
//   BudgetError with the five figures at the refusal
//                                        → TestRule_BudgetErrorReportsFiguresAtRefusal

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestRule_LocationNames(t *testing.T) {
	good := map[string]string{
		"pageable-host":        "pageable-host",
		"pinned-host":          "pinned-host",
		"cuda:0":               "cuda:0",
		"cuda:7":               "cuda:7",
		"cuda:123":             "cuda:123",
		"cuda:0@node-b":        "cuda:0@node-b",
		"pinned-host@n1.rack2": "pinned-host@n1.rack2",
	}
	for in, want := range good {
		n, err := ParseLocation(in)
		if err != nil {
			t.Errorf("ParseLocation(%q): %v", in, err)
			continue
		}
		if n.String() != want {
			t.Errorf("ParseLocation(%q).String() = %q", in, n.String())
		}
	}
	bad := []string{"", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda:01", "cuda:x", "cuda:1.5", "cuda: 1",
		"CUDA:0", "gpu:0", "cpu", "pinned", "Pinned-Host", "pageable-host ", " cuda:0",
		"cuda:0@", "cuda:0@a b", "cuda:0@n@m", "@node", "host"}
	for _, in := range bad {
		_, err := ParseLocation(in)
		wantInvalid(t, err, fmt.Sprintf("%q", in))
	}
}

func TestRule_MalformedLocationIsInvalidInputAndChangesNothing(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	const bad = "gpu:0"
	ops := map[string]func() error{
		"register at":     func() error { _, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, At: bad}); return err },
		"register source": func() error { _, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, Source: bad}); return err },
		"place":           func() error { _, err := c.Place(w, bad); return err },
		"copy from":       func() error { _, err := c.Copy(w, bad, "cuda:1"); return err },
		"copy to":         func() error { _, err := c.Copy(w, "cuda:0", bad); return err },
		"move from":       func() error { _, err := c.Move(w, bad, "cuda:1"); return err },
		"move to":         func() error { _, err := c.Move(w, "cuda:0", bad); return err },
		"evict":           func() error { _, err := c.Evict(w, bad); return err },
		"acquire":         func() error { _, err := c.Acquire(w, bad); return err },
		"hold":            func() error { _, err := c.Hold(w, bad); return err },
		"reserve":         func() error { return c.Reserve(bad, "r", 1) },
		"start run": func() error {
			_, err := c.StartRun(Plan{Enter: []Action{{Handle: w, Location: bad}}}, RunOptions{})
			return err
		},
	}
	for name, op := range ops {
		err := c.refused(name, op)
		wantInvalid(t, err, `"gpu:0"`)
	}
	ex := c.Explain(Plan{Reservations: []ReservationSpec{{Name: "r", Location: bad, Bytes: 1}}})
	if ex.Feasible || !strings.Contains(ex.Reason, `"gpu:0"`) {
		t.Fatalf("explain with a malformed location: %+v", ex)
	}
}

func TestRule_UnconfiguredLocationIsUnavailable(t *testing.T) {
	c := newChecked(t, Config{ManagerID: "m1", Locations: []LocationConfig{{Name: "pageable-host"}, {Name: "cuda:0"}}})
	w := c.reg("w", 10, Replicable, "pageable-host")
	for _, loc := range []string{"cuda:1", "pinned-host", "cuda:0@node-b"} {
		ops := map[string]func() error{
			"register at":     func() error { _, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, At: loc}); return err },
			"register source": func() error { _, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, Source: loc}); return err },
			"place":           func() error { _, err := c.Place(w, loc); return err },
			"copy":            func() error { _, err := c.Copy(w, "pageable-host", loc); return err },
			"move":            func() error { _, err := c.Move(w, "pageable-host", loc); return err },
			"evict":           func() error { _, err := c.Evict(w, loc); return err },
			"acquire":         func() error { _, err := c.Acquire(w, loc); return err },
			"hold":            func() error { _, err := c.Hold(w, loc); return err },
			"reserve":         func() error { return c.Reserve(loc, "r", 1) },
			"start run": func() error {
				_, err := c.StartRun(Plan{Enter: []Action{{Handle: w, Location: loc}}}, RunOptions{})
				return err
			},
		}
		for name, op := range ops {
			err := c.refused(name+" "+loc, op)
			wantUnavailable(t, err, "", loc, UnavailableLocation)
		}
	}
	// A node-qualified location works once it is configured.
	c2 := newChecked(t, Config{ManagerID: "m2", Locations: []LocationConfig{{Name: "pageable-host"}, {Name: "cuda:0@node-b", HasBudget: true, BudgetBytes: 10}}})
	x := c2.reg("x", 10, Exclusive, "pageable-host")
	c2.placed(x, "cuda:0@node-b")
	eq(t, "mats", c2.mats("x"), []string{"cuda:0@node-b:resident:0/0/0"})
}

func TestRule_LocationOrder(t *testing.T) {
	var locs []LocationConfig
	for _, n := range []string{"cuda:10", "cuda:0@b", "cuda:1", "pinned-host@a", "pinned-host", "cuda:2", "pageable-host", "cuda:0"} {
		locs = append(locs, LocationConfig{Name: n})
	}
	c := newChecked(t, Config{ManagerID: "m1", Locations: locs})
	want := []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1", "cuda:2", "cuda:10", "pinned-host@a", "cuda:0@b"}
	eq(t, "Locations()", c.L.Locations(), want)
	var got []string
	for _, r := range c.Snapshot().Locations {
		got = append(got, r.Location)
	}
	eq(t, "snapshot location order", got, want)
	// Materializations are listed in location order too, whatever the
	// order they were created in.
	w := c.reg("w", 1, Replicable, "cuda:10")
	for _, l := range []string{"cuda:2", "pageable-host", "cuda:0@b", "pinned-host"} {
		c.placed(w, l)
	}
	eq(t, "materialization order", c.mats("w"), []string{
		"pageable-host:resident:0/0/0", "pinned-host:resident:0/0/0", "cuda:2:resident:0/0/0",
		"cuda:10:resident:0/0/0", "cuda:0@b:resident:0/0/0"})
}

func TestRule_NewRejectsBadConfiguration(t *testing.T) {
	cases := map[string]Config{
		"no manager id":      {Locations: []LocationConfig{{Name: "cuda:0"}}},
		"no locations":       {ManagerID: "m"},
		"malformed location": {ManagerID: "m", Locations: []LocationConfig{{Name: "gpu0"}}},
		"non-canonical":      {ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:00"}}},
		"duplicate location": {ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:0"}, {Name: "cuda:0"}}},
		"zero budget":        {ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:0", HasBudget: true}}},
		"negative budget":    {ManagerID: "m", Locations: []LocationConfig{{Name: "cuda:0", HasBudget: true, BudgetBytes: -5}}},
		"negative trace":     {ManagerID: "m", TraceCapacity: -1, Locations: []LocationConfig{{Name: "cuda:0"}}},
	}
	for name, cfg := range cases {
		l, err := New(cfg)
		if l != nil {
			t.Errorf("%s: got a ledger", name)
		}
		wantInvalid(t, err)
	}
}

func TestRule_UsedBytesIncludeEnteringAndTemporaryCharges(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 40, Exclusive, "pinned-host")
	eq(t, "pinned-host before", c.figures("pinned-host"), [3]int64{0, 0, 0})
	a, err := c.Place(s, "cuda:0")
	c.must(err)
	eq(t, "entering materialization", c.mats("s"), []string{"cuda:0:entering:0/0/0"})
	eq(t, "cuda:0 while entering", c.figures("cuda:0"), [3]int64{40, 0, 40})
	eq(t, "pinned-host temporary charge", c.figures("pinned-host"), [3]int64{40, 0, 40})
	_, err = c.Complete(a.ID)
	c.must(err)
	eq(t, "cuda:0 after", c.figures("cuda:0"), [3]int64{40, 0, 40})
	eq(t, "pinned-host after", c.figures("pinned-host"), [3]int64{0, 0, 40})
}

func TestRule_ReservedBytesAreActiveReservations(t *testing.T) {
	c := std(t)
	c.must(c.Reserve("cuda:0", "a", 10))
	c.must(c.Reserve("cuda:0", "b", 20))
	c.must(c.Reserve("cuda:1", "c", 5))
	r := c.loc("cuda:0")
	eq(t, "reserved", r.ReservedBytes, int64(30))
	eq(t, "used", r.UsedBytes, int64(0))
	eq(t, "records", r.Reservations, []ReservationRecord{{Name: "a", Bytes: 10}, {Name: "b", Bytes: 20}})
	c.must(c.Unreserve("a"))
	r = c.loc("cuda:0")
	eq(t, "reserved after release", r.ReservedBytes, int64(20))
	eq(t, "records after release", r.Reservations, []ReservationRecord{{Name: "b", Bytes: 20}})
	eq(t, "cuda:1", c.figures("cuda:1"), [3]int64{0, 5, 5})
}

func TestRule_PeakIsHighestUsedPlusReserved(t *testing.T) {
	c := std(t)
	c.must(c.Reserve("cuda:0", "r", 30))
	w := c.reg("w", 50, Exclusive, "cuda:0")
	eq(t, "after register", c.figures("cuda:0"), [3]int64{50, 30, 80})
	c.must(c.Unreserve("r"))
	eq(t, "after unreserve", c.figures("cuda:0"), [3]int64{50, 0, 80})
	c.placed(w, "cuda:1") // move: cuda:0 keeps 50 until completion
	eq(t, "after move away", c.figures("cuda:0"), [3]int64{0, 0, 80})
	c.must(c.Reserve("cuda:0", "r2", 90))
	eq(t, "new high", c.figures("cuda:0"), [3]int64{0, 90, 90})
	c.must(c.Unreserve("r2"))
	c.must(c.Reserve("cuda:1", "r3", 40))
	eq(t, "cuda:1", c.figures("cuda:1"), [3]int64{50, 40, 90})
}

func TestRule_AdmissionBoundary(t *testing.T) {
	// used + reserved + requested <= budget is admitted; one byte more is not.
	t.Run("register", func(t *testing.T) {
		c := std(t)
		c.must(c.Reserve("cuda:0", "r", 30))
		c.reg("a", 70, Exclusive, "cuda:0") // 0+30+70 = 100
		err := c.refused("register 1 more byte", func() error {
			_, _, err := c.Register(ValueSpec{Name: "b", Bytes: 1, At: "cuda:0"})
			return err
		})
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 70, ReservedBytes: 30, RequestedBytes: 1})
	})
	t.Run("reserve", func(t *testing.T) {
		c := std(t)
		c.reg("a", 60, Exclusive, "cuda:0")
		c.must(c.Reserve("cuda:0", "r", 40))
		err := c.refused("reserve 1 more byte", func() error { return c.Reserve("cuda:0", "r2", 1) })
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 60, ReservedBytes: 40, RequestedBytes: 1})
	})
	t.Run("place copy move", func(t *testing.T) {
		c := std(t)
		w := c.reg("w", 50, Replicable, "pageable-host")
		x := c.reg("x", 51, Replicable, "pageable-host")
		c.must(c.Reserve("cuda:0", "r", 50))
		err := c.refused("copy 51 into 50 free", func() error { _, err := c.Copy(x, "pageable-host", "cuda:0"); return err })
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 50, RequestedBytes: 51})
		err = c.refused("move 51 into 50 free", func() error { _, err := c.Move(x, "pageable-host", "cuda:0"); return err })
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 50, RequestedBytes: 51})
		err = c.refused("place 51 into 50 free", func() error { _, err := c.Place(x, "cuda:0"); return err })
		wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 50, RequestedBytes: 51})
		c.placed(w, "cuda:0") // exactly fits
		eq(t, "cuda:0", c.figures("cuda:0"), [3]int64{50, 50, 100})
	})
	t.Run("temporary charge", func(t *testing.T) {
		c := std(t)
		s := c.regSrc("s", 40, Exclusive, "cuda:1")
		c.must(c.Reserve("cuda:1", "r", 60))
		c.placed(s, "cuda:0") // 0+60+40 = 100 at cuda:1, temporarily
		eq(t, "cuda:1", c.figures("cuda:1"), [3]int64{0, 60, 100})
		c.must(c.Reserve("cuda:1", "r2", 1))
		c.must2(c.Evict(s, "cuda:0"))
		err := c.refused("temporary charge one byte over", func() error { _, err := c.Place(s, "cuda:0"); return err })
		wantBudget(t, err, BudgetError{Location: "cuda:1", BudgetBytes: 100, UsedBytes: 0, ReservedBytes: 61, RequestedBytes: 40})
	})
}

func TestRule_NoBudgetMeansNoLimit(t *testing.T) {
	c := std(t)
	for i := range 4 {
		c.reg(fmt.Sprint("big", i), 1<<50, Exclusive, "pageable-host")
	}
	c.must(c.Reserve("pageable-host", "huge", 1<<52))
	eq(t, "pageable-host", c.figures("pageable-host"), [3]int64{1 << 52, 1 << 52, 1 << 53})
	eq(t, "budget flag", c.loc("pageable-host").HasBudget, false)
}

func TestRule_AdmissionIsExactIntegerArithmetic(t *testing.T) {
	// used + reserved + requested must be compared exactly: a request so
	// large that the sum overflows int64 must not wrap around and pass.
	c := std(t)
	c.reg("w", 10, Exclusive, "cuda:0")
	err := c.refused("register MaxInt64", func() error {
		_, _, err := c.Register(ValueSpec{Name: "huge", Bytes: math.MaxInt64, At: "cuda:0"})
		return err
	})
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 10, ReservedBytes: 0, RequestedBytes: math.MaxInt64})
	err = c.refused("reserve MaxInt64", func() error { return c.Reserve("cuda:0", "huge", math.MaxInt64) })
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 10, ReservedBytes: 0, RequestedBytes: math.MaxInt64})
	// Without a budget the figures must stay exact too: a charge that
	// cannot be represented is refused rather than wrapped.
	c.reg("half", math.MaxInt64/2+1, Exclusive, "pageable-host")
	err = c.refused("overflowing unlimited location", func() error {
		_, _, err := c.Register(ValueSpec{Name: "half2", Bytes: math.MaxInt64/2 + 1, At: "pageable-host"})
		return err
	})
	wantInvalid(t, err, "pageable-host")
	eq(t, "pageable-host", c.figures("pageable-host"), [3]int64{math.MaxInt64/2 + 1, 0, math.MaxInt64/2 + 1})
}

func TestRule_BudgetErrorReportsFiguresAtRefusal(t *testing.T) {
	c := std(t)
	c.reg("a", 45, Exclusive, "cuda:1")
	c.must(c.Reserve("cuda:1", "r", 25))
	b := c.reg("b", 31, Exclusive, "pinned-host")
	err := c.refused("move b to cuda:1", func() error { _, err := c.Move(b, "pinned-host", "cuda:1"); return err })
	wantBudget(t, err, BudgetError{Location: "cuda:1", BudgetBytes: 100, UsedBytes: 45, ReservedBytes: 25, RequestedBytes: 31})
	if msg := err.Error(); !strings.Contains(msg, "cuda:1") || !strings.Contains(msg, "short by 1") {
		t.Fatalf("message %q", msg)
	}
}
