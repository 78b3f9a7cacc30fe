package budget

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// FuzzLedger decodes the input into a configuration and a sequence of
// operations, applies each to the real ledger (through the checked
// harness: invariants, unchanged state on refusal, trace = versions) and
// to the naive reference model of refmodel_test.go, and after every
// operation compares the error (kind and typed fields), what the operation
// returned, the state version and the whole observable state.
//
// Input layout: bytes 0–3 configure the budgets of pageable-host,
// pinned-host, cuda:0 and cuda:1 (b%4 == 0: no budget; else 4 + b%40),
// byte 4 the trace capacity (b%6; 0 disables it; b ≥ 128 also makes
// the input charge-dense: every opcode byte ≥ 128 is a charge operation);
// a budget byte ≥ 128 also gives its location a spill target (another
// location). A plan's
// shape byte with shape/12%3 == 1 makes its reclaim a demotion (one more
// byte: the target), and a run's failAt also fails a demotion's copy at
// that reclaim index. Then each operation is
// an opcode byte (b % fzOps) followed by its argument bytes; a missing
// byte reads as 0. The fz* constants list the operations and their
// arguments; argument decoding: location b%12 (0–9 the four configured
// ones by b%4, 10 an unconfigured cuda:7, 11 a malformed cuda:01); handle
// b%n over every handle ever registered, or for b ≥ 240 a foreign (even)
// or unknown (odd) one; name b%8 == 0 an already used name, else a fresh
// one; bytes 1 + b%16, or 0/−1 for b ≥ 250; mode b%2 (1 replicable);
// admission, lease, hold, event, reservation b%n over all ever issued
// (released ones included). An opcode byte ≥ fzChargeOpsFrom (≥ 128 in a
// charge-dense input) is a charge operation instead
// (fuzz_charges_test.go).
func FuzzLedger(f *testing.F) {
	// A few inline seeds besides testdata/fuzz/FuzzLedger.
	f.Add([]byte{})
	f.Add([]byte{0, 1, 2, 3, 5, fzRegisterDone, 1, 5, 1, 2, fzPlaceDone, 0, 3, fzAcquire, 0, 3, fzRecord, 0, fzRelease, 0, fzEvict, 0, 2, fzReap, 0, fzEvict, 0, 2})
	// Demotions: one that completes (v0 pageable-host → pinned-host), one
	// whose copy fails on a value with a source (dropped; the run goes
	// on), one whose copy fails on the last copy of a value without a
	// source (the run fails), with spill targets configured (bytes ≥ 128).
	f.Add([]byte{200, 204, 0, 0, 5, fzRegisterDone, 1, 5, 0, 0, fzRun, 0, 13, 0, 0, 1, fzExplain, 13, 0, 1, 2})
	f.Add([]byte{0, 0, 0, 0, 5, fzRegisterSrc, 1, 5, 0, 0, fzPlaceDone, 0, 2, fzRun, 8, 13, 0, 2, 1})
	f.Add([]byte{0, 0, 0, 0, 5, fzRegisterDone, 1, 5, 0, 0, fzRun, 9, 13, 0, 0, 1})
	// Charges: an idle cache entry offered, then room decided for another
	// charge: the entry is the victim, its owner refuses (failAt 0) or
	// confirms (failAt −1); then a withdrawal and a direct eviction.
	for _, failAt := range []byte{1, 0} {
		f.Add([]byte{0, 0, 21, 0, 5, fzRegisterSrc, 1, 9, 0, 0, fzPlaceDone, 0, 2,
			fzChargeOpsFrom + fzReserveCharge, 0, 0, 2, 7, fzChargeOpsFrom + fzOfferCharge, 0, 1,
			fzChargeOpsFrom + fzDecideRoom, 1, 2, 9, failAt,
			fzChargeOpsFrom + fzWithdrawCharge, 0, fzChargeOpsFrom + fzOfferCharge, 0, 3,
			fzChargeOpsFrom + fzEvictCharge, 0, 0, failAt})
	}
	for _, s := range fzSpillSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newFzHarness(t, data)
		for n := 0; !h.r.done() && n < 200; n++ {
			h.step()
		}
	})
}

