package budget

// Rule tests of docs/semantics.md, "Evict and discard" (and dead handles).
// Every call goes through the checked harness (rules_test.go).
//
// rule → test
//
// Values and materializations: evict and discard
//   evict removes a materialization      → TestRule_EvictRemovesMaterialization
//   evict protected → InUse naming all three counts
//                                        → TestRule_EvictProtectedIsInUseNamingAllCounts
//   evict last copy without source → PlanError; with source fine
//                                        → TestRule_EvictLastCopyWithoutSourceIsPlanError,
//                                          TestRule_EvictLastCopyWithSourceIsAllowed
//   (resolved) evict checks protection before data loss
//                                        → TestRule_EvictChecksProtectionBeforeDataLoss
//   discard removes everything, retires the handle
//                                        → TestRule_DiscardRemovesEveryMaterializationAndRetires
//   (resolved) discard reports first protected in location order
//   (ledger choice: protection over every materialization before any
//   in-flight check)                     → TestRule_DiscardReportsFirstProtectedInLocationOrder,
//                                          TestRule_DiscardChecksProtectionBeforeInFlight
//   discarded handle → Unavailable "discarded" everywhere (plans too)
//                                        → TestRule_DiscardedHandleIsUnavailableEverywhere
//   its name is free for a new registration, which gets a new handle
//                                        → TestRule_DiscardedNameIsFreeForANewHandle
//   foreign handle → Unavailable "foreign" → TestRule_ForeignHandleIsUnavailable
//   (resolved) unknown names → invalid input
//                                        → TestRule_UnknownHandleIsInvalidInput

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestRule_EvictRemovesMaterialization(t *testing.T) {
	c := std(t)
	w := c.reg("w", 25, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	var effs []Effect
	eq(t, "versions", c.delta(func() { var err error; effs, err = c.Evict(w, "cuda:0"); c.must(err) }), uint64(1))
	eq(t, "free", effs, []Effect{{Kind: EffectFree, Handle: w, Location: "cuda:0", Bytes: 25}})
	eq(t, "cuda:0", c.figures("cuda:0"), [3]int64{0, 0, 25})
	eq(t, "left", c.mats("w"), []string{"pageable-host:resident:0/0/0"})
	err := c.refused("evict absent", func() error { _, err := c.Evict(w, "cuda:0"); return err })
	wantUnavailable(t, err, "w", "cuda:0", UnavailableEndpoint)
	a, err := c.Place(w, "cuda:1")
	c.must(err)
	err = c.refused("evict entering", func() error { _, err := c.Evict(w, "cuda:1"); return err })
	wantUnavailable(t, err, "w", "cuda:1", UnavailableInFlight)
	c.must2(c.Complete(a.ID))
}

func TestRule_EvictProtectedIsInUseNamingAllCounts(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	l1, err := c.Acquire(w, "cuda:0")
	c.must(err)
	c.must2(c.Acquire(w, "cuda:0"))
	c.must2(c.Hold(w, "cuda:0"))
	c.must2(c.RecordEvent(l1))
	c.must2(c.RecordEvent(l1))
	c.must2(c.RecordEvent(l1))
	err = c.refused("evict protected", func() error { _, err := c.Evict(w, "cuda:0"); return err })
	wantInUse(t, err, InUseError{Handle: "w", Location: "cuda:0", UseCount: 2, HoldCount: 1, PendingEventCount: 3})
	if msg := err.Error(); !strings.Contains(msg, "2 leases") || !strings.Contains(msg, "1 holds") || !strings.Contains(msg, "3 pending events") {
		t.Fatalf("message %q does not name all three counts", msg)
	}
}

func TestRule_EvictLastCopyWithoutSourceIsPlanError(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	err := c.refused("evict last copy", func() error { _, err := c.Evict(w, "pageable-host"); return err })
	wantPlanError(t, err, "discard")
	c.placed(w, "cuda:0")
	c.must2(c.Evict(w, "pageable-host")) // another copy remains
	err = c.refused("evict the new last copy", func() error { _, err := c.Evict(w, "cuda:0"); return err })
	wantPlanError(t, err)
}

func TestRule_EvictLastCopyWithSourceIsAllowed(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	c.placed(s, "cuda:0")
	c.must2(c.Evict(s, "cuda:0"))
	v := c.val("s")
	eq(t, "no materializations", len(v.Materializations), 0)
	eq(t, "still recoverable", v.Recoverable, true)
}

func TestRule_EvictChecksProtectionBeforeDataLoss(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Exclusive, "pageable-host")
	c.must2(c.Hold(w, "pageable-host"))
	err := c.refused("evict protected last copy", func() error { _, err := c.Evict(w, "pageable-host"); return err })
	wantInUse(t, err, InUseError{Handle: "w", Location: "pageable-host", HoldCount: 1})
}

