package budget

import (
	"fmt"
	"math/big"
	"slices"
)

// The reference model's shared budgets: a figure over a group of
// locations, checked after the location at every charge. Written from the
// rule (docs/semantics.md, "Shared budgets") without the ledger's code:
// sums are exact (big integers), members are looked up by name.

type refShared struct {
	name  string
	locs  []string
	bytes int64
	peak  int64
}

func refSharedBudget(group, loc string, bytes, charged, requested int64) string {
	return fmt.Sprintf("shared{%s at %s %d charged=%d requested=%d}", group, loc, bytes, charged, requested)
}

// withShared gives the model its groups.
func (m *refModel) withShared(groups []SharedBudget) *refModel {
	for _, g := range groups {
		m.shared = append(m.shared, refShared{name: g.Name, locs: slices.Clone(g.Locations), bytes: g.Bytes})
	}
	slices.SortFunc(m.shared, func(a, b refShared) int {
		if a.name < b.name {
			return -1
		}
		return 1
	})
	return m
}

func (m *refModel) groupOf(loc string) *refShared {
	for i := range m.shared {
		if slices.Contains(m.shared[i].locs, loc) {
			return &m.shared[i]
		}
	}
	return nil
}

func (m *refModel) charged(g *refShared) *big.Int {
	n := new(big.Int)
	for _, loc := range g.locs {
		n.Add(n, big.NewInt(m.used(loc)))
		n.Add(n, big.NewInt(m.reserved(loc)))
	}
	return n
}

// admit checks the location, then its group, then the room earlier
// waiters hold.
func (m *refModel) admit(loc string, requested int64) string {
	if e := m.admitRoom(loc, requested); e != "" {
		return e
	}
	return m.heldAt(loc)
}

// admitRoom checks the location, then its group.
func (m *refModel) admitRoom(loc string, requested int64) string {
	if e := m.admitLoc(loc, requested); e != "" {
		return e
	}
	return m.admitShared(loc, requested, 0)
}

// admitTemp checks a reconstruction's temporary charge at temp: its
// location, then its group, with the destination's charge counted when
// dest is in the same group.
func (m *refModel) admitTemp(dest, temp string, requested int64) string {
	if e := m.admitLoc(temp, requested); e != "" {
		return e
	}
	also := int64(0)
	if g := m.groupOf(temp); g != nil && g == m.groupOf(dest) {
		also = requested
	}
	return m.admitShared(temp, requested, also)
}

func (m *refModel) admitShared(loc string, requested, also int64) string {
	g := m.groupOf(loc)
	if g == nil {
		return ""
	}
	c := m.charged(g)
	total := new(big.Int).Add(c, big.NewInt(requested))
	total.Add(total, big.NewInt(also))
	if total.Cmp(big.NewInt(g.bytes)) > 0 {
		add := new(big.Int).Add(big.NewInt(requested), big.NewInt(also))
		if !add.IsInt64() {
			add.SetInt64(1<<63 - 1)
		}
		return refSharedBudget(g.name, loc, g.bytes, c.Int64(), add.Int64())
	}
	return ""
}

func (m *refModel) noteSharedPeaks() {
	for i := range m.shared {
		if c := m.charged(&m.shared[i]).Int64(); c > m.shared[i].peak {
			m.shared[i].peak = c
		}
	}
}

func (m *refModel) sharedState() []string {
	var out []string
	for i := range m.shared {
		g := &m.shared[i]
		locs := slices.Clone(g.locs)
		slices.SortFunc(locs, func(a, b string) int { return m.locIndex(a) - m.locIndex(b) })
		out = append(out, fmt.Sprintf("shared %s %v %d used=%s peak=%d", g.name, locs, g.bytes, m.charged(g), g.peak))
	}
	return out
}

func ledgerSharedState(s Snapshot) []string {
	var out []string
	for _, g := range s.SharedBudgets {
		out = append(out, fmt.Sprintf("shared %s %v %d used=%d peak=%d", g.Name, g.Locations, g.Bytes, g.UsedBytes, g.PeakBytes))
	}
	return out
}