// Operations (opcode values) and their argument bytes.
const (
	fzRegisterAt     = iota // name, bytes, mode, loc
	fzRegisterSrc           // name, bytes, mode, loc
	fzPlace                 // handle, loc
	fzCopy                  // handle, from, to
	fzMove                  // handle, from, to
	fzComplete              // admission
	fzFail                  // admission
	fzEvict                 // handle, loc
	fzDiscard               // handle
	fzAcquire               // handle, loc
	fzRelease               // lease
	fzRecord                // lease
	fzReap                  // event
	fzHold                  // handle, loc
	fzUnhold                // hold
	fzReserve               // name, loc, bytes
	fzUnreserve             // reservation
	fzUnreserveOwned        // reservation
	fzExplain               // plan
	fzRun                   // mode, plan
	fzPlaceDone             // handle, loc: place and, when pending, complete
	fzRegisterDone          // name, bytes, mode, loc: register at and complete
	fzOps
)

var fzLocations = []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}

var errFzInjected = errors.New("injected transfer failure")

type fzReader struct {
	b []byte
	i int
}

func (r *fzReader) done() bool { return r.i >= len(r.b) }

func (r *fzReader) next() int {
	if r.i >= len(r.b) {
		return 0
	}
	x := r.b[r.i]
	r.i++
	return int(x)
}

type fzPair[L comparable] struct {
	l L
	m int
}

type fzHarness struct {
	t      *testing.T
	r      *fzReader
	c      *checked
	m      *refModel
	log    []string
	names  int
	scopes int
	// Everything ever issued, released or not, so that double releases
	// and stale ids are exercised too.
	handles []Handle
	adms    []fzPair[AdmissionID]
	leases  []fzPair[LeaseID]
	holds   []fzPair[HoldID]
	events  []fzPair[EventID]
	resv    []fzResv
	// chargeFrom: an opcode byte ≥ chargeFrom is a charge operation.
	chargeFrom int
	// held (nil: none) is the room earlier waiters hold (held.go), in
	// force for every other call that may charge (fzHeldFor); steps
	// counts the steps.
	held  map[string]int
	steps int
	// heldNow: the current step ran under held (its description says so).
	heldNow bool
}

type fzResv struct{ name, owner string }

func newFzHarness(t *testing.T, data []byte) *fzHarness {
	r := &fzReader{b: data}
	cfg := Config{ManagerID: "m1"}
	var locs []refLoc
	for _, name := range fzLocations {
		b := r.next()
		lc := LocationConfig{Name: name}
		if b%4 != 0 {
			lc.HasBudget, lc.BudgetBytes = true, int64(4+b%40)
		}
		if b >= 128 { // a spill target, another location (where charges live too)
			i := len(cfg.Locations)
			lc.SpillTo = fzLocations[(i+1+b%3)%len(fzLocations)]
		}
		cfg.Locations = append(cfg.Locations, lc)
		locs = append(locs, refLoc{name: name, hasBudget: lc.HasBudget, budget: lc.BudgetBytes, spill: lc.SpillTo})
	}
	tb := r.next()
	cfg.TraceCapacity = tb % 6
	cfg.SharedBudgets = fzShared(tb)
	h := &fzHarness{t: t, r: r, c: newChecked(t, cfg), m: newRefModel("m1", locs).withShared(cfg.SharedBudgets)}
	h.held = fzHeld(tb)
	if tb >= 128 { // charge-dense: half the opcode bytes are charge operations
		h.chargeFrom = 128
	} else {
		h.chargeFrom = fzChargeOpsFrom
	}
	return h
}

// fzHeld gives one run in five room held by earlier waiters at one
// location, from the trace byte (no byte more is read).
func fzHeld(tb int) map[string]int {
	if tb%5 != 3 {
		return nil
	}
	return map[string]int{fzLocations[(tb>>1)%len(fzLocations)]: 1 + (tb>>2)%3}
}

