package budget

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecideSpillProperties checks the spill rule (spill.go) on random
// states: the same state is built twice from one seed, once without and
// once with random spill targets, and the same request is decided on both.
//
//   - Spill targets change nothing but demotions: the same error, or the
//     same victims in the same order, explored states, exhaustiveness,
//     reservations and enters; each reclaim carries the To of its
//     eviction record, whose kind is EvictionDemoted exactly when To is
//     set.
//   - Which victims are demoted, and where, equals dtRefSpill: the rule
//     transcribed from docs/semantics.md on the snapshot and the decision
//     without spill, sharing no code with spill.go.
//   - The plan with demotions passes dtCheckDecision (feasible under
//     Explain, executes, requirements resident, nothing made
//     unrecoverable, invariants), and each demoted value ends resident at
//     its target and nowhere else.
func TestDecideSpillProperties(t *testing.T) {
	n := 600
	if testing.Short() {
		n = 150
	}
	var demoted, dropped, decided, chargesDemoted, chargesDropped, made int
	for seed := range uint64(n) {
		spill := dtRandomSpill(rand.New(rand.NewPCG(seed, 0x5b111)))
		plain, hs := dtRandomLedgerWith(t, rand.New(rand.NewPCG(seed, 0xdec1de)), nil)
		l, _ := dtRandomLedgerWith(t, rand.New(rand.NewPCG(seed, 0xdec1de)), spill)
		dtRandomCharges(t, rand.New(rand.NewPCG(seed, 0xc4a26e)), plain, spill, false)
		dtRandomCharges(t, rand.New(rand.NewPCG(seed, 0xc4a26e)), l, spill, true)
		require.Equal(t, plain.Snapshot().Values, l.Snapshot().Values, "seed %d: the two states differ", seed)
		require.Equal(t, plain.Snapshot().Locations, l.Snapshot().Locations, "seed %d: the two states differ", seed)
		req, limit := dtRandomRequest(rand.New(rand.NewPCG(seed, 0x2e9)), l, hs)
		want, werr := plain.Decide(req, limit)
		got, err := l.Decide(req, limit)
		if werr != nil || err != nil {
			require.Equal(t, fmt.Sprintf("%T", werr), fmt.Sprintf("%T", err), "seed %d", seed)
			continue
		}
		decided++
		wantList := dtRefSpill(l, req, spill, want)
		require.Len(t, got.Evictions, len(wantList), "seed %d: spill %v, want %v, got %v", seed, spill, wantList, got.Evictions)
		for i, e := range got.Evictions {
			w := wantList[i]
			require.Equal(t, []any{w.Handle.ID, w.Charge, w.Owner, w.Location, w.Bytes, w.To, w.RoomFor}, []any{e.Handle.ID, e.Charge, e.Owner, e.Location, e.Bytes, e.To, e.RoomFor},
				"seed %d: spill %v, victim %d (%s%s@%s)", seed, spill, i, e.Handle.Name, e.Charge, e.Location)
			if e.Charge != "" {
				require.Equal(t, EvictionIdleCacheEntry, e.Kind, "seed %d: a charge victim's kind", seed)
				require.Equal(t, Action{Location: e.Location, Owner: e.Owner, Charge: e.Charge, To: e.To}, got.Plan.Reclaim[i], "seed %d: reclaim %d", seed, i)
			} else {
				require.Equal(t, e.To != "", e.Kind == EvictionDemoted, "seed %d: kind %s with to %q", seed, e.Kind, e.To)
				require.Equal(t, Action{Handle: e.Handle, Location: e.Location, To: e.To}, got.Plan.Reclaim[i], "seed %d: reclaim %d", seed, i)
			}
			if e.RoomFor > 0 {
				made++
				d := got.Evictions[e.RoomFor]
				require.Equal(t, e.Location, d.To, "seed %d: victim %d made room at the target of demotion %d", seed, i, e.RoomFor)
				require.Contains(t, e.Reason, fmt.Sprintf("to make room for the demotion of %s%s from %s (reclaim %d)", dtChargeWord(d), d.Handle.Name+d.Charge, d.Location, e.RoomFor))
			}
			switch {
			case e.To != "" && e.Charge != "":
				chargesDemoted++
				fallthrough
			case e.To != "":
				demoted++
				require.Contains(t, e.Reason, "demoted to "+e.To)
			case spill[e.Location] != "":
				dropped++
				if e.Charge != "" {
					chargesDropped++
				}
			}
		}
		require.Equal(t, want.Plan.Enter, got.Plan.Enter, "seed %d", seed)
		require.Equal(t, want.Plan.Reservations, got.Plan.Reservations, "seed %d", seed)
		require.Equal(t, []any{want.ExploredStates, want.Exhaustive, want.ExpectedStateVersion},
			[]any{got.ExploredStates, got.Exhaustive, got.ExpectedStateVersion}, "seed %d", seed)
		dtCheckDecision(t, seed, l, req, got)
		for _, e := range got.Evictions {
			if e.To == "" {
				continue
			}
			if e.Charge != "" {
				_, old := l.Charge(e.Charge)
				require.False(t, old, "seed %d: demoted charge %s still active", seed, e.Charge)
				info, ok := l.Charge(e.Charge + "→" + e.To)
				require.True(t, ok, "seed %d: demoted charge %s has no new charge at %s", seed, e.Charge, e.To)
				require.Equal(t, ChargeInfo{Name: e.Charge + "→" + e.To, Owner: e.Owner, Location: e.To, Bytes: e.Bytes, State: ChargeNotOffered}, info, "seed %d", seed)
				continue
			}
			var locs []string
			for _, m := range dtValueRecord(l.Snapshot(), e.Handle).Materializations {
				locs = append(locs, m.Location)
			}
			require.Equal(t, []string{e.To}, locs, "seed %d: demoted %s", seed, e.Handle.Name)
		}
	}
	t.Logf("%d seeds: %d decided, %d victims demoted (%d charges), %d victims with a spill target dropped (%d charges), %d victims made room at a spill target", n, decided, demoted, chargesDemoted, dropped, chargesDropped, made)
	require.Greater(t, made, n/60, "the generator no longer makes room at spill targets")
	require.Greater(t, demoted, n/30, "the generator no longer demotes enough")
	require.Greater(t, dropped, n/50, "the generator no longer drops victims that have a spill target")
	require.Greater(t, chargesDemoted, n/60, "the generator no longer demotes enough charges")
	require.Greater(t, chargesDropped, n/100, "the generator no longer drops charges that have a spill target")
}

