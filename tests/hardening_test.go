package tests

// Regression tests of the runtime's hardening (event watches, allocation
// timeouts, concurrent registrations, supervisor panics), the atomic
// admission path, and the runtime's fatal stop.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/internal/testhooks"
	"github.com/residency-go/residency/internal/testsys"
	"github.com/residency-go/residency/system"
)

// endsAfterSend is a context that is still live when a call checks it
// before sending, and already done while the call waits for the reply: the
// caller gives up right after its request was sent (a done context wins
// over a reply already there, which is then handed back as a late one).
type endsAfterSend struct {
	context.Context
	checks atomic.Int32
	done   chan struct{}
}

func newEndsAfterSend() *endsAfterSend {
	c := &endsAfterSend{Context: context.Background(), done: make(chan struct{})}
	close(c.done)
	return c
}

func (c *endsAfterSend) Done() <-chan struct{} { return c.done }
func (c *endsAfterSend) Err() error {
	if c.checks.Add(1) == 1 {
		return nil
	}
	return context.Canceled
}

// waitUntil is waitFor with a condition that says why it does not hold
// yet, so a timeout reports the last reason.
func waitUntil(t *testing.T, sys *system.System, what string, cond func(system.Snapshot) error) {
	t.Helper()
	var last error
	waitFor(t, sys, what, func(s system.Snapshot) bool {
		last = cond(s)
		return last == nil
	})
	require.NoError(t, last, what)
}

func noPendingEvents(s system.Snapshot) error {
	for _, v := range s.Values {
		for _, m := range v.Materializations {
			if m.PendingEventCount != 0 {
				return fmt.Errorf("%s at %s has %d pending events", v.Handle.Name, m.Location, m.PendingEventCount)
			}
		}
	}
	return nil
}

// A RecordEvent whose caller gave up after sending must still be
// watched and reaped: the protection ends with the event.
func TestRecordEventAbandonedAfterSendIsStillReaped(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 64<<20)})
	const n = 200
	var handles []system.Handle
	var events []*system.ManualEvent
	abandoned := 0
	for i := range n {
		data := pattern(1024, byte(i))
		h := register(t, sys, system.Value{Name: fmt.Sprintf("kv-%d", i), Bytes: int64(len(data)), Source: "pageable-host", Loader: loaderOf(data)})
		require.NoError(t, sys.Place(ctx, h, "cuda:0"))
		l, err := sys.Acquire(ctx, h, "cuda:0")
		require.NoError(t, err)
		ev := system.NewManualEvent()
		_, err = l.RecordEvent(newEndsAfterSend(), ev)
		if err != nil {
			require.ErrorIs(t, err, context.Canceled)
			abandoned++
		}
		require.NoError(t, l.Release(ctx))
		handles, events = append(handles, h), append(events, ev)
	}
	require.Positive(t, abandoned, "no call was abandoned after sending: the test exercised nothing")
	t.Logf("%d of %d RecordEvent calls abandoned after sending", abandoned, n)
	// Every event was recorded (abandoned or not), so every materialization
	// is protected until its event completes.
	s := snapshot(t, sys)
	for _, h := range handles {
		assert.Equal(t, 1, mats(t, s, h.Name)["cuda:0"].PendingEventCount, "%s: the event must be recorded whether or not its caller waited", h.Name)
	}
	for _, ev := range events {
		ev.Complete()
	}
	waitUntil(t, sys, "every completed event reaped", noPendingEvents)
	for _, h := range handles {
		require.NoError(t, sys.Evict(ctx, h, "cuda:0"), "%s must be evictable once its event completed", h.Name)
	}
	require.NoError(t, sys.Close(ctx), "nothing may be outstanding at close")
}

// slowAllocBackend allocates late at one location while armed: it waits
// past the allocation deadline it was given and then allocates anyway (the
// worst case: a backend that ignores its context).
type slowAllocBackend struct {
	cuda.Backend
	loc   string
	armed atomic.Bool
	delay time.Duration
	late  chan struct{} // receives once per late allocation, after it returned
}

