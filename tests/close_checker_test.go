package tests

// The close checker: workers call the public API at random (register a
// value and place it, a loader cache's loads, admissions that demote the
// cache's idle entries through its Spill.Demote, leases, write tasks of a
// staging pipeline opened on the runtime, closed with Close's context
// just before it) with loaders and
// Demotes that succeed, fail, panic, call runtime.Goexit, block until
// their context ends, or block ignoring it; the runtime is closed at a
// random point with a random deadline. Checks, each round:
//
//   - Close returns (a hang detector far above its deadline, never a
//     timing);
//   - a round whose loaders and Demotes all honour their context gets no
//     *StillRunningError (Close canceled them all);
//   - after Close nothing is charged (the final snapshot), and the bytes
//     still allocated at the backend are at most what the
//     *StillRunningError names, by location;
//   - once the blocked loaders and Demotes are let go, every caller has
//     returned, the owned backend is closed with no buffer left live, and
//     no goroutine is left (goleak).
//
// Seeds: RESIDENCY_CLOSE_SEED=N replays a round's choices (the
// interleaving is the scheduler's). Bounded by default; RESIDENCY_SOAK (a
// Go duration) runs rounds until it has passed.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/internal/checkharness"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
)

// ccBehaviour is what a loader or a Demote does.
type ccBehaviour int

const (
	ccOK ccBehaviour = iota
	ccFail
	ccPanic
	ccGoexit
	ccHonour // blocks until its context ends (or the round lets it go)
	ccIgnore // blocks until the round lets it go, whatever its context
	ccBehaviours
)

// ccRound is one runtime, its workers and what they saw.
type ccRound struct {
	t      *testing.T
	seed   uint64
	polite bool // no behaviour ignores its context
	// deadline is Close's (an hour: only in polite rounds).
	deadline time.Duration
	sys      *system.System
	be       *liveBackend
	cache    *cache.Cache
	pipe     *staging.Pipeline // closed just before the runtime, with the same context
	step     cuda.Buffer       // the device buffer write tasks copy from (the test's, outside the count)
	gate     chan struct{}     // closed: every blocked loader and Demote returns
	calls    atomic.Int64
	names    atomic.Int64
	tasks    atomic.Int64 // write tasks submitted and waited on
}

// ccFigures sum the rounds.
type ccFigures struct {
	rounds, calls, tasks, stillRunning, abandoned, violations int64
	heldBytes                                                 int64
	maxLate                                                   time.Duration
}

// behave carries out b for code given ctx.
func (r *ccRound) behave(ctx context.Context, b ccBehaviour, what string) error {
	switch b {
	case ccFail:
		return fmt.Errorf("%s: failed on purpose", what)
	case ccPanic:
		panic(what + ": panicked on purpose")
	case ccGoexit:
		runtime.Goexit()
	case ccHonour:
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.gate:
		}
	case ccIgnore:
		<-r.gate
	}
	return nil
}

func (r *ccRound) draw(rng *rand.Rand) ccBehaviour {
	for {
		b := ccBehaviour(rng.IntN(int(ccBehaviours)))
		if !(r.polite && b == ccIgnore) {
			return b
		}
	}
}

// worker makes calls until Close refuses them.
func (r *ccRound) worker(id int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(r.seed, uint64(id)))
	for {
		select {
		case <-stop:
			return
		default:
		}
		r.calls.Add(1)
		var err error
		switch rng.IntN(5) {
		case 0, 1:
			err = r.placeValue(rng)
		case 2:
			err = r.loadCache(rng)
		case 3:
			err = r.admit(rng)
		case 4:
			err = r.writeTask(rng)
		}
		if errors.Is(err, system.ErrClosed) || errors.Is(err, system.ErrCacheClosed) || errors.Is(err, staging.ErrClosed) {
			return
		}
	}
}

// writeTask runs one write task through the round's pipeline: a task of
// either join mode with one row from the step buffer (a step of it for
// JOIN_NEXT_STEP), submitted, and waited for or not.
func (r *ccRound) writeTask(rng *rand.Rand) error {
	ctx, cancel := r.callCtx(rng)
	defer cancel()
	row := []staging.Row{{Key: "k", Slot: rng.IntN(64), Offset: int64(rng.IntN(8)) * stRow}}
	chunk := staging.Chunk{Device: r.step, Rows: row}
	mode := staging.JoinOnFinish
	if rng.IntN(2) == 0 {
		mode = staging.JoinNextStep
		st, err := r.pipe.Stage(ctx, r.step, nil)
		if err != nil {
			return err
		}
		defer func() { _ = st.Release() }()
		chunk = staging.Chunk{Step: st, Rows: row}
	}
	task, err := r.pipe.Open(ctx, staging.TaskSpec{ReqID: fmt.Sprintf("w%d", r.names.Add(1)), WriteN: 1, Mode: mode})
	if err != nil {
		return err
	}
	if err := task.Append(ctx, chunk); err != nil {
		return err
	}
	if err := r.pipe.Submit(ctx, task); err != nil || rng.IntN(2) == 0 {
		return err
	}
	r.tasks.Add(1)
	return task.Wait(ctx)
}