func TestRule_DiscardRemovesEveryMaterializationAndRetires(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "cuda:1")
	c.placed(w, "pageable-host")
	c.placed(w, "cuda:0")
	var effs []Effect
	eq(t, "versions (3 removals + retire)", c.delta(func() { var err error; effs, err = c.Discard(w); c.must(err) }), uint64(4))
	eq(t, "frees in location order", effs, []Effect{
		{Kind: EffectFree, Handle: w, Location: "pageable-host", Bytes: 10},
		{Kind: EffectFree, Handle: w, Location: "cuda:0", Bytes: 10},
		{Kind: EffectFree, Handle: w, Location: "cuda:1", Bytes: 10},
	})
	tr := c.L.Trace()
	eq(t, "transitions", kinds(tr[len(tr)-4:]), []string{"remove w@pageable-host", "remove w@cuda:0", "remove w@cuda:1", "discard w"})
	c.gone("w")
	for _, l := range []string{"pageable-host", "cuda:0", "cuda:1"} {
		eq(t, l+" used", c.figures(l)[0], int64(0))
	}
	// A value with only a source: one version, for the retirement.
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	eq(t, "discard source-only", c.delta(func() { c.must2(c.Discard(s)) }), uint64(1))
}

func TestRule_DiscardReportsFirstProtectedInLocationOrder(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "cuda:1")
	c.placed(w, "pinned-host")
	c.placed(w, "pageable-host")
	c.must2(c.Hold(w, "cuda:1"))
	c.must2(c.Acquire(w, "pinned-host"))
	err := c.refused("discard", func() error { _, err := c.Discard(w); return err })
	wantInUse(t, err, InUseError{Handle: "w", Location: "pinned-host", UseCount: 1})
	eq(t, "nothing removed", len(c.val("w").Materializations), 3)
}