func (b *slowAllocBackend) Allocate(ctx context.Context, loc string, n int64) (cuda.Buffer, error) {
	if loc != b.loc || !b.armed.Load() {
		return b.Backend.Allocate(ctx, loc, n)
	}
	time.Sleep(b.delay) // the slow device; it does not look at ctx
	buf, err := b.Backend.Allocate(context.Background(), loc, n)
	defer func() { b.late <- struct{}{} }()
	return buf, err
}

func backendUsed(t *testing.T, b cuda.Backend, loc string) int64 {
	t.Helper()
	mi, err := b.MemInfo(loc)
	require.NoError(t, err)
	return mi.UsedBytes
}

// An allocation that outlives the allocation timeout must not
// leave a buffer behind that the ledger no longer charges; a retry works.
func TestAllocationTimeoutLeavesNoUnchargedBuffer(t *testing.T) {
	ctx := context.Background()
	locs := fourLocations(0, 0, 1<<20)
	base, err := soft.New(soft.Config{Locations: []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}, Capacity: map[string]int64{"cuda:0": 1 << 20, "cuda:1": 1 << 20}})
	require.NoError(t, err)
	defer base.Close()
	b := &slowAllocBackend{Backend: base, loc: "cuda:0", delay: 150 * time.Millisecond, late: make(chan struct{}, 4)}
	sys := start(t, system.Options{Locations: locs, Backend: b, AllocTimeout: 20 * time.Millisecond})
	data := pattern(4096, 9)
	h := register(t, sys, system.Value{Name: "w", Bytes: int64(len(data)), At: "pageable-host", Data: data})

	b.armed.Store(true)
	err = sys.Place(ctx, h, "cuda:0")
	var pe *system.PlanExecutionError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, system.PhaseExecute, pe.Phase)
	var te *system.AllocTimeoutError
	require.ErrorAs(t, err, &te, "the cause names the allocation timeout")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, "cuda:0", te.Location)
	// The failure is reported only after the late buffer was freed: at
	// this instant the device holds no more than the ledger charges.
	s := snapshot(t, sys)
	assert.Equal(t, int64(0), loc(t, s, "cuda:0").UsedBytes)
	assert.LessOrEqual(t, backendUsed(t, b, "cuda:0"), loc(t, s, "cuda:0").UsedBytes, "device bytes above admitted bytes")
	<-b.late // the late allocation has returned (and was freed)
	assert.Equal(t, int64(0), backendUsed(t, b, "cuda:0"), "the late buffer must be freed")

	b.armed.Store(false)
	require.NoError(t, sys.Place(ctx, h, "cuda:0"), "a retry must find no stale buffer")
	got, err := sys.Read(ctx, h, "cuda:0")
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "bytes after the retry")
	assert.Equal(t, int64(len(data)), backendUsed(t, b, "cuda:0"))
	require.NoError(t, sys.Close(ctx))
	assert.Equal(t, int64(0), backendUsed(t, b, "cuda:0"))
}

func TestNegativeAllocTimeoutIsInvalid(t *testing.T) {
	_, err := startSoft(t, context.Background(), system.Options{Locations: fourLocations(0, 0, 0), AllocTimeout: -time.Second})
	require.ErrorIs(t, err, system.ErrInvalidInput)
}

// Concurrent registrations of one name must each keep their own
// loader: the winner reconstructs its own bytes.
func TestConcurrentSameNameRegistrationsKeepTheirLoaders(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 64<<20)})
	const rounds, callers = 30, 6
	for r := range rounds {
		name := fmt.Sprintf("model-%d", r)
		var wg sync.WaitGroup
		winners := make(chan int, callers)
		handles := make([]system.Handle, callers)
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				data := pattern(2048, byte(c+1))
				h, err := sys.Register(ctx, system.Value{Name: name, Bytes: int64(len(data)), Source: "pageable-host", Loader: loaderOf(data)})
				if err == nil {
					handles[c] = h
					winners <- c
					return
				}
				if !errors.Is(err, system.ErrInvalidInput) {
					t.Errorf("round %d caller %d: a losing registration must be invalid input (duplicate name), got %v", r, c, err)
				}
			}()
		}
		wg.Wait()
		close(winners)
		var won []int
		for c := range winners {
			won = append(won, c)
		}
		require.Len(t, won, 1, "round %d: exactly one registration of %q wins", r, name)
		w := won[0]
		require.NoError(t, sys.Place(ctx, handles[w], "cuda:0"))
		got, err := sys.Read(ctx, handles[w], "cuda:0")
		require.NoError(t, err)
		require.True(t, bytes.Equal(pattern(2048, byte(w+1)), got), "round %d: the winner (caller %d) reconstructed another caller's bytes", r, w)
	}
}

