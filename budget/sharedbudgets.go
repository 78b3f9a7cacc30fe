package budget

import (
	"fmt"
	"math/big"
	"sort"
)

// ---- shared budgets: one figure over a group of locations ------------------

// A shared budget bounds the charges of a group of locations that draw on
// one memory (an integrated GPU and the host RAM it allocates from). The
// group's charged bytes are the sum of used+reserved over its members;
// every charge at a member is admitted only if it fits the member's own
// budget (if any) and then the group's figure. The rule is in
// docs/semantics.md, "Shared budgets".

// SharedBudget configures one group: its name, its member locations
// (at least two, each configured, each in at most one group) and its
// figure in bytes (> 0).
type SharedBudget struct {
	Name      string
	Locations []string
	Bytes     int64
}

// SharedBudgetRecord is a group's figures in a snapshot.
type SharedBudgetRecord struct {
	Name      string
	Locations []string // members, in location order
	Bytes     int64    // the figure
	UsedBytes int64    // charged: used+reserved summed over the members
	PeakBytes int64    // the highest UsedBytes ever seen
}

// sharedGroup is one configured group. members are location indices in
// location order.
type sharedGroup struct {
	name    string
	bytes   int64
	members []int
	peak    int64
}

// configureShared validates the groups and records them, by name, with
// each member location's group (location.shared, index+1).
func (l *Ledger) configureShared(cfg []SharedBudget) error {
	if len(cfg) == 0 {
		return nil
	}
	names := map[string]bool{}
	groups := make([]sharedGroup, 0, len(cfg))
	owner := map[int]string{}
	for _, sb := range cfg {
		if sb.Name == "" {
			return invalidf("shared budget: name is empty")
		}
		if names[sb.Name] {
			return invalidf("shared budget %q configured twice", sb.Name)
		}
		names[sb.Name] = true
		if sb.Bytes <= 0 {
			return invalidf("shared budget %q: bytes must be positive, got %d", sb.Name, sb.Bytes)
		}
		if len(sb.Locations) < 2 {
			return invalidf("shared budget %q: want at least two locations, got %d", sb.Name, len(sb.Locations))
		}
		g := sharedGroup{name: sb.Name, bytes: sb.Bytes}
		for _, name := range sb.Locations {
			i, ok := l.locIndex[name]
			if !ok {
				return invalidf("shared budget %q: location %q is not configured", sb.Name, name)
			}
			if other, dup := owner[i]; dup {
				if other == sb.Name {
					return invalidf("shared budget %q: location %q listed twice", sb.Name, name)
				}
				return invalidf("shared budget %q: location %q is already in shared budget %q", sb.Name, name, other)
			}
			owner[i] = sb.Name
			g.members = append(g.members, i)
		}
		sort.Ints(g.members)
		groups = append(groups, g)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].name < groups[j].name })
	for gi, g := range groups {
		for _, m := range g.members {
			l.locs[m].shared = gi + 1
		}
	}
	l.shared = groups
	return nil
}

// sharedOf returns loc's group, or nil.
func (l *Ledger) sharedOf(loc int) *sharedGroup {
	if g := l.locs[loc].shared; g > 0 {
		return &l.shared[g-1]
	}
	return nil
}

// sharedCharged is g's charged bytes. It never overflows: every charge at
// a member was admitted against the figure, so the sum stays within it.
func (l *Ledger) sharedCharged(g *sharedGroup) int64 {
	n := int64(0)
	for _, m := range g.members {
		n += l.locs[m].used + l.locs[m].reserved
	}
	return n
}

// admitsShared checks whether requested more bytes at loc fit loc's group,
// with also bytes of the same operation already counted against it (a
// reconstruction's destination, when its temporary is in the same group).
func (l *Ledger) admitsShared(loc int, requested, also int64) error {
	g := l.sharedOf(loc)
	if g == nil {
		return nil
	}
	charged := l.sharedCharged(g)
	free := g.bytes - charged
	if also <= free && requested <= free-also {
		return nil
	}
	lc := &l.locs[loc]
	return &BudgetError{Location: lc.name, BudgetBytes: lc.budget, UsedBytes: lc.used, ReservedBytes: lc.reserved, RequestedBytes: requested,
		Shared: g.name, SharedBytes: g.bytes, SharedUsedBytes: charged, SharedRequestedBytes: addSat(requested, also)}
}

// notePeak raises the peak of loc's group to its charged bytes.
func (l *Ledger) notePeak(loc int) {
	if g := l.sharedOf(loc); g != nil {
		g.peak = max(g.peak, l.sharedCharged(g))
	}
}

// cloneShared copies the groups for a simulation clone (their peaks
// change there; the member lists are never changed and stay shared).
func cloneShared(gs []sharedGroup) []sharedGroup {
	if gs == nil {
		return nil
	}
	return append([]sharedGroup(nil), gs...)
}

// sharedRecords returns the groups' figures, by name.
func (l *Ledger) sharedRecords() []SharedBudgetRecord {
	if len(l.shared) == 0 {
		return nil
	}
	out := make([]SharedBudgetRecord, len(l.shared))
	for i := range l.shared {
		g := &l.shared[i]
		locs := make([]string, len(g.members))
		for j, m := range g.members {
			locs[j] = l.locs[m].name
		}
		out[i] = SharedBudgetRecord{Name: g.name, Locations: locs, Bytes: g.bytes, UsedBytes: l.sharedCharged(g), PeakBytes: g.peak}
	}
	return out
}

// cloneSharedRecords copies records and their lists of names.
func cloneSharedRecords(rs []SharedBudgetRecord) []SharedBudgetRecord {
	if rs == nil {
		return nil
	}
	out := make([]SharedBudgetRecord, len(rs))
	for i, r := range rs {
		r.Locations = append([]string(nil), r.Locations...)
		out[i] = r
	}
	return out
}

// checkShared verifies every group: its members point back at it, its
// charged bytes (summed exactly) are within its figure and its peak
// covers them.
func (l *Ledger) checkShared() error {
	for gi := range l.shared {
		g := &l.shared[gi]
		sum := new(big.Int)
		for _, m := range g.members {
			if l.locs[m].shared != gi+1 {
				return fmt.Errorf("shared budget %q: member %s points at group %d", g.name, l.locs[m].name, l.locs[m].shared)
			}
			sum.Add(sum, big.NewInt(l.locs[m].used))
			sum.Add(sum, big.NewInt(l.locs[m].reserved))
		}
		if sum.Cmp(big.NewInt(g.bytes)) > 0 {
			return fmt.Errorf("shared budget %q: charged %s over its figure %d", g.name, sum, g.bytes)
		}
		if g.peak < sum.Int64() {
			return fmt.Errorf("shared budget %q: peak %d below charged %s", g.name, g.peak, sum)
		}
	}
	for i := range l.locs {
		if s := l.locs[i].shared; s < 0 || s > len(l.shared) {
			return fmt.Errorf("%s: shared budget index %d out of range", l.locs[i].name, s)
		}
	}
	return nil
}
