package liveview

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
	"github.com/residency-go/residency/system/diagnose"
	"github.com/residency-go/residency/system/wire"
)

// The feeds of the options: /caches (WithCache), /pipelines
// (WithPipeline) and /diagnose (WithEvidence); and /waiters.

// cacheView is one cache on /caches: its owner name (Cache.Owner), its
// statistics in the form of replay's cache_stats op, or why they could
// not be read, and its entries.
type cacheView struct {
	Owner   string           `json:"owner"`
	Stats   *wire.CacheStats `json:"stats"`
	Error   string           `json:"error,omitempty"`
	Entries []cacheEntry     `json:"entries"`
}

// cacheEntry is the JSON form of one entry of a loader cache on /caches
// ([cache.Entry]). Times are RFC 3339 in UTC, to the nanosecond.
type cacheEntry struct {
	Key string `json:"key"`
	// State is "loading" or "ready".
	State string `json:"state"`
	// Bytes are the declared resident bytes (0 while loading, and for a
	// value loaded with cache.LoadBudgeted).
	Bytes int64 `json:"bytes"`
	// Leases, Pins and KeepAlives count the references that hold it.
	Leases     int `json:"leases"`
	Pins       int `json:"pins"`
	KeepAlives int `json:"keep_alives"`
	// LastUse is when a caller last took it or its last holder let it go
	// (null while it loads).
	LastUse *string `json:"last_use"`
	// KeepAliveNS is its keep-alive in nanoseconds: null when it is kept
	// until evicted (cache.KeepForever), 0 when it unloads once idle.
	KeepAliveNS *int64 `json:"keep_alive_ns"`
	// Expiry is when it leaves if nobody uses it before (null while it is
	// held or loading, or kept forever).
	Expiry *string `json:"expiry"`
	// EvictWhenIdle: marked to leave once idle (Cache.EvictWhenIdle).
	EvictWhenIdle bool `json:"evict_when_idle"`
}

// entryOf is e in the JSON form /caches serves.
func entryOf(e cache.Entry) cacheEntry {
	out := cacheEntry{
		Key: e.Key, State: e.State.String(), Bytes: e.Bytes,
		Leases: e.Leases, Pins: e.Pins, KeepAlives: e.KeepAlives,
		LastUse: timeOf(e.LastUse), Expiry: timeOf(e.Expiry), EvictWhenIdle: e.EvictWhenIdle,
	}
	if e.KeepAlive >= 0 {
		ns := int64(e.KeepAlive)
		out.KeepAliveNS = &ns
	}
	return out
}