// The atomic path decides and enters in one step: eight goroutines
// admitting and exiting concurrently never see a stale decision, while the
// two-step path (Decide, then ScopeFor(d).Enter) does under the same load.
func TestAdmitIsNeverStaleUnderLoad(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 64<<20, 64<<20)})
	const workers, iters = 8, 60
	var hs []system.Handle
	for i := range workers {
		data := pattern(4096, byte(i))
		hs = append(hs, register(t, sys, system.Value{Name: fmt.Sprintf("m%d", i), Bytes: int64(len(data)), Mode: system.Replicable, Source: "pageable-host", Loader: loaderOf(data)}))
	}
	run := func(atomicPath bool) (stale, other int64) {
		var wg sync.WaitGroup
		var nStale, nOther atomic.Int64
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := system.Request{Name: fmt.Sprintf("req-%d", w), Requirements: []system.Requirement{{Handle: hs[w], Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}}}}
				for range iters {
					var sc *system.Scope
					var err error
					if atomicPath {
						var d system.Decision
						sc, d, err = sys.Admit(ctx, req)
						if err == nil && d.ExploredStates == 0 {
							t.Errorf("Admit returned a decision without evidence: %+v", d)
						}
					} else {
						var d system.Decision
						d, err = sys.Decide(ctx, req)
						if err == nil {
							sc = sys.ScopeFor(d)
							err = sc.Enter(ctx)
						}
					}
					var se *system.StaleStateError
					switch {
					case errors.As(err, &se):
						nStale.Add(1)
						continue
					case err != nil:
						nOther.Add(1)
						t.Errorf("atomic=%v: %v", atomicPath, err)
						continue
					}
					if err := sc.Exit(ctx); err != nil {
						t.Errorf("exit: %v", err)
					}
				}
			}()
		}
		wg.Wait()
		return nStale.Load(), nOther.Load()
	}
	stale, other := run(true)
	assert.Zero(t, stale, "the atomic path must never be stale")
	assert.Zero(t, other)
	twoStepStale, _ := run(false)
	t.Logf("stale errors under load: atomic path %d, two-step path %d of %d", stale, twoStepStale, workers*iters)
	assert.Positive(t, twoStepStale, "the two-step path reports stale errors under load, as documented")
	s := snapshot(t, sys)
	for _, l := range s.Locations {
		assert.Zero(t, l.ReservedBytes, "%s: reservations left after every scope exited", l.Location)
	}
}

