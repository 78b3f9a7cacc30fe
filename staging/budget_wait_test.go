package staging

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
)

// countingRuntime admits every reservation within the clone cap (its
// ledger's locations have no budget) and counts them; the GPU-byte budget
// needs nothing else.
type countingRuntime struct {
	*ledgerBook
	live atomic.Int64
}

func newCountingRuntime(tb testing.TB) *countingRuntime {
	return &countingRuntime{ledgerBook: newLedgerBook(tb)}
}

func (r *countingRuntime) Backend() cuda.Backend { return nil }
func (r *countingRuntime) ReserveCapped(ctx context.Context, loc, name, capName string, capBytes, bytes int64) error {
	err := r.ledgerBook.ReserveCapped(ctx, loc, name, capName, capBytes, bytes)
	if err == nil {
		r.live.Add(1)
	}
	return err
}
func (r *countingRuntime) Unreserve(ctx context.Context, name string) error {
	r.live.Add(-1)
	return r.ledgerBook.Unreserve(ctx, name)
}

// Waiting reserves are served first in first out, and a release wakes only
// the waiters it can satisfy: n reserves queued on a full cap, released one
// at a time, are admitted in their order of arrival, and each looks at the
// budget once on arrival and once more when its bytes are free. The flush
// hook counts the looks that found no room: exactly n (one per arrival).
// Waking every waiter on every release (a broadcast) made each release
// cost a look, and a flush, per waiter: n²/2 in all; with thousands of
// requests waiting in demo offload that work starved the copy path that
// frees the bytes, and the run fell from seconds to minutes.
func TestWaitingReservesAreServedInOrderWithoutHerd(t *testing.T) {
	const n = 40
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a lost wake-up fails here instead of hanging
	defer cancel()
	rt := newCountingRuntime(t)
	b, err := newGPUBudget(rt, "cuda:0", "t", 1)
	require.NoError(t, err)
	var misses atomic.Int64
	arrived := make(chan struct{}, n)
	b.flush = func() (TaskID, bool) { // nothing deferred to flush: a miss only waits
		misses.Add(1)
		select {
		case arrived <- struct{}{}:
		default:
		}
		return 0, false
	}
	first, err := b.reserve(ctx, 1, true, 0)
	require.NoError(t, err)

	type admitted struct {
		i  int
		tk *ticket
	}
	got := make(chan admitted, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, err := b.reserve(ctx, 1, true, 0)
			assert.NoError(t, err)
			got <- admitted{i, tk}
		}()
		select { // reserve i missed and queued before i+1 starts
		case <-arrived:
		case <-ctx.Done():
			t.Fatal("reserve did not miss")
		}
	}
	require.EqualValues(t, n, misses.Load())

	held := first
	for want := range n {
		require.NoError(t, b.release(ctx, held))
		select {
		case a := <-got:
			assert.Equal(t, want, a.i, "first in, first out")
			held = a.tk
		case <-ctx.Done():
			t.Fatalf("reserve %d was not woken by a release (lost wake-up)", want)
		}
	}
	require.NoError(t, b.release(ctx, held))
	wg.Wait()
	assert.EqualValues(t, n, misses.Load(), "looks that found no room: one per arrival, none per release")
	assert.Zero(t, rt.live.Load())
	assert.Zero(t, b.state().used)
}

// A queued reserve that gives up (its ctx ends) hands the bytes it was
// first in line for to the reserve behind it, and a failure wakes every
// waiting reserve with the failure.
func TestQueuedReserveLeavingAndFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a lost wake-up fails here instead of hanging
	defer cancel()
	b, err := newGPUBudget(newCountingRuntime(t), "cuda:0", "t", 2)
	require.NoError(t, err)
	missed := make(chan struct{}, 8)
	b.flush = func() (TaskID, bool) { missed <- struct{}{}; return 0, false }
	miss := func() {
		t.Helper()
		select {
		case <-missed:
		case <-ctx.Done():
			t.Fatal("no miss")
		}
	}
	h1, err := b.reserve(ctx, 1, true, 0)
	require.NoError(t, err)
	h2, err := b.reserve(ctx, 1, true, 0)
	require.NoError(t, err)

	actx, acancel := context.WithCancel(ctx)
	aErr := make(chan error, 1)
	go func() { _, err := b.reserve(actx, 2, true, 0); aErr <- err }()
	miss() // A (2 bytes) queued first
	bTk := make(chan *ticket, 1)
	go func() {
		tk, err := b.reserve(ctx, 1, true, 0)
		assert.NoError(t, err)
		bTk <- tk
	}()
	miss() // B (1 byte) queued behind A
	require.NoError(t, b.release(ctx, h1))
	miss() // A woke, 1 byte is not enough: it flushes again; B stays behind it
	acancel()
	require.ErrorIs(t, <-aErr, context.Canceled)
	var tk *ticket
	select {
	case tk = <-bTk: // A left: B takes the free byte
	case <-ctx.Done():
		t.Fatal("the reserve behind a leaving one was not woken")
	}
	assert.EqualValues(t, 2, b.state().used)

	// Two reserves wait on a full cap; a failure wakes both with it.
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := b.reserve(ctx, 1, true, 0); errs <- err }()
		miss()
	}
	boom := errors.New("boom")
	b.fail(boom)
	for range 2 {
		select {
		case err := <-errs:
			assert.ErrorIs(t, err, boom)
		case <-ctx.Done():
			t.Fatal("a failure did not wake a waiting reserve")
		}
	}
	require.NoError(t, b.release(ctx, tk))
	require.NoError(t, b.release(ctx, h2))
	assert.Zero(t, b.state().used)
	assert.Zero(t, b.waiters.Len())
}
