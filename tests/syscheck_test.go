package tests

// The system checker: goroutines call the public API at random
// (register, admit and exit, acquire and release, hold, place, copy, move,
// evict, discard, reserve, a loader cache's loads, evictions and releases,
// staging saves) on one runtime over the soft backend behind cuda/faulty,
// with device faults armed (alloc, copy — whose failure reaches the
// stream's next event —, reconstruct) and contexts that end at random
// points (before the call, by a short deadline, or cancelled by another
// goroutine). A checker takes snapshots all along and checks their
// arithmetic, that every protection a worker holds throughout a snapshot
// is there, and that the backend never holds more than the ledger admitted
// (its capacity is the budget: an allocation above it fails and is
// counted). At the end of every round everything is closed: zero bytes
// charged, zero bytes at the backend, no goroutine left (goleak, TestMain),
// and the recorded histories of leases, admissions, value operations and
// cache loads are checked for linearizability (syscheck_model_test.go).
//
// Each worker draws its choices from its own rand.Rand, seeded from the
// round's seed and its id: RESIDENCY_SYSCHECK_SEED=N replays a round's
// choices (the interleaving is the scheduler's). Bounded by default;
// RESIDENCY_SOAK (a Go duration) runs rounds until it has passed
// (scChecker).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/checkharness"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// scBudgets are the budgets (pageable-host has none); the soft backend's
// capacity is the same, plus the application's own device buffers of the
// staging saves at cuda:0.
var scBudgets = map[string]int64{"pinned-host": 64 << 10, "cuda:0": 64 << 10, "cuda:1": 48 << 10}

// scRound is one runtime with its workers.
type scRound struct {
	t        *testing.T
	seed     uint64
	sys      *system.System
	backend  *oomCountingBackend
	capacity map[string]int64
	hist     *scHistory // residency model
	chist    *scHistory // cache model
	values   scValues
	prot     scProtections
	cancels  chan context.CancelFunc
	cache    *scCache
	staging  *scStaging
	rec      checkharness.Recorder // violations seen while the round runs
	mu       sync.Mutex
	counts   map[string]int // outcomes of calls outside the models
	snaps    atomic.Int64
	inFlight atomic.Int64
	heldSeen atomic.Int64
}

func (r *scRound) count(what string, err error) {
	k := what + "=ok"
	if err != nil {
		k = what + "=" + errorType(err)
		if errorType(err) == "" {
			k = what + "=" + scClassify(err)
		}
	}
	r.mu.Lock()
	r.counts[k]++
	r.mu.Unlock()
}

func (r *scRound) fail(format string, args ...any) { r.rec.Fail(format, args...) }

// scProtections are the leases and holds workers hold: added after the
// call that took one returned, removed before the call that lets it go.
type scProtections struct {
	mu   sync.Mutex
	next int
	held map[int]scEndpoint
}

type scEndpoint struct {
	val string
	loc string
}

func (p *scProtections) add(e scEndpoint) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	p.held[p.next] = e
	return p.next
}

func (p *scProtections) remove(id int) {
	p.mu.Lock()
	delete(p.held, id)
	p.mu.Unlock()
}

func (p *scProtections) copy() map[int]scEndpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[int]scEndpoint, len(p.held))
	for k, v := range p.held {
		out[k] = v
	}
	return out
}

// scChecker is TestSyscheck's seed loop: two rounds by default, seeds
// from the clock; RESIDENCY_SYSCHECK_SEED replays one.
var scChecker = checkharness.Checker{SeedEnv: "RESIDENCY_SYSCHECK_SEED", Pattern: "TestSyscheck", Package: "./tests/", Seeds: 2, Stride: 7919}

// TestSyscheck runs rounds of the system checker: two in `make test`, more
// until RESIDENCY_SOAK has passed, or the one RESIDENCY_SYSCHECK_SEED names.
func TestSyscheck(t *testing.T) {
	workers, ops := 8, 250
	if testing.Short() {
		workers, ops = 4, 60
	}
	var total scFigures
	sum := scChecker.Loop(t, func(seed uint64) bool {
		total.add(runSyscheckRound(t, seed, workers, ops))
		return !t.Failed()
	})
	el := sum.Elapsed
	t.Logf("syscheck: %d rounds in %v: %d calls (%.0f/s), %d snapshots checked, %d with a transfer in flight, %d held protections seen in them; linearizability: %d value operations in %d partitions, %d cache operations in %d partitions, checked in %v (%d partitions timed out)",
		total.rounds, el.Round(time.Millisecond), total.calls, float64(total.calls)/el.Seconds(), total.snaps, total.inFlight, total.held,
		total.ops, total.parts, total.cops, total.cparts, total.checkTime.Round(time.Millisecond), total.unknown)
}

