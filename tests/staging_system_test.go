package tests

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
)

// The device→host write pipeline (package staging) on a real runtime: the
// soft backend behind system.System, every reservation in the runtime's
// ledger, every byte real.

const stRow = 256 // pool row size of these tests

// stagingConfig is the pipeline of these tests: 2 keys × 64 pool slots of
// 256 bytes, slots of 16 rows.
func stagingConfig(name string) staging.Config {
	return staging.Config{
		Name: name, Device: "cuda:0", Slots: 3, SlotBytes: 16 * stRow, ClaimTimeout: 10 * time.Second,
		Keys: []string{"k", "v"}, PoolSlots: 64, RowBytes: stRow,
		CloneBudgetBytes: 64 * stRow,
	}
}

func newPipeline(t *testing.T, sys *system.System, cfg staging.Config) *staging.Pipeline {
	t.Helper()
	p, err := staging.New(context.Background(), sys, cfg)
	require.NoError(t, err, "staging.New")
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// devBuf allocates a device buffer at cuda:0 holding data (freed when the
// test ends, before the runtime closes).
func devBuf(t *testing.T, sys *system.System, data []byte) cuda.Buffer {
	t.Helper()
	ctx := context.Background()
	be := sys.Backend()
	b, err := be.Allocate(ctx, "cuda:0", int64(len(data)))
	require.NoError(t, err)
	require.NoError(t, be.Write(ctx, b, data))
	t.Cleanup(func() { _ = be.Free(b) })
	return b
}

// reservation returns the named reservation at loc in s, if any.
func reservation(s system.Snapshot, loc, name string) (budget.ReservationRecord, bool) {
	l, ok := s.Location(loc)
	if !ok {
		return budget.ReservationRecord{}, false
	}
	for _, r := range l.Reservations {
		if r.Name == name {
			return r, true
		}
	}
	return budget.ReservationRecord{}, false
}

// clones lists the pipeline's clone reservations at cuda:0 in s.
func clones(s system.Snapshot, name string) []budget.ReservationRecord {
	var out []budget.ReservationRecord
	l, _ := s.Location("cuda:0")
	for _, r := range l.Reservations {
		if strings.HasPrefix(r.Name, name+"/clone/") {
			out = append(out, r)
		}
	}
	return out
}

// stGate is a freeze event the test completes.
type stGate struct{ ch chan struct{} }

func newStGate() *stGate                { return &stGate{ch: make(chan struct{})} }
func (g *stGate) open()                 { close(g.ch) }
func (g *stGate) Done() <-chan struct{} { return g.ch }
func (g *stGate) Err() error            { return nil }
func (g *stGate) Query() bool {
	select {
	case <-g.ch:
		return true
	default:
		return false
	}
}
func (g *stGate) Wait(ctx context.Context) error {
	select {
	case <-g.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Both join modes write exactly the rows' bytes into the pool: rows taken
// from scattered offsets of the save, in another order than the pool's,
// over two keys; the pipeline's reservations are in the runtime's snapshot.
func TestStagingBothJoinModesByteExact(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sys := start(t, system.Options{Locations: fourLocations(0, 1<<20, 1<<20)})
	cfg := stagingConfig("kv")
	p := newPipeline(t, sys, cfg)

	s := snapshot(t, sys)
	slots, ok := reservation(s, "pinned-host", "kv/slots")
	require.True(t, ok, "the slots are a reservation at pinned-host")
	assert.Equal(t, int64(cfg.Slots)*cfg.SlotBytes, slots.Bytes)
	pool, ok := reservation(s, "pageable-host", "kv/pool")
	require.True(t, ok, "the pool is a reservation at pageable-host")
	assert.Equal(t, int64(len(cfg.Keys)*cfg.PoolSlots)*cfg.RowBytes, pool.Bytes)

	// JOIN_NEXT_STEP: a whole step of 12 rows; the task takes 6 of them,
	// for both keys, out of order.
	step := pattern(12*stRow, 0x11)
	stepBuf := devBuf(t, sys, step)
	st, err := p.Stage(ctx, stepBuf, nil)
	require.NoError(t, err)
	next, err := p.Open(ctx, staging.TaskSpec{ReqID: "req-1", WriteN: 1, Mode: staging.JoinNextStep})
	require.NoError(t, err)
	nextRows := []staging.Row{
		{Key: "k", Slot: 7, Offset: 11 * stRow}, {Key: "k", Slot: 3, Offset: 0},
		{Key: "v", Slot: 7, Offset: 5 * stRow}, {Key: "v", Slot: 8, Offset: 6 * stRow},
		{Key: "k", Slot: 4, Offset: 2 * stRow}, {Key: "v", Slot: 63, Offset: 9 * stRow},
	}
	require.NoError(t, next.Append(ctx, staging.Chunk{Step: st, Rows: nextRows}))
	require.NoError(t, p.Submit(ctx, next))
	require.NoError(t, st.Release())
	require.NoError(t, next.Wait(ctx))
	assert.Equal(t, staging.Written, next.State())

	// JOIN_ON_FINISH: two saves cloned on the device, submitted when the
	// request finishes.
	saveA, saveB := pattern(4*stRow, 0x22), pattern(3*stRow, 0x33)
	fin, err := p.Open(ctx, staging.TaskSpec{ReqID: "req-2", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	finRowsA := []staging.Row{{Key: "k", Slot: 20, Offset: 3 * stRow}, {Key: "v", Slot: 21, Offset: stRow}}
	finRowsB := []staging.Row{{Key: "k", Slot: 22, Offset: 2 * stRow}, {Key: "v", Slot: 0, Offset: 0}}
	require.NoError(t, fin.Append(ctx, staging.Chunk{Device: devBuf(t, sys, saveA), Rows: finRowsA}))
	require.NoError(t, fin.Append(ctx, staging.Chunk{Device: devBuf(t, sys, saveB), Rows: finRowsB}))
	assert.Equal(t, staging.Pending, fin.State())
	require.NoError(t, p.Submit(ctx, fin))
	require.NoError(t, fin.Wait(ctx))

	check := func(rows []staging.Row, save []byte, what string) {
		t.Helper()
		for _, r := range rows {
			got, err := p.ReadPool(r.Key, r.Slot)
			require.NoError(t, err)
			requireBytes(t, save[r.Offset:r.Offset+stRow], got, fmt.Sprintf("%s: pool row (%s, %d)", what, r.Key, r.Slot))
		}
	}
	check(nextRows, step, "JOIN_NEXT_STEP")
	check(finRowsA, saveA, "JOIN_ON_FINISH first save")
	check(finRowsB, saveB, "JOIN_ON_FINISH second save")
	untouched, err := p.ReadPool("k", 5)
	require.NoError(t, err)
	requireBytes(t, make([]byte, stRow), untouched, "a row no task wrote")
	written := int64(len(nextRows)+len(finRowsA)+len(finRowsB)) * stRow
	stats := p.Stats()
	assert.Equal(t, written, stats.CommittedBytes)
	assert.Equal(t, int64(2), stats.Written)

	// Nothing of the clones is left on the device's books.
	s = snapshot(t, sys)
	assert.Zero(t, loc(t, s, "cuda:0").ReservedBytes)
	assert.Empty(t, loc(t, s, "cuda:0").Reservations)
}

// A device clone is a named reservation at cuda:0: it shows in the
// snapshot and shares the location's budget with resident values, in both
// directions. A Place that only the clone's reservation keeps out is
// refused with the exact figures; a clone that only the resident value
// keeps out flushes the oldest deferred task and goes on.
func TestStagingCloneSharesDeviceBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const devBudget = 16 * stRow
	sys := start(t, system.Options{Locations: fourLocations(0, 0, devBudget)})
	register(t, sys, system.Value{Name: "resident", Bytes: 8 * stRow, At: "cuda:0", Data: pattern(8*stRow, 1)})
	cfg := stagingConfig("kv")
	p := newPipeline(t, sys, cfg)

	// The oldest deferred task: a 4-row clone.
	save1 := pattern(4*stRow, 0x41)
	oldest, err := p.Open(ctx, staging.TaskSpec{ReqID: "old", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	rows1 := []staging.Row{{Key: "k", Slot: 1, Offset: 0}, {Key: "k", Slot: 2, Offset: 3 * stRow}}
	require.NoError(t, oldest.Append(ctx, staging.Chunk{Device: devBuf(t, sys, save1), Rows: rows1}))

	s := snapshot(t, sys)
	cl := clones(s, "kv")
	require.Len(t, cl, 1, "the clone is a reservation at cuda:0: %+v", loc(t, s, "cuda:0").Reservations)
	assert.Equal(t, int64(4*stRow), cl[0].Bytes)
	first := cl[0].Name
	dev := loc(t, s, "cuda:0")
	assert.Equal(t, int64(8*stRow), dev.UsedBytes)
	assert.Equal(t, int64(4*stRow), dev.ReservedBytes)

	// A value of 6 rows fits the budget (8 + 6 ≤ 16) but not beside the
	// clone's reservation (8 + 4 + 6 > 16).
	other := register(t, sys, system.Value{Name: "other", Bytes: 6 * stRow, At: "pageable-host", Data: pattern(6*stRow, 2)})
	before := snapshot(t, sys)
	err = sys.Place(ctx, other, "cuda:0")
	be := as[*system.BudgetError](t, err, "place other at cuda:0 beside the clone")
	equal(t, system.BudgetError{Location: "cuda:0", BudgetBytes: devBudget, UsedBytes: 8 * stRow, ReservedBytes: 4 * stRow, RequestedBytes: 6 * stRow}, *be, "budget error of the place")
	unchanged(t, sys, before, "refused place")

	// A second deferred task wants 6 rows of clone: the pipeline's own cap
	// (64 rows) has room, the location does not (8 + 4 + 6 > 16). Budget
	// pressure flushes the oldest deferred task; its clone's release makes
	// room.
	save2 := pattern(6*stRow, 0x42)
	younger, err := p.Open(ctx, staging.TaskSpec{ReqID: "young", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	rows2 := []staging.Row{{Key: "v", Slot: 9, Offset: 5 * stRow}}
	require.NoError(t, younger.Append(ctx, staging.Chunk{Device: devBuf(t, sys, save2), Rows: rows2}))
	require.NoError(t, oldest.Wait(ctx), "the oldest deferred task was flushed and written")
	assert.Equal(t, staging.Pending, younger.State(), "the new task stays deferred")
	stats := p.Stats()
	assert.Equal(t, int64(1), stats.Flushes)
	assert.Equal(t, int64(6*stRow), stats.CloneBytes)
	for _, r := range rows1 {
		got, err := p.ReadPool(r.Key, r.Slot)
		require.NoError(t, err)
		requireBytes(t, save1[r.Offset:r.Offset+stRow], got, "flushed task's row")
	}
	s = snapshot(t, sys)
	cl = clones(s, "kv")
	require.Len(t, cl, 1, "only the new clone is reserved: %+v", cl)
	assert.NotEqual(t, first, cl[0].Name, "the flushed clone's reservation is released")
	assert.Equal(t, int64(6*stRow), cl[0].Bytes)
	assert.Equal(t, int64(6*stRow), loc(t, s, "cuda:0").ReservedBytes)

	// The younger clone still keeps the value out: 8 + 6 + 6 > 16.
	err = sys.Place(ctx, other, "cuda:0")
	be = as[*system.BudgetError](t, err, "place other beside the second clone")
	equal(t, system.BudgetError{Location: "cuda:0", BudgetBytes: devBudget, UsedBytes: 8 * stRow, ReservedBytes: 6 * stRow, RequestedBytes: 6 * stRow}, *be, "budget error of the second place")

	// Finished: the clone is copied out, its reservation released, and the
	// value fits.
	require.NoError(t, p.Submit(ctx, younger))
	require.NoError(t, younger.Wait(ctx))
	got, err := p.ReadPool("v", 9)
	require.NoError(t, err)
	requireBytes(t, save2[5*stRow:6*stRow], got, "younger task's row")
	require.NoError(t, sys.Place(ctx, other, "cuda:0"))
	s = snapshot(t, sys)
	dev = loc(t, s, "cuda:0")
	assert.Equal(t, int64(14*stRow), dev.UsedBytes)
	assert.Zero(t, dev.ReservedBytes)

	// Now the location is full of resident bytes: a clone that cannot fit
	// with nothing of the pipeline's to flush is the runtime's BudgetError.
	third, err := p.Open(ctx, staging.TaskSpec{ReqID: "third", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	err = third.Append(ctx, staging.Chunk{Device: devBuf(t, sys, pattern(4*stRow, 3)), Rows: []staging.Row{{Key: "k", Slot: 30}}})
	be = as[*system.BudgetError](t, err, "a clone with nothing to flush")
	equal(t, system.BudgetError{Location: "cuda:0", BudgetBytes: devBudget, UsedBytes: 14 * stRow, ReservedBytes: 0, RequestedBytes: 4 * stRow}, *be, "budget error of the clone")
	// And a try-reserve is a drop, counted by reason.
	err = third.Append(ctx, staging.Chunk{Device: devBuf(t, sys, pattern(4*stRow, 3)), Rows: []staging.Row{{Key: "k", Slot: 30}}, NoWait: true})
	drop := as[*staging.DropError](t, err, "try-reserve at a full location")
	assert.Equal(t, staging.DropLocation, drop.Reason)
	assert.Equal(t, map[string]int64{staging.DropLocation: 1}, p.Stats().Drops)
	assert.Zero(t, loc(t, snapshot(t, sys), "cuda:0").ReservedBytes)
}

// A failed device→host copy (an injected copy fault at pinned-host) wakes
// every waiter with the fault, after the failure record is published;
// pending tasks fail with the record and release their clones; every
// later call returns the record.
func TestStagingCopyFailureWakesWaitersAndPoisons(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1<<20)})
	p := newPipeline(t, sys, stagingConfig("kv"))

	pending, err := p.Open(ctx, staging.TaskSpec{ReqID: "deferred", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	require.NoError(t, pending.Append(ctx, staging.Chunk{Device: devBuf(t, sys, pattern(2*stRow, 5)), Rows: []staging.Row{{Key: "v", Slot: 0}}}))
	_, err = pending.ReadRow(ctx, "v", 0) // waits for the clone to land on the device
	require.NoError(t, err)
	require.Len(t, clones(snapshot(t, sys), "kv"), 1)

	testsys.Faults(sys).Arm(cuda.FaultCopy, "pinned-host") // the step's copy into its slot fails
	freeze := newStGate()
	st, err := p.Stage(ctx, devBuf(t, sys, pattern(4*stRow, 6)), freeze)
	require.NoError(t, err)
	task, err := p.Open(ctx, staging.TaskSpec{ReqID: "step", WriteN: 1, Mode: staging.JoinNextStep})
	require.NoError(t, err)
	require.NoError(t, task.Append(ctx, staging.Chunk{Step: st, Rows: []staging.Row{{Key: "k", Slot: 1, Offset: stRow}}}))
	require.NoError(t, p.Submit(ctx, task))

	type woke struct{ err, record error }
	waits := []func(context.Context) error{task.WaitHostReady, task.Wait, task.Wait, pending.Wait, pending.WaitHostReady}
	results := make(chan woke, len(waits))
	for _, w := range waits {
		go func() {
			err := w(ctx)
			results <- woke{err, p.Err()}
		}()
	}
	freeze.open()
	for range waits {
		r := <-results
		var inj *cuda.InjectedFaultError
		require.ErrorAs(t, r.err, &inj, "every waiter wakes with the copy fault")
		assert.Equal(t, "pinned-host", inj.Location)
		require.Error(t, r.record, "the failure record is published before a waiter wakes")
	}
	assert.Equal(t, staging.Failed, task.State())
	assert.Equal(t, staging.Failed, pending.State())
	failed := as[*staging.FailedError](t, p.Err(), "the failure record")
	assert.Equal(t, task.ID(), failed.Task)

	// The pending task's clone is released in the runtime.
	s := snapshot(t, sys)
	assert.Zero(t, loc(t, s, "cuda:0").ReservedBytes)
	assert.Zero(t, p.Stats().CloneBytes)

	// Poisoned: every later call returns the record.
	_, err = p.Stage(ctx, nil, nil)
	as[*staging.FailedError](t, err, "Stage after the failure")
	_, err = p.Open(ctx, staging.TaskSpec{Mode: staging.JoinNextStep})
	as[*staging.FailedError](t, err, "Open after the failure")
	as[*staging.FailedError](t, task.Append(ctx, staging.Chunk{Step: st, Rows: []staging.Row{{Key: "k", Slot: 2}}}), "Append after the failure")
	as[*staging.FailedError](t, p.Submit(ctx, task), "Submit after the failure")
	as[*staging.FailedError](t, p.Prioritize(ctx, task.ID()), "Prioritize after the failure")
	_, err = p.ReadPool("k", 1)
	as[*staging.FailedError](t, err, "ReadPool after the failure")
	_, err = task.ReadRow(ctx, "k", 1)
	as[*staging.FailedError](t, err, "ReadRow after the failure")

	require.NoError(t, st.Release())
	require.NoError(t, p.Close(ctx))
	s = snapshot(t, sys)
	for _, l := range s.Locations {
		assert.Zero(t, l.ReservedBytes, "%s after Close", l.Location)
	}
}

// Close releases every reservation of the pipeline and frees every buffer
// of it, even with a step never released and a deferred task never
// submitted: the snapshot is back at zero, and after the runtime closes
// the backend holds no byte.
func TestStagingCloseReleasesEverything(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locs := []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}
	be, err := soft.New(soft.Config{Locations: locs})
	require.NoError(t, err)
	defer func() { require.NoError(t, be.Close()) }()
	sys, err := system.Start(ctx, system.Options{Locations: fourLocations(0, 1<<20, 1<<20), Backend: be})
	require.NoError(t, err)
	defer func() { _ = sys.Close(context.Background()) }()

	p, err := staging.New(ctx, sys, stagingConfig("kv"))
	require.NoError(t, err)
	stepData, saveData := pattern(8*stRow, 7), pattern(2*stRow, 8)
	stepBuf, err := be.Allocate(ctx, "cuda:0", int64(len(stepData)))
	require.NoError(t, err)
	require.NoError(t, be.Write(ctx, stepBuf, stepData))
	saveBuf, err := be.Allocate(ctx, "cuda:0", int64(len(saveData)))
	require.NoError(t, err)
	require.NoError(t, be.Write(ctx, saveBuf, saveData))

	// A written task, a step never released, a task submitted but not
	// waited for, and a deferred task never submitted.
	st1, err := p.Stage(ctx, stepBuf, nil)
	require.NoError(t, err)
	done, err := p.Open(ctx, staging.TaskSpec{ReqID: "a", WriteN: 1, Mode: staging.JoinNextStep})
	require.NoError(t, err)
	require.NoError(t, done.Append(ctx, staging.Chunk{Step: st1, Rows: []staging.Row{{Key: "k", Slot: 0, Offset: stRow}}}))
	require.NoError(t, p.Submit(ctx, done))
	require.NoError(t, done.Wait(ctx))
	require.NoError(t, st1.Release())
	st2, err := p.Stage(ctx, stepBuf, nil) // never released
	require.NoError(t, err)
	inFlight, err := p.Open(ctx, staging.TaskSpec{ReqID: "b", WriteN: 1, Mode: staging.JoinNextStep})
	require.NoError(t, err)
	require.NoError(t, inFlight.Append(ctx, staging.Chunk{Step: st2, Rows: []staging.Row{{Key: "k", Slot: 1, Offset: 2 * stRow}}}))
	require.NoError(t, p.Submit(ctx, inFlight))
	deferred, err := p.Open(ctx, staging.TaskSpec{ReqID: "c", WriteN: 1, Mode: staging.JoinOnFinish})
	require.NoError(t, err)
	require.NoError(t, deferred.Append(ctx, staging.Chunk{Device: saveBuf, Rows: []staging.Row{{Key: "v", Slot: 2, Offset: stRow}}}))

	s := snapshot(t, sys)
	for _, l := range []string{"pageable-host", "pinned-host", "cuda:0"} {
		assert.NotZero(t, loc(t, s, l).ReservedBytes, "the pipeline holds reservations at %s", l)
	}

	require.NoError(t, p.Close(ctx))
	assert.Equal(t, staging.Written, inFlight.State(), "Close writes the tasks in flight")
	assert.Equal(t, staging.Written, deferred.State(), "Close submits the deferred task")
	assert.ErrorIs(t, p.Submit(ctx, deferred), staging.ErrClosed)
	stats := p.Stats()
	assert.Equal(t, stats.Slots, stats.FreeSlots)
	assert.Zero(t, stats.CloneBytes)
	assert.Zero(t, stats.LiveSteps)

	s = snapshot(t, sys)
	for _, l := range s.Locations {
		assert.Zero(t, l.ReservedBytes, "%s: reserved after Close", l.Location)
		assert.Empty(t, l.Reservations, "%s: reservations after Close", l.Location)
		assert.Zero(t, l.UsedBytes, "%s: used after Close", l.Location)
	}
	require.NoError(t, be.Free(stepBuf))
	require.NoError(t, be.Free(saveBuf))
	require.NoError(t, sys.Close(ctx))
	for _, l := range locs {
		mi, err := be.MemInfo(l)
		require.NoError(t, err)
		assert.Zero(t, mi.UsedBytes, "%s: backend bytes after Close", l)
	}
}

// A concurrent run: producers stage steps and write both join modes under
// a small clone budget and a device location shared with a value that
// another goroutine keeps placing and evicting, while snapshots are taken
// and checked. Every snapshot satisfies the ledger's invariants, and every
// pool row ends with the last bytes written to it.
func TestStagingConcurrentRunInvariants(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const devBudget = 48 * stRow
	sys := start(t, system.Options{Locations: fourLocations(0, 0, devBudget)})
	cfg := stagingConfig("kv")
	cfg.CloneBudgetBytes = 12 * stRow
	p := newPipeline(t, sys, cfg)
	// The tenant (40 rows) and the clones (at most 12) do not fit together:
	// each keeps the other out of cuda:0 at times.
	tenant := register(t, sys, system.Value{Name: "tenant", Bytes: 40 * stRow, At: "pageable-host", Data: pattern(40*stRow, 9)})

	const producers, rounds = 4, 100
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, producers+2)
	// Snapshots, checked as the run goes.
	var snaps int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			s, err := sys.Snapshot(ctx)
			if err == nil {
				err = checkInvariants(s)
			}
			if err != nil {
				errs <- err
				return
			}
			snaps++
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	// A resident value competing for cuda:0.
	var placed, refused int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := sys.Place(ctx, tenant, "cuda:0"); err == nil {
				placed++
				time.Sleep(100 * time.Microsecond)
				_ = sys.Evict(ctx, tenant, "cuda:0")
				time.Sleep(100 * time.Microsecond)
			} else if errorType(err) == "BudgetError" {
				refused++
			} else if errorType(err) != "BudgetError" {
				errs <- fmt.Errorf("place tenant: %w", err)
				return
			}
		}
	}()

	// Producer i owns pool slots [16i, 16i+16): rows of key k from steps,
	// rows of key v from clones; the last round's bytes are what stays.
	last := make([][2][]byte, producers)
	var pwg, frees sync.WaitGroup
	for i := range producers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			var tasks []*staging.Task
			be := sys.Backend()
			for r := range rounds {
				seed := byte(i*rounds + r)
				stepData, saveData := pattern(8*stRow, seed), pattern(4*stRow, ^seed)
				stepBuf, err := be.Allocate(ctx, "cuda:0", int64(len(stepData)))
				if err == nil {
					err = be.Write(ctx, stepBuf, stepData)
				}
				if err != nil {
					errs <- err
					return
				}
				st, err := p.Stage(ctx, stepBuf, nil)
				if err != nil {
					errs <- fmt.Errorf("stage: %w", err)
					return
				}
				next, _ := p.Open(ctx, staging.TaskSpec{ReqID: fmt.Sprintf("p%d", i), WriteN: r, Mode: staging.JoinNextStep})
				var rows []staging.Row
				for j := range 8 {
					rows = append(rows, staging.Row{Key: "k", Slot: 16*i + (j*5+r)%16, Offset: int64(j) * stRow})
				}
				if err := next.Append(ctx, staging.Chunk{Step: st, Rows: rows}); err != nil {
					errs <- fmt.Errorf("append step: %w", err)
					return
				}
				if err := p.Submit(ctx, next); err != nil {
					errs <- err
					return
				}
				// The device buffer may be reused after the step's copy.
				if err := st.Event().Wait(ctx); err != nil {
					errs <- err
					return
				}
				_ = be.Free(stepBuf)
				_ = st.Release()

				saveBuf, err := be.Allocate(ctx, "cuda:0", int64(len(saveData)))
				if err == nil {
					err = be.Write(ctx, saveBuf, saveData)
				}
				if err != nil {
					errs <- err
					return
				}
				fin, _ := p.Open(ctx, staging.TaskSpec{ReqID: fmt.Sprintf("p%d", i), WriteN: r, Mode: staging.JoinOnFinish})
				err = fin.Append(ctx, staging.Chunk{Device: saveBuf, Rows: []staging.Row{
					{Key: "v", Slot: 16 * i, Offset: 0}, {Key: "v", Slot: 16*i + 1 + r%15, Offset: 3 * stRow}}})
				if err != nil && errorType(err) != "BudgetError" {
					errs <- fmt.Errorf("append clone: %w", err)
					return
				}
				if err == nil {
					if r%2 == 0 {
						_ = p.Submit(ctx, fin) // the others wait for budget pressure or the end
					}
					tasks = append(tasks, fin)
				}
				tasks = append(tasks, next)
				// Free the save once its clone has been copied out.
				if err == nil {
					frees.Add(1)
					go func() { defer frees.Done(); _ = fin.WaitHostReady(ctx); _ = be.Free(saveBuf) }()
				} else {
					_ = be.Free(saveBuf)
				}
				if r == rounds-1 {
					last[i] = [2][]byte{stepData, saveData}
				}
			}
			if err := p.Submit(ctx, tasks...); err != nil {
				errs <- err
				return
			}
			for _, t := range tasks {
				if err := t.Wait(ctx); err != nil {
					errs <- fmt.Errorf("task %d: %w", t.ID(), err)
					return
				}
			}
		}()
	}
	pwg.Wait()
	frees.Wait()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("%d snapshots checked during the run; tenant placed %d times, refused %d; %+v", snaps, placed, refused, p.Stats())

	// The step rows of the last round are the k rows' bytes.
	for i := range producers {
		r := rounds - 1
		for j := range 8 {
			got, err := p.ReadPool("k", 16*i+(j*5+r)%16)
			require.NoError(t, err)
			requireBytes(t, last[i][0][j*stRow:(j+1)*stRow], got, fmt.Sprintf("producer %d k row %d", i, j))
		}
	}
	stats := p.Stats()
	assert.Zero(t, stats.CloneBytes)
	assert.Equal(t, stats.Slots, stats.FreeSlots)
	require.NoError(t, p.Close(ctx))
	s := snapshot(t, sys)
	for _, l := range s.Locations {
		assert.Zero(t, l.ReservedBytes, "%s after Close", l.Location)
	}
}
