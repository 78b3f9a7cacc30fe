package metrics

import (
	"context"
	"errors"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is a [prometheus.Collector] for one runtime: register it on the
// registry the host application serves.
//
//	reg := prometheus.NewRegistry()
//	m, err := metrics.NewMetrics(sys)
//	if err != nil { ... }
//	reg.MustRegister(m)
//	m.WatchCache(cache) // optional: a loader cache's statistics
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// docs/metrics.md lists every metric. In short:
//
//   - Gauges are computed at scrape time from one snapshot: per location the budget, used,
//     reserved, peak and temporary bytes; materializations by state;
//     protections (leases, holds, pending events); live values; the state
//     version; and each watched cache's [Cache.Statistics].
//   - Counters are cumulative from [Start] and exact. Admissions (by
//     operation), refusals (by operation and error class), decisions,
//     their evictions (by reason), stale entries and search-limit
//     refusals, and the two histograms (explored states per decision,
//     Decide latency) are counted by the facade as each call returns:
//     they do not depend on scrapes. Transitions by kind (and removals by
//     reason) are the ledger's own cumulative counts, read with the
//     snapshot ([Snapshot].TransitionCounts): exact whatever the trace
//     ring's capacity, and they add up to the state version.
//
// A scrape costs one round trip to the runtime for the snapshot and one
// per watched cache, and renders the snapshot outside the
// runtime's supervisor; it never blocks other calls for long. After
// [System.Close] the gauges show the final snapshot and the counters keep
// their values. Each scrape waits at most 10 seconds for the runtime.
//
// To put several runtimes on one registry, register each through
// prometheus.WrapRegistererWith with a label that tells them apart.
//
// Metrics is safe for concurrent use; scrapes are serialized.
type Metrics struct {
	sys *system.System

	mu     sync.Mutex // serializes scrapes and guards the fields below
	caches []*cache.Cache
	// byKind and removals are the ledger's counts at the last scrape
	// (removals keyed by reason), kept so a scrape that cannot read the
	// runtime still reports them.
	byKind   map[string]uint64
	removals map[string]uint64
}

// NewMetrics returns the metrics collector of sys. Every counter counts
// from Start, whenever the collector is created (the facade's counters
// are kept by the runtime; transitions by kind are the ledger's).
// Errors: a nil sys ([*system.InvalidInputError]).
func NewMetrics(sys *system.System) (*Metrics, error) {
	if sys == nil {
		return nil, &system.InvalidInputError{Message: "metrics: the runtime is nil"}
	}
	m := &Metrics{sys: sys, byKind: map[string]uint64{}, removals: map[string]uint64{}}
	for _, k := range transitionKinds {
		m.byKind[k] = 0
	}
	for _, r := range system.RemovalKinds() {
		m.removals[r.String()] = 0
	}
	return m, nil
}

// WatchCache adds c's statistics to the metrics (labels cache, the cache's
// Owner, and location). A closed cache (or any cache once the runtime is
// closed) is dropped at the next scrape.
// Watching a cache twice has no further effect.
func (m *Metrics) WatchCache(c *cache.Cache) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, x := range m.caches {
		if x == c {
			return
		}
	}
	m.caches = append(m.caches, c)
}

// The kinds of committed transitions (the trace's Kind), initialized to
// zero (like the kinds of removal) so that every series exists from the
// first scrape.
var transitionKinds = []string{"register", "admit", "complete", "fail", "remove", "discard",
	"acquire", "release", "record_event", "reap_event", "hold", "unhold",
	"reserve", "unreserve", "resize"}