// scFigures are one round's (or the sum of rounds') figures.
type scFigures struct {
	rounds, calls, snaps, inFlight, held int64
	ops, parts, cops, cparts, unknown    int
	checkTime                            time.Duration
}

func (f *scFigures) add(o scFigures) {
	f.rounds += o.rounds
	f.calls += o.calls
	f.snaps += o.snaps
	f.inFlight += o.inFlight
	f.held += o.held
	f.ops += o.ops
	f.parts += o.parts
	f.cops += o.cops
	f.cparts += o.cparts
	f.unknown += o.unknown
	f.checkTime += o.checkTime
}

func runSyscheckRound(t *testing.T, seed uint64, workers, ops int) scFigures {
	t.Logf("syscheck: round seed %d (replay: %s)", seed, scChecker.Replay(seed))
	ctx := context.Background()
	r := &scRound{t: t, seed: seed, hist: newHistory(), chist: newHistory(), cancels: make(chan context.CancelFunc, 64),
		counts: map[string]int{}, prot: scProtections{held: map[int]scEndpoint{}}}
	r.capacity = map[string]int64{"cuda:0": scBudgets["cuda:0"] + scStagingDeviceBytes}
	for l, b := range scBudgets {
		if l != "cuda:0" {
			r.capacity[l] = b
		}
	}
	sb, err := soft.New(soft.Config{Locations: scLocs, Capacity: r.capacity, BandwidthBytesPerSec: 16 << 20})
	require.NoError(t, err)
	r.backend = &oomCountingBackend{Backend: sb}
	var locs []system.LocationConfig
	for _, l := range scLocs {
		if b, ok := scBudgets[l]; ok {
			locs = append(locs, system.Limit(l, b))
		} else {
			locs = append(locs, system.NoLimit(l))
		}
	}
	r.sys, err = system.Start(ctx, system.Options{Locations: locs, Backend: faulty.Wrap(r.backend, soft.ErrorPrefix), TraceCapacity: 128})
	require.NoError(t, err)
	defer func() { _ = r.backend.Close() }()
	defer func() { _ = r.sys.Close(context.Background()) }()
	r.cache = newSCCache(t, r)
	r.staging = newSCStaging(t, r)

	// The canceller: another goroutine cancels the contexts it is handed.
	cancellerDone := make(chan struct{})
	go func() {
		defer close(cancellerDone)
		for c := range r.cancels {
			c()
		}
	}()
	stopCheck := make(chan struct{})
	checkDone := make(chan struct{})
	go func() { defer close(checkDone); r.checkLoop(stopCheck) }()

	began := time.Now()
	var calls atomic.Int64
	var wg sync.WaitGroup
	ws := make([]*scWorker, workers)
	for i := range ws {
		ws[i] = &scWorker{id: i, r: rand.New(rand.NewPCG(seed, uint64(i))), rd: r}
		wg.Add(1)
		go func(w *scWorker) {
			defer wg.Done()
			for range ops {
				w.step()
			}
			w.finish()
			calls.Add(w.calls)
		}(ws[i])
	}
	wg.Add(1)
	go func() { defer wg.Done(); r.staging.run(rand.New(rand.NewPCG(seed, 1<<32)), ops/4) }()
	wg.Wait()
	ran := time.Since(began)
	close(stopCheck)
	<-checkDone
	close(r.cancels)
	<-cancellerDone
	if !r.rec.Report(t, scChecker, "syscheck", seed) || t.Failed() {
		return scFigures{}
	}
	r.teardown()
	f := scFigures{rounds: 1, calls: calls.Load(), snaps: r.snaps.Load(), inFlight: r.inFlight.Load(), held: r.heldSeen.Load()}
	r.checkHistories(&f)
	t.Logf("syscheck: round %d: %d workers, %d calls in %v (%.0f/s); %d snapshots, %d with a transfer in flight; %d backend allocations; %d value and %d cache operations checked in %v",
		seed, workers, f.calls, ran.Round(time.Millisecond), float64(f.calls)/ran.Seconds(), f.snaps, f.inFlight, r.backend.allocs.Load(), f.ops, f.cops, f.checkTime.Round(time.Millisecond))
	t.Logf("syscheck: round %d: value calls by result: %s", seed, formatCounts(r.hist.results()))
	t.Logf("syscheck: round %d: cache calls by result: %s", seed, formatCounts(r.chist.results()))
	t.Logf("syscheck: round %d: other calls by result: %s", seed, formatCounts(r.counts))
	return f
}

