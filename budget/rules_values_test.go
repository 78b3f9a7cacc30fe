package budget

// Rule tests of docs/semantics.md, "Values and materializations"
// (registering; place, copy, move). Every call goes through the checked
// harness (rules_test.go).
//
// rule → test
//
// Values and materializations
//   register: bytes > 0                  → TestRule_RegisterBytesMustBePositive
//   replica mode exclusive (default) or replicable
//                                        → TestRule_RegisterReplicaModes
//   first location xor source (Go API)   → TestRule_RegisterNeedsExactlyOneOfAtOrSource
//   charge is exactly bytes              → TestRule_ChargeIsTheFixedValueSize
//   source: has_source, source_location  → TestRule_RegisterWithSource
//   no source: admitted at first location at registration
//                                        → TestRule_RegisterAtAdmitsAtFirstLocation
//   recoverable = resident copy or source → TestRule_Recoverability
//   place already there: no version      → TestRule_PlaceOnResidentIsNoOp
//   place source preference pinned, pageable, cuda:0, …
//                                        → TestRule_PlaceSourcePreference
//   place reconstructs when no resident copy; else Unavailable
//                                        → TestRule_PlaceReconstructsWhenNoResidentCopy
//   exclusive place is a move            → TestRule_PlaceOfExclusiveValueMoves,
//                                          TestRule_PlaceOfReplicableValueCopies
//   copy: replicable only (PlanError)    → TestRule_CopyRequiresReplicableValue
//   move = copy then remove from         → TestRule_MoveRemovesSourceAfterCompletion,
//                                          TestRule_MoveOntoResidentCopyRemovesSource
//   move: from unprotected before anything starts (InUse)
//                                        → TestRule_MoveSourceMustBeUnprotected

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

func TestRule_RegisterBytesMustBePositive(t *testing.T) {
	c := std(t)
	for _, b := range []int64{0, -1, math.MinInt64} {
		for _, spec := range []ValueSpec{{Name: "w", Bytes: b, At: "cuda:0"}, {Name: "w", Bytes: b, Source: "pinned-host"}} {
			err := c.refused(fmt.Sprint("register bytes ", b), func() error { _, _, err := c.Register(spec); return err })
			wantInvalid(t, err, "bytes must be positive", fmt.Sprint(b))
		}
	}
	if _, ok := c.L.Lookup("w"); ok {
		t.Fatal("a refused registration left the name taken")
	}
}

func TestRule_RegisterReplicaModes(t *testing.T) {
	c := std(t)
	c.reg("d", 1, ReplicaMode(0), "pageable-host")
	c.reg("r", 1, Replicable, "pageable-host")
	eq(t, "default mode", c.val("d").ReplicaMode, Exclusive)
	eq(t, "replicable", c.val("r").ReplicaMode, Replicable)
	for in, want := range map[string]ReplicaMode{"": Exclusive, "exclusive": Exclusive, "replicable": Replicable} {
		m, err := ParseReplicaMode(in)
		c.must(err)
		eq(t, "ParseReplicaMode("+in+")", m, want)
	}
	_, err := ParseReplicaMode("shared")
	wantInvalid(t, err, `"shared"`)
	err = c.refused("unknown mode", func() error {
		_, _, err := c.Register(ValueSpec{Name: "x", Bytes: 1, Mode: ReplicaMode(7), At: "cuda:0"})
		return err
	})
	wantInvalid(t, err, "replica mode")
}

func TestRule_RegisterNeedsExactlyOneOfAtOrSource(t *testing.T) {
	c := std(t)
	for _, spec := range []ValueSpec{{Name: "x", Bytes: 1}, {Name: "x", Bytes: 1, At: "cuda:0", Source: "pinned-host"}} {
		err := c.refused(fmt.Sprintf("%+v", spec), func() error { _, _, err := c.Register(spec); return err })
		wantInvalid(t, err, "exactly one")
	}
	err := c.refused("empty name", func() error { _, _, err := c.Register(ValueSpec{Bytes: 1, At: "cuda:0"}); return err })
	wantInvalid(t, err, "name")
}