// underHeld runs f (a call that does not wait and may charge: a
// register, place, copy, move, reserve or run) under the run's held room
// on every other step, on the ledger and on the model alike.
func (h *fzHarness) underHeld(f func()) {
	if h.held == nil || h.steps%2 == 0 {
		f()
		return
	}
	h.m.held, h.heldNow = h.held, true
	defer func() { h.m.held = nil }()
	h.c.L.WithHeld(h.held, f)
}

// fzShared gives one run in eight a shared budget, from the trace byte
// (no byte more is read, so every other run is as before).
func fzShared(tb int) []SharedBudget {
	if (tb>>3)&7 != 5 {
		return nil
	}
	groups := [][]string{{"pageable-host", "cuda:0"}, {"pinned-host", "cuda:1"}, {"cuda:1", "pageable-host", "cuda:0"}, {"pinned-host", "pageable-host"}}
	return []SharedBudget{{Name: "shared", Locations: groups[tb>>6], Bytes: int64(10 + (tb*7)%41)}}
}

func (h *fzHarness) loc() string { return fzLoc(h.r.next()) }

func fzLoc(b int) string {
	b %= 12
	switch {
	case b < 10:
		return fzLocations[b%4]
	case b == 10:
		return "cuda:7" // well formed, not configured
	default:
		return "cuda:01" // malformed
	}
}

func (h *fzHarness) handle() Handle {
	b := h.r.next()
	if len(h.handles) == 0 || b >= 240 {
		if b%2 == 0 {
			return Handle{Manager: "other", ID: 1, Name: "v0"}
		}
		return Handle{Manager: "m1", ID: 999, Name: "ghost"}
	}
	return h.handles[b%len(h.handles)]
}

func (h *fzHarness) name() string {
	b := h.r.next()
	if b%8 == 0 && h.names > 0 {
		return fmt.Sprint("v", b/8%h.names) // maybe taken
	}
	h.names++
	return fmt.Sprint("v", h.names-1)
}

// bytes: 1…16, or 0 and −1 (bad input) for bytes ≥ 250.
func (h *fzHarness) bytes() int64 { return fzBytes(h.r.next()) }

func fzBytes(b int) int64 {
	if b >= 250 {
		return int64(b%2) - 1
	}
	return int64(1 + b%16)
}

func (h *fzHarness) mode() ReplicaMode {
	if h.r.next()%2 == 1 {
		return Replicable
	}
	return Exclusive
}

func pick[T any](h *fzHarness, list []T) (T, bool) {
	b := h.r.next()
	var zero T
	if len(list) == 0 {
		return zero, false
	}
	return list[b%len(list)], true
}

func (h *fzHarness) plan() Plan {
	var p Plan
	shape := h.r.next()
	for range shape % 2 {
		a := Action{Handle: h.handle(), Location: h.loc()}
		if shape/12%3 == 1 { // a demotion
			a.To = h.loc()
		}
		p.Reclaim = append(p.Reclaim, a)
	}
	for range shape / 2 % 2 {
		name := fmt.Sprint("p", h.r.next()%4)
		p.Reservations = append(p.Reservations, ReservationSpec{Name: name, Location: h.loc(), Bytes: h.bytes()})
	}
	for range shape / 4 % 3 {
		a := Action{Handle: h.handle(), Location: h.loc()}
		if h.r.next()%3 == 0 {
			a.From = h.loc()
		}
		p.Enter = append(p.Enter, a)
	}
	return p
}