// Admit returns the decision as evidence and a scope that protects what it
// entered; its failures return no scope.
func TestAdmitEvidenceAndFailures(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 8192)})
	old := register(t, sys, system.Value{Name: "old", Bytes: 8192, Source: "pageable-host", Loader: loaderOf(pattern(8192, 1))})
	require.NoError(t, sys.Place(ctx, old, "cuda:0"))
	data := pattern(8192, 2)
	h := register(t, sys, system.Value{Name: "new", Bytes: 8192, Source: "pageable-host", Loader: loaderOf(data)})
	sc, d, err := sys.Admit(ctx, system.Request{Name: "chat", Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:0"}}}}})
	require.NoError(t, err)
	require.Len(t, d.Evictions, 1, "the decision names its eviction")
	assert.Equal(t, "old", d.Evictions[0].Handle.Name)
	assert.NotEmpty(t, d.Evictions[0].Reason)
	assert.Positive(t, d.ExploredStates)
	require.Len(t, sc.Leases(), 1)
	got, err := sys.Read(ctx, h, "cuda:0")
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	// The scope's lease protects the entered endpoint.
	var iu *system.InUseError
	require.ErrorAs(t, sys.Evict(ctx, h, "cuda:0"), &iu)
	require.ErrorIs(t, sys.Evict(ctx, h, "cuda:0"), system.ErrBusy)
	require.NoError(t, sc.Exit(ctx))
	require.NoError(t, sys.Evict(ctx, h, "cuda:0"))

	// Infeasible: a PlanError, no scope, nothing changed.
	big := register(t, sys, system.Value{Name: "big", Bytes: 1 << 20, Source: "pageable-host", Loader: loaderOf(pattern(1<<20, 3))})
	before := snapshot(t, sys).StateVersion
	sc, _, err = sys.Admit(ctx, system.Request{Name: "too-big", Requirements: []system.Requirement{{Handle: big, Tiers: [][]string{{"cuda:0"}}}}})
	require.ErrorIs(t, err, system.ErrPlan)
	assert.Nil(t, sc)
	assert.Equal(t, before, snapshot(t, sys).StateVersion)

	// A failure during entry: a PlanExecutionError, the decision alongside.
	testsys.Faults(sys).Arm(cuda.FaultAlloc, "cuda:0")
	sc, d, err = sys.Admit(ctx, system.Request{Name: "faulty", Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:0"}}}}})
	var pe *system.PlanExecutionError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, system.PhaseEnter, pe.Phase)
	assert.Nil(t, sc)
	assert.NotEmpty(t, d.Plan.Enter, "the decision is returned with the failure")
}

// An Admit whose caller gave up hands back what the entry took.
func TestAdmitAbandonedHandsBackItsScope(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 64<<20)})
	var hs []system.Handle
	for i := range 50 {
		hs = append(hs, register(t, sys, system.Value{Name: fmt.Sprintf("v%d", i), Bytes: 1024, Source: "pageable-host", Loader: loaderOf(pattern(1024, byte(i)))}))
	}
	abandoned := 0
	for _, h := range hs {
		sc, _, err := sys.Admit(newEndsAfterSend(), system.Request{Name: "r", Requirements: []system.Requirement{{Handle: h, Tiers: [][]string{{"cuda:0"}}}}, Reservations: []system.ReservationSpec{{Name: "scratch-" + h.Name, Location: "cuda:0", Bytes: 512}}})
		if err != nil {
			require.ErrorIs(t, err, context.Canceled)
			abandoned++
			continue
		}
		require.NoError(t, sc.Exit(ctx))
	}
	require.Positive(t, abandoned)
	waitUntil(t, sys, "abandoned scopes handed back", func(s system.Snapshot) error {
		for _, v := range s.Values {
			for _, m := range v.Materializations {
				if m.UseCount != 0 {
					return fmt.Errorf("%s at %s still leased", v.Handle.Name, m.Location)
				}
			}
		}
		if r := loc(t, s, "cuda:0").ReservedBytes; r != 0 {
			return fmt.Errorf("%d bytes still reserved", r)
		}
		return nil
	})
	require.NoError(t, sys.Close(ctx))
}

// gatedLoader blocks until release is closed, then produces data.
func gatedLoader(data []byte, entered chan<- struct{}, release <-chan struct{}) system.Loader {
	return func(ctx context.Context, dst []byte) error {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		copy(dst, data)
		return nil
	}
}

