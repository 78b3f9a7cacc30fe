package actors

import "github.com/residency-go/residency/messages"

// cacheRequest carries out a loader cache's request on the ledger. The
// cache's charges are owned reservations at its location; what the cache
// keeps in process (keys, leases, recency) never reaches the supervisor.
func (s *supervisor) cacheRequest(m messages.CacheRequest) {
	switch m := m.(type) {
	case *messages.CacheReserve:
		err := s.ledger.ReserveOwned(m.Location, m.Name, m.Bytes, m.Owner)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.CacheResize:
		err := s.ledger.ResizeOwned(m.Name, m.Owner, m.Bytes)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.CacheUnreserve:
		err := s.ledger.UnreserveOwned(m.Name, m.Owner)
		s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
	case *messages.CacheCharges:
		c, err := s.ledger.OwnerCharges(m.Location, m.Owner)
		s.reply(m.ReplyTo, &messages.CacheChargesReply{Charges: c, Err: err, Version: s.ledger.Version()})
	}
}
