package actors

import "github.com/residency-go/residency/messages"

// ownedRequest carries out a request on an owner's reservations on the
// ledger (a loader cache's charges are such reservations at its location;
// what the cache keeps in process — keys, leases, recency — never reaches
// the supervisor).
func (s *supervisor) ownedRequest(m messages.OwnedRequest) {
	switch m := m.(type) {
	case *messages.OwnedReserve:
		err := s.ledger.ReserveOwned(m.Location, m.Name, m.Bytes, m.Owner)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.OwnedResize:
		err := s.ledger.ResizeOwned(m.Name, m.Owner, m.Bytes)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.OwnedUnreserve:
		err := s.ledger.UnreserveOwned(m.Name, m.Owner)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.OwnerChargesRequest:
		c, err := s.ledger.OwnerCharges(m.Location, m.Owner)
		s.reply(m.ReplyTo, &messages.OwnerChargesReply{Charges: c, Err: err, Version: s.ledger.Version()})
	}
}
