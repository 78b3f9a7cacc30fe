package system

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/checkharness"
	"github.com/residency-go/residency/internal/testsys"
)

// The randomized checker of waiting admission: many goroutines wait for
// reservations at one location whose device capacity equals its budget.
// Steps (a new waiter of random size, class and bypass; a holder exits; a
// waiter is canceled; a call that does not wait) run one at a time, and after each the checker waits
// until the runtime has settled (every waiter accounted for: queued or
// returned, and tried since the last release), then compares with a
// small reference model of the rule:
//   - no oversubscription: the holders' bytes, and the ledger's, fit the
//     budget;
//   - no lost wake-up: no waiter that the rule lets through still waits
//     while the free bytes fit it;
//   - no starvation beyond the rule: nobody was admitted while a waiter
//     ahead of it (higher class, or same class and earlier) that did not
//     allow bypass was still waiting;
//   - a call that does not wait takes no room a waiter holds: one that
//     fits is refused with a *WaitersAheadError while one is queued, and
//     admitted otherwise.
//
// Odd seeds run the same model over a shared budget: cuda:0 (its own
// budget above the figure) and pageable-host (none) share the checker's
// figure, and every waiter and call picks one of the two at random. The
// members count as one location (docs/semantics.md), so the model is
// unchanged: one pool of bytes, one queue.
//
// Bounded by default (a few hundred steps of one seed); RESIDENCY_SOAK
// (a Go duration) runs seeds one after another for that long instead,
// each for at most waitSoakChunk, so that a soak runs both modes. The
// seed is in every failure message; RESIDENCY_WAIT_SEED replays one.
func TestWaitingAdmissionChecker(t *testing.T) {
	seed, replayed := waitSeeds.Replayed(t)
	if !replayed {
		seed = uint64(time.Now().UnixNano())
	}
	soak := checkharness.Soak(t)
	if soak == 0 {
		runWaitSeed(t, seed, 300, time.Time{})
		return
	}
	end := time.Now().Add(soak)
	for n := 0; time.Now().Before(end); n++ {
		until := time.Now().Add(waitSoakChunk)
		if until.After(end) {
			until = end
		}
		runWaitSeed(t, seed+uint64(n), 0, until)
		if replayed {
			break
		}
	}
}

// waitSoakChunk is how long a soak runs one seed.
const waitSoakChunk = 30 * time.Second

// runWaitSeed runs one seed for steps steps (0: until until), then drains.
func runWaitSeed(t *testing.T, seed uint64, steps int, until time.Time) {
	t.Logf("seed %d (replay: %s)", seed, waitSeeds.Replay(seed))
	c := newWaitChecker(t, seed)
	c.soaking = steps == 0
	defer c.shutdown()
	for i := 0; steps == 0 || i < steps; i++ {
		if steps == 0 && time.Now().After(until) {
			break
		}
		c.step(i)
	}
	c.drain()
	t.Logf("seed %d (shared budget: %v): %d waiters, %d admitted, %d canceled", seed, c.shared, c.launched, c.admittedN, c.canceledN)
}

const checkerBudget = 100

// waitSeeds names TestWaitingAdmissionChecker for its replay command.
var waitSeeds = checkharness.Checker{SeedEnv: "RESIDENCY_WAIT_SEED", Pattern: "TestWaitingAdmissionChecker", Package: "./system/"}

type modelWaiter struct {
	name     string
	seq      int
	class    int
	size     int64
	bypass   bool
	cancel   context.CancelFunc
	canceled bool
}

// ahead says whether a is ahead of b in the queue.
func (a *modelWaiter) ahead(b *modelWaiter) bool {
	return a.class > b.class || (a.class == b.class && a.seq < b.seq)
}

type waitChecker struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	s    *System
	w    *roomWatch
	out  chan admitted

	waiting   map[string]*modelWaiter
	holders   map[string]*Scope
	sizes     map[string]int64
	class     map[string]int
	loc       map[string]string // where each waiter and call reserves
	launched  int
	admittedN int
	canceledN int
	fresh     []string // admitted during the current step
	shared    bool     // the shared-budget mode (odd seeds)
	soaking   bool     // steps are not bounded (RESIDENCY_SOAK)
}

// checkerHost is the other member of the shared budget (shared mode).
const checkerHost = "pageable-host"

func newWaitChecker(t *testing.T, seed uint64) *waitChecker {
	shared := seed%2 == 1
	locs := []LocationConfig{Limit(gpu, checkerBudget)}
	opts := Options{MaxWaiters: 64}
	if shared {
		// The group's figure binds: cuda:0's own budget is above it.
		locs = []LocationConfig{Limit(gpu, checkerBudget+checkerBudget/2), NoLimit(checkerHost)}
		opts.SharedBudgets = []SharedBudget{{Name: "igpu", Locations: []string{gpu, checkerHost}, Bytes: checkerBudget}}
	}
	opts.Locations = locs
	opts.Backend = testsys.Soft(t, locs, testsys.Capacity(map[string]int64{gpu: locs[0].BudgetBytes}))
	s, err := Start(context.Background(), opts)
	require.NoError(t, err)
	return &waitChecker{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), s: s, w: watchRoom(s), shared: shared,
		out: make(chan admitted, 64), waiting: map[string]*modelWaiter{}, holders: map[string]*Scope{}, sizes: map[string]int64{}, class: map[string]int{}, loc: map[string]string{}}
}

