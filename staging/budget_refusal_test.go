package staging

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
)

// hookRuntime is a runtime over a ledger book that runs a hook when the
// ledger refuses a clone for the cap, before the refusal reaches the
// budget.
type hookRuntime struct {
	*ledgerBook
	onCapRefusal atomic.Pointer[func()]
	asks         atomic.Int64 // clone reservations asked for
}

func (r *hookRuntime) Backend() cuda.Backend { return nil }

func (r *hookRuntime) ReserveCapped(ctx context.Context, loc, name, capName string, capBytes, bytes int64) error {
	r.asks.Add(1)
	err := r.ledgerBook.ReserveCapped(ctx, loc, name, capName, capBytes, bytes)
	var ce *budget.CapError
	if hook := r.onCapRefusal.Swap(nil); hook != nil && errors.As(err, &ce) {
		(*hook)()
	}
	return err
}

// deferredTasks stands for the pipeline's deferred tasks: flush takes the
// oldest, counts its clone bytes on their way out, and records it.
type deferredTasks struct {
	b       *gpuBudget
	mu      sync.Mutex
	pending []deferredTask
	flushed []TaskID
}

type deferredTask struct {
	id TaskID
	tk *ticket
}

func (d *deferredTasks) flush() (TaskID, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.pending) == 0 {
		return 0, false
	}
	t := d.pending[0]
	d.pending = d.pending[1:]
	d.b.addInflight(t.tk.bytes)
	d.flushed = append(d.flushed, t.id)
	return t.id, true
}

func (d *deferredTasks) flushes() []TaskID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]TaskID(nil), d.flushed...)
}

func asleep(t *testing.T, b *gpuBudget, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return b.state().asleep == n }, 10*time.Second, time.Millisecond, "%d reserves asleep", n)
}

// A reserve the ledger refuses for the cap flushes deferred tasks, oldest
// first, until the bytes on their way out cover the shortfall the refusal
// names; a reserve that arrives while it waits asks nothing and flushes
// for what the cap lacks for both. Each gets its bytes, first in first
// out, when the flushed tasks release theirs.
func TestCapRefusalFlushesItsShortfall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := &hookRuntime{ledgerBook: newLedgerBook(t)}
	b, err := newGPUBudget(rt, "cuda:0", "t", 10)
	require.NoError(t, err)
	d := &deferredTasks{b: b}
	b.flush = d.flush
	t1, err := b.reserve(ctx, 6, true, 1)
	require.NoError(t, err)
	t2, err := b.reserve(ctx, 3, true, 2)
	require.NoError(t, err)
	d.pending = []deferredTask{{1, t1}, {2, t2}}

	got := make(chan *ticket, 2)
	go func() {
		tk, err := b.reserve(ctx, 4, true, 3) // 9 + 4 > 10: short by 3
		assert.NoError(t, err)
		got <- tk
	}()
	asleep(t, b, 1)
	assert.Equal(t, []TaskID{1}, d.flushes(), "task 1's 6 bytes on their way out cover the 3")
	go func() {
		tk, err := b.reserve(ctx, 5, true, 4) // behind the 4: the cap lacks 9 + 4 + 5 − 10 = 8
		assert.NoError(t, err)
		got <- tk
	}()
	asleep(t, b, 2)
	assert.Equal(t, []TaskID{1, 2}, d.flushes(), "6 on their way out do not cover 8; 9 do")

	require.NoError(t, b.releaseAll(ctx, []*ticket{t1}, 6))
	b.wakeAll()
	first := <-got
	assert.Equal(t, int64(4), first.bytes, "first in, first out")
	require.NoError(t, b.releaseAll(ctx, []*ticket{t2}, 3))
	b.wakeAll()
	second := <-got
	assert.Equal(t, int64(5), second.bytes)
	st := b.state()
	assert.Equal(t, [3]int64{9, 9, 2}, [3]int64{st.used, st.peak, st.flushes})
	assert.Equal(t, []budget.CapRecord{{Name: "t/clones", CapBytes: 10, UsedBytes: 9, PeakBytes: 9,
		Reservations: []string{"t/clone/3", "t/clone/4"}}}, rt.caps(), "the refused asks took no name")
	require.NoError(t, b.release(ctx, first))
	require.NoError(t, b.release(ctx, second))
	assert.Nil(t, rt.caps())
	assert.Zero(t, b.state().used)
}