// dtRandomSpill draws spill targets: most often the GPU → pinned host →
// pageable host chain, sometimes other pairs (a target after its
// location in location order included).
func dtRandomSpill(r *rand.Rand) map[string]string {
	out := map[string]string{}
	for _, loc := range dtPropLocs {
		switch r.IntN(4) {
		case 0:
		case 1, 2:
			switch loc {
			case "cuda:0", "cuda:1":
				out[loc] = "pinned-host"
			case "pinned-host":
				out[loc] = "pageable-host"
			}
		default:
			if t := dtPropLocs[r.IntN(len(dtPropLocs))]; t != loc {
				out[loc] = t
			}
		}
	}
	return out
}

func dtValueRecord(s Snapshot, h Handle) ValueRecord {
	for _, v := range s.Values {
		if v.Handle.ID == h.ID {
			return v
		}
	}
	return ValueRecord{}
}

// dtRefSpill applies the spill rule of docs/semantics.md (refSpill, the
// cascade included) to a decision made without spill targets, on the
// state of l (the same state, with spill targets), and returns the
// eviction list the decision with spill targets must have. The plan's own
// additions at a location are recomputed from the plan as place() would
// charge them: an enter already resident adds nothing, any other adds
// its bytes, and one with no resident copy to copy or move from (none
// now, none entered earlier in the plan) also charges its bytes
// temporarily at its source location when that differs; reservations
// add theirs.
//
// A charge victim is demoted when its owner offered it as demotable and
// its new charge's name (NAME→T) is not active, with the same room.
func dtRefSpill(l *Ledger, req Request, spill map[string]string, d Decision) []Eviction {
	s := l.Snapshot()
	resident := func(v ValueRecord, at string) bool {
		for _, m := range v.Materializations {
			if m.Location == at && m.State == Resident {
				return true
			}
		}
		return false
	}
	adds := map[string]int64{}
	entered := map[string]bool{}    // "id@location" entered earlier in the plan
	enteredVal := map[uint64]bool{} // values entered earlier in the plan
	for _, a := range d.Plan.Enter {
		v := dtValueRecord(s, a.Handle)
		key := fmt.Sprint(v.Handle.ID, "@", a.Location)
		if resident(v, a.Location) || entered[key] {
			continue
		}
		copyable := enteredVal[v.Handle.ID]
		for _, m := range v.Materializations {
			copyable = copyable || m.State == Resident
		}
		entered[key], enteredVal[v.Handle.ID] = true, true
		adds[a.Location] += v.Bytes
		if !copyable && v.SourceLocation != a.Location {
			adds[v.SourceLocation] += v.Bytes
		}
	}
	for _, r := range d.Plan.Reservations {
		adds[r.Location] += r.Bytes
	}
	required := map[uint64]bool{}
	for _, r := range req.Requirements {
		required[r.Handle.ID] = true
	}
	rec := func(loc string) LocationRecord { r, _ := s.Location(loc); return r }
	in := refSpillIn{
		hasBudget: func(loc string) bool { return rec(loc).HasBudget },
		budget:    func(loc string) int64 { return rec(loc).BudgetBytes },
		charged:   func(loc string) int64 { r := rec(loc); return r.UsedBytes + r.ReservedBytes },
		spill:     func(loc string) string { return spill[loc] },
		adds:      adds,
		demotable: func(e Eviction, t string) bool {
			if e.Charge != "" {
				info, _ := l.Charge(e.Charge)
				_, taken := l.Charge(e.Charge + "→" + t)
				return info.Demotable && !taken
			}
			for _, m := range dtValueRecord(s, e.Handle).Materializations {
				if m.Location == t || (m.Location != e.Location && m.State == Resident) {
					return false
				}
			}
			return true
		},
		cands: func(loc string) []Eviction { return refCandidates(l, loc, required) },
	}
	victims := make([]Eviction, len(d.Evictions))
	for i, e := range d.Evictions {
		victims[i] = Eviction{Handle: e.Handle, Location: e.Location, Bytes: e.Bytes, Owner: e.Owner, Charge: e.Charge}
	}
	return refSpill(in, victims)
}