// pick is the location of a new waiter or call: cuda:0, or in shared mode
// either member.
func (c *waitChecker) pick() string {
	if c.shared && c.rng.IntN(2) == 1 {
		return checkerHost
	}
	return gpu
}

func (c *waitChecker) fatalf(format string, args ...any) {
	c.t.Helper()
	replay := waitSeeds.Replay(c.seed)
	if c.soaking {
		// A bounded run stops at 300 steps: a soak's failure may come later.
		replay = checkharness.SoakEnv + "=" + waitSoakChunk.String() + " " + replay
	}
	c.t.Fatalf("seed %d (replay: %s): "+format, append([]any{c.seed, replay}, args...)...)
}

func (c *waitChecker) step(i int) {
	c.fresh = c.fresh[:0]
	switch r := c.rng.IntN(12); {
	case r < 5 && len(c.waiting) < 16:
		c.spawn()
	case r < 9 && len(c.holders) > 0:
		c.releaseOne()
	case r < 11:
		c.direct(i)
	case len(c.waiting) > 0:
		c.cancelOne()
	default:
		c.spawn()
	}
	c.settle()
	c.check(i)
}

func (c *waitChecker) spawn() {
	c.launched++
	mw := &modelWaiter{name: "w" + strconv.Itoa(c.launched), seq: c.launched, class: c.rng.IntN(3),
		size: 1 + c.rng.Int64N(checkerBudget), bypass: c.rng.IntN(5) == 0}
	ctx, cancel := context.WithCancel(context.Background())
	mw.cancel = cancel
	c.waiting[mw.name] = mw
	c.sizes[mw.name] = mw.size
	c.class[mw.name] = mw.class
	opts := []WaitOption{WaitClass(mw.class)}
	if mw.bypass {
		opts = append(opts, WaitAllowBypass())
	}
	loc := c.pick()
	c.loc[mw.name] = loc
	go func() {
		sc, _, err := c.s.Admit(ctx, resvAt(mw.name, loc, mw.size), append([]WaitOption{WaitForRoom()}, opts...)...)
		c.out <- admitted{mw.name, sc, err}
	}()
	// Wait until it is queued or has returned, so queue order is spawn order.
	c.waitFor(func() bool {
		if _, ok := c.waiting[mw.name]; !ok {
			return true
		}
		for _, s := range c.w.r.q.Waiting() {
			if s.Name == mw.name {
				return true
			}
		}
		return false
	})
}

// direct makes a call that does not wait (an Admit without a wait
// option): the model refuses it for room when it does not fit the free
// bytes, with a *WaitersAheadError when it fits but a waiter that does not
// allow bypass is queued (every class here is ≥ 0), and admits it
// otherwise.
func (c *waitChecker) direct(i int) {
	c.launched++
	name := "d" + strconv.Itoa(c.launched)
	size := 1 + c.rng.Int64N(checkerBudget)
	var used int64
	for n := range c.holders {
		used += c.sizes[n]
	}
	// The waiters that hold the room, by the location they name; the
	// refusal names the member with the most (the call's own on a tie)
	// and their number.
	held, at := 0, map[string]int{}
	for _, mw := range c.waiting {
		if !mw.bypass {
			held++
			at[c.loc[mw.name]]++
		}
	}
	loc := c.pick()
	most := max(at[gpu], at[checkerHost])
	sc, _, err := c.s.Admit(context.Background(), resvAt(name, loc, size))
	var wa *WaitersAheadError
	switch {
	case size > checkerBudget-used:
		if err == nil || errors.Is(err, ErrBusy) {
			c.fatalf("step %d: %s (%d bytes at %s) does not fit the %d free bytes: want a refusal for room, got %v", i, name, size, loc, checkerBudget-used, err)
		}
	case held > 0:
		if !errors.As(err, &wa) || wa.Waiters != most || at[wa.Location] != most || (at[loc] == most && wa.Location != loc) || !errors.Is(err, ErrBusy) {
			c.fatalf("step %d: %s (%d bytes at %s, %d free) with waiters holding the room (%v): want a *WaitersAheadError for %d waiters, got %v", i, name, size, loc, checkerBudget-used, at, most, err)
		}
	default:
		if err != nil {
			c.fatalf("step %d: %s (%d bytes) fits the %d free bytes and nobody holds them: %v", i, name, size, checkerBudget-used, err)
		}
		c.holders[name], c.sizes[name] = sc, size
	}
	if sc != nil && err != nil {
		c.fatalf("step %d: %s: a scope beside an error", i, name)
	}
}

func (c *waitChecker) releaseOne() {
	names := sortedKeys(c.holders)
	n := names[c.rng.IntN(len(names))]
	if err := c.holders[n].Exit(context.Background()); err != nil {
		c.fatalf("exit %s: %v", n, err)
	}
	delete(c.holders, n)
}