func TestRule_RegisterAtAdmitsAtFirstLocation(t *testing.T) {
	c := std(t)
	var h Handle
	var a Admission
	if d := c.delta(func() {
		var err error
		h, a, err = c.Register(ValueSpec{Name: "w", Bytes: 30, At: "cuda:0"})
		c.must(err)
	}); d != 1 {
		t.Fatalf("register at: %d versions before completion, want 1", d)
	}
	eq(t, "effects", a.Effects, []Effect{{Kind: EffectInitialize, Handle: h, Location: "cuda:0", Bytes: 30}})
	eq(t, "entering", c.mats("w"), []string{"cuda:0:entering:0/0/0"})
	eq(t, "charged from admission", c.figures("cuda:0"), [3]int64{30, 0, 30})
	if d := c.delta(func() { _, err := c.Complete(a.ID); c.must(err) }); d != 1 {
		t.Fatalf("completion: %d versions, want 1", d)
	}
	eq(t, "resident", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	v := c.val("w")
	eq(t, "has source", v.HasSource, false)
	eq(t, "source location", v.SourceLocation, "")
	// Registration is refused (nothing registered) when the first location
	// lacks room.
	err := c.refused("register over budget", func() error {
		_, _, err := c.Register(ValueSpec{Name: "big", Bytes: 71, At: "cuda:0"})
		return err
	})
	wantBudget(t, err, BudgetError{Location: "cuda:0", BudgetBytes: 100, UsedBytes: 30, RequestedBytes: 71})
}

func TestRule_RegisterWithSource(t *testing.T) {
	c := std(t)
	if d := c.delta(func() { c.regSrc("s", 40, Exclusive, "pinned-host") }); d != 1 {
		t.Fatalf("register with source: %d versions, want 1", d)
	}
	v := c.val("s")
	eq(t, "has source", v.HasSource, true)
	eq(t, "source location", v.SourceLocation, "pinned-host")
	eq(t, "materializations", len(v.Materializations), 0)
	eq(t, "recoverable", v.Recoverable, true)
	eq(t, "nothing charged", c.figures("pinned-host"), [3]int64{0, 0, 0})
}

func TestRule_ChargeIsTheFixedValueSize(t *testing.T) {
	c := std(t)
	w := c.reg("w", 37, Replicable, "pageable-host")
	c.placed(w, "pinned-host")
	c.placed(w, "cuda:0")
	s := c.regSrc("s", 13, Replicable, "pinned-host")
	c.placed(s, "cuda:1")
	for _, name := range []string{"w", "s"} {
		v := c.val(name)
		for _, m := range v.Materializations {
			if m.ChargedBytes != v.Bytes {
				t.Fatalf("%s at %s charged %d, want %d", name, m.Location, m.ChargedBytes, v.Bytes)
			}
		}
	}
	eq(t, "pageable-host", c.figures("pageable-host")[0], int64(37))
	eq(t, "pinned-host", c.figures("pinned-host")[0], int64(37))
	eq(t, "cuda:0", c.figures("cuda:0")[0], int64(37))
	eq(t, "cuda:1", c.figures("cuda:1")[0], int64(13))
}

func TestRule_Recoverability(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 10, Exclusive, "pinned-host")
	w := c.reg("w", 10, Exclusive, "pageable-host")
	_, a, err := c.Register(ValueSpec{Name: "lost", Bytes: 10, At: "cuda:0"})
	c.must(err)
	eq(t, "source only", c.val("s").Recoverable, true)
	eq(t, "resident", c.val("w").Recoverable, true)
	eq(t, "entering only, no source", c.val("lost").Recoverable, false)
	c.must(c.Fail(a.ID, errors.New("init failed")))
	// A failed registration never existed: retired, name free, and left
	// out of snapshots.
	if snap := c.L.Snapshot(); func() bool { _, ok := snap.Value("lost"); return ok }() {
		t.Fatal("a value whose registration failed must not appear in snapshots")
	}
	if _, ok := c.L.Lookup("lost"); ok {
		t.Fatal("the name of a failed registration must be free again")
	}
	c.placed(s, "cuda:1")
	eq(t, "source and resident", c.val("s").Recoverable, true)
	// A discarded value is not recoverable: it is gone from snapshots, and
	// its handle answers unavailable (discarded) — not even its source
	// brings it back.
	_, err = c.Discard(w)
	c.must(err)
	c.gone("w")
	_, err = c.Discard(s)
	c.must(err)
	c.gone("s")
	_, err = c.L.Place(s, "cuda:1")
	wantUnavailable(t, err, "s", "", UnavailableDiscarded)
}

func TestRule_PlaceOnResidentIsNoOp(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	x := c.reg("x", 10, Exclusive, "cuda:0")
	c.placed(w, "cuda:1")
	before := c.Snapshot()
	for name, op := range map[string]func() (Admission, error){
		"place replicable": func() (Admission, error) { return c.Place(w, "cuda:1") },
		"place exclusive":  func() (Admission, error) { return c.Place(x, "cuda:0") },
		"copy onto copy":   func() (Admission, error) { return c.Copy(w, "pageable-host", "cuda:1") },
		"move onto itself": func() (Admission, error) { return c.Move(x, "cuda:0", "cuda:0") },
	} {
		a, err := op()
		c.must(err)
		eq(t, name, a, Admission{})
	}
	eq(t, "state after no-ops", c.Snapshot(), before)
}

