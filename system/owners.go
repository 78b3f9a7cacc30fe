package system

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/residency-go/residency/actors"
	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
	"github.com/residency-go/residency/system/internal/owners"
)

// Owners of charges: the runtime's side of the seam in
// system/internal/owners, through which the loader cache (package
// system/cache) keeps its charges — named reservations under an owner
// name at one location — and waits for room like Admit does.

func init() {
	owners.Set(func(sys any) owners.Runtime {
		s, _ := sys.(*System)
		if s == nil {
			return nil
		}
		return ownerSeam{s}
	})
}

// ownerNames are the owner names claimed in a runtime: unique for its
// life (a closed cache's charges may outlive it under its name).
type ownerNames struct {
	mu    sync.Mutex
	names map[string]struct{}
	seq   atomic.Uint64
}

// ownerSeam is owners.Runtime on a *System.
type ownerSeam struct{ s *System }

func (o ownerSeam) Register(owner string, co owners.ChargeOwner) bool {
	n := &o.s.owners
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, taken := n.names[owner]; taken {
		return false
	}
	if n.names == nil {
		n.names = map[string]struct{}{}
	}
	n.names[owner] = struct{}{}
	if co != nil {
		o.s.eng.RegisterChargeOwner(owner, co)
	}
	return true
}

func (o ownerSeam) OffersPending(co owners.ChargeOwner) { o.s.eng.OffersPending(offerSource{co}) }

// offerSource is an owner's DrainOffers as the engine's OfferSource.
type offerSource struct{ co owners.ChargeOwner }

func (d offerSource) DrainOffers(sink actors.OfferSink) { d.co.DrainOffers(sink) }

// Admit decides and runs req in one message (as System.Admit, without a
// scope: its reservations are owned). A success that comes after ctx
// ended releases them.
func (o ownerSeam) Admit(ctx context.Context, req budget.Request) (budget.Decision, error) {
	s := o.s
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.Admit{Request: req, ReplyTo: p}
	}, func(m any) {
		if r, ok := m.(*messages.RunReply); ok && r.Err == nil {
			for _, rs := range req.Reservations {
				s.root.Send(s.sup, &messages.OwnedUnreserve{Name: rs.Name, Owner: rs.Owner})
			}
		}
	})
	if err != nil {
		return budget.Decision{}, err
	}
	rep := r.(*messages.RunReply)
	var d budget.Decision
	if rep.Decision != nil {
		d = *rep.Decision
	}
	return d, rep.Err
}

func (o ownerSeam) Seq() uint64 { return o.s.owners.seq.Add(1) }

func (o ownerSeam) SpillTarget(loc string) (string, bool) {
	to, ok := o.s.spill[loc]
	return to, ok
}

func (o ownerSeam) Charges(ctx context.Context, loc, owner string) (budget.OwnerCharges, error) {
	r, err := o.s.call(ctx, func(p *actor.PID) any {
		return &messages.OwnerChargesRequest{Location: loc, Owner: owner, ReplyTo: p}
	}, nil)
	if err != nil {
		return budget.OwnerCharges{}, err
	}
	rep := r.(*messages.OwnerChargesReply)
	return rep.Charges, rep.Err
}

// Reserve admits an owned reservation. A reply that comes after the
// caller gave up is released at once (nobody holds it).
func (o ownerSeam) Reserve(ctx context.Context, loc, owner, name string, bytes int64) error {
	s := o.s
	r, err := s.call(ctx, func(p *actor.PID) any {
		return &messages.OwnedReserve{Location: loc, Name: name, Owner: owner, Bytes: bytes, ReplyTo: p}
	}, func(m any) {
		if r, ok := m.(*messages.Reply); ok && r.Err == nil {
			s.root.Send(s.sup, &messages.OwnedUnreserve{Name: name, Owner: owner})
		}
	})
	if err != nil {
		return err
	}
	return r.(*messages.Reply).Err
}

func (o ownerSeam) Resize(ctx context.Context, owner, name string, bytes int64) error {
	return o.s.callErr(ctx, func(p *actor.PID) any {
		return &messages.OwnedResize{Name: name, Owner: owner, Bytes: bytes, ReplyTo: p}
	})
}

// Unreserve releases an owned reservation. After the runtime closed
// there is nothing to release (Close released every reservation).
func (o ownerSeam) Unreserve(owner, name string) error {
	err := o.s.callErr(context.Background(), func(p *actor.PID) any {
		return &messages.OwnedUnreserve{Name: name, Owner: owner, ReplyTo: p}
	})
	if errors.Is(err, ErrClosed) {
		return nil
	}
	if err != nil {
		o.s.log.Error().Err(err).Str("reservation", name).Msg("cache: releasing a charge failed")
	}
	return err
}

func (o ownerSeam) Refusal(ctx context.Context) error { return o.s.refusal(ctx) }

func (o ownerSeam) Wait(ctx context.Context, spec budget.WaitSpec, notify func(budget.WaitState), try func() (bool, error)) error {
	return o.s.room.wait(ctx, spec, notify, try)
}

func (o ownerSeam) WaitersAhead(spec budget.WaitSpec) int { return o.s.room.ahead(spec) }

func (o ownerSeam) RoomMade() { o.s.room.signal() }

func (o ownerSeam) LoadFailed(owner, loc, key string, peak int64, err error) {
	o.s.events.cacheLoadFailed(owner, loc, key, peak, err)
}

func (o ownerSeam) Log() *zerolog.Logger { return &o.s.log }