const scrapeTimeout = 10 * time.Second

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	mInfo          = desc("residency_info", "The runtime: 1, with its manager id and device backend.", "manager_id", "backend")
	mStateVersion  = desc("residency_state_version", "State version of the snapshot the gauges were read from (the number of committed transitions).")
	mValues        = desc("residency_values", "Live registered values.")
	mBudget        = desc("residency_location_budget_bytes", "Budget of a location (locations without a budget have no series).", "location")
	mUsed          = desc("residency_location_used_bytes", "Bytes charged by materializations and temporary reconstruction buffers at a location.", "location")
	mReserved      = desc("residency_location_reserved_bytes", "Bytes of active named reservations at a location (scopes' and caches' included).", "location")
	mPeak          = desc("residency_location_peak_bytes", "Highest used+reserved bytes a location has reached.", "location")
	mTemporary     = desc("residency_location_temporary_bytes", "Part of used bytes charged by reconstructions in flight (their temporary buffers).", "location")
	mReservations  = desc("residency_location_reservations", "Active named reservations at a location.", "location")
	mMats          = desc("residency_materializations", "Materializations at a location by state (entering, resident, leaving).", "location", "state")
	mProtections   = desc("residency_protections", "Protections of materializations at a location by kind: lease (active uses), hold, event (pending consumer events).", "location", "kind")
	mCacheBudget   = desc("residency_cache_budget_bytes", "Budget of a watched loader cache's location (no series without a budget).", "cache", "location")
	mCacheReserved = desc("residency_cache_reserved_bytes", "Bytes a watched loader cache charges at its location.", "cache", "location")
	mCacheEntries  = desc("residency_cache_entries", "Ready and loading entries of a watched loader cache.", "cache", "location")
	mCacheEvicted  = desc("residency_cache_evictions_total", "Entries a watched loader cache evicted (for capacity or by Evict).", "cache", "location")

	mTransitions = desc("residency_transitions_total", "Committed transitions by kind, read from the trace ring.", "kind")
	mRemovals    = desc("residency_removals_total", "Materializations removed, by reason (evict, reclaim, move_source, discard, shutdown), read from the trace ring.", "reason")

	mAdmissions = desc("residency_admissions_total", "Admission calls answered by the runtime, by operation.", "op")
	mRefused    = desc("residency_admissions_refused_total", "Admission calls refused, by operation and error class.", "op", "class")
	mUnanswered = desc("residency_admissions_unanswered_total", "Admission calls whose answer the caller did not see (its context ended or the runtime was closed), by operation.", "op")

	mDecisions    = desc("residency_decisions_total", "Decisions the controller made, by call (decide, admit).", "call")
	mDecRefused   = desc("residency_decisions_refused_total", "Requests the controller refused (no decision), by call and error class.", "call", "class")
	mInexhaustive = desc("residency_decisions_inexhaustive_total", "Decisions the state limit cut short after a feasible assignment was found.", "call")
	mSearchLimit  = desc("residency_decisions_search_limit_total", "Requests refused with a search-limit error (no feasible assignment within the state limit).", "call")
	mStale        = desc("residency_decisions_stale_total", "Scope entries refused because the decision's state version was stale.")
	mEvictions    = desc("residency_decision_evictions_total", "Victims of the controller's decisions, by call and reason.", "call", "reason")
	mEvictedBytes = desc("residency_decision_evicted_bytes_total", "Charged bytes of the controller's victims, by call.", "call")
	mExplored     = desc("residency_decision_explored_states", "States the controller's search explored per decision.", "call")
	mDecideTime   = desc("residency_decide_duration_seconds", "Latency of Decide calls as the caller sees it (round trip and search).")
	mAdmitTime    = desc("residency_admit_duration_seconds", "Latency of Admit calls as the caller sees it (decision and scope entry, transfers included).")
	mScrapeError  = desc("residency_scrape_error", "Why the runtime's state could not be read.")
)

// Describe sends every metric's descriptor.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mInfo, mStateVersion, mValues, mBudget, mUsed, mReserved, mPeak, mTemporary,
		mReservations, mMats, mProtections, mCacheBudget, mCacheReserved, mCacheEntries, mCacheEvicted,
		mTransitions, mRemovals, mAdmissions, mRefused, mUnanswered, mDecisions, mDecRefused,
		mInexhaustive, mSearchLimit, mStale, mEvictions, mEvictedBytes, mExplored, mDecideTime, mAdmitTime, mScrapeError} {
		ch <- d
	}
}

// Collect reads one snapshot and the trace, each watched cache's
// statistics, and the facade's counters, and sends them. If the runtime
// cannot be read (it stopped on a fatal error), the state's gauges are
// replaced by an invalid metric carrying the error, which fails the
// scrape; the counters are still sent.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	s := m.sys
	ch <- prometheus.MustNewConstMetric(mInfo, prometheus.GaugeValue, 1, s.ManagerID(), s.Backend().Name())

	snap, err := s.Snapshot(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(mScrapeError, err)
	} else {
		m.count(snap)
		collectSnapshot(ch, snap)
		m.collectCaches(ctx, ch)
	}
	m.collectTrace(ch)
	collectStats(ch, s.CallStats())
}

// count takes the ledger's cumulative transition counts from snap.
func (m *Metrics) count(snap system.Snapshot) {
	for k, n := range snap.TransitionCounts {
		m.byKind[k] = n
	}
	for kind, n := range snap.RemovalCounts {
		m.removals[kind.String()] = n
	}
}