func timeOf(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

func (h *handler) cacheStats(w http.ResponseWriter, r *http.Request) {
	out := make([]cacheView, 0, len(h.cfg.caches))
	for _, c := range h.cfg.caches {
		v := cacheView{Owner: c.Owner()}
		st, err := c.Statistics(r.Context())
		if err != nil {
			v.Error = err.Error()
		} else {
			v.Stats = wire.CacheStatsOf(st)
		}
		es := c.Entries()
		v.Entries = make([]cacheEntry, 0, len(es))
		for _, e := range es {
			v.Entries = append(v.Entries, entryOf(e))
		}
		out = append(out, v)
	}
	writeJSON(w, struct {
		Caches []cacheView `json:"caches"`
	}{out})
}

// pipelineView is one pipeline on /pipelines: its position among those
// given with WithPipeline, and its counters.
type pipelineView struct {
	Pipeline int                `json:"pipeline"`
	Stats    *wire.StagingStats `json:"stats"`
}

// liveTaskStates are the states a live task can be in, in chain order.
var liveTaskStates = []staging.TaskState{staging.Pending, staging.Queued, staging.Copying, staging.HostReady}

// pipelineStatsOf is st in the JSON form /pipelines serves: the form of
// replay's staging_stats op (wire.StagingStats), with the live tasks
// per state in chain order (pending, queued, copying, host_ready, zeros
// included), the drops by reason (the gpu-budget and location-budget
// reasons first, zeros included, then any other in name order) and the
// failure's message (null while healthy).
func pipelineStatsOf(st staging.Stats) *wire.StagingStats {
	out := &wire.StagingStats{
		Slots: st.Slots, FreeSlots: st.FreeSlots, SlotHolders: st.SlotHolders, SlotClaims: st.SlotClaims, SlotWaits: st.SlotWaits,
		CloneBytes: st.CloneBytes, CloneBudgetBytes: st.CloneBudgetBytes, PeakCloneBytes: st.PeakCloneBytes,
		Flushes: st.Flushes, Opened: st.Opened, Written: st.Written, Failed: st.Failed,
		StepsStaged: st.StepsStaged, LiveSteps: st.LiveSteps, CommittedBytes: st.CommittedBytes,
		Drops: wire.Object{{Key: staging.DropBudget, Value: st.Drops[staging.DropBudget]}, {Key: staging.DropLocation, Value: st.Drops[staging.DropLocation]}},
		Tasks: make(wire.Object, 0, len(liveTaskStates)),
	}
	var other []string
	for reason := range st.Drops {
		if reason != staging.DropBudget && reason != staging.DropLocation {
			other = append(other, reason)
		}
	}
	slices.Sort(other)
	for _, reason := range other {
		out.Drops = append(out.Drops, wire.Field{Key: reason, Value: st.Drops[reason]})
	}
	for _, s := range liveTaskStates {
		out.Tasks = append(out.Tasks, wire.Field{Key: s.String(), Value: st.Tasks[s]})
	}
	if st.Failure != nil {
		msg := st.Failure.Error()
		out.Failure = &msg
	}
	return out
}

func (h *handler) pipelineStats(w http.ResponseWriter) {
	out := make([]pipelineView, 0, len(h.cfg.pipelines))
	for i, p := range h.cfg.pipelines {
		out = append(out, pipelineView{Pipeline: i, Stats: pipelineStatsOf(p.Stats())})
	}
	writeJSON(w, struct {
		Pipelines []pipelineView `json:"pipelines"`
	}{out})
}

// noFailure is the text form of /diagnose while there is no failure.
const noFailure = "no failure to diagnose\n"

// diagnosis serves the diagnosis of the application's last failure:
// JSON (the default, or format=json) or text (format=text).
func (h *handler) diagnosis(w http.ResponseWriter, r *http.Request) {
	if h.cfg.evidence == nil {
		http.Error(w, "no evidence to diagnose: the view is mounted without liveview.WithEvidence", http.StatusNotFound)
		return
	}
	format := r.URL.Query().Get("format")
	if format != "" && format != "json" && format != "text" {
		http.Error(w, fmt.Sprintf("format must be json or text, got %q", format), http.StatusBadRequest)
		return
	}
	ev, ok := h.cfg.evidence()
	if format == "text" {
		var b bytes.Buffer
		if !ok {
			b.WriteString(noFailure)
		} else if err := diagnose.DiagnoseEvidence(ev).Render(&b); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b.Bytes())
		return
	}
	if !ok {
		writeJSON(w, nil)
		return
	}
	writeJSON(w, diagnose.DiagnoseEvidence(ev))
}

// waiterView is the JSON form of one caller waiting for room on /waiters
// ([system.WaiterInfo]).
type waiterView struct {
	Name        string   `json:"name"`
	Class       int      `json:"class"`
	Locations   []string `json:"locations"`
	AllowBypass bool     `json:"allow_bypass"`
	// Since is when it was queued, RFC 3339 in UTC.
	Since    *string `json:"since"`
	Tries    int     `json:"tries"`
	Eligible bool    `json:"eligible"`
}

func waiterOf(w system.WaiterInfo) waiterView {
	locs := w.Locations
	if locs == nil {
		locs = []string{}
	}
	return waiterView{Name: w.Name, Class: w.Class, Locations: locs, AllowBypass: w.AllowBypass,
		Since: timeOf(w.Since), Tries: w.Tries, Eligible: w.Eligible}
}

// waiters serves the callers waiting for room, in queue order.
func (h *handler) waiters(w http.ResponseWriter) {
	ws := h.sys.Waiters()
	out := make([]waiterView, 0, len(ws))
	for _, x := range ws {
		out = append(out, waiterOf(x))
	}
	writeJSON(w, struct {
		Waiters []waiterView `json:"waiters"`
	}{out})
}
