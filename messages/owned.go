package messages

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
)

// ---- owned reservations: an owner's charges --------------------------------
//
// An owner of charges (today the loader cache, package system/cache) keeps
// them as named reservations owned by it (Owner) at one location. Each
// request below is answered by one reply: a Reply for the three
// mutations, an OwnerChargesReply for OwnerChargesRequest.

// OwnedRequest is implemented by the requests on owned reservations (the
// supervisor handles them together).
type OwnedRequest interface {
	Request
	ownedRequest()
}

// OwnedReserve admits a reservation of Bytes at Location named Name and
// owned by Owner (1 version).
type OwnedReserve struct {
	Location string
	Name     string
	Owner    string
	Bytes    int64
	ReplyTo  *actor.PID
}

// OwnedResize sets an owned reservation's bytes: shrinking is always
// admitted, growing is admitted like a charge of the difference (1
// version; none when the size does not change).
type OwnedResize struct {
	Name    string
	Owner   string
	Bytes   int64
	ReplyTo *actor.PID
}

// OwnedUnreserve releases an owned reservation (1 version).
type OwnedUnreserve struct {
	Name    string
	Owner   string
	ReplyTo *actor.PID
}

// OwnerChargesRequest asks for the figures of Location and the bytes Owner's
// reservations charge there (a read).
type OwnerChargesRequest struct {
	Location string
	Owner    string
	ReplyTo  *actor.PID
}

// OwnerChargesReply answers OwnerChargesRequest.
type OwnerChargesReply struct {
	Charges budget.OwnerCharges
	Err     error
	Version uint64
}

func (m *OwnedReserve) Replier() *actor.PID        { return m.ReplyTo }
func (m *OwnedResize) Replier() *actor.PID         { return m.ReplyTo }
func (m *OwnedUnreserve) Replier() *actor.PID      { return m.ReplyTo }
func (m *OwnerChargesRequest) Replier() *actor.PID { return m.ReplyTo }

func (*OwnedReserve) ownedRequest()        {}
func (*OwnedResize) ownedRequest()         {}
func (*OwnedUnreserve) ownedRequest()      {}
func (*OwnerChargesRequest) ownedRequest() {}

// ---- offered charges: a cache's idle entries as the controller's victims ----

// ChargeDropped is an owner's answer to a run's EffectDropCharge of
// admission Admission: Err nil, the entry left the cache (the run's step
// completes and the ledger releases the charge); otherwise the owner's
// refusal (the entry became busy; the run fails with a
// *budget.ChargeBusyError). Answered by a Reply once the step is settled.
//
// For a demotion (the effect's To set), Dropped non-nil says the owner's
// copy failed and it dropped the entry instead (the run settles the step
// with Run.CompleteDropped and goes on); Err and Dropped both nil say the
// entry is kept at To under the effect's Demoted charge.
type ChargeDropped struct {
	Admission budget.AdmissionID
	Err       error
	Dropped   error
	ReplyTo   *actor.PID
}

func (m *ChargeDropped) Replier() *actor.PID { return m.ReplyTo }
