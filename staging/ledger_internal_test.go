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
// reservations, the only limit the pipeline's clones meet (newLedgerBookAt
// gives cuda:0 a budget).
type ledgerBook struct {
	mu  sync.Mutex
	led *budget.Ledger
}

func newLedgerBook(tb testing.TB) *ledgerBook { return newLedgerBookAt(tb, 0) }

// newLedgerBookAt is newLedgerBook with a budget of devBudget bytes at
// cuda:0 (none when 0).
func newLedgerBookAt(tb testing.TB, devBudget int64) *ledgerBook {
	tb.Helper()
	dev := budget.LocationConfig{Name: "cuda:0"}
	if devBudget > 0 {
		dev = budget.LocationConfig{Name: "cuda:0", HasBudget: true, BudgetBytes: devBudget}
	}
	led, err := budget.New(budget.Config{ManagerID: "staging-internal-test", Locations: []budget.LocationConfig{
		{Name: "pageable-host"}, {Name: "pinned-host"}, dev,
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