func (r *ccRound) callCtx(rng *rand.Rand) (context.Context, context.CancelFunc) {
	if rng.IntN(3) == 0 {
		return context.WithTimeout(context.Background(), time.Duration(rng.IntN(5000))*time.Microsecond)
	}
	return context.WithCancel(context.Background())
}

func (r *ccRound) placeValue(rng *rand.Rand) error {
	b := r.draw(rng)
	name := fmt.Sprintf("v%d", r.names.Add(1))
	h, err := r.sys.Register(context.Background(), system.Value{Name: name, Bytes: int64(1+rng.IntN(8)) << 10, Source: "pageable-host",
		Loader: func(ctx context.Context, dst []byte) error {
			if err := r.behave(ctx, b, "loader of "+name); err != nil {
				return err
			}
			dst[0] = 1
			return nil
		}})
	if err != nil {
		return err
	}
	ctx, cancel := r.callCtx(rng)
	defer cancel()
	to := []string{"cuda:0", "pinned-host"}[rng.IntN(2)]
	if err := r.sys.Place(ctx, h, to); err != nil {
		return err
	}
	l, err := r.sys.Acquire(ctx, h, to)
	if err == nil {
		err = l.Release(context.Background())
	}
	return err
}

func (r *ccRound) loadCache(rng *rand.Rand) error {
	b := r.draw(rng)
	key := fmt.Sprintf("k%d", rng.IntN(6))
	ctx, cancel := r.callCtx(rng)
	defer cancel()
	peak := int64(100+rng.IntN(200)) << 10
	l, err := cache.Load(ctx, r.cache, key, peak, nil, func(ctx context.Context) (int, int64, error) {
		if err := r.behave(ctx, b, "cache loader of "+key); err != nil {
			return 0, 0, err
		}
		return 1, peak, nil
	})
	if err != nil {
		return err
	}
	return l.Release()
}

func (r *ccRound) admit(rng *rand.Rand) error {
	ctx, cancel := r.callCtx(rng)
	defer cancel()
	name := fmt.Sprintf("kv%d", r.names.Add(1))
	sc, _, err := r.sys.Admit(ctx, system.Request{Name: name, Reservations: []system.ReservationSpec{{Name: name, Location: "cuda:0", Bytes: int64(200+rng.IntN(400)) << 10}}})
	if err != nil {
		return err
	}
	return sc.Exit(context.Background())
}

// demote is the cache's Spill.Demote.
func (r *ccRound) demote(rng *rand.Rand, mu *sync.Mutex) func(context.Context, string, any) (any, error) {
	return func(ctx context.Context, key string, _ any) (any, error) {
		mu.Lock()
		b := r.draw(rng)
		mu.Unlock()
		if err := r.behave(ctx, b, "Demote of "+key); err != nil {
			return nil, err
		}
		return 2, nil
	}
}

// ccChecker is TestCloseChecker's seed loop: seeds from the clock;
// RESIDENCY_CLOSE_SEED replays one.
var ccChecker = checkharness.Checker{SeedEnv: "RESIDENCY_CLOSE_SEED", Pattern: "TestCloseChecker", Package: "./tests/", Stride: 7919}

// TestCloseChecker runs rounds of the close checker: 12 by default, more
// until RESIDENCY_SOAK has passed, or the one RESIDENCY_CLOSE_SEED names.
func TestCloseChecker(t *testing.T) {
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	var total ccFigures
	c := ccChecker
	c.Seeds = rounds
	sum := c.Loop(t, func(seed uint64) bool {
		total.add(runCloseRound(t, seed))
		return !t.Failed()
	})
	t.Logf("close checker: %d rounds (seeds from %d) in %v: %d calls (%d write tasks submitted and waited on), %d closes with operations still running (%d operations, %d bytes held at close), latest return %v after the deadline, %d violations",
		total.rounds, sum.First, sum.Elapsed.Round(time.Millisecond), total.calls, total.tasks, total.stillRunning, total.abandoned, total.heldBytes, total.maxLate.Round(time.Microsecond), total.violations)
}

func (f *ccFigures) add(o ccFigures) {
	f.rounds += o.rounds
	f.calls += o.calls
	f.tasks += o.tasks
	f.stillRunning += o.stillRunning
	f.abandoned += o.abandoned
	f.violations += o.violations
	f.heldBytes += o.heldBytes
	f.maxLate = max(f.maxLate, o.maxLate)
}

