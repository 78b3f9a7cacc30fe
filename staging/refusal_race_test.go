package staging_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// refusalHookRuntime is a ledger runtime that, when the device location
// refuses a clone's reservation, runs a hook before the refusal reaches
// the pipeline: the window between the runtime's answer and the reserve
// looking at its budget again, where the soak of issue 18 lost a race.
type refusalHookRuntime struct {
	*ledgerRuntime
	mu        sync.Mutex
	refusals  int    // clone reservations the location refused
	onRefusal func() // run at the next refusal, once
}

func (r *refusalHookRuntime) Reserve(ctx context.Context, loc, name string, bytes int64) error {
	return r.hooked(name, r.ledgerRuntime.Reserve(ctx, loc, name, bytes))
}

// ReserveCapped: a clone's reservation in the ledger's cap.
func (r *refusalHookRuntime) ReserveCapped(ctx context.Context, loc, name, capName string, capBytes, bytes int64) error {
	return r.hooked(name, r.ledgerRuntime.ReserveCapped(ctx, loc, name, capName, capBytes, bytes))
}

// hooked counts a location's refusal of a clone's reservation and runs the
// hook, then returns err.
func (r *refusalHookRuntime) hooked(name string, err error) error {
	var be *budget.BudgetError
	if errors.As(err, &be) && strings.Contains(name, "/clone/") {
		r.mu.Lock()
		r.refusals++
		hook := r.onRefusal
		r.onRefusal = nil
		r.mu.Unlock()
		if hook != nil {
			hook()
		}
	}
	return err
}

func (r *refusalHookRuntime) refused() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refusals
}

// newHookFixture is newFixture on a refusalHookRuntime over a ledger whose
// device location has devBudget bytes.
func newHookFixture(t *testing.T, cfg staging.Config, devBudget int64) (*fixture, *refusalHookRuntime) {
	t.Helper()
	rt := &refusalHookRuntime{ledgerRuntime: newRuntime(t, devBudget, soft.Config{})}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	p, err := staging.New(ctx, rt, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return &fixture{t: t, rt: rt.ledgerRuntime, p: p, cfg: cfg, ctx: ctx}, rt
}

// A blocking reserve that the device location refuses while a task of the
// pipeline's own still holds clone bytes there (on their way out: the task
// left Pending) does not return the refusal because, by the time it looks
// at its budget again, that task has released them: the refusal counted
// bytes that are gone, so it asks again, and gets them.
//
// Issue 18's soak (seed 1796145954631983065, at 29 min): an append of 48
// bytes at a 48-byte cuda:0 got "used 0 + reserved 32 + requested 48 >
// budget 48": the runtime refused while the flushed t5's 32 bytes were
// reserved, t5's release (runtime first, then the cap and the bytes on
// their way out) completed before the reserve relocked, and the reserve,
// seeing nothing held, nothing on its way out and nothing to flush,
// concluded that the location was full of others' bytes.
func TestLocationRefusalRacingOwnReleaseIsRetried(t *testing.T) {
	for _, leave := range []string{"submit", "prioritize"} {
		t.Run(leave, func(t *testing.T) {
			f, rt := newHookFixture(t, baseConfig(), 2*rowBytes)
			g := newGate()
			open := openOnce(t, g)
			c, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "c", Mode: staging.JoinOnFinish})
			require.NoError(t, err)
			require.NoError(t, c.Append(f.ctx, staging.Chunk{Device: f.device(fill(1, 2*rowBytes)), Freeze: g, Rows: rowsAt("k", 0, 1)}))
			if leave == "submit" {
				require.NoError(t, f.p.Submit(f.ctx, c))
			} else {
				require.NoError(t, f.p.Prioritize(f.ctx, c.ID()))
			}
			require.Equal(t, int64(2*rowBytes), f.rt.reserved("cuda:0"), "c's clone fills the location; its copy waits for g")

			// The location refuses b's clone for c's bytes; before the
			// refusal reaches the pipeline, c's copy lands and c is
			// written: its clone bytes are released.
			rt.mu.Lock()
			rt.onRefusal = func() {
				open()
				require.NoError(t, c.Wait(f.ctx))
				require.Zero(t, f.rt.reserved("cuda:0"), "c released its clone")
			}
			rt.mu.Unlock()
			b, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "b", Mode: staging.JoinOnFinish})
			require.NoError(t, err)
			err = b.Append(f.ctx, staging.Chunk{Device: f.device(fill(2, 2*rowBytes)), Rows: rowsAt("v", 0, 1)})
			require.NoError(t, err, "the refusal counted c's bytes, released since")
			assert.Equal(t, 1, rt.refused())
			assert.Zero(t, f.p.Stats().Flushes, "nothing needed a flush")
			assert.Equal(t, int64(2*rowBytes), f.rt.reserved("cuda:0"), "b's clone")

			require.NoError(t, f.p.Submit(f.ctx, b))
			require.NoError(t, b.Wait(f.ctx))
			assert.Equal(t, fill(1, rowBytes), f.pool("k", 1))
			assert.Equal(t, fill(2, rowBytes), f.pool("v", 1))
		})
	}
}

// A blocking reserve refused by the location while its flushed task's
// clone is on its way out sleeps until that task ends; it does not wake
// itself with the cap bytes it gave back and ask the runtime again and
// again. In the soak above it did: every look after the first refusal of a
// queued waiter found its own wake-up pending, so it asked the runtime in
// a loop until the flushed task came back, and each of those asks was one
// more chance for the race.
func TestLocationRefusedReserveSleepsUntilItsFlushEnds(t *testing.T) {
	f, rt := newHookFixture(t, baseConfig(), 2*rowBytes)
	g := newGate()
	open := openOnce(t, g)
	a := f.deferredTask(fill(1, rowBytes), "k", 0)
	c, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "c", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	require.NoError(t, c.Append(f.ctx, staging.Chunk{Device: f.device(fill(2, rowBytes)), Freeze: g, Rows: rowsAt("k", 1)}))
	b, err := f.p.Open(f.ctx, staging.TaskSpec{ReqID: "b", Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	dev := f.device(fill(3, 2*rowBytes))
	done := make(chan error, 1)
	go func() { done <- b.Append(f.ctx, staging.Chunk{Device: dev, Rows: rowsAt("v", 0, 1)}) }()
	// Refused for a and c: flush a (the oldest), wait for it; refused for
	// c: flush c, whose copy waits for g; then asleep until c ends.
	require.NoError(t, a.Wait(f.ctx))
	asleep := assert.Eventually(t, func() bool { return f.p.Stats().WaitingAppends == 1 }, 10*time.Second, time.Millisecond)
	require.True(t, asleep, "the reserve sleeps while c is on its way out: it asked the runtime %d times", rt.refused())
	assert.Equal(t, int64(2), f.p.Stats().Flushes)
	assert.Contains(t, []staging.TaskState{staging.Queued, staging.Copying}, c.State(), "c was flushed; its copy waits for g")
	assert.Equal(t, 2, rt.refused(), "one refusal per flush, none while waiting")
	open()
	require.NoError(t, <-done)
	assert.Equal(t, 2, rt.refused())
	require.NoError(t, f.p.Submit(f.ctx, b))
	require.NoError(t, b.Wait(f.ctx))
	assert.Equal(t, fill(3, rowBytes), f.pool("v", 1))
}