// fzErr renders a ledger error in the reference model's form.
func fzErr(err error) string {
	if err == nil {
		return ""
	}
	var cb *ChargeBusyError
	var pe *PlanExecutionError
	var wa *WaitersAheadError
	if errors.As(err, &wa) {
		return refHeld(wa.Location, wa.Waiters)
	}
	if errors.As(err, &pe) {
		cause := "injected"
		if pe.Cause != errFzInjected {
			cause = fzErr(pe.Cause)
		}
		return refExec(pe.Phase, pe.FailedAction, pe.FailedActionIndex, pe.FailedReservation, pe.FailedReservationIndex, len(pe.PartialReport.Transitions), cause)
	}
	var be *BudgetError
	var ie *InUseError
	var ue *UnavailableError
	var se *StaleStateError
	var pl *PlanError
	var ii *InvalidInputError
	switch {
	case errors.As(err, &cb):
		return refChargeBusy(cb.Charge, cb.State, cb.Refused)
	case errors.As(err, &be) && be.Shared != "":
		return refSharedBudget(be.Shared, be.Location, be.SharedBytes, be.SharedUsedBytes, be.SharedRequestedBytes)
	case errors.As(err, &be):
		return refBudget(be.Location, be.BudgetBytes, be.UsedBytes, be.ReservedBytes, be.RequestedBytes)
	case errors.As(err, &ie):
		return refInUse(ie.Handle, ie.Location, ie.UseCount, ie.HoldCount, ie.PendingEventCount)
	case errors.As(err, &ue):
		return refUnavailable(ue.Handle, ue.Location, ue.Reason)
	case errors.As(err, &se):
		return refStale(se.ExpectedVersion, se.ActualVersion)
	case errors.As(err, &pl):
		return refPlan()
	case errors.As(err, &ii):
		return refInvalid()
	}
	return fmt.Sprintf("unexpected %T: %v", err, err)
}

func (h *fzHarness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\noperations so far:\n  %s", fmt.Sprintf(format, args...), strings.Join(h.log, "\n  "))
}

func (h *fzHarness) same(what string, ledger, model any) {
	h.t.Helper()
	if !reflect.DeepEqual(ledger, model) {
		h.fatalf("%s: ledger %v, model %v", what, ledger, model)
	}
}