func TestRule_PlaceSourcePreference(t *testing.T) {
	// Preference among resident copies: pinned-host, pageable-host, cuda:0,
	// cuda:1 — whatever the order the copies were made in.
	cases := []struct {
		resident []string // the first is the registration location
		dest     string
		from     string
	}{
		{[]string{"cuda:1", "cuda:0"}, "pageable-host", "cuda:0"},
		{[]string{"cuda:1", "pageable-host"}, "cuda:0", "pageable-host"},
		{[]string{"cuda:0", "pageable-host", "pinned-host"}, "cuda:1", "pinned-host"},
		{[]string{"pageable-host", "cuda:0"}, "pinned-host", "pageable-host"},
		{[]string{"cuda:1", "cuda:0", "pageable-host"}, "pinned-host", "pageable-host"},
	}
	for _, tc := range cases {
		c := std(t)
		w := c.reg("w", 10, Replicable, tc.resident[0])
		for _, l := range tc.resident[1:] {
			c.placed(w, l)
		}
		a, err := c.Place(w, tc.dest)
		c.must(err)
		eq(t, fmt.Sprintf("%v → %s", tc.resident, tc.dest), a.Effects,
			[]Effect{{Kind: EffectCopy, Handle: w, Location: tc.dest, From: tc.from, Bytes: 10}})
	}
}

func TestRule_PlaceReconstructsWhenNoResidentCopy(t *testing.T) {
	c := std(t)
	s := c.regSrc("s", 40, Replicable, "pinned-host")
	var a Admission
	if d := c.delta(func() {
		var err error
		a, err = c.Place(s, "cuda:0")
		c.must(err)
	}); d != 1 {
		t.Fatalf("admission: %d versions", d)
	}
	eq(t, "effects", a.Effects, []Effect{{Kind: EffectReconstruct, Handle: s, Location: "cuda:0", TempAt: "pinned-host", Bytes: 40}})
	c.must2(c.Complete(a.ID))
	// With a resident copy the bytes are copied, not reconstructed.
	a, err := c.Place(s, "cuda:1")
	c.must(err)
	eq(t, "copy instead", a.Effects, []Effect{{Kind: EffectCopy, Handle: s, Location: "cuda:1", From: "cuda:0", Bytes: 40}})
	// Without a resident copy and without a source the value is
	// unavailable: a replicable value whose only copy is still entering.
	g, _, err := c.Register(ValueSpec{Name: "g", Bytes: 5, Mode: Replicable, At: "cuda:1"})
	c.must(err)
	err = c.refused("place without copy or source", func() error { _, err := c.Place(g, "cuda:0"); return err })
	wantUnavailable(t, err, "g", "cuda:0", UnavailableSource)
}

