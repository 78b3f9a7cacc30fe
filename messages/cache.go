package messages

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
)

// ---- the loader cache's requests to the supervisor -------------------------
//
// A cache's charges are named reservations owned by the cache (Owner) at
// its location. Each request below is answered by one reply: a Reply for
// the three mutations, a CacheChargesReply for CacheCharges.

// CacheRequest is implemented by the cache's requests (the supervisor
// handles them together).
type CacheRequest interface {
	Request
	cacheRequest()
}

// CacheReserve admits a reservation of Bytes at Location named Name and
// owned by Owner (1 version).
type CacheReserve struct {
	Location string
	Name     string
	Owner    string
	Bytes    int64
	ReplyTo  *actor.PID
}

// CacheResize sets an owned reservation's bytes: shrinking is always
// admitted, growing is admitted like a charge of the difference (1
// version; none when the size does not change).
type CacheResize struct {
	Name    string
	Owner   string
	Bytes   int64
	ReplyTo *actor.PID
}

// CacheUnreserve releases an owned reservation (1 version).
type CacheUnreserve struct {
	Name    string
	Owner   string
	ReplyTo *actor.PID
}

// CacheCharges asks for the figures of Location and the bytes Owner's
// reservations charge there (a read).
type CacheCharges struct {
	Location string
	Owner    string
	ReplyTo  *actor.PID
}

// CacheChargesReply answers CacheCharges.
type CacheChargesReply struct {
	Charges budget.OwnerCharges
	Err     error
	Version uint64
}

func (m *CacheReserve) Replier() *actor.PID   { return m.ReplyTo }
func (m *CacheResize) Replier() *actor.PID    { return m.ReplyTo }
func (m *CacheUnreserve) Replier() *actor.PID { return m.ReplyTo }
func (m *CacheCharges) Replier() *actor.PID   { return m.ReplyTo }

func (*CacheReserve) cacheRequest()   {}
func (*CacheResize) cacheRequest()    {}
func (*CacheUnreserve) cacheRequest() {}
func (*CacheCharges) cacheRequest()   {}

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