// A panic inside the supervisor (here: after the ledger granted
// a lease, before the reply) must not leave a runtime that carries on over
// a half-applied change, nor a caller without a reply. The runtime stops
// with a FatalError that the caller, every waiting caller and every later
// caller receive; Close frees every buffer.
func TestSupervisorPanicStopsTheRuntimeWithFatalError(t *testing.T) {
	ctx := context.Background()
	backend, err := soft.New(soft.Config{Locations: []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"}})
	require.NoError(t, err)
	defer backend.Close()
	var armed atomic.Bool
	sys := startHooked(t, testhooks.Knobs{
		AfterLedger: func(request string) {
			if request == "Acquire" && armed.CompareAndSwap(true, false) {
				panic("injected ledger invariant panic (test hook)")
			}
		},
	}, system.Options{Locations: fourLocations(0, 0, 1<<20), Backend: backend})
	h := register(t, sys, system.Value{Name: "resident", Bytes: 4096, At: "cuda:0", Data: pattern(4096, 1)})
	// A transfer in flight: its caller waits on the supervisor too.
	entered, release := make(chan struct{}, 1), make(chan struct{})
	slow := register(t, sys, system.Value{Name: "slow", Bytes: 4096, Source: "pageable-host", Loader: gatedLoader(pattern(4096, 2), entered, release)})
	placeErr := make(chan error, 1)
	go func() { placeErr <- sys.Place(ctx, slow, "cuda:1") }()
	<-entered

	armed.Store(true)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = sys.Acquire(wctx, h, "cuda:0")
	var fe *system.FatalError
	require.ErrorAs(t, err, &fe, "the caller whose request panicked gets the fatal error, not a wait")
	assert.Equal(t, "Acquire", fe.Message)
	assert.Contains(t, fe.Reason, "injected ledger invariant panic")
	assert.NotEmpty(t, fe.Stack)

	require.ErrorAs(t, <-placeErr, &fe, "a caller waiting on a transfer gets the fatal error")
	// Every later call, reads included: the ledger cannot be trusted.
	_, err = sys.Snapshot(ctx)
	require.ErrorAs(t, err, &fe)
	_, err = sys.Register(ctx, system.Value{Name: "later", Bytes: 1, At: "pageable-host"})
	require.ErrorAs(t, err, &fe)
	require.ErrorAs(t, sys.Place(ctx, h, "cuda:1"), &fe)

	close(release) // the in-flight transfer finishes into a stopped runtime
	require.ErrorAs(t, sys.Close(ctx), &fe, "Close reports the fatal stop")
	require.ErrorAs(t, sys.Close(ctx), &fe, "Close is idempotent")
	for _, l := range []string{"pageable-host", "pinned-host", "cuda:0", "cuda:1"} {
		assert.Zero(t, backendUsed(t, backend, l), "%s: Close after a fatal stop frees every buffer", l)
	}
}

// A registration with several problems reports the first in field order:
// the ledger's fields (name, bytes, replica mode, at or source, the
// location) before the runtime's own checks on later ones (the source's
// loader, the initial data's size).
func TestRegisterReportsTheFirstProblemInFieldOrder(t *testing.T) {
	ctx := context.Background()
	sys := start(t, system.Options{Locations: fourLocations(0, 0, 1<<20)})
	register(t, sys, system.Value{Name: "taken", Bytes: 8, At: "pageable-host"})
	cases := []struct {
		v    system.Value
		want string
	}{
		{system.Value{Name: "", Bytes: 8, Source: "pageable-host"}, "value name is empty"},
		{system.Value{Name: "taken", Bytes: 8, Source: "pageable-host"}, `duplicate value name "taken"`},
		{system.Value{Name: "a", Bytes: 0, Source: "pageable-host"}, "bytes must be positive"},
		{system.Value{Name: "a", Bytes: 8, Source: "gpu:0"}, `"gpu:0"`},
		{system.Value{Name: "a", Bytes: 8, Source: "cuda:7"}, "cuda:7"},
		{system.Value{Name: "a", Bytes: 8, Source: "pageable-host"}, "a source needs a loader"},
		{system.Value{Name: "a", Bytes: 8, At: "pageable-host", Loader: loaderOf(make([]byte, 8))}, "a loader needs a source location"},
		{system.Value{Name: "a", Bytes: 8, At: "pageable-host", Data: []byte{1}}, "data has 1 bytes, value has 8"},
	}
	before := snapshot(t, sys).StateVersion
	for _, c := range cases {
		_, err := sys.Register(ctx, c.v)
		require.Error(t, err, "%+v", c.v)
		assert.Contains(t, err.Error(), c.want, "%+v", c.v)
	}
	assert.Equal(t, before, snapshot(t, sys).StateVersion, "refusals change nothing")
	_, err := sys.Register(ctx, system.Value{Name: "a", Bytes: 0, Source: "pageable-host"})
	require.ErrorIs(t, err, system.ErrInvalidInput)
}