func TestRule_PlaceOfExclusiveValueMoves(t *testing.T) {
	c := std(t)
	w := c.reg("w", 60, Exclusive, "pageable-host")
	var a Admission
	d := c.delta(func() {
		var err error
		a, err = c.Place(w, "cuda:0")
		c.must(err)
	})
	eq(t, "admission versions", d, uint64(1))
	eq(t, "effects", a.Effects, []Effect{{Kind: EffectCopy, Handle: w, Location: "cuda:0", From: "pageable-host", Bytes: 60}})
	eq(t, "during", c.mats("w"), []string{"pageable-host:leaving:0/0/0", "cuda:0:entering:0/0/0"})
	var freed []Effect
	d = c.delta(func() {
		var err error
		freed, err = c.Complete(a.ID)
		c.must(err)
	})
	eq(t, "completion versions (complete + remove source)", d, uint64(2))
	eq(t, "free effect", freed, []Effect{{Kind: EffectFree, Handle: w, Location: "pageable-host", Bytes: 60}})
	eq(t, "after", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
	eq(t, "pageable-host released", c.figures("pageable-host")[0], int64(0))
}

func TestRule_PlaceOfReplicableValueCopies(t *testing.T) {
	c := std(t)
	w := c.reg("w", 60, Replicable, "pageable-host")
	d := c.delta(func() { c.placed(w, "cuda:0") })
	eq(t, "versions", d, uint64(2))
	eq(t, "both resident", c.mats("w"), []string{"pageable-host:resident:0/0/0", "cuda:0:resident:0/0/0"})
}

func TestRule_CopyRequiresReplicableValue(t *testing.T) {
	c := std(t)
	x := c.reg("x", 10, Exclusive, "pageable-host")
	err := c.refused("copy exclusive", func() error { _, err := c.Copy(x, "pageable-host", "cuda:0"); return err })
	wantPlanError(t, err, "exclusive")
	w := c.reg("w", 10, Replicable, "pageable-host")
	a, err := c.Copy(w, "pageable-host", "cuda:0")
	c.must(err)
	eq(t, "copy effect", a.Effects, []Effect{{Kind: EffectCopy, Handle: w, Location: "cuda:0", From: "pageable-host", Bytes: 10}})
	// The source of a copy must be resident.
	err = c.refused("copy from absent", func() error { _, err := c.Copy(w, "cuda:1", "pinned-host"); return err })
	wantUnavailable(t, err, "w", "cuda:1", UnavailableEndpoint)
	err = c.refused("copy from entering", func() error { _, err := c.Copy(w, "cuda:0", "pinned-host"); return err })
	wantUnavailable(t, err, "w", "cuda:0", UnavailableInFlight)
}

func TestRule_MoveRemovesSourceAfterCompletion(t *testing.T) {
	c := std(t)
	w := c.reg("w", 60, Exclusive, "cuda:0")
	var a Admission
	eq(t, "admit", c.delta(func() { var err error; a, err = c.Move(w, "cuda:0", "cuda:1"); c.must(err) }), uint64(1))
	eq(t, "source leaving, still charged", c.mats("w"), []string{"cuda:0:leaving:0/0/0", "cuda:1:entering:0/0/0"})
	eq(t, "cuda:0 during", c.figures("cuda:0")[0], int64(60))
	var effs []Effect
	eq(t, "complete + remove", c.delta(func() { var err error; effs, err = c.Complete(a.ID); c.must(err) }), uint64(2))
	eq(t, "free", effs, []Effect{{Kind: EffectFree, Handle: w, Location: "cuda:0", Bytes: 60}})
	eq(t, "after", c.mats("w"), []string{"cuda:1:resident:0/0/0"})
	tr := c.L.Trace()
	eq(t, "last transitions", kinds(tr[len(tr)-3:]), []string{"admit w@cuda:1", "complete w@cuda:1", "remove w@cuda:0"})
	// A leaving source cannot be leased, held, evicted or moved again.
	b := c.reg("b", 10, Exclusive, "pageable-host")
	a, err := c.Move(b, "pageable-host", "cuda:0")
	c.must(err)
	for name, op := range map[string]func() error{
		"acquire": func() error { _, err := c.Acquire(b, "pageable-host"); return err },
		"hold":    func() error { _, err := c.Hold(b, "pageable-host"); return err },
		"evict":   func() error { _, err := c.Evict(b, "pageable-host"); return err },
		"move":    func() error { _, err := c.Move(b, "pageable-host", "cuda:1"); return err },
	} {
		err := c.refused(name+" of a leaving source", op)
		wantUnavailable(t, err, "b", "pageable-host", UnavailableInFlight)
	}
	c.must2(c.Complete(a.ID))
}

func TestRule_MoveSourceMustBeUnprotected(t *testing.T) {
	type protect func(c *checked, h Handle, loc string) InUseError
	cases := map[string]protect{
		"lease": func(c *checked, h Handle, loc string) InUseError {
			c.must2(c.Acquire(h, loc))
			return InUseError{Handle: h.Name, Location: loc, UseCount: 1}
		},
		"hold": func(c *checked, h Handle, loc string) InUseError {
			c.must2(c.Hold(h, loc))
			return InUseError{Handle: h.Name, Location: loc, HoldCount: 1}
		},
		"pending event": func(c *checked, h Handle, loc string) InUseError {
			id, err := c.Acquire(h, loc)
			c.must(err)
			c.must2(c.RecordEvent(id))
			c.must(c.Release(id))
			return InUseError{Handle: h.Name, Location: loc, PendingEventCount: 1}
		},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			c := std(t)
			x := c.reg("x", 10, Exclusive, "pageable-host")
			w := c.reg("w", 10, Replicable, "pageable-host")
			wantX := p(c, x, "pageable-host")
			wantW := p(c, w, "pageable-host")
			err := c.refused("move exclusive", func() error { _, err := c.Move(x, "pageable-host", "cuda:0"); return err })
			wantInUse(t, err, wantX)
			err = c.refused("place exclusive (a move)", func() error { _, err := c.Place(x, "cuda:0"); return err })
			wantInUse(t, err, wantX)
			err = c.refused("move replicable", func() error { _, err := c.Move(w, "pageable-host", "cuda:0"); return err })
			wantInUse(t, err, wantW)
			// Copying from a protected materialization is fine.
			c.placed(w, "cuda:0")
		})
	}
}

func TestRule_MoveOntoResidentCopyRemovesSource(t *testing.T) {
	c := std(t)
	w := c.reg("w", 10, Replicable, "pageable-host")
	c.placed(w, "cuda:0")
	var a Admission
	eq(t, "versions", c.delta(func() { var err error; a, err = c.Move(w, "pageable-host", "cuda:0"); c.must(err) }), uint64(1))
	eq(t, "admission", a, Admission{Effects: []Effect{{Kind: EffectFree, Handle: w, Location: "pageable-host", Bytes: 10}}})
	eq(t, "after", c.mats("w"), []string{"cuda:0:resident:0/0/0"})
}