// checkLoop checks snapshots until stop is closed.
func (r *scRound) checkLoop(stop chan struct{}) {
	ctx := context.Background()
	var last uint64
	for {
		select {
		case <-stop:
			return
		default:
		}
		before := r.prot.copy()
		s, err := r.sys.Snapshot(ctx)
		if err != nil {
			r.fail("snapshot: %v", err)
			return
		}
		after := r.prot.copy()
		r.snaps.Add(1)
		if s.StateVersion < last {
			r.fail("state version went back from %d to %d", last, s.StateVersion)
		}
		last = s.StateVersion
		if err := checkInvariants(s); err != nil {
			r.fail("snapshot invariants: %v", err)
			return
		}
		if err := r.checkHeld(s, before, after); err != nil {
			r.fail("%v", err)
			return
		}
		for _, l := range scLocs {
			mi, err := r.backend.MemInfo(l)
			if err == nil && r.capacity[l] > 0 && mi.UsedBytes > r.capacity[l] {
				r.fail("%s: the backend holds %d bytes, above the budget (%d with the application's own)", l, mi.UsedBytes, r.capacity[l])
			}
		}
		if n := r.backend.ooms.Load(); n > 0 {
			r.fail("%d allocations failed for lack of capacity: physical bytes would exceed admitted bytes: %v", n, r.backend.first)
			return
		}
	flight:
		for _, v := range s.Values {
			for _, m := range v.Materializations {
				if m.State != system.Resident {
					r.inFlight.Add(1)
					break flight
				}
			}
		}
	}
}

// checkHeld: every lease or hold a worker held from before the snapshot
// was asked for until after it came back is in it, on a resident
// materialization, counted.
func (r *scRound) checkHeld(s system.Snapshot, before, after map[int]scEndpoint) error {
	need := map[scEndpoint]int{}
	for id, e := range before {
		if _, ok := after[id]; ok {
			need[e]++
		}
	}
	for e, n := range need {
		v, ok := s.Value(e.val)
		if !ok {
			return fmt.Errorf("v%d: %s is held at %s by %d protections but is not in the snapshot", s.StateVersion, e.val, e.loc, n)
		}
		found := false
		for _, m := range v.Materializations {
			if m.Location == e.loc {
				found = true
				if m.State == system.Entering || m.UseCount+m.HoldCount+m.PendingEventCount < n {
					return fmt.Errorf("v%d: %s at %s is held by %d protections, snapshot has %+v", s.StateVersion, e.val, e.loc, n, m)
				}
			}
		}
		if !found {
			return fmt.Errorf("v%d: %s at %s is held by %d protections but has no materialization there (protected bytes evicted)", s.StateVersion, e.val, e.loc, n)
		}
		r.heldSeen.Add(int64(n))
	}
	return nil
}

