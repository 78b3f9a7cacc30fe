package metrics_test

import (
	"context"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
	"github.com/residency-go/residency/system/metrics"
)

// scrape gathers reg and indexes the samples by name and labels
// ("name{k=v,k=v}", labels sorted by name).
type scraped map[string]float64

func scrape(t *testing.T, reg *prometheus.Registry) (scraped, map[string]*dto.MetricFamily) {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	out := scraped{}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
		for _, m := range f.GetMetric() {
			key := seriesKey(f.GetName(), m.GetLabel())
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key+"_count"] = float64(m.GetHistogram().GetSampleCount())
				out[key+"_sum"] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out, byName
}

func seriesKey(name string, labels []*dto.LabelPair) string {
	var parts []string
	for _, l := range labels {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	sort.Strings(parts)
	return name + "{" + strings.Join(parts, ",") + "}"
}

// get returns a series that must exist.
func (s scraped) get(t *testing.T, key string) float64 {
	t.Helper()
	v, ok := s[key]
	require.Truef(t, ok, "no series %s", key)
	return v
}

// sum adds every series of a metric whose key contains all of parts.
func (s scraped) sum(name string, parts ...string) float64 {
	var total float64
next:
	for k, v := range s {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(k, p) {
				continue next
			}
		}
		total += v
	}
	return total
}

func zeroLoader(_ context.Context, dst []byte) error { clear(dst); return nil }

