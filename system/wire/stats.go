package wire

import "github.com/residency-go/residency/system/cache"

// CacheStats is a loader cache's statistics.
type CacheStats struct {
	Location              string `json:"location"`
	BudgetBytes           *int64 `json:"budget_bytes"`
	ReservedBytes         int64  `json:"reserved_bytes"`
	Resources             int    `json:"resources"`
	Evictions             uint64 `json:"evictions"`
	LocationUsedBytes     int64  `json:"location_used_bytes"`
	LocationReservedBytes int64  `json:"location_reserved_bytes"`
	// A cache opened with spill (absent when zero): the demoted copies
	// kept now and their bytes, entries demoted, demotions whose copy
	// failed, loads started from a copy.
	Demoted          int    `json:"demoted,omitempty"`
	DemotedBytes     int64  `json:"demoted_bytes,omitempty"`
	Demotions        uint64 `json:"demotions,omitempty"`
	DemotionFailures uint64 `json:"demotion_failures,omitempty"`
	WarmStarts       uint64 `json:"warm_starts,omitempty"`
}

// CacheStatsOf is st in its JSON form (a cache_stats op's statistics).
func CacheStatsOf(st cache.Stats) *CacheStats {
	out := &CacheStats{
		Location: st.Location, ReservedBytes: st.ReservedBytes, Resources: st.Resources, Evictions: st.Evictions,
		LocationUsedBytes: st.LocationUsedBytes, LocationReservedBytes: st.LocationReservedBytes,
		Demoted: st.Demoted, DemotedBytes: st.DemotedBytes, Demotions: st.Demotions, DemotionFailures: st.DemotionFailures, WarmStarts: st.WarmStarts,
	}
	if st.HasBudget {
		b := st.BudgetBytes
		out.BudgetBytes = &b
	}
	return out
}

// StagingStats is the write pipeline's statistics: its slots, clone bytes,
// drops and tasks by reason and state, and its counters.
type StagingStats struct {
	Slots            int     `json:"slots"`
	FreeSlots        int     `json:"free_slots"`
	SlotHolders      int     `json:"slot_holders"`
	SlotClaims       int64   `json:"slot_claims"`
	SlotWaits        int64   `json:"slot_waits"`
	CloneBytes       int64   `json:"clone_bytes"`
	CloneBudgetBytes int64   `json:"clone_budget_bytes"`
	PeakCloneBytes   int64   `json:"peak_clone_bytes"`
	Flushes          int64   `json:"flushes"`
	Drops            Object  `json:"drops"`
	Tasks            Object  `json:"tasks"`
	Opened           int64   `json:"opened"`
	Written          int64   `json:"written"`
	Failed           int64   `json:"failed"`
	StepsStaged      int64   `json:"steps_staged"`
	LiveSteps        int64   `json:"live_steps"`
	CommittedBytes   int64   `json:"committed_bytes"`
	Failure          *string `json:"failure"`
}