// dtChargeWord is "charge " for a charge's eviction record, "" for a
// value's.
func dtChargeWord(e Eviction) string {
	if e.Charge != "" {
		return "charge "
	}
	return ""
}

// TestDecideSpillFailedDemotions runs decisions with demotions and fails
// every demotion's copy: each demoted value ends dropped (no
// materialization at its location or its target), and each demoted
// charge too (Run.CompleteDropped: neither it nor its new charge stays),
// exactly as the same plan with every demotion written as a drop leaves
// them on the state without spill targets (the victims a spill target
// gave up for a demotion are gone either way); the requirements are
// resident and the invariants hold.
func TestDecideSpillFailedDemotions(t *testing.T) {
	runs, chargeRuns := 0, 0
	for seed := range uint64(300) {
		spill := dtRandomSpill(rand.New(rand.NewPCG(seed, 0x5b111)))
		plain, hs := dtRandomLedgerWith(t, rand.New(rand.NewPCG(seed, 0xdec1de)), nil)
		l, _ := dtRandomLedgerWith(t, rand.New(rand.NewPCG(seed, 0xdec1de)), spill)
		dtRandomCharges(t, rand.New(rand.NewPCG(seed, 0xc4a26e)), plain, spill, false)
		dtRandomCharges(t, rand.New(rand.NewPCG(seed, 0xc4a26e)), l, spill, true)
		req, limit := dtRandomRequest(rand.New(rand.NewPCG(seed, 0x2e9)), l, hs)
		d, err := l.Decide(req, limit)
		if err != nil || !dtDemotes(d) {
			continue
		}
		runs++
		d0 := d
		d0.Plan.Reclaim = slices.Clone(d.Plan.Reclaim)
		for i := range d0.Plan.Reclaim {
			d0.Plan.Reclaim[i].To = ""
		}
		_, err = dtExecute(plain, d0)
		require.NoError(t, err)
		run, err := l.StartRun(d.Plan, RunOptions{CheckVersion: true, ExpectedVersion: d.ExpectedStateVersion})
		require.NoError(t, err)
		for {
			step, ok, err := run.Next()
			require.NoError(t, err, "seed %d", seed)
			if !ok {
				break
			}
			if !step.Admission.Pending {
				continue
			}
			if eff := step.Admission.Effects; len(eff) == 1 && eff[0].Kind == EffectDropCharge {
				if eff[0].To != "" {
					chargeRuns++
					require.NoError(t, run.CompleteDropped(errors.New("injected copy fault")), "seed %d", seed)
				} else {
					_, err := run.Complete()
					require.NoError(t, err, "seed %d", seed)
				}
				continue
			}
			if step.Phase == PhaseReclaim {
				effs, err := run.FailStep(errors.New("injected copy fault"))
				require.NoError(t, err, "seed %d", seed)
				require.Len(t, effs, 1)
				require.Equal(t, EffectFree, effs[0].Kind)
				continue
			}
			_, err = run.Complete()
			require.NoError(t, err)
		}
		_, _, err = run.Finish()
		require.NoError(t, err)
		require.NoError(t, l.CheckInvariants())
		got, want := l.Snapshot(), plain.Snapshot()
		require.Equal(t, dtResidency(want), dtResidency(got), "seed %d: a failed demotion must leave what a drop leaves", seed)
		for _, lr := range want.Locations {
			g, _ := got.Location(lr.Location)
			require.Equal(t, lr.UsedBytes, g.UsedBytes, "seed %d: used at %s", seed, lr.Location)
			require.Equal(t, lr.ReservedBytes, g.ReservedBytes, "seed %d: reserved at %s", seed, lr.Location)
			require.Equal(t, lr.Reservations, g.Reservations, "seed %d: reservations at %s", seed, lr.Location)
		}
	}
	t.Logf("%d runs with demotions, %d charge demotions dropped", runs, chargeRuns)
	require.Greater(t, runs, 10, "too few decisions with demotions")
	require.Greater(t, chargeRuns, 5, "too few decisions that demote a charge")
}