// TestRule_DiscardChecksProtectionBeforeInFlight: discard reports the
// first protected materialization in location order, whatever else is in
// flight (protection is checked before anything in flight); only when
// nothing is protected is the first materialization in flight, in location
// order, Unavailable (in flight).
func TestRule_DiscardChecksProtectionBeforeInFlight(t *testing.T) {
	cases := []struct {
		name  string
		setup func(c *checked) (Handle, []AdmissionID, func())
		check func(t *testing.T, err error)
	}{{
		name: "protected after an entering one in location order",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			r := c.reg("r", 10, Replicable, "cuda:1")
			l, err := c.Acquire(r, "cuda:1")
			c.must(err)
			a, err := c.Place(r, "pageable-host") // pageable-host entering, cuda:1 read
			c.must(err)
			return r, []AdmissionID{a.ID}, func() { c.must(c.Release(l)) }
		},
		check: func(t *testing.T, err error) {
			wantInUse(t, err, InUseError{Handle: "r", Location: "cuda:1", UseCount: 1})
		},
	}, {
		name: "protected source of a copy in flight",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			r := c.reg("r", 10, Replicable, "pinned-host")
			hd, err := c.Hold(r, "pinned-host")
			c.must(err)
			a, err := c.Copy(r, "pinned-host", "cuda:0")
			c.must(err)
			return r, []AdmissionID{a.ID}, func() { c.must(c.Unhold(hd)) }
		},
		check: func(t *testing.T, err error) {
			wantInUse(t, err, InUseError{Handle: "r", Location: "pinned-host", HoldCount: 1})
		},
	}, {
		name: "pending event behind two transfers in flight",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			s := c.regSrc("s", 10, Replicable, "pinned-host")
			c.placed(s, "cuda:1")
			l, err := c.Acquire(s, "cuda:1")
			c.must(err)
			ev, err := c.RecordEvent(l)
			c.must(err)
			c.must(c.Release(l))
			a1, err := c.Place(s, "pageable-host")
			c.must(err)
			a2, err := c.Place(s, "cuda:0")
			c.must(err)
			return s, []AdmissionID{a1.ID, a2.ID}, func() { c.must(c.ReapEvent(ev)) }
		},
		check: func(t *testing.T, err error) {
			wantInUse(t, err, InUseError{Handle: "s", Location: "cuda:1", PendingEventCount: 1})
		},
	}, {
		name: "nothing protected: the first in flight in location order",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			r := c.reg("r", 10, Replicable, "pinned-host")
			c.placed(r, "cuda:1")
			a, err := c.Copy(r, "cuda:1", "cuda:0") // cuda:0 entering, cuda:1 read
			c.must(err)
			return r, []AdmissionID{a.ID}, func() {}
		},
		check: func(t *testing.T, err error) {
			ue := wantUnavailable(t, err, "r", "cuda:0", UnavailableInFlight)
			eq(t, "detail", ue.Detail, "materialization is entering; a transition is in flight")
		},
	}, {
		name: "nothing protected: a copy's source first in location order",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			r := c.reg("r", 10, Replicable, "pinned-host")
			a, err := c.Copy(r, "pinned-host", "cuda:1")
			c.must(err)
			return r, []AdmissionID{a.ID}, func() {}
		},
		check: func(t *testing.T, err error) {
			ue := wantUnavailable(t, err, "r", "pinned-host", UnavailableInFlight)
			eq(t, "detail", ue.Detail, "materialization is the source of a copy in flight")
		},
	}, {
		name: "nothing protected: an exclusive value moving",
		setup: func(c *checked) (Handle, []AdmissionID, func()) {
			w := c.reg("w", 10, Exclusive, "cuda:0")
			a, err := c.Move(w, "cuda:0", "pageable-host")
			c.must(err)
			return w, []AdmissionID{a.ID}, func() {}
		},
		check: func(t *testing.T, err error) {
			wantUnavailable(t, err, "w", "pageable-host", UnavailableInFlight)
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := std(t)
			h, adms, unprotect := tc.setup(c)
			err := c.refused("discard", func() error { _, err := c.Discard(h); return err })
			tc.check(t, err)
			// Settled and unprotected, the value can be discarded.
			for _, id := range adms {
				c.must2(c.Complete(id))
			}
			unprotect()
			c.must2(c.Discard(h))
		})
	}
}

func TestRule_DiscardedHandleIsUnavailableEverywhere(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.must2(c.Discard(w))
	checkDeadHandle(t, c, w, UnavailableDiscarded, ErrDiscarded, "discarded")
	// Request validation too.
	_, err := c.L.Decide(Request{Name: "q", Requirements: []Requirement{{Handle: w, Tiers: [][]string{{"cuda:0"}}}}}, 0)
	wantUnavailable(t, err, "w", "", UnavailableDiscarded)
}