// startCloseRound starts a round's runtime and cache.
func startCloseRound(t *testing.T, seed uint64) *ccRound {
	rng := rand.New(rand.NewPCG(seed, 0))
	r := &ccRound{t: t, seed: seed, polite: rng.IntN(3) == 0, gate: make(chan struct{})}
	locs := closeLocations()
	r.be = newLiveBackend(t, locs)
	var err error
	r.sys, err = system.Start(context.Background(), system.Options{Locations: locs, Backend: r.be, CloseBackend: true,
		Spill: map[string]string{"cuda:0": "pinned-host"}})
	require.NoError(t, err)
	var mu sync.Mutex
	r.cache, err = cache.New(context.Background(), r.sys, cache.Options{Location: "cuda:0", Name: "models",
		Spill: &cache.Spill{Demote: r.demote(rand.New(rand.NewPCG(seed, 1<<32)), &mu)}})
	require.NoError(t, err)
	// The step buffer is the test's, allocated beside the count of the
	// runtime's buffers (freed with the backend).
	r.step, err = r.be.Backend.Allocate(context.Background(), "cuda:0", 8*stRow)
	require.NoError(t, err)
	require.NoError(t, r.be.Backend.Write(context.Background(), r.step, pattern(8*stRow, 5)))
	r.pipe, err = staging.New(context.Background(), r.sys, stagingConfig("writes"))
	require.NoError(t, err)
	return r
}

// runCloseRound runs one round and checks it.
func runCloseRound(t *testing.T, seed uint64) ccFigures {
	r := startCloseRound(t, seed)
	rng := rand.New(rand.NewPCG(seed, 1<<33))
	var violations []string
	fail := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	stop := make(chan struct{})
	var workers sync.WaitGroup
	for w := range 4 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			r.worker(w+1, stop)
		}()
	}
	// Close at a random point, with a random deadline (an hour, where
	// every loader honours its context: Close must not need it).
	timer := time.NewTimer(time.Duration(rng.IntN(30000)) * time.Microsecond)
	<-timer.C
	deadline := time.Duration(rng.IntN(50000)) * time.Microsecond
	if r.polite && rng.IntN(2) == 0 {
		deadline = time.Hour
	}
	r.deadline = deadline
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	began := time.Now()
	// A pipeline is closed by its owner (its Close may wait for a step's
	// freeze event, which only the user can fire), then the runtime.
	_ = r.pipe.Close(ctx) // its error is a task's failure or ctx's; what it leaves is checked below
	err := closeWithin(t, r.sys, ctx)
	late := time.Since(began) - deadline
	cancel()
	close(stop)
	f := ccFigures{rounds: 1}
	r.checkAfterClose(err, &f, fail)
	close(r.gate) // every blocked loader and Demote returns
	waitAll(t, &workers)
	<-r.be.closed // the owned backend closes once the last abandoned operation returned
	if len(r.be.liveAtClose) > 0 {
		fail("bytes still allocated when the backend was closed: %v", r.be.liveAtClose)
	}
	if err := checkharness.Leaks(); err != nil {
		fail("goroutines left after every loader returned: %v", err)
	}
	f.calls, f.tasks, f.violations = r.calls.Load(), r.tasks.Load(), int64(len(violations))
	if late > 0 && deadline < time.Hour {
		f.maxLate = late
	}
	if len(violations) > 0 {
		t.Errorf("close checker, seed %d (polite %v, deadline %v; replay: %s): %d violations:\n  %v\nClose returned: %v",
			seed, r.polite, deadline, ccChecker.Replay(seed), len(violations), violations, err)
	}
	return f
}

// checkAfterClose checks what Close left: nothing charged, nothing
// allocated beyond what its error names, nothing named in a polite round.
func (r *ccRound) checkAfterClose(err error, f *ccFigures, fail func(string, ...any)) {
	var sr *system.StillRunningError
	held := map[string]int64{}
	if errors.As(err, &sr) {
		f.stillRunning, f.abandoned = 1, int64(len(sr.Running))
		held = sr.HeldBytes
		if r.polite && r.deadline == time.Hour {
			fail("a round whose loaders honour their context left operations running with an hour to wait: %v", sr)
		}
		sum := map[string]int64{}
		for _, op := range sr.Running {
			for loc, n := range op.HeldBytes {
				sum[loc] += n
				f.heldBytes += n
			}
		}
		if fmt.Sprint(sum) != fmt.Sprint(sr.HeldBytes) {
			fail("HeldBytes %v is not the sum of the operations' %v", sr.HeldBytes, sum)
		}
	}
	if ch := finalCharges(r.t, r.sys); len(ch) > 0 {
		fail("still charged after Close: %v", ch)
	}
	for loc, n := range r.be.liveBytes() {
		if n > held[loc] {
			fail("%d bytes still allocated at %s after Close, %d named by its error (%v)", n, loc, held[loc], err)
		}
	}
}

// waitAll waits for wg, failing the test after hangBound (a hang).
func waitAll(t *testing.T, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(hangBound)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("callers still waiting %v after Close and every loader returned", hangBound)
	}
}