// TestMetricsAfterScenario runs a scripted scenario, scrapes, and checks
// every gauge against the snapshot at the scraped version and every
// counter against the calls the scenario made.
func TestMetricsAfterScenario(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"),
		system.Limit("pinned-host", 1<<20),
		system.Limit("cuda:0", 64<<10),
		system.Limit("cuda:1", 64<<10),
	}})
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			_ = sys.Close(ctx)
		}
	}()
	m, err := metrics.NewMetrics(sys)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(m))

	must := func(err error) { t.Helper(); require.NoError(t, err) }
	refused := func(err error, target any) { t.Helper(); require.ErrorAs(t, err, target) }
	register := func(v system.Value) system.Handle {
		t.Helper()
		h, err := sys.Register(ctx, v)
		require.NoError(t, err)
		return h
	}

	// Registrations: five answered and admitted, one refused (a duplicate
	// name), one a canceled caller never saw.
	a := register(system.Value{Name: "a", Bytes: 16 << 10, At: "cuda:0"})
	b := register(system.Value{Name: "b", Bytes: 32 << 10, Source: "pageable-host", Loader: zeroLoader})
	big := register(system.Value{Name: "big", Bytes: 40 << 10, At: "pinned-host"})
	c := register(system.Value{Name: "c", Bytes: 48 << 10, Mode: system.Replicable, At: "pinned-host"})
	huge := register(system.Value{Name: "huge", Bytes: 100 << 10, At: "pinned-host"})
	_, err = sys.Register(ctx, system.Value{Name: "a", Bytes: 1, At: "pinned-host"})
	var inv *system.InvalidInputError
	refused(err, &inv)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, sys.Place(canceled, big, "cuda:1"), context.Canceled)

	must(sys.Place(ctx, b, "cuda:0"))               // reconstructed through pageable-host
	var be *system.BudgetError                      // 16+32+40 KiB > 64 KiB
	refused(sys.Place(ctx, big, "cuda:0"), &be)     //
	must(sys.Copy(ctx, c, "pinned-host", "cuda:1")) //
	lease, err := sys.Acquire(ctx, a, "cuda:0")     //
	must(err)                                       //
	var iu *system.InUseError                       //
	refused(sys.Evict(ctx, a, "cuda:0"), &iu)       //
	hold, err := sys.Hold(ctx, b, "cuda:0")         //
	must(err)                                       //
	ev := system.NewManualEvent()                   //
	evID, err := lease.RecordEvent(ctx, ev)         // a stays protected by the event
	must(err)                                       //
	must(lease.Release(ctx))                        //
	must(sys.Reserve(ctx, "pinned-host", "kv", 100<<10))

	// A decision that evicts c from cuda:1 to make room for big.
	req := system.Request{Name: "big-on-gpu", Requirements: []system.Requirement{{Handle: big, Tiers: [][]string{{"cuda:1"}}}}}
	d, err := sys.Decide(ctx, req)
	must(err)
	require.Len(t, d.Evictions, 1)
	// Something commits in between: the decision is stale.
	must(sys.Reserve(ctx, "pinned-host", "kv2", 1<<10))
	var se *system.StaleStateError
	refused(sys.ScopeFor(d).Enter(ctx), &se)
	// Admit decides and enters in one step.
	scope, ad, err := sys.Admit(ctx, req)
	must(err)
	require.Len(t, ad.Evictions, 1)
	must(scope.Exit(ctx))
	// A search limit: huge fits nowhere on the devices, and one explored
	// state is not enough to reach pinned-host.
	_, err = sys.DecideWithLimit(ctx, system.Request{Name: "huge", Requirements: []system.Requirement{
		{Handle: huge, Tiers: [][]string{{"cuda:0", "cuda:1"}, {"pinned-host"}}}}}, 1)
	var sl *system.SearchLimitError
	refused(err, &sl)

	// A loader cache with one entry.
	lc, err := cache.New(ctx, sys, cache.Options{Location: "pinned-host", Name: "weights"})
	must(err)
	m.WatchCache(lc)
	l, err := cache.Load(ctx, lc, "w1", 8<<10, nil, func(context.Context) (string, int64, error) { return "w1", 4 << 10, nil })
	must(err)
	must(l.Release())

	got, fams := scrape(t, reg)
	snap, err := sys.Snapshot(ctx)
	must(err)
	trace, err := sys.Trace(ctx)
	must(err)
	require.Equal(t, float64(snap.StateVersion), got.get(t, "residency_state_version{}"), "nothing committed between the scrape and the snapshot")

	// Gauges: every figure of the snapshot.
	assert.Equal(t, float64(len(snap.Values)), got.get(t, "residency_values{}"))
	for _, loc := range snap.Locations {
		lbl := "{location=" + loc.Location + "}"
		if loc.HasBudget {
			assert.Equal(t, float64(loc.BudgetBytes), got.get(t, "residency_location_budget_bytes"+lbl), loc.Location)
		} else {
			assert.NotContains(t, got, "residency_location_budget_bytes"+lbl)
		}
		assert.Equal(t, float64(loc.UsedBytes), got.get(t, "residency_location_used_bytes"+lbl), loc.Location)
		assert.Equal(t, float64(loc.ReservedBytes), got.get(t, "residency_location_reserved_bytes"+lbl), loc.Location)
		assert.Equal(t, float64(loc.PeakBytes), got.get(t, "residency_location_peak_bytes"+lbl), loc.Location)
		assert.Equal(t, float64(loc.TemporaryBytes), got.get(t, "residency_location_temporary_bytes"+lbl), loc.Location)
		assert.Equal(t, float64(len(loc.Reservations)), got.get(t, "residency_location_reservations"+lbl), loc.Location)
		var states [3]int
		var uses, holds, events int
		for _, v := range snap.Values {
			for _, mat := range v.Materializations {
				if mat.Location == loc.Location {
					states[mat.State]++
					uses += mat.UseCount
					holds += mat.HoldCount
					events += mat.PendingEventCount
				}
			}
		}
		for i, st := range []system.MatState{system.Entering, system.Resident, system.Leaving} {
			assert.Equal(t, float64(states[i]), got.get(t, "residency_materializations{location="+loc.Location+",state="+st.String()+"}"))
		}
		assert.Equal(t, float64(uses), got.get(t, "residency_protections{kind=lease,location="+loc.Location+"}"))
		assert.Equal(t, float64(holds), got.get(t, "residency_protections{kind=hold,location="+loc.Location+"}"))
		assert.Equal(t, float64(events), got.get(t, "residency_protections{kind=event,location="+loc.Location+"}"))
	}
	// The scenario left one hold (b) and one pending event (a) at cuda:0.
	assert.Equal(t, 1.0, got.get(t, "residency_protections{kind=hold,location=cuda:0}"))
	assert.Equal(t, 1.0, got.get(t, "residency_protections{kind=event,location=cuda:0}"))
	assert.Equal(t, 0.0, got.get(t, "residency_protections{kind=lease,location=cuda:0}"))

	st, err := lc.Statistics(ctx)
	must(err)
	cl := "{cache=" + lc.Owner() + ",location=pinned-host}"
	assert.Equal(t, float64(st.BudgetBytes), got.get(t, "residency_cache_budget_bytes"+cl))
	assert.Equal(t, float64(4<<10), got.get(t, "residency_cache_reserved_bytes"+cl))
	assert.Equal(t, float64(st.ReservedBytes), got.get(t, "residency_cache_reserved_bytes"+cl))
	assert.Equal(t, float64(st.Resources), got.get(t, "residency_cache_entries"+cl))
	assert.Equal(t, float64(st.Evictions), got.get(t, "residency_cache_evictions_total"+cl))

	// Transitions by kind: the trace holds every version (1 … v), so
	// each kind's count must be the trace's.
	require.Equal(t, uint64(1), trace[0].Version)
	kinds := map[string]float64{}
	removals := map[string]float64{}
	for _, tr := range trace {
		kinds[tr.Kind]++
		if tr.Kind == "remove" {
			removals[tr.Removal.String()]++
		}
	}
	for k, n := range kinds {
		assert.Equal(t, n, got.get(t, "residency_transitions_total{kind="+k+"}"), k)
	}
	assert.Equal(t, float64(snap.StateVersion), got.sum("residency_transitions_total"))
	assert.Equal(t, 1.0, removals["reclaim"], "admit reclaimed c at cuda:1")
	for r, n := range removals {
		assert.Equal(t, n, got.get(t, "residency_removals_total{reason="+r+"}"), r)
	}

	// Admissions: the calls above, one by one.
	admissions := map[string]float64{"register": 6, "place": 2, "copy": 1, "move": 0, "evict": 1, "discard": 0,
		"reserve": 2, "execute": 0, "enter": 1, "admit": 1, "acquire": 1, "hold": 1}
	for op, n := range admissions {
		assert.Equal(t, n, got.get(t, "residency_admissions_total{op="+op+"}"), op)
	}
	assert.Equal(t, 1.0, got.get(t, "residency_admissions_unanswered_total{op=place}"))
	assert.Equal(t, 1.0, got.sum("residency_admissions_unanswered_total"))
	refusals := map[string]float64{
		"{class=InvalidInput,op=register}":          1,
		"{class=ResidencyBudgetError,op=place}":     1,
		"{class=ResidencyInUseError,op=evict}":      1,
		"{class=ResidencyStaleStateError,op=enter}": 1,
	}
	for k, n := range refusals {
		assert.Equal(t, n, got.get(t, "residency_admissions_refused_total"+k), k)
	}
	assert.Equal(t, 4.0, got.sum("residency_admissions_refused_total"), "no other refusal")

	// Decisions.
	assert.Equal(t, 1.0, got.get(t, "residency_decisions_total{call=decide}"))
	assert.Equal(t, 1.0, got.get(t, "residency_decisions_total{call=admit}"))
	assert.Equal(t, 1.0, got.get(t, "residency_decisions_refused_total{call=decide,class=ResidencySearchLimitError}"))
	assert.Equal(t, 1.0, got.sum("residency_decisions_refused_total"))
	assert.Equal(t, 1.0, got.get(t, "residency_decisions_search_limit_total{call=decide}"))
	assert.Equal(t, 0.0, got.get(t, "residency_decisions_search_limit_total{call=admit}"))
	assert.Equal(t, 1.0, got.get(t, "residency_decisions_stale_total{}"))
	assert.Equal(t, 1.0, got.get(t, "residency_decision_evictions_total{call=decide,reason=lowest_priority}"))
	assert.Equal(t, 1.0, got.get(t, "residency_decision_evictions_total{call=admit,reason=lowest_priority}"))
	assert.Equal(t, float64(48<<10), got.get(t, "residency_decision_evicted_bytes_total{call=admit}"))
	assert.Equal(t, 1.0, got.get(t, "residency_decision_explored_states{call=decide}_count"))
	assert.Equal(t, float64(d.ExploredStates), got.get(t, "residency_decision_explored_states{call=decide}_sum"))
	assert.Equal(t, float64(ad.ExploredStates), got.get(t, "residency_decision_explored_states{call=admit}_sum"))
	assert.Equal(t, 2.0, got.get(t, "residency_decide_duration_seconds{}_count"), "two Decide calls answered")
	assert.Equal(t, 1.0, got.get(t, "residency_admit_duration_seconds{}_count"))
	assert.Equal(t, dto.MetricType_HISTOGRAM, fams["residency_decide_duration_seconds"].GetType())
	assert.Positive(t, got.get(t, "residency_decide_duration_seconds{}_sum"))

	// Counters are cumulative: a second scrape with no call in between
	// reads the same counters and counts no transition twice.
	again, _ := scrape(t, reg)
	for k, v := range got {
		if strings.HasSuffix(k, "_total") || strings.Contains(k, "_total{") {
			assert.Equalf(t, v, again[k], "%s changed without a call", k)
		}
	}

	// After Close: the final snapshot (every location back to zero), the
	// same counters, and the shutdown's transitions counted too.
	must(hold.Release(ctx))
	ev.Complete()
	must(sys.WaitReaped(ctx, evID)) // reaped (asynchronously) before Close
	must(lc.Close(ctx))
	closed = true
	must(sys.Close(ctx))
	final, err := sys.Snapshot(ctx)
	must(err)
	after, _ := scrape(t, reg)
	assert.Equal(t, float64(final.StateVersion), after.get(t, "residency_state_version{}"))
	assert.Equal(t, 0.0, after.sum("residency_location_used_bytes"))
	assert.Equal(t, 0.0, after.sum("residency_location_reserved_bytes"))
	assert.Equal(t, float64(final.StateVersion), after.sum("residency_transitions_total"))
	assert.Equal(t, float64(final.TransitionCounts["remove"]), after.sum("residency_removals_total"))
	assert.Equal(t, got.get(t, "residency_admissions_total{op=register}"), after.get(t, "residency_admissions_total{op=register}"))
	assert.NotContains(t, after, "residency_cache_entries"+cl, "a closed cache is dropped")
}