// TestRule_DiscardedNameIsFreeForANewHandle: a discarded value's name is
// free for a new registration, which gets a new handle (a new ID: IDs are
// never reused); Lookup returns the new handle; the retired handle still
// answers Unavailable (discarded) everywhere and never reaches the new
// value.
func TestRule_DiscardedNameIsFreeForANewHandle(t *testing.T) {
	c := std(t)
	old := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(old, "cuda:0")
	c.reg("other", 5, Exclusive, "cuda:1")
	c.must2(c.Discard(old))
	if h, ok := c.L.Lookup("w"); ok {
		t.Fatalf("Lookup of a discarded name found %+v", h)
	}
	// Same name, another size, mode and kind of registration.
	var h2 Handle
	eq(t, "register again: 1 version", c.delta(func() { h2 = c.regSrc("w", 30, Exclusive, "pinned-host") }), uint64(1))
	eq(t, "new handle", h2, Handle{Manager: "m1", ID: 3, Name: "w"})
	if h, ok := c.L.Lookup("w"); !ok || h != h2 {
		t.Fatalf("Lookup(w) = %+v %v, want the new handle %+v", h, ok, h2)
	}
	// The name is taken again while the new value lives.
	err := c.refused("register a live name", func() error {
		_, _, err := c.Register(ValueSpec{Name: "w", Bytes: 1, At: "cuda:0"})
		return err
	})
	wantInvalid(t, err, `duplicate value name "w"`)
	c.placed(h2, "cuda:0")
	// The old handle is dead everywhere, and none of its refusals touched
	// the new value (checkDeadHandle: refused, state unchanged).
	checkDeadHandle(t, c, old, UnavailableDiscarded, ErrDiscarded, "discarded")
	_, err = c.L.Decide(Request{Name: "q", Requirements: []Requirement{{Handle: old, Tiers: [][]string{{"cuda:1"}}}}}, 0)
	wantUnavailable(t, err, "w", "", UnavailableDiscarded)
	eq(t, "new value untouched", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	// The snapshot lists live values only: the new w, not the old one.
	v := c.val("w")
	eq(t, "Value(w)", []any{v.Handle, v.Bytes}, []any{h2, int64(30)})
	var listed []string
	for _, r := range c.Snapshot().Values {
		listed = append(listed, fmt.Sprintf("%s#%d", r.Handle.Name, r.Handle.ID))
	}
	eq(t, "snapshot values", listed, []string{"other#2", "w#3"})
	// The new handle works, and is retired in its turn; a third
	// registration gets a third id.
	l, err := c.Acquire(h2, "cuda:0")
	c.must(err)
	c.must(c.Release(l))
	c.must2(c.Discard(h2))
	checkDeadHandle(t, c, h2, UnavailableDiscarded, ErrDiscarded, "discarded")
	h3 := c.reg("w", 1, Replicable, "cuda:1")
	eq(t, "third handle", h3.ID, uint64(4))
	// A handle that pairs the old id with another name is discarded too:
	// ids, not names, identify values, and the runtime keeps nothing of a
	// retired value but that answer (SEMANTICS: O(1) memory), not even
	// its name. A live id with another name is unknown.
	err = c.refused("old id, other name", func() error {
		_, err := c.Place(Handle{Manager: "m1", ID: old.ID, Name: "other"}, "cuda:0")
		return err
	})
	wantUnavailable(t, err, "other", "", UnavailableDiscarded)
	err = c.refused("live id, other name", func() error {
		_, err := c.Place(Handle{Manager: "m1", ID: h3.ID, Name: "other"}, "cuda:0")
		return err
	})
	wantInvalid(t, err, `handle id 4 names "w", not "other"`)
}

func TestRule_ForeignHandleIsUnavailable(t *testing.T) {
	c := std(t)
	c.reg("w", 10, Replicable, "pageable-host")
	other := newChecked(t, Config{ManagerID: "m2", Locations: []LocationConfig{{Name: "pageable-host"}}})
	f := other.reg("w", 10, Replicable, "pageable-host")
	eq(t, "foreign handle looks local", f.ID, uint64(1))
	checkDeadHandle(t, c, f, UnavailableForeign, ErrForeign, "foreign")
}

// checkDeadHandle: every operation on h is an UnavailableError with the
// given reason, matching sentinel and saying what, and changes nothing.
func checkDeadHandle(t *testing.T, c *checked, h Handle, reason UnavailableReason, sentinel error, what string) {
	t.Helper()
	ops := map[string]func() error{
		"place":   func() error { _, err := c.Place(h, "cuda:0"); return err },
		"copy":    func() error { _, err := c.Copy(h, "pageable-host", "cuda:0"); return err },
		"move":    func() error { _, err := c.Move(h, "pageable-host", "cuda:0"); return err },
		"evict":   func() error { _, err := c.Evict(h, "pageable-host"); return err },
		"discard": func() error { _, err := c.Discard(h); return err },
		"acquire": func() error { _, err := c.Acquire(h, "pageable-host"); return err },
		"hold":    func() error { _, err := c.Hold(h, "pageable-host"); return err },
		"run reclaim": func() error {
			_, err := c.StartRun(Plan{Reclaim: []Action{{Handle: h, Location: "pageable-host"}}}, RunOptions{})
			return err
		},
		"run enter": func() error {
			_, err := c.StartRun(Plan{Enter: []Action{{Handle: h, Location: "cuda:0"}}}, RunOptions{Scope: "s"})
			return err
		},
	}
	for name, op := range ops {
		err := c.refused(name, op)
		wantUnavailable(t, err, h.Name, "", reason)
		if !errors.Is(err, sentinel) {
			t.Fatalf("%s: %v does not match %v", name, err, sentinel)
		}
		if !strings.Contains(err.Error(), what) {
			t.Fatalf("%s: %q does not say %q", name, err.Error(), what)
		}
	}
	ex := c.Explain(Plan{Enter: []Action{{Handle: h, Location: "cuda:0"}}})
	if ex.Feasible || !strings.Contains(ex.Reason, what) {
		t.Fatalf("explain: %+v", ex)
	}
}

func TestRule_UnknownHandleIsInvalidInput(t *testing.T) {
	c := std(t)
	c.reg("w", 10, Replicable, "pageable-host")
	for _, h := range []Handle{{Manager: "m1", ID: 99, Name: "ghost"}, {Manager: "m1"}, {Manager: "m1", ID: 1, Name: "not-w"}} {
		for name, op := range map[string]func() error{
			"place":   func() error { _, err := c.Place(h, "cuda:0"); return err },
			"evict":   func() error { _, err := c.Evict(h, "pageable-host"); return err },
			"acquire": func() error { _, err := c.Acquire(h, "pageable-host"); return err },
			"discard": func() error { _, err := c.Discard(h); return err },
			"run": func() error {
				_, err := c.StartRun(Plan{Enter: []Action{{Handle: h, Location: "cuda:0"}}}, RunOptions{})
				return err
			},
		} {
			err := c.refused(name, op)
			wantInvalid(t, err, fmt.Sprintf("%q", h.Name))
		}
	}
}

// The source of a move in flight keeps the data (the move leaves its
// destination or, failed, its source): evicting a value's other copy
// meanwhile is not losing its last copy. Found by tests/TestSyscheck.
func TestRule_EvictWhileTheOtherCopyIsAMoveSource(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("move fails=%v", fail), func(t *testing.T) {
			c := std(t)
			w := c.reg("w", 10, Replicable, "pageable-host") // no source
			c.placed(w, "cuda:0")
			a, err := c.Move(w, "pageable-host", "cuda:1")
			c.must(err)
			eq(t, "during", c.mats("w"), []string{"pageable-host:leaving:0/0/0", "cuda:0:resident:0/0/0", "cuda:1:entering:0/0/0"})
			_, err = c.Evict(w, "cuda:0")
			c.must(err)
			if fail {
				c.must(c.Fail(a.ID, errors.New("copy failed")))
				eq(t, "after", c.mats("w"), []string{"pageable-host:resident:0/0/0"})
				// Now it is the last copy.
				err := c.refused("evict the last copy", func() error { _, err := c.Evict(w, "pageable-host"); return err })
				var pe *PlanError
				if !errors.As(err, &pe) {
					t.Fatalf("want *PlanError, got %v", err)
				}
				return
			}
			c.must2(c.Complete(a.ID))
			eq(t, "after", c.mats("w"), []string{"cuda:1:resident:0/0/0"})
		})
	}
}