// A waiting reserve whose look found nothing to flush is woken by a
// deferred task appearing (poke), asks again and flushes it; one whose
// shortfall is covered by bytes on their way out sleeps on, asking nothing.
func TestPokeWakesAStarvedReserve(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := &hookRuntime{ledgerBook: newLedgerBook(t)}
	b, err := newGPUBudget(rt, "cuda:0", "t", 10)
	require.NoError(t, err)
	d := &deferredTasks{b: b}
	b.flush = d.flush
	t1, err := b.reserve(ctx, 8, true, 1)
	require.NoError(t, err)
	got := make(chan *ticket, 1)
	go func() {
		tk, err := b.reserve(ctx, 5, true, 2)
		assert.NoError(t, err)
		got <- tk
	}()
	asleep(t, b, 1)
	assert.Equal(t, int64(2), rt.asks.Load(), "refused once, nothing to flush")
	b.poke() // nothing deferred yet: it asks again, and sleeps again
	require.Eventually(t, func() bool { return rt.asks.Load() == 3 && b.state().asleep == 1 }, 10*time.Second, time.Millisecond)
	d.mu.Lock()
	d.pending = []deferredTask{{1, t1}} // task 1 is deferred now
	d.mu.Unlock()
	b.poke()
	require.Eventually(t, func() bool { return len(d.flushes()) == 1 && b.state().asleep == 1 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int64(4), rt.asks.Load())
	b.poke() // covered by task 1's bytes on their way out: no wake
	time.Sleep(10 * time.Millisecond)
	assert.Equal(t, int64(4), rt.asks.Load())
	require.NoError(t, b.releaseAll(ctx, []*ticket{t1}, 8))
	b.wakeAll()
	tk := <-got
	assert.Equal(t, int64(5), rt.asks.Load())
	assert.Equal(t, int64(1), b.state().flushes)
	require.NoError(t, b.release(ctx, tk))
}

// A cap refusal after which clone bytes of the pipeline's came back (the
// refusal counted them) flushes nothing: the reserve asks again.
func TestCapRefusalAfterOwnReleaseAsksAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := &hookRuntime{ledgerBook: newLedgerBook(t)}
	b, err := newGPUBudget(rt, "cuda:0", "t", 10)
	require.NoError(t, err)
	b.flush = func() (TaskID, bool) {
		t.Error("no flush: the refusal counted bytes that came back")
		return 0, false
	}
	held, err := b.reserve(ctx, 8, true, 1)
	require.NoError(t, err)
	hook := func() { assert.NoError(t, b.release(ctx, held)) }
	rt.onCapRefusal.Store(&hook)
	tk, err := b.reserve(ctx, 5, true, 2)
	require.NoError(t, err)
	assert.Nil(t, rt.onCapRefusal.Load(), "refused once")
	st := b.state()
	assert.Equal(t, [3]int64{5, 8, 0}, [3]int64{st.used, st.peak, st.flushes})
	require.NoError(t, b.release(ctx, tk))
}

// A try-reserve asks the ledger once: a refusal for the cap is a drop for
// the budget, one for the location a drop for the location (with the
// location's refusal); a clone larger than the whole cap is ErrConfig. A
// cap refusal takes no clone name; a location refusal does.
func TestTryReserveDropsByLedgerRefusal(t *testing.T) {
	ctx := context.Background()
	rt := &hookRuntime{ledgerBook: newLedgerBookAt(t, 10)}
	b, err := newGPUBudget(rt, "cuda:0", "t", 8)
	require.NoError(t, err)
	b.flush = func() (TaskID, bool) { t.Error("a try-reserve flushes nothing"); return 0, false }
	t1, err := b.reserve(ctx, 5, false, 1)
	require.NoError(t, err)

	_, err = b.reserve(ctx, 4, false, 2)
	var drop *DropError
	require.ErrorAs(t, err, &drop)
	assert.Equal(t, DropError{Reason: DropBudget, Requested: 4}, *drop)
	assert.ErrorIs(t, err, ErrDropped)

	require.NoError(t, rt.Reserve(ctx, "cuda:0", "tenant", 4))
	_, err = b.reserve(ctx, 2, false, 2)
	require.ErrorAs(t, err, &drop)
	assert.Equal(t, DropLocation, drop.Reason)
	var be *budget.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "cuda:0", be.Location)

	for _, wait := range []bool{false, true} {
		_, err = b.reserve(ctx, 9, wait, 2)
		require.ErrorIs(t, err, ErrConfig, "wait %v", wait)
	}
	st := b.state()
	assert.Equal(t, map[string]int64{DropBudget: 1, DropLocation: 1}, st.drops)
	assert.Equal(t, [3]int64{5, 5, 0}, [3]int64{st.used, st.peak, st.flushes})

	require.NoError(t, rt.Unreserve(ctx, "tenant"))
	t3, err := b.reserve(ctx, 2, false, 2)
	require.NoError(t, err)
	assert.Equal(t, []string{"t/clone/1", "t/clone/3"}, []string{t1.name, t3.name})
	require.NoError(t, b.release(ctx, t1))
	require.NoError(t, b.release(ctx, t3))
}