// step decodes and applies one operation, then compares the states.
func (h *fzHarness) step() {
	h.t.Helper()
	c, m := h.c, h.m
	h.steps++
	h.heldNow = false
	b := h.r.next()
	op := b % fzOps
	if b >= h.chargeFrom {
		op = fzOps // a charge operation (fuzz_charges_test.go)
	}
	var desc string
	var lerr error
	var merr string
	switch op {
	case fzRegisterAt, fzRegisterSrc, fzRegisterDone:
		spec := ValueSpec{Name: h.name(), Bytes: h.bytes(), Mode: h.mode()}
		if op == fzRegisterSrc {
			spec.Source = h.loc()
		} else {
			spec.At = h.loc()
		}
		desc = fmt.Sprintf("register %+v", spec)
		var lh Handle
		var la Admission
		var mh Handle
		var ma refAdm
		var e string
		h.underHeld(func() {
			lh, la, lerr = c.Register(spec)
			mh, ma, e = m.Register(spec)
		})
		merr = e
		if lerr == nil && e == "" {
			h.same("handle", lh, mh)
			h.same("pending", la.Pending, ma.id > 0)
			h.handles = append(h.handles, lh)
			if la.Pending {
				h.adms = append(h.adms, fzPair[AdmissionID]{la.ID, ma.id})
				if op == fzRegisterDone {
					_, lerr = c.Complete(la.ID)
					merr = m.Complete(ma.id)
				}
			}
		}
	case fzPlace, fzPlaceDone:
		hd, loc := h.handle(), h.loc()
		desc = fmt.Sprintf("place %s %s", hd.Name, loc)
		var la Admission
		var ma refAdm
		var err error
		var e string
		h.underHeld(func() {
			la, err = c.Place(hd, loc)
			ma, e = m.Place(hd, loc)
		})
		lerr, merr = err, e
		if err == nil && e == "" {
			h.same("pending", la.Pending, ma.id > 0)
			if la.Pending {
				h.adms = append(h.adms, fzPair[AdmissionID]{la.ID, ma.id})
				if op == fzPlaceDone {
					_, lerr = c.Complete(la.ID)
					merr = m.Complete(ma.id)
				}
			}
		}
	case fzCopy, fzMove:
		hd, from, to := h.handle(), h.loc(), h.loc()
		var la Admission
		var ma refAdm
		h.underHeld(func() {
			if op == fzCopy {
				desc = fmt.Sprintf("copy %s %s %s", hd.Name, from, to)
				la, lerr = c.Copy(hd, from, to)
				ma, merr = m.Copy(hd, from, to)
			} else {
				desc = fmt.Sprintf("move %s %s %s", hd.Name, from, to)
				la, lerr = c.Move(hd, from, to)
				ma, merr = m.Move(hd, from, to)
			}
		})
		if lerr == nil && merr == "" {
			h.same("pending", la.Pending, ma.id > 0)
			if la.Pending {
				h.adms = append(h.adms, fzPair[AdmissionID]{la.ID, ma.id})
			}
		}
	case fzComplete, fzFail:
		a, ok := pick(h, h.adms)
		if !ok {
			a = fzPair[AdmissionID]{12345, 12345}
		}
		if op == fzComplete {
			desc = fmt.Sprintf("complete %d", a.l)
			_, lerr = c.Complete(a.l)
			merr = m.Complete(a.m)
		} else {
			desc = fmt.Sprintf("fail %d", a.l)
			lerr = c.Fail(a.l, errFzInjected)
			merr = m.Fail(a.m)
		}
	case fzEvict:
		hd, loc := h.handle(), h.loc()
		desc = fmt.Sprintf("evict %s %s", hd.Name, loc)
		_, lerr = c.Evict(hd, loc)
		merr = m.Evict(hd, loc)
	case fzDiscard:
		hd := h.handle()
		desc = "discard " + hd.Name
		_, lerr = c.Discard(hd)
		merr = m.Discard(hd)
	case fzAcquire, fzHold:
		hd, loc := h.handle(), h.loc()
		if op == fzAcquire {
			desc = fmt.Sprintf("acquire %s %s", hd.Name, loc)
			id, err := c.Acquire(hd, loc)
			mid, e := m.Acquire(hd, loc)
			lerr, merr = err, e
			if err == nil && e == "" {
				h.leases = append(h.leases, fzPair[LeaseID]{id, mid})
			}
		} else {
			desc = fmt.Sprintf("hold %s %s", hd.Name, loc)
			id, err := c.Hold(hd, loc)
			mid, e := m.Hold(hd, loc)
			lerr, merr = err, e
			if err == nil && e == "" {
				h.holds = append(h.holds, fzPair[HoldID]{id, mid})
			}
		}
	case fzRelease, fzRecord:
		ls, ok := pick(h, h.leases)
		if !ok {
			ls = fzPair[LeaseID]{777, 777}
		}
		if op == fzRelease {
			desc = fmt.Sprintf("release lease %d", ls.l)
			lerr = c.Release(ls.l)
			merr = m.Release(ls.m)
		} else {
			desc = fmt.Sprintf("record on lease %d", ls.l)
			id, err := c.RecordEvent(ls.l)
			mid, e := m.RecordEvent(ls.m)
			lerr, merr = err, e
			if err == nil && e == "" {
				h.events = append(h.events, fzPair[EventID]{id, mid})
			}
		}
	case fzReap:
		ev, ok := pick(h, h.events)
		if !ok {
			ev = fzPair[EventID]{777, 777}
		}
		desc = fmt.Sprintf("reap event %d", ev.l)
		lerr = c.ReapEvent(ev.l)
		merr = m.ReapEvent(ev.m)
	case fzUnhold:
		hd, ok := pick(h, h.holds)
		if !ok {
			hd = fzPair[HoldID]{777, 777}
		}
		desc = fmt.Sprintf("unhold %d", hd.l)
		lerr = c.Unhold(hd.l)
		merr = m.Unhold(hd.m)
	case fzReserve:
		name := fmt.Sprint("r", h.r.next()%6)
		loc, b := h.loc(), h.bytes()
		desc = fmt.Sprintf("reserve %s %s %d", name, loc, b)
		h.underHeld(func() {
			lerr = c.Reserve(loc, name, b)
			merr = m.Reserve(loc, name, b, "")
		})
		if lerr == nil {
			h.resv = append(h.resv, fzResv{name: name})
		}
	case fzUnreserve, fzUnreserveOwned:
		rs, ok := pick(h, h.resv)
		if !ok {
			rs = fzResv{name: "none"}
		}
		if op == fzUnreserve {
			desc = "unreserve " + rs.name
			lerr = c.Unreserve(rs.name)
			merr = m.Unreserve(rs.name, "")
		} else {
			desc = fmt.Sprintf("unreserve %s owned by %q", rs.name, rs.owner)
			lerr = c.UnreserveOwned(rs.name, rs.owner)
			merr = m.Unreserve(rs.name, rs.owner)
		}
	case fzExplain:
		p := h.plan()
		desc = fmt.Sprintf("explain %+v", p)
		ex := c.Explain(p)
		ok, peaks := m.Explain(p)
		h.same("explain feasible ("+ex.Reason+")", ex.Feasible, ok)
		h.same("explain peaks", ex.PredictedPeakBytes, peaks)
		h.same("explain reason given", ex.Reason != "", !ok)
	case fzOps:
		desc, merr, lerr = h.chargeStep(b - h.chargeFrom)
	case fzRun:
		mode := h.r.next()
		p := h.plan()
		opts := RunOptions{}
		if mode%2 == 1 {
			h.scopes++
			opts.Scope = fmt.Sprint("sc", h.scopes)
		}
		if mode/2%4 != 0 {
			opts.CheckVersion = true
			opts.ExpectedVersion = c.L.Version()
			if mode/2%4 == 3 {
				opts.ExpectedVersion--
			}
		}
		failAt := mode/8%4 - 1
		desc = fmt.Sprintf("run %+v %+v failAt=%d", opts, p, failAt)
		var report int
		var leases []LeaseID
		var res refRunResult
		h.underHeld(func() {
			report, leases, lerr = fzRunLedger(c, p, opts, failAt, -1)
			res = m.Run(p, opts.Scope, opts.CheckVersion, opts.ExpectedVersion, failAt, -1)
		})
		merr = res.err
		if lerr == nil && merr == "" {
			h.same("run report length", report, res.report)
			h.same("run leases", len(leases), len(res.leases))
			for i := range leases {
				h.leases = append(h.leases, fzPair[LeaseID]{leases[i], res.leases[i]})
			}
			for _, r := range p.Reservations {
				h.resv = append(h.resv, fzResv{name: r.Name, owner: opts.Scope})
			}
		}
	}
	if h.heldNow {
		desc += fmt.Sprintf(" (room held: %v)", h.held)
	}
	h.log = append(h.log, desc)
	h.same("error of "+desc, fzErr(lerr), merr)
	if merr != "" {
		h.log[len(h.log)-1] += " → " + merr
	}
	h.same("state after "+desc, strings.Join(ledgerState(c.L.Snapshot()), "\n"), strings.Join(m.State(), "\n"))
	h.same("charges after "+desc, ledgerCharges(c.L, m), m.charges())
}