// teardown releases what is left, checks that physical bytes equal the
// charges once nothing is in flight, discards everything and closes.
func (r *scRound) teardown() {
	t, ctx := r.t, context.Background()
	r.staging.close(t)
	r.cache.close(t)
	testsys.Faults(r.sys).Reset()
	waitUntil(t, r.sys, "nothing protected, in flight, temporary or reserved", cancelQuiet)
	// An eviction releases its charge when it commits and sends the free to
	// its location actor, which handles it before any allocation admitted
	// later there; a location actor still inside a slow allocation frees a
	// moment after the snapshot. At rest the two agree once those frees
	// have run: a buffer never freed keeps them apart until the deadline.
	var s system.Snapshot
	deadline := time.Now().Add(10 * time.Second)
	for {
		s = snapshot(t, r.sys)
		apart := ""
		for _, l := range s.Locations {
			if got := backendUsed(t, r.backend, l.Location); got != l.UsedBytes {
				apart = fmt.Sprintf("%s: the backend holds %d bytes, the ledger charges %d", l.Location, got, l.UsedBytes)
				break
			}
		}
		if apart == "" {
			break
		}
		if time.Now().After(deadline) {
			assert.Fail(t, "at rest the backend holds exactly the charged bytes", "%s (10 s after the runtime was quiet)", apart)
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, v := range s.Values {
		require.NoError(t, r.sys.Discard(ctx, v.Handle), "discard %s", v.Handle.Name)
	}
	require.NoError(t, r.sys.Close(ctx), "close: nothing outstanding")
	final, err := r.sys.Snapshot(ctx)
	require.NoError(t, err)
	require.NoError(t, checkInvariants(final))
	for _, l := range final.Locations {
		assert.Zero(t, l.UsedBytes+l.ReservedBytes+l.TemporaryBytes, "%s after close: %+v", l.Location, l)
		assert.Zero(t, backendUsed(t, r.backend, l.Location), "%s: the backend still holds bytes after close", l.Location)
	}
	assert.Zero(t, r.backend.ooms.Load(), "allocations above capacity: %v", r.backend.first)
}

// checkHistories runs porcupine on both histories.
func (r *scRound) checkHistories(f *scFigures) {
	t := r.t
	for _, c := range []struct {
		name  string
		h     *scHistory
		model porcupine.NondeterministicModel
		ops   *int
		parts *int
	}{
		{"values (leases, admissions, transfers)", r.hist, residencyModel, &f.ops, &f.parts},
		{"cache loads", r.chist, cacheModel, &f.cops, &f.cparts},
	} {
		began := time.Now()
		res, info := c.h.check(c.model, 60*time.Second)
		f.checkTime += time.Since(began)
		*c.ops = c.h.len()
		*c.parts = len(c.model.Partition(c.h.ops))
		switch res {
		case porcupine.Ok:
		case porcupine.Unknown:
			f.unknown++
			t.Logf("seed %d: linearizability of %s: not decided within the time limit", r.seed, c.name)
		default:
			path := fmt.Sprintf("%s/syscheck-%d.html", os.TempDir(), r.seed)
			m := c.model.ToModel()
			_ = porcupine.VisualizePath(m, info, path)
			t.Errorf("seed %d: the history of %s is not linearizable (visualization: %s; replay: %s)", r.seed, c.name, path, scChecker.Replay(r.seed))
			r.logIllegal(c.model, c.h)
		}
	}
}

// logIllegal logs the calls of the first partition porcupine rejects.
func (r *scRound) logIllegal(model porcupine.NondeterministicModel, h *scHistory) {
	m := model.ToModel()
	for _, part := range model.Partition(h.ops) {
		if porcupine.CheckOperations(porcupine.Model{Init: m.Init, Step: m.Step, Equal: m.Equal}, part) {
			continue
		}
		_, info := porcupine.CheckOperationsVerbose(porcupine.Model{Init: m.Init, Step: m.Step, Equal: m.Equal}, part, 10*time.Second)
		if lins := info.PartialLinearizationsOperations(); len(lins) > 0 {
			var longest []porcupine.Operation
			for _, l := range lins[0] {
				if len(l) > len(longest) {
					longest = l
				}
			}
			r.t.Logf("  the longest linearizable prefix has %d of %d calls; its last ones:", len(longest), len(part))
			for _, op := range longest[max(0, len(longest)-6):] {
				r.t.Logf("    worker %d [%d] %s", op.ClientId, op.Call, model.DescribeOperation(op.Input, op.Output))
			}
		}
		sort.Slice(part, func(i, j int) bool { return part[i].Call < part[j].Call })
		for _, op := range part {
			ret := fmt.Sprint(op.Return)
			if op.Return > h.never-int64(len(h.ops))-1 {
				ret = "never"
			}
			r.t.Logf("  worker %d [%d, %s] %s", op.ClientId, op.Call, ret, model.DescribeOperation(op.Input, op.Output))
		}
		return
	}
}
