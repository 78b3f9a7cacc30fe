package messages

import "github.com/asynkron/protoactor-go/actor"

// ReserveCapped admits a reservation of Bytes at Location named Name in
// the group of the cap Cap of CapBytes (set by the group's first
// reservation): within the cap, then within the location's budget (1
// version). It is released with Unreserve. Answered by a Reply.
type ReserveCapped struct {
	Location string
	Name     string
	Cap      string
	CapBytes int64
	Bytes    int64
	ReplyTo  *actor.PID
}

func (m *ReserveCapped) Replier() *actor.PID { return m.ReplyTo }
