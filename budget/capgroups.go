package budget

import (
	"fmt"
	"sort"
)

// ---- caps over groups of reservations, in the ledger -------------------------

// A cap bounds the bytes of a group of named reservations, whatever room
// their locations have: a reservation made in the group (ReserveCapped,
// which names the cap and its bytes) is admitted only if the group's bytes
// plus its own stay within the cap, and only if its location admits it
// too. The group's first reservation sets the cap, Unreserve gives a
// reservation's bytes back to it, and the cap goes with its group's last
// reservation: it lives in the ledger as long as it bounds something, each
// of its changes is the committed transition (one version) of a
// reservation, and a snapshot shows it. The write pipeline (package
// staging) keeps its device clones in one (Config.CloneBudgetBytes).

// capGroup is one cap and the figures of its group.
type capGroup struct {
	name     string
	capBytes int64
	used     int64 // bytes of the group's active reservations
	peak     int64 // the highest used since the cap was set
	members  int   // the group's active reservations
}

// CapRecord is a cap's figures in a snapshot.
type CapRecord struct {
	Name      string
	CapBytes  int64
	UsedBytes int64 // bytes of the group's active reservations
	PeakBytes int64 // the highest UsedBytes since the cap was set
	// Reservations names the group's active reservations, sorted (each
	// is also in its location's Reservations).
	Reservations []string
}

// ReserveCapped is Reserve (1 version) for a reservation in the group of
// the cap capName of capBytes, which it sets if the group is empty.
// Errors (nothing changed): an empty cap name, a negative capBytes, or
// capBytes other than the cap's while its group holds reservations
// (invalid input); the group's bytes plus bytes exceed the cap
// ([*CapError], with the group's figures; checked before the location);
// then Reserve's errors.
func (l *Ledger) ReserveCapped(loc, name, capName string, capBytes, bytes int64) error {
	if capName == "" {
		return invalidf("reservation %q: cap name is empty", name)
	}
	if capBytes < 0 {
		return invalidf("cap %q: bytes must not be negative, got %d", capName, capBytes)
	}
	c := l.caps[capName]
	if c != nil && c.capBytes != capBytes {
		return invalidf("cap %q is %d bytes, not %d", capName, c.capBytes, capBytes)
	}
	used := int64(0)
	if c != nil {
		used = c.used
	}
	if bytes > 0 && bytes > capBytes-used {
		return &CapError{Cap: capName, CapBytes: capBytes, UsedBytes: used, RequestedBytes: bytes}
	}
	if c == nil {
		c = &capGroup{name: capName, capBytes: capBytes}
	}
	if err := l.reserveIn(loc, name, bytes, "", c); err != nil {
		return err
	}
	if l.caps == nil {
		l.caps = map[string]*capGroup{}
	}
	l.caps[capName] = c
	c.used += bytes
	c.members++
	c.peak = max(c.peak, c.used)
	return nil
}

// leaveCap gives a released reservation's bytes back to its cap, and
// removes the cap with its group's last reservation.
func (l *Ledger) leaveCap(c *capGroup, bytes int64) {
	c.used -= bytes
	c.members--
	if c.used < 0 || c.members < 0 {
		panic("budget: a cap's figures went negative")
	}
	if c.members == 0 {
		delete(l.caps, c.name)
	}
}

// capRecords returns the caps' figures, by name.
func (l *Ledger) capRecords() []CapRecord {
	if len(l.caps) == 0 {
		return nil
	}
	out := make([]CapRecord, 0, len(l.caps))
	at := make(map[*capGroup]int, len(l.caps))
	for _, c := range l.caps {
		at[c] = len(out)
		out = append(out, CapRecord{Name: c.name, CapBytes: c.capBytes, UsedBytes: c.used, PeakBytes: c.peak})
	}
	for _, r := range l.reservations {
		if r.cap != nil {
			rec := &out[at[r.cap]]
			rec.Reservations = append(rec.Reservations, r.name)
		}
	}
	for i := range out {
		sort.Strings(out[i].Reservations)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// cloneCaps copies caps and their lists of names.
func cloneCaps(caps []CapRecord) []CapRecord {
	if caps == nil {
		return nil
	}
	out := make([]CapRecord, len(caps))
	for i, c := range caps {
		c.Reservations = append([]string(nil), c.Reservations...)
		out[i] = c
	}
	return out
}

// checkCaps verifies each cap's figures against the reservations of its
// group.
func (l *Ledger) checkCaps() error {
	used := map[*capGroup]int64{}
	members := map[*capGroup]int{}
	for _, r := range l.reservations {
		if r.cap != nil {
			if l.caps[r.cap.name] != r.cap {
				return fmt.Errorf("reservation %q: its cap %q is not set", r.name, r.cap.name)
			}
			used[r.cap] += r.bytes
			members[r.cap]++
		}
	}
	for _, c := range l.caps {
		if c.members == 0 {
			return fmt.Errorf("cap %q: set with no reservation in its group", c.name)
		}
		if c.used != used[c] || c.members != members[c] {
			return fmt.Errorf("cap %q: used %d bytes in %d reservations, its group holds %d in %d", c.name, c.used, c.members, used[c], members[c])
		}
		if c.used > c.capBytes {
			return fmt.Errorf("cap %q: used %d bytes over its cap of %d", c.name, c.used, c.capBytes)
		}
	}
	return nil
}
