package system

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// The ledger side of a cache: its reservations, named by owner and key.

func (c *Cache) chargeName(key string) string {
	return fmt.Sprintf("%s/%s#%d", c.owner, key, c.seq.Add(1))
}

func (c *Cache) charges(ctx context.Context) (budget.OwnerCharges, error) {
	return ownerCharges(ctx, c.sys, c.loc, c.owner)
}

func ownerCharges(ctx context.Context, s *System, loc, owner string) (budget.OwnerCharges, error) {
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.CacheCharges{Location: loc, Owner: owner, ReplyTo: p}
	}, nil)
	if err != nil {
		return budget.OwnerCharges{}, err
	}
	rep := r.(*messages.CacheChargesReply)
	return rep.Charges, rep.Err
}

func (c *Cache) reserve(ctx context.Context, name string, bytes int64) error {
	return reserveOwned(ctx, c.sys, c.loc, c.owner, name, bytes)
}

// reserveOwned admits an owned reservation. A reply that comes after the
// caller gave up is released at once (nobody holds it).
func reserveOwned(ctx context.Context, s *System, loc, owner, name string, bytes int64) error {
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.CacheReserve{Location: loc, Name: name, Owner: owner, Bytes: bytes, ReplyTo: p}
	}, func(m any) {
		if r, ok := m.(*messages.Reply); ok && r.Err == nil {
			s.root.Send(s.sup, &messages.CacheUnreserve{Name: name, Owner: owner})
		}
	})
	if err != nil {
		return err
	}
	return r.(*messages.Reply).Err
}

// resize and unreserve never give up: a charge must follow its value.
func (c *Cache) resize(name string, bytes int64) error {
	return resizeOwned(context.Background(), c.sys, c.owner, name, bytes)
}

func resizeOwned(ctx context.Context, s *System, owner, name string, bytes int64) error {
	return s.callErr(ctx, func(p *actor.PID) any {
		return &messages.CacheResize{Name: name, Owner: owner, Bytes: bytes, ReplyTo: p}
	})
}

func (c *Cache) unreserve(name string) {
	unreserveOwned(c.sys, c.owner, name)
}

// ErrCacheClosed is returned by calls on a closed cache (the runtime may
// still be running): loads and evictions after [Cache.Close], and a load
// that Close interrupted. errors.Is(err, [ErrClosed]) also holds.
var ErrCacheClosed error = cacheClosedError{}

type cacheClosedError struct{}

func (cacheClosedError) Error() string { return "residency: cache is closed" }

// Is matches [ErrClosed].
func (cacheClosedError) Is(target error) bool { return target == ErrClosed }

func (c *Cache) closedErr() error { return ErrCacheClosed }

func (c *Cache) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// tooLarge is the refusal of a request larger than the whole budget, with
// the location's figures now.
func (c *Cache) tooLarge(ctx context.Context, bytes int64) error {
	ch, err := c.charges(ctx)
	if err != nil {
		return err
	}
	return &BudgetError{Location: ch.Location, BudgetBytes: ch.BudgetBytes, UsedBytes: ch.UsedBytes, ReservedBytes: ch.ReservedBytes, RequestedBytes: bytes}
}

// unreserveOwned releases an owned reservation. After the runtime closed
// there is nothing to release (Close released every reservation).
func unreserveOwned(s *System, owner, name string) error {
	err := s.callErr(context.Background(), func(p *actor.PID) any {
		return &messages.CacheUnreserve{Name: name, Owner: owner, ReplyTo: p}
	})
	if errors.Is(err, ErrClosed) {
		return nil
	}
	if err != nil {
		s.log.Error().Err(err).Str("reservation", name).Msg("cache: releasing a charge failed")
	}
	return err
}
