package staging_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
	"github.com/residency-go/residency/cuda/faulty"
	"github.com/residency-go/residency/cuda/soft"
	"github.com/residency-go/residency/staging"
)

// ledgerRuntime is a minimal staging.Runtime for this package's tests: the
// soft backend (an honest simulation of pinned memory and a GPU in Go
// memory) behind the fault injector, and the pure ledger of package budget for the named
// reservations. The integration tests in tests/ use system.System.
type ledgerRuntime struct {
	be  *faulty.Backend
	mu  sync.Mutex
	led *budget.Ledger
	log *[]string // see record
}

// record makes r log every reservation it makes ("+name") and releases
// ("-name"), in order; the function returned gives the log so far.
func (r *ledgerRuntime) record() func() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = new([]string)
	return func() []string {
		r.mu.Lock()
		defer r.mu.Unlock()
		return append([]string(nil), *r.log...)
	}
}

// note logs a successful call (r.mu held).
func (r *ledgerRuntime) note(err error, entry string) error {
	if err == nil && r.log != nil {
		*r.log = append(*r.log, entry)
	}
	return err
}

func newRuntime(t testing.TB, devBudget int64, sc soft.Config) *ledgerRuntime {
	t.Helper()
	locs := []string{"pageable-host", "pinned-host", "cuda:0"}
	if sc.Locations == nil {
		sc.Locations = locs
	}
	be, err := soft.New(sc)
	require.NoError(t, err)
	cfgs := []budget.LocationConfig{{Name: "pageable-host"}, {Name: "pinned-host"}, {Name: "cuda:0"}}
	if devBudget > 0 {
		cfgs[2] = budget.LocationConfig{Name: "cuda:0", HasBudget: true, BudgetBytes: devBudget}
	}
	led, err := budget.New(budget.Config{ManagerID: "staging-test", Locations: cfgs})
	require.NoError(t, err)
	r := &ledgerRuntime{be: faulty.Wrap(be, soft.ErrorPrefix), led: led}
	t.Cleanup(func() { _ = be.Close() })
	return r
}

func (r *ledgerRuntime) Backend() cuda.Backend { return r.be }

func (r *ledgerRuntime) Reserve(_ context.Context, loc, name string, bytes int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.note(r.led.Reserve(loc, name, bytes), "+"+name)
}

func (r *ledgerRuntime) Unreserve(_ context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.note(r.led.Unreserve(name), "-"+name)
}

// ReserveCapped: the clone cap is in the ledger.
func (r *ledgerRuntime) ReserveCapped(_ context.Context, loc, name, capName string, capBytes, bytes int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.note(r.led.ReserveCapped(loc, name, capName, capBytes, bytes), "+"+name)
}

// reserved returns the reserved bytes of loc in the ledger.
func (r *ledgerRuntime) reserved(loc string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.led.Snapshot().Locations {
		if l.Location == loc {
			return l.ReservedBytes
		}
	}
	return -1
}

// fixture is a pipeline on a ledger runtime with a device buffer helper.
type fixture struct {
	t   testing.TB
	rt  *ledgerRuntime
	p   *staging.Pipeline
	cfg staging.Config
	ctx context.Context
}

const rowBytes = 64

func baseConfig() staging.Config {
	return staging.Config{
		Device: "cuda:0", Slots: 2, SlotBytes: 16 * rowBytes, ClaimTimeout: 0,
		Keys: []string{"k", "v"}, PoolSlots: 32, RowBytes: rowBytes,
		CloneBudgetBytes: 64 * rowBytes,
	}
}

func newFixture(t testing.TB, cfg staging.Config, rt *ledgerRuntime) *fixture {
	t.Helper()
	if rt == nil {
		rt = newRuntime(t, 0, soft.Config{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	p, err := staging.New(ctx, rt, cfg)
	require.NoError(t, err)
	f := &fixture{t: t, rt: rt, p: p, cfg: cfg, ctx: ctx}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return f
}

// device allocates a device buffer holding data.
func (f *fixture) device(data []byte) cuda.Buffer {
	f.t.Helper()
	b, err := f.rt.be.Allocate(f.ctx, "cuda:0", int64(len(data)))
	require.NoError(f.t, err)
	require.NoError(f.t, f.rt.be.Write(f.ctx, b, data))
	f.t.Cleanup(func() { _ = f.rt.be.Free(b) })
	return b
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// rowsAt returns the rows of key for pool slots, one per row of the save,
// laid out in order from offset 0.
func rowsAt(key string, slots ...int) []staging.Row {
	rows := make([]staging.Row, len(slots))
	for i, s := range slots {
		rows[i] = staging.Row{Key: key, Slot: s, Offset: int64(i) * rowBytes}
	}
	return rows
}

// gate is a freeze event completed by the test.
type gate struct{ ch chan struct{} }

func newGate() *gate                  { return &gate{ch: make(chan struct{})} }
func (g *gate) open()                 { close(g.ch) }
func (g *gate) Done() <-chan struct{} { return g.ch }
func (g *gate) Err() error            { return nil }
func (g *gate) Query() bool {
	select {
	case <-g.ch:
		return true
	default:
		return false
	}
}
func (g *gate) Wait(ctx context.Context) error {
	select {
	case <-g.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
