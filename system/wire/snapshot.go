package wire

import "github.com/residency-go/residency/system"

// SnapshotOf is s in its JSON form; owner gives the name a reservation's
// owner is written by (nil: the runtime's own).
func SnapshotOf(s system.Snapshot, owner func(string) string) *Snapshot {
	out := &Snapshot{
		StateVersion: s.StateVersion,
		ManagerID:    s.ManagerID,
		Locations:    make([]SnapshotLocation, 0, len(s.Locations)),
		Values:       make([]SnapshotValue, 0, len(s.Values)),
	}
	for _, l := range s.Locations {
		lj := SnapshotLocation{
			Location: l.Location, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes,
			PeakBytes: l.PeakBytes, Reservations: make([]SnapshotReservation, 0, len(l.Reservations)),
		}
		if l.HasBudget {
			b := l.BudgetBytes
			lj.BudgetBytes = &b
		}
		for _, res := range l.Reservations {
			o := res.Owner
			if owner != nil {
				o = owner(o)
			}
			lj.Reservations = append(lj.Reservations, SnapshotReservation{Name: res.Name, Bytes: res.Bytes, Owner: Nullable(o)})
		}
		out.Locations = append(out.Locations, lj)
	}
	for _, v := range s.Values {
		vj := SnapshotValue{
			Handle: v.Handle.Name, Bytes: v.Bytes, ReplicaMode: v.ReplicaMode.String(),
			HasSource: v.HasSource, Recoverable: v.Recoverable, // Discarded stays false: a snapshot lists live values only
			Materializations: make([]SnapshotMaterialization, 0, len(v.Materializations)),
		}
		if v.HasSource {
			vj.SourceLocation = Nullable(v.SourceLocation)
		}
		for _, m := range v.Materializations {
			vj.Materializations = append(vj.Materializations, MaterializationOf(m))
		}
		out.Values = append(out.Values, vj)
	}
	return out
}

// System is the snapshot s names. Its values' handles carry their names
// and the snapshot's manager; a value's discarded flag is not read.
func (s Snapshot) System() system.Snapshot {
	out := system.Snapshot{StateVersion: s.StateVersion, ManagerID: s.ManagerID, Locations: []system.LocationRecord{}}
	for _, l := range s.Locations {
		r := system.LocationRecord{Location: l.Location, UsedBytes: l.UsedBytes, ReservedBytes: l.ReservedBytes, PeakBytes: l.PeakBytes}
		if l.BudgetBytes != nil {
			r.HasBudget, r.BudgetBytes = true, *l.BudgetBytes
		}
		for _, x := range l.Reservations {
			r.Reservations = append(r.Reservations, system.ReservationRecord{Name: x.Name, Bytes: x.Bytes, Owner: Text(x.Owner)})
		}
		out.Locations = append(out.Locations, r)
	}
	for _, v := range s.Values {
		r := system.ValueRecord{Handle: system.Handle{Manager: s.ManagerID, Name: v.Handle}, Bytes: v.Bytes, HasSource: v.HasSource,
			SourceLocation: Text(v.SourceLocation), Recoverable: v.Recoverable}
		if v.ReplicaMode == "replicable" {
			r.ReplicaMode = system.Replicable
		}
		for _, m := range v.Materializations {
			r.Materializations = append(r.Materializations, m.System())
		}
		out.Values = append(out.Values, r)
	}
	return out
}

// System is the materialization m names.
func (m SnapshotMaterialization) System() system.MaterializationRecord {
	st := system.Resident
	switch m.State {
	case "entering":
		st = system.Entering
	case "leaving":
		st = system.Leaving
	}
	return system.MaterializationRecord{Location: m.Location, State: st, ChargedBytes: m.ChargedBytes,
		UseCount: m.UseCount, HoldCount: m.HoldCount, PendingEventCount: m.PendingEventCount}
}
