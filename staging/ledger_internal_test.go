package staging

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/budget"
)

// ledgerBook is the named reservations of this package's internal test
// runtimes: the pure ledger of package budget, whose locations have no
// budget (it admits every reservation), with its caps over groups of
// reservations, the only limit the pipeline's clones meet.
type ledgerBook struct {
	mu  sync.Mutex
	led *budget.Ledger
}

func newLedgerBook(tb testing.TB) *ledgerBook {
	tb.Helper()
	led, err := budget.New(budget.Config{ManagerID: "staging-internal-test", Locations: []budget.LocationConfig{
		{Name: "pageable-host"}, {Name: "pinned-host"}, {Name: "cuda:0"},
	}})
	require.NoError(tb, err)
	return &ledgerBook{led: led}
}

func (l *ledgerBook) Reserve(_ context.Context, loc, name string, bytes int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.led.Reserve(loc, name, bytes)
}

func (l *ledgerBook) ReserveCapped(_ context.Context, loc, name, capName string, capBytes, bytes int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.led.ReserveCapped(loc, name, capName, capBytes, bytes)
}

func (l *ledgerBook) Unreserve(_ context.Context, name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.led.Unreserve(name)
}

// caps returns the ledger's caps.
func (l *ledgerBook) caps() []budget.CapRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.led.Snapshot().Caps
}