func collectSnapshot(ch chan<- prometheus.Metric, snap system.Snapshot) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(mStateVersion, float64(snap.StateVersion))
	g(mValues, float64(len(snap.Values)))
	type tally struct {
		states              [3]int
		uses, holds, events int
	}
	per := make(map[string]*tally, len(snap.Locations))
	for _, l := range snap.Locations {
		per[l.Location] = &tally{}
	}
	for _, v := range snap.Values {
		for _, mat := range v.Materializations {
			t := per[mat.Location]
			if t == nil {
				continue
			}
			if i := int(mat.State); i >= 0 && i < len(t.states) {
				t.states[i]++
			}
			t.uses += mat.UseCount
			t.holds += mat.HoldCount
			t.events += mat.PendingEventCount
		}
	}
	for _, l := range snap.Locations {
		name := l.Location
		if l.HasBudget {
			g(mBudget, float64(l.BudgetBytes), name)
		}
		g(mUsed, float64(l.UsedBytes), name)
		g(mReserved, float64(l.ReservedBytes), name)
		g(mPeak, float64(l.PeakBytes), name)
		g(mTemporary, float64(l.TemporaryBytes), name)
		g(mReservations, float64(len(l.Reservations)), name)
		t := per[name]
		for i, st := range []system.MatState{system.Entering, system.Resident, system.Leaving} {
			g(mMats, float64(t.states[i]), name, st.String())
		}
		g(mProtections, float64(t.uses), name, "lease")
		g(mProtections, float64(t.holds), name, "hold")
		g(mProtections, float64(t.events), name, "event")
	}
}

func (m *Metrics) collectCaches(ctx context.Context, ch chan<- prometheus.Metric) {
	kept := m.caches[:0]
	for _, c := range m.caches {
		st, err := c.Statistics(ctx)
		if errors.Is(err, system.ErrClosed) { // the cache or the runtime is closed
			continue
		}
		kept = append(kept, c)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(mScrapeError, err)
			continue
		}
		lv := []string{c.Owner(), c.Location()}
		if st.HasBudget {
			ch <- prometheus.MustNewConstMetric(mCacheBudget, prometheus.GaugeValue, float64(st.BudgetBytes), lv...)
		}
		ch <- prometheus.MustNewConstMetric(mCacheReserved, prometheus.GaugeValue, float64(st.ReservedBytes), lv...)
		ch <- prometheus.MustNewConstMetric(mCacheEntries, prometheus.GaugeValue, float64(st.Resources), lv...)
		ch <- prometheus.MustNewConstMetric(mCacheEvicted, prometheus.CounterValue, float64(st.Evictions), lv...)
	}
	for i := len(kept); i < len(m.caches); i++ {
		m.caches[i] = nil
	}
	m.caches = kept
}

func (m *Metrics) collectTrace(ch chan<- prometheus.Metric) {
	c := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, k := range sortedKeys(m.byKind) {
		c(mTransitions, m.byKind[k], k)
	}
	for _, r := range sortedKeys(m.removals) {
		c(mRemovals, m.removals[r], r)
	}
}

// collectStats sends the facade's counters and histograms.
func collectStats(ch chan<- prometheus.Metric, st system.CallStats) {
	cnt := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	hist := func(d *prometheus.Desc, h system.Histogram, labels ...string) {
		ch <- prometheus.MustNewConstHistogram(d, h.Count, h.Sum, h.Buckets, labels...)
	}
	for _, op := range st.Ops {
		cnt(mAdmissions, op.Answered, op.Op)
		cnt(mUnanswered, op.Unanswered, op.Op)
		for class, v := range op.Refused {
			cnt(mRefused, v, op.Op, class.String())
		}
	}
	for _, c := range st.Calls {
		cnt(mDecisions, c.Decisions, c.Call)
		cnt(mInexhaustive, c.Inexhaustive, c.Call)
		cnt(mSearchLimit, c.SearchLimit, c.Call)
		for class, v := range c.Refused {
			cnt(mDecRefused, v, c.Call, class.String())
		}
		cnt(mEvictedBytes, c.EvictedBytes, c.Call)
		for kind, v := range c.Evictions {
			cnt(mEvictions, v, c.Call, kind.String())
		}
		hist(mExplored, c.ExploredStates, c.Call)
	}
	cnt(mStale, st.Stale)
	hist(mDecideTime, st.DecideSeconds)
	hist(mAdmitTime, st.AdmitSeconds)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