func dtDemotes(d Decision) bool {
	for _, e := range d.Evictions {
		if e.To != "" {
			return true
		}
	}
	return false
}

// dtResidency lists every materialization (value, location, state).
func dtResidency(s Snapshot) []string {
	var out []string
	for _, v := range s.Values {
		for _, m := range v.Materializations {
			out = append(out, fmt.Sprintf("%s@%s:%s", v.Handle.Name, m.Location, m.State))
		}
	}
	return out
}

// dtRandomCharges adds a few idle cache entries' charges to a random
// state (none, for a third of the seeds): reserved at random locations,
// most offered; on the ledger with spill targets (demotable) an offer
// at a location with a spill target is made as demotable, and on the one
// without (the same draws) as a plain offer, so that the two states
// offer the same candidates in the same order. Sometimes a charge's
// demoted name (NAME→T) is already taken, so that it must be dropped.
func dtRandomCharges(t *testing.T, r *rand.Rand, l *Ledger, spill map[string]string, demotable bool) {
	t.Helper()
	if r.IntN(3) == 0 {
		return
	}
	for i := range 2 + r.IntN(6) {
		loc := dtPropLocs[1+r.IntN(len(dtPropLocs)-1)] // pinned host or a GPU: where victims are chosen
		name, owner := fmt.Sprintf("kc%d", i), fmt.Sprintf("%sp#%d", CacheOwnerPrefix, r.IntN(2))
		if err := l.ReserveOwned(loc, name, int64(10+r.IntN(40)), owner); err != nil {
			continue
		}
		if to := spill[loc]; to != "" && r.IntN(6) == 0 {
			_ = l.ReserveOwned(to, name+"→"+to, 1, owner)
		}
		if r.IntN(5) == 0 {
			continue
		}
		freq := int64(r.IntN(2))
		if demotable && spill[loc] != "" {
			require.NoError(t, l.OfferDemotableCharge(name, owner, freq))
		} else {
			require.NoError(t, l.OfferCharge(name, owner, freq))
		}
	}
	require.NoError(t, l.CheckInvariants())
}