// Reserves, try-reserves and releases from many goroutines, with a tenant
// coming and going at the device location: the ledger's cap is never
// passed, the pipeline's figures never exceed it, every reserve ends
// (granted, dropped, or refused for a location full of others' bytes) and
// everything comes back. Run under -race.
func TestCloneBudgetUnderConcurrency(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const capBytes = 8
	rt := &hookRuntime{ledgerBook: newLedgerBookAt(t, 12)}
	b, err := newGPUBudget(rt, "cuda:0", "t", capBytes)
	require.NoError(t, err)
	b.flush = func() (TaskID, bool) { return 0, false }
	stop := make(chan struct{})
	var tenant sync.WaitGroup
	tenant.Add(1)
	go func() { // the tenant: 6 bytes at cuda:0, on and off
		defer tenant.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if rt.Reserve(ctx, "cuda:0", "tenant", 6) == nil {
				runtime.Gosched()
				assert.NoError(t, rt.Unreserve(ctx, "tenant"))
			}
		}
	}()
	var granted, dropped, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 300 {
				n, wait := 1+rng.Int64N(4), rng.IntN(2) == 0
				tk, err := b.reserve(ctx, n, wait, TaskID(g))
				var be *budget.BudgetError
				switch {
				case err == nil:
					granted.Add(1)
					if st := b.state(); st.used > capBytes || st.peak > capBytes {
						t.Errorf("clone bytes %d (peak %d) above the cap %d", st.used, st.peak, capBytes)
					}
					runtime.Gosched()
					assert.NoError(t, b.release(ctx, tk))
				case errors.Is(err, ErrDropped):
					assert.False(t, wait, "a blocking reserve is never dropped")
					dropped.Add(1)
				case wait && errors.As(err, &be):
					refused.Add(1) // the tenant's bytes filled the location
				default:
					t.Errorf("reserve of %d (wait %v): %v", n, wait, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	tenant.Wait()
	t.Logf("granted %d, dropped %d, refused %d", granted.Load(), dropped.Load(), refused.Load())
	assert.Positive(t, granted.Load())
	st := b.state()
	assert.Zero(t, st.used)
	assert.LessOrEqual(t, st.peak, int64(capBytes))
	assert.Equal(t, dropped.Load(), st.drops[DropBudget]+st.drops[DropLocation])
	assert.Zero(t, b.waiters.Len())
	assert.Nil(t, rt.caps(), "every clone came back")
}

// The pipeline fails (or closes) while a waiting reserve asks the ledger,
// before the reserve has joined the waiters: fail finds no waiter to wake,
// so the reserve must see the failure itself before it sleeps, and return
// it, instead of sleeping until its context ends. (A concurrent round of
// the model checker met this once in a 30-minute soak: a blocking append
// stuck until the round's deadline after a fault failed the pipeline.)
func TestFailDuringTheAskIsNotLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := &hookRuntime{ledgerBook: newLedgerBook(t)}
	b, err := newGPUBudget(rt, "cuda:0", "t", 10)
	require.NoError(t, err)
	b.flush = func() (TaskID, bool) { return 0, false } // nothing deferred
	held, err := b.reserve(ctx, 8, true, 1)
	require.NoError(t, err)
	failure := errors.New("the pipeline failed")
	hook := func() { b.fail(failure) }
	rt.onCapRefusal.Store(&hook)

	wait, cancelWait := context.WithTimeout(ctx, 10*time.Second)
	defer cancelWait()
	_, err = b.reserve(wait, 4, true, 2) // 8 + 4 > 10: refused, and the pipeline fails meanwhile
	require.ErrorIs(t, err, failure, "the failure, not the reserve's own deadline")
	require.NoError(t, wait.Err(), "returned at once")
	require.NoError(t, b.release(ctx, held))
}
