package system

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages"
)

// ReserveCapped is Reserve for a reservation in the group of the cap
// capName of capBytes, in the ledger (1 state version): the group's first
// reservation sets the cap, and the cap goes with the group's last one
// (Unreserve gives each one's bytes back to it). Refused with a *CapError
// when the group's bytes plus bytes would exceed the cap (checked first),
// with invalid input for capBytes other than those of the cap while its
// group holds reservations, then as Reserve. Snapshot shows each cap with
// its figures and the names in its group. Safe for concurrent use.
func (s *System) ReserveCapped(ctx context.Context, loc, name, capName string, capBytes, bytes int64) (err error) {
	defer func() { s.stats.admission(ctx, opReserve, err) }()
	return s.callErr(ctx, func(p *actor.PID) any {
		return &messages.ReserveCapped{Location: loc, Name: name, Cap: capName, CapBytes: capBytes, Bytes: bytes, ReplyTo: p}
	})
}

// The ledger's types of caps.
type (
	// CapError: a reservation would take its cap's group past the cap.
	CapError = budget.CapError
	// CapRecord is a cap's figures in a Snapshot.
	CapRecord = budget.CapRecord
)
