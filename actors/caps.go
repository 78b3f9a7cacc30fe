package actors

import "github.com/residency-go/residency/messages"

// reserveCapped answers a reservation in the group of a cap
// (budget/capgroups.go): the ledger admits or refuses it, one version,
// like every other reservation.
func (s *supervisor) reserveCapped(m *messages.ReserveCapped) {
	err := s.ledger.ReserveCapped(m.Location, m.Name, m.Cap, m.CapBytes, m.Bytes)
	s.reply(m.ReplyTo, &messages.Reply{Err: err, Version: s.ledger.Version()})
}
