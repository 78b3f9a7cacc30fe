package budget

import (
	"errors"
	"fmt"
	"math/rand/v2"
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
	var demoted, dropped, decided int
	for seed := range uint64(n) {
		spill := dtRandomSpill(rand.New(rand.NewPCG(seed, 0x5b111)))
		plain, hs := dtRandomLedgerWith(t, rand.New(rand.NewPCG(seed, 0xdec1de)), nil)
		l, _ := dtRandomLedgerWith(t, rand.New(rand.NewPCG(seed, 0xdec1de)), spill)
		require.Equal(t, plain.Snapshot().Values, l.Snapshot().Values, "seed %d: the two states differ", seed)
		req, limit := dtRandomRequest(rand.New(rand.NewPCG(seed, 0x2e9)), l, hs)
		want, werr := plain.Decide(req, limit)
		got, err := l.Decide(req, limit)
		if werr != nil || err != nil {
			require.Equal(t, fmt.Sprintf("%T", werr), fmt.Sprintf("%T", err), "seed %d", seed)
			continue
		}
		decided++
		tos := dtRefSpill(l.Snapshot(), spill, want)
		require.Len(t, got.Evictions, len(want.Evictions), "seed %d", seed)
		for i, e := range got.Evictions {
			w := want.Evictions[i]
			require.Equal(t, []any{w.Handle, w.Location, w.Bytes}, []any{e.Handle, e.Location, e.Bytes}, "seed %d: victim %d", seed, i)
			require.Equal(t, tos[i], e.To, "seed %d: spill %v, victim %d (%s@%s): demotion target", seed, spill, i, e.Handle.Name, e.Location)
			require.Equal(t, e.To != "", e.Kind == EvictionDemoted, "seed %d: kind %s with to %q", seed, e.Kind, e.To)
			require.Equal(t, Action{Handle: e.Handle, Location: e.Location, To: e.To}, got.Plan.Reclaim[i], "seed %d: reclaim %d", seed, i)
			switch {
			case e.To != "":
				demoted++
				require.Contains(t, e.Reason, "demoted to "+e.To)
			case spill[e.Location] != "":
				dropped++
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
			var locs []string
			for _, m := range dtValueRecord(l.Snapshot(), e.Handle).Materializations {
				locs = append(locs, m.Location)
			}
			require.Equal(t, []string{e.To}, locs, "seed %d: demoted %s", seed, e.Handle.Name)
		}
	}
	t.Logf("%d seeds: %d decided, %d victims demoted, %d victims with a spill target dropped", n, decided, demoted, dropped)
	require.Greater(t, demoted, n/30, "the generator no longer demotes enough")
	require.Greater(t, dropped, n/50, "the generator no longer drops victims that have a spill target")
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

// dtRefSpill applies the spill rule of docs/semantics.md to a decision
// made without spill targets, on the snapshot it was made from, and
// returns each victim's target ("" when dropped). The plan's own
// additions at a location are recomputed from the plan as place() would
// charge them: an enter already resident adds nothing, any other adds
// its bytes, and one with no resident copy to copy or move from (none
// now, none entered earlier in the plan) also charges its bytes
// temporarily at its source location when that differs; reservations
// add theirs.
func dtRefSpill(s Snapshot, spill map[string]string, d Decision) []string {
	loc := map[string]LocationRecord{}
	for _, r := range s.Locations {
		loc[r.Location] = r
	}
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
	removed := map[string]int64{}
	for _, e := range d.Evictions {
		removed[e.Location] += e.Bytes
	}
	before, into := map[string]int64{}, map[string]int64{}
	out := make([]string, len(d.Evictions))
	for i, e := range d.Evictions {
		v := dtValueRecord(s, e.Handle)
		t := spill[e.Location]
		others, atT := 0, false
		for _, m := range v.Materializations {
			if m.Location != e.Location && m.State == Resident {
				others++
			}
			atT = atT || m.Location == t
		}
		if t != "" && others == 0 && !atT {
			r := loc[t]
			final := r.UsedBytes + r.ReservedBytes - removed[t] + adds[t] + into[t] + e.Bytes
			landing := r.UsedBytes + r.ReservedBytes - before[t] + into[t] + e.Bytes
			if !r.HasBudget || (final <= r.BudgetBytes && landing <= r.BudgetBytes) {
				out[i] = t
				into[t] += e.Bytes
			}
		}
		before[e.Location] += e.Bytes
	}
	return out
}

// TestDecideSpillFailedDemotions runs decisions with demotions and fails
// every demotion's copy: each demoted value ends dropped (no
// materialization at its location or its target), exactly as the same
// decision without spill would leave it; the requirements are resident
// and the invariants hold.
func TestDecideSpillFailedDemotions(t *testing.T) {
	runs := 0
	for seed := range uint64(300) {
		spill := dtRandomSpill(rand.New(rand.NewPCG(seed, 0x5b111)))
		plain, hs := dtRandomLedgerWith(t, rand.New(rand.NewPCG(seed, 0xdec1de)), nil)
		l, _ := dtRandomLedgerWith(t, rand.New(rand.NewPCG(seed, 0xdec1de)), spill)
		req, limit := dtRandomRequest(rand.New(rand.NewPCG(seed, 0x2e9)), l, hs)
		d, err := l.Decide(req, limit)
		if err != nil || !dtDemotes(d) {
			continue
		}
		runs++
		d0, err := plain.Decide(req, limit)
		require.NoError(t, err)
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
		}
	}
	require.Greater(t, runs, 10, "too few decisions with demotions")
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
