package wire

import "github.com/residency-go/residency/system"

// Action is a plan's reclaim or enter step: the value's name, the
// location, and the optional source (enter) or demotion target (reclaim).
type Action struct {
	Handle   string  `json:"handle"`
	Location string  `json:"location"`
	From     *string `json:"from,omitempty"`
	To       *string `json:"to,omitempty"` // a reclaim that demotes the copy to this location
}

// Reservation is a plan's named reservation.
type Reservation struct {
	Name     string `json:"name"`
	Location string `json:"location"`
	Bytes    int64  `json:"bytes"`
}

// Plan is reclaim → reservations → enter. Each list is written as an
// array, empty when the plan has none.
type Plan struct {
	Reclaim      []Action      `json:"reclaim"`
	Reservations []Reservation `json:"reservations"`
	Enter        []Action      `json:"enter"`
}

// ActionOf is a in its JSON form.
func ActionOf(a system.Action) Action {
	return Action{Handle: a.Handle.Name, Location: a.Location, From: Nullable(a.From), To: Nullable(a.To)}
}

// ReservationOf is r in its JSON form.
func ReservationOf(r system.ReservationSpec) Reservation {
	return Reservation{Name: r.Name, Location: r.Location, Bytes: r.Bytes}
}

// PlanOf is p in its JSON form.
func PlanOf(p system.Plan) Plan {
	out := Plan{
		Reclaim:      make([]Action, 0, len(p.Reclaim)),
		Reservations: make([]Reservation, 0, len(p.Reservations)),
		Enter:        make([]Action, 0, len(p.Enter)),
	}
	for _, a := range p.Reclaim {
		out.Reclaim = append(out.Reclaim, ActionOf(a))
	}
	for _, r := range p.Reservations {
		out.Reservations = append(out.Reservations, ReservationOf(r))
	}
	for _, a := range p.Enter {
		out.Enter = append(out.Enter, ActionOf(a))
	}
	return out
}

// System is the action a names (its handle by name only: the JSON form
// carries no handle id).
func (a Action) System() system.Action {
	return system.Action{Handle: system.Handle{Name: a.Handle}, Location: a.Location, From: Text(a.From), To: Text(a.To)}
}

// System is the reservation r names.
func (r Reservation) System() system.ReservationSpec {
	return system.ReservationSpec{Name: r.Name, Location: r.Location, Bytes: r.Bytes}
}

// System is the plan p names; an empty list is nil.
func (p Plan) System() system.Plan {
	var out system.Plan
	for _, a := range p.Reclaim {
		out.Reclaim = append(out.Reclaim, a.System())
	}
	for _, r := range p.Reservations {
		out.Reservations = append(out.Reservations, r.System())
	}
	for _, a := range p.Enter {
		out.Enter = append(out.Enter, a.System())
	}
	return out
}
