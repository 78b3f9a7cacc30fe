package cache

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/system"
)

// The ledger side of a cache: its reservations, named by owner and key,
// made through the runtime's seam for owners of charges
// (system.Owners).

// ownerRuntime is what a cache calls of its runtime: the methods of
// [system.Owners] (documented there) it uses.
type ownerRuntime interface {
	Register(owner string, co system.ChargeOwner) bool
	OffersPending(co system.ChargeOwner)
	Admit(ctx context.Context, req budget.Request) (budget.Decision, error)
	Seq() uint64
	SpillTarget(loc string) (string, bool)
	Reserve(ctx context.Context, loc, owner, name string, bytes int64) error
	Resize(ctx context.Context, owner, name string, bytes int64) error
	Unreserve(owner, name string) error
	Charges(ctx context.Context, loc, owner string) (budget.OwnerCharges, error)
	Refusal(ctx context.Context) error
	Wait(ctx context.Context, spec budget.WaitSpec, notify func(budget.WaitState), try func() (done bool, err error)) error
	WaitersAhead(spec budget.WaitSpec) int
	RoomMade()
	LoadFailed(owner, loc, key string, peak int64, err error)
	Log() *zerolog.Logger
}

func (c *Cache) chargeName(key string) string {
	return fmt.Sprintf("%s/%s#%d", c.owner, key, c.seq.Add(1))
}

func (c *Cache) charges(ctx context.Context) (budget.OwnerCharges, error) {
	return c.rt.Charges(ctx, c.loc, c.owner)
}

// resize and unreserve never give up: a charge must follow its value.
func (c *Cache) resize(name string, bytes int64) error {
	return c.rt.Resize(context.Background(), c.owner, name, bytes)
}

func (c *Cache) unreserve(name string) {
	_ = c.rt.Unreserve(c.owner, name) // a failure is logged by the runtime
}

func (c *Cache) closedErr() error { return system.ErrCacheClosed }

func (c *Cache) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// tooLarge is tooLargeAt at the cache's location.
func (c *Cache) tooLarge(ctx context.Context, bytes int64) error {
	return c.tooLargeAt(ctx, c.loc, bytes)
}
