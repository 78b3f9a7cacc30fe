package replay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/checkharness"
)

// TestNamesChecker drives a replay runner with random ops on a small pool
// of names (register, discard, acquire, release, hold, unhold,
// record_event, complete_event), with a small window of finished names,
// and checks every Result against a reference model of the rules of
// docs/replay.md's "Limits": a name is kept while what it names is alive;
// once finished it is remembered among the latest `window` finished
// names, answering precisely (a discarded value is unavailable, a
// released lease "already released", ...); older, it is an unknown name.
// And the runner never keeps more names than the live ones plus the
// window. Bounded by default (namesSeeds); RESIDENCY_SOAK=30m runs seeds
// for that long. A failure prints its seed and the command that replays
// it (RESIDENCY_NAMES_SEED).
func TestNamesChecker(t *testing.T) {
	hits := map[string]int{}
	sum := namesSeeds.Loop(t, func(seed uint64) bool {
		checkNames(t, seed, 3000, hits)
		return true
	})
	t.Logf("%v: %v", sum, hits)
	if _, replay := namesSeeds.Replayed(t); replay {
		return // one seed need not see every kind of answer
	}
	// The checker must have seen every kind of answer, or it proves little.
	for _, c := range []string{"discard ok", "discard ResidencyUnavailableError", "discard ResidencyInUseError", "discard forgotten",
		"release InvalidInput", "release forgotten", "unhold forgotten", "complete_event forgotten", "acquire ResidencyUnavailableError",
		"acquire forgotten", "record_event ok", "complete_event ok", "register InvalidInput"} {
		require.Positive(t, hits[c], "the random ops never produced %q", c)
	}
}

// namesSeeds is TestNamesChecker's seed loop: seeds 1 to 5 by default;
// RESIDENCY_NAMES_SEED replays one.
var namesSeeds = checkharness.Checker{SeedEnv: "RESIDENCY_NAMES_SEED", Pattern: "TestNamesChecker", Package: "./system/replay/", Seeds: 5, Base: 1}

// nameModel is the reference model of the runner's names.
type nameModel struct {
	window   int
	finished int // finished names so far; one finished at index i is remembered while finished-i <= window

	values map[string]*modelValue
	leases map[string]*modelLease
	holds  map[string]*modelLife
	events map[string]*modelEvent
}

type modelValue struct {
	live         bool
	finishedAt   int // discarded: its index among finished names
	leases, held int // live leases and holds on it
	pending      int // events not completed on its leases
}

type modelLife struct {
	live       bool
	finishedAt int
	value      *modelValue
}

type modelLease struct {
	modelLife
}

type modelEvent struct {
	modelLife
}

func (m *nameModel) remembered(finishedAt int) bool { return m.finished-finishedAt <= m.window }

func (m *nameModel) finish() int {
	at := m.finished
	m.finished++
	return at
}

// known says whether a name is still bound (alive, or finished and
// remembered).
func (m *nameModel) known(live bool, finishedAt int) bool { return live || m.remembered(finishedAt) }