func (c *waitChecker) cancelOne() {
	names := sortedKeys(c.waiting)
	mw := c.waiting[names[c.rng.IntN(len(names))]]
	mw.canceled = true
	mw.cancel()
}

// settle waits until every waiter of the model is accounted for (queued
// and settled, or returned).
func (c *waitChecker) settle() {
	c.waitFor(func() bool {
		if c.w.r.q.Len() != len(c.waiting) {
			return false
		}
		for _, mw := range c.waiting {
			if mw.canceled {
				return false // its cancellation has not reached it yet
			}
		}
		ep := c.w.r.epoch.Load()
		for _, x := range c.w.r.ws {
			if x.trying {
				return false
			}
		}
		for _, id := range c.w.r.q.Eligible(nil) {
			if x := c.w.r.ws[id]; !x.tried || x.epoch < ep {
				return false
			}
		}
		return true
	})
}

// waitFor waits for cond (under the room's lock), taking results as they
// come.
func (c *waitChecker) waitFor(cond func() bool) {
	c.t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		c.w.r.mu.Lock()
		ok := cond()
		c.w.r.mu.Unlock()
		if ok {
			return
		}
		select {
		case a := <-c.out:
			c.result(a)
		case <-c.w.ch:
		case <-deadline.C:
			c.fatalf("the runtime did not settle: waiting %v, queue %d", sortedKeys(c.waiting), c.w.r.q.Len())
		}
	}
}

func (c *waitChecker) result(a admitted) {
	mw, ok := c.waiting[a.name]
	if !ok {
		c.fatalf("result for %s, which is not waiting", a.name)
	}
	delete(c.waiting, a.name)
	mw.cancel()
	switch {
	case a.err == nil:
		c.holders[a.name] = a.sc
		c.fresh = append(c.fresh, a.name)
		c.admittedN++
	case mw.canceled && errors.Is(a.err, context.Canceled):
		c.canceledN++
	default:
		c.fatalf("waiter %s: %v", a.name, a.err)
	}
}

func (c *waitChecker) check(i int) {
	var used int64
	for n := range c.holders {
		used += c.sizes[n]
	}
	if used > checkerBudget {
		c.fatalf("step %d: oversubscribed: holders take %d of %d", i, used, checkerBudget)
	}
	snap, err := c.s.Snapshot(context.Background())
	if err != nil {
		c.fatalf("snapshot: %v", err)
	}
	var charged int64
	for _, l := range snap.Locations {
		charged += l.UsedBytes + l.ReservedBytes
	}
	if charged != used {
		c.fatalf("step %d: the ledger charges %d, the holders %d", i, charged, used)
	}
	order := make([]*modelWaiter, 0, len(c.waiting))
	for _, mw := range c.waiting {
		order = append(order, mw)
	}
	slices.SortFunc(order, func(a, b *modelWaiter) int {
		return cmp.Or(cmp.Compare(b.class, a.class), cmp.Compare(a.seq, b.seq))
	})
	c.w.r.mu.Lock()
	queue := c.w.r.q.Waiting()
	c.w.r.mu.Unlock()
	for k, mw := range order {
		if k >= len(queue) || queue[k].Name != mw.name {
			var got, want []string
			for _, q := range queue {
				got = append(got, q.Name)
			}
			for _, m := range order {
				want = append(want, m.name)
			}
			c.fatalf("step %d: queue order %v differs from the model's %v", i, got, want)
		}
	}
	free, blocked := checkerBudget-used, false
	for _, mw := range order {
		if !blocked && mw.size <= free {
			c.fatalf("step %d: lost wake-up: %s (%d bytes, class %d) still waits with %d free", i, mw.name, mw.size, mw.class, free)
		}
		if !mw.bypass {
			blocked = true
		}
	}
	for _, n := range c.fresh {
		x := &modelWaiter{name: n, seq: seqOf(n), class: c.class[n]}
		for _, y := range order {
			if !y.bypass && y.ahead(x) {
				c.fatalf("step %d: %s was admitted while %s, ahead of it without bypass, waits", i, n, y.name)
			}
		}
	}
}

func seqOf(n string) int {
	v, _ := strconv.Atoi(n[1:])
	return v
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// drain releases every holder until every waiter is admitted (each fits
// the budget on its own) and checks the runtime ends empty.
func (c *waitChecker) drain() {
	for len(c.holders) > 0 || len(c.waiting) > 0 {
		c.fresh = c.fresh[:0]
		if len(c.holders) > 0 {
			c.releaseOne()
		}
		c.settle()
		c.check(-1)
		if len(c.holders) == 0 && len(c.waiting) > 0 {
			c.fatalf("waiters %v still wait on an empty budget", sortedKeys(c.waiting))
		}
	}
}

func (c *waitChecker) shutdown() {
	for _, mw := range c.waiting {
		mw.cancel()
	}
	require.NoError(c.t, c.s.Close(context.Background()))
}