// TestMetricsTraceOverrun: a trace ring smaller than the transitions
// between two scrapes (or none at all) loses nothing: the counts are the
// ledger's own, exact, and add up to the version.
func TestMetricsTraceOverrun(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{TraceCapacity: 4, Locations: []system.LocationConfig{
		system.Limit("pinned-host", 1<<20), system.Limit("cuda:0", 1<<20)}})
	require.NoError(t, err)
	defer func() { require.NoError(t, sys.Close(ctx)) }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(newMetrics(t, sys))

	for i := range 5 {
		require.NoError(t, sys.Reserve(ctx, "cuda:0", "r"+string(rune('a'+i)), 1))
	}
	got, _ := scrape(t, reg)
	assert.Equal(t, 5.0, got.get(t, "residency_state_version{}"))
	assert.Equal(t, 5.0, got.get(t, "residency_transitions_total{kind=reserve}"), "the ring holds 4; the count is 5")

	// Three more: all still in the ring at the next scrape.
	for i := range 3 {
		require.NoError(t, sys.Unreserve(ctx, "r"+string(rune('a'+i))))
	}
	got, _ = scrape(t, reg)
	assert.Equal(t, 3.0, got.get(t, "residency_transitions_total{kind=unreserve}"))
	assert.Equal(t, 5.0, got.get(t, "residency_transitions_total{kind=reserve}"))
	assert.Equal(t, 8.0, got.sum("residency_transitions_total"))

	// A disabled trace counts the same.
	off, err := startSoft(t, ctx, system.Options{DisableTrace: true, Locations: []system.LocationConfig{system.Limit("cuda:0", 1<<20)}})
	require.NoError(t, err)
	defer func() { require.NoError(t, off.Close(ctx)) }()
	reg2 := prometheus.NewRegistry()
	reg2.MustRegister(newMetrics(t, off))
	require.NoError(t, off.Reserve(ctx, "cuda:0", "x", 1))
	require.NoError(t, off.Unreserve(ctx, "x"))
	got, _ = scrape(t, reg2)
	assert.Equal(t, 1.0, got.get(t, "residency_transitions_total{kind=reserve}"))
	assert.Equal(t, 1.0, got.get(t, "residency_transitions_total{kind=unreserve}"))
}

// TestMetricsLintClean: the descriptors match what Collect sends (the
// pedantic registry checks it) and the names follow Prometheus's
// conventions (promlint).
func TestMetricsLintClean(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{Locations: []system.LocationConfig{system.Limit("cuda:0", 1<<20)}})
	require.NoError(t, err)
	defer func() { require.NoError(t, sys.Close(ctx)) }()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(newMetrics(t, sys)))
	fams, err := reg.Gather()
	require.NoError(t, err)
	problems, err := promlint.NewWithMetricFamilies(fams).Lint()
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// newMetrics is metrics.NewMetrics(sys), which must succeed.
func newMetrics(t *testing.T, sys *system.System) *metrics.Metrics {
	t.Helper()
	m, err := metrics.NewMetrics(sys)
	require.NoError(t, err)
	return m
}

// TestNewMetricsRefusesNil: a nil runtime is refused at construction
// (an InvalidInputError), not at the first scrape.
func TestNewMetricsRefusesNil(t *testing.T) {
	m, err := metrics.NewMetrics(nil)
	var inv *system.InvalidInputError
	require.ErrorAs(t, err, &inv)
	assert.Contains(t, err.Error(), "runtime is nil")
	assert.Nil(t, m)
}