func checkNames(t *testing.T, seed uint64, steps int, hits map[string]int) {
	t.Helper()
	ctx := context.Background()
	r, closeAll := newTestRunner(t, locationSpec{name: "cuda:0"})
	defer closeAll()
	const window = 8
	r.done.maxCount, r.doneIDs.window = window, window
	m := &nameModel{window: window, values: map[string]*modelValue{}, leases: map[string]*modelLease{},
		holds: map[string]*modelLife{}, events: map[string]*modelEvent{}}
	rng := rand.New(rand.NewPCG(seed, 18))
	name := func(prefix string, n int) string { return fmt.Sprint(prefix, rng.IntN(n)) }
	mostKept := 0
	for step := range steps {
		var o Op
		var want string // "ok", "InvalidInput", "ResidencyUnavailableError", "ResidencyInUseError"
		var wantMsg string
		var apply func()
		forgotten := false
		gone := func(live bool, finishedAt int) bool {
			if !m.known(live, finishedAt) {
				forgotten = true
				return true
			}
			return false
		}
		switch k := rng.IntN(8); k {
		case 0: // register
			v := name("v", 6)
			o = Op{Name: "register", handle: v, bytes: 16, at: "cuda:0"}
			mv := m.values[v]
			if mv != nil && mv.live {
				want, wantMsg = "InvalidInput", "duplicate value name"
			} else {
				want = "ok"
				apply = func() { m.values[v] = &modelValue{live: true} }
			}
		case 1: // discard
			v := name("v", 6)
			o = Op{Name: "discard", handle: v}
			mv := m.values[v]
			switch {
			case mv == nil || gone(mv.live, mv.finishedAt):
				want, wantMsg = "InvalidInput", "unknown handle"
			case !mv.live:
				want, wantMsg = "ResidencyUnavailableError", "discarded"
			case mv.leases+mv.held+mv.pending > 0:
				want = "ResidencyInUseError"
			default:
				want = "ok"
				apply = func() { mv.live, mv.finishedAt = false, m.finish() }
			}
		case 2, 4: // acquire, hold
			v, as := name("v", 6), name("n", 12)
			kind := "acquire"
			if k == 4 {
				kind = "hold"
			}
			o = Op{Name: kind, handle: v, location: "cuda:0", as: as}
			mv := m.values[v]
			var dup bool
			if kind == "acquire" {
				l := m.leases[as]
				dup = l != nil && m.known(l.live, l.finishedAt)
			} else {
				h := m.holds[as]
				dup = h != nil && m.known(h.live, h.finishedAt)
			}
			switch {
			case mv == nil || gone(mv.live, mv.finishedAt):
				want, wantMsg = "InvalidInput", "unknown handle"
			case !mv.live:
				want, wantMsg = "ResidencyUnavailableError", "discarded"
			case dup:
				want, wantMsg = "InvalidInput", "duplicate"
			default:
				want = "ok"
				apply = func() {
					if kind == "acquire" {
						mv.leases++
						m.leases[as] = &modelLease{modelLife{live: true, value: mv}}
					} else {
						mv.held++
						m.holds[as] = &modelLife{live: true, value: mv}
					}
				}
			}
		case 3, 5: // release, unhold
			as := name("n", 12)
			var life *modelLife
			if k == 3 {
				o = Op{Name: "release", lease: as}
				if l := m.leases[as]; l != nil {
					life = &l.modelLife
				}
			} else {
				o = Op{Name: "unhold", hold: as}
				life = m.holds[as]
			}
			switch {
			case life == nil || gone(life.live, life.finishedAt):
				want, wantMsg = "InvalidInput", "unknown"
			case !life.live:
				want, wantMsg = "InvalidInput", "already released"
			default:
				want = "ok"
				apply = func() {
					life.live, life.finishedAt = false, m.finish()
					if k == 3 {
						life.value.leases--
					} else {
						life.value.held--
					}
				}
			}
		case 6: // record_event
			l, e := name("n", 12), name("e", 10)
			o = Op{Name: "record_event", lease: l, event: e}
			ml, me := m.leases[l], m.events[e]
			switch {
			case ml == nil || gone(ml.live, ml.finishedAt):
				want, wantMsg = "InvalidInput", "unknown lease"
			case !ml.live:
				want, wantMsg = "InvalidInput", "it was released"
			case me != nil && m.known(me.live, me.finishedAt):
				want, wantMsg = "InvalidInput", "duplicate event"
			default:
				want = "ok"
				apply = func() {
					ml.value.pending++
					m.events[e] = &modelEvent{modelLife{live: true, value: ml.value}}
				}
			}
		case 7: // complete_event
			e := name("e", 10)
			o = Op{Name: "complete_event", event: e}
			me := m.events[e]
			switch {
			case me == nil || gone(me.live, me.finishedAt):
				want, wantMsg = "InvalidInput", "unknown event"
			case !me.live:
				want, wantMsg = "InvalidInput", "already completed"
			default:
				want = "ok"
				apply = func() {
					me.live, me.finishedAt = false, m.finish()
					me.value.pending--
				}
			}
		}
		o.Line = step + 2
		res := r.Do(ctx, o)
		got, msg := "ok", ""
		if res.Error != nil {
			got, msg = res.Error.Type, res.Error.Message
		}
		if got != want || wantMsg != "" && !strings.Contains(msg, wantMsg) {
			t.Fatalf("seed %d, step %d: %s %+v: got %s %q, the model says %s (%q)", seed, step, o.Name, o, got, msg, want, wantMsg)
		}
		if apply != nil {
			apply()
		}
		if forgotten {
			hits[o.Name+" forgotten"]++
		} else {
			hits[o.Name+" "+want]++
		}
		// Bound: every live name, plus the window of finished names, plus
		// the window of finished runtime ids (and the live ones' ids).
		live := 0
		for _, v := range m.values {
			if v.live {
				live++
			}
		}
		for _, l := range m.leases {
			if l.live {
				live += 2 // name and id
			}
		}
		for _, h := range m.holds {
			if h.live {
				live += 2
			}
		}
		for _, e := range m.events {
			if e.live {
				live += 2
			}
		}
		kept := r.namesKept()
		mostKept = max(mostKept, kept)
		if kept > live+2*window+len(m.leases) {
			t.Fatalf("seed %d, step %d: the runner keeps %d names, %d alive", seed, step, kept, live)
		}
	}
	if mostKept > 6+3*(12+12+10)+2*window {
		t.Fatalf("seed %d: the runner kept up to %d names", seed, mostKept)
	}
}