// fzRunLedger runs p on the ledger: every step admitted and completed, the
// enter step failAt (−1: none) failed instead, and so the reclaim step
// failAt (a demotion's copy fails; a charge's owner refuses); a charge
// demoted at the reclaim step dropAt (−1: none) is settled as dropped
// (fzSettleCharge).
func fzRunLedger(c *checked, p Plan, opts RunOptions, failAt, dropAt int) (int, []LeaseID, error) {
	r, err := c.StartRun(p, opts)
	if err != nil {
		return 0, nil, err
	}
	for {
		s, ok, err := r.Next()
		if err != nil {
			return 0, nil, err
		}
		if !ok {
			break
		}
		if s.Admission.Pending {
			if done, err := fzSettleCharge(r, s, failAt, dropAt); done || err != nil {
				if err != nil {
					return 0, nil, err
				}
				continue
			}
			if s.Phase == PhaseReclaim && s.Index == failAt {
				// A demotion's copy fails: the value is dropped instead
				// and the run goes on (or fails, when that would lose
				// data).
				if _, err := r.FailStep(errFzInjected); err != nil {
					return 0, nil, err
				}
				continue
			}
			if s.Phase == PhaseEnter && s.Index == failAt {
				return 0, nil, r.Fail(errFzInjected)
			}
			if _, err := r.Complete(); err != nil {
				return 0, nil, err
			}
		}
	}
	rep, leases, err := r.Finish()
	return len(rep.Transitions), leases, err
}
