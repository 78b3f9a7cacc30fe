package liveview_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system/cache"
	"github.com/residency-go/residency/system/diagnose"
	"github.com/residency-go/residency/system/liveview"
)

type entryJSON struct {
	Key           string  `json:"key"`
	State         string  `json:"state"`
	Bytes         int64   `json:"bytes"`
	Leases        int     `json:"leases"`
	Pins          int     `json:"pins"`
	KeepAlives    int     `json:"keep_alives"`
	LastUse       *string `json:"last_use"`
	KeepAliveNS   *int64  `json:"keep_alive_ns"`
	Expiry        *string `json:"expiry"`
	EvictWhenIdle bool    `json:"evict_when_idle"`
}

type cachesJSON struct {
	Caches []struct {
		Owner   string          `json:"owner"`
		Stats   json.RawMessage `json:"stats"`
		Entries []entryJSON     `json:"entries"`
	} `json:"caches"`
}

// parseTime reads a JSON time (RFC 3339, null: the zero time).
func parseTime(t *testing.T, s *string) time.Time {
	t.Helper()
	if s == nil {
		return time.Time{}
	}
	x, err := time.Parse(time.RFC3339Nano, *s)
	require.NoError(t, err)
	return x
}

// TestCacheEntries: /caches lists each cache's entries, every field equal
// to Cache.Entries, in its order: a leased and pinned entry marked to
// leave when idle, an idle one with its expiry, one still loading.
func TestCacheEntries(t *testing.T) {
	f := newFixture(t)
	srv := mount(t, f.sys, f.options()...)
	before := f.cache.Entries()
	resp, body := do(t, http.MethodGet, srv.URL+prefix+"/caches")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, before, f.cache.Entries(), "the entries did not change around the request")

	var got cachesJSON
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Len(t, got.Caches, 1)
	assert.Equal(t, f.cache.Owner(), got.Caches[0].Owner)
	assert.NotEqual(t, "null", string(got.Caches[0].Stats))
	entries := got.Caches[0].Entries
	require.Len(t, entries, len(before))
	for i, e := range before {
		g := entries[i]
		assert.Equal(t, e.Key, g.Key)
		assert.Equal(t, e.State.String(), g.State, e.Key)
		assert.Equal(t, e.Bytes, g.Bytes, e.Key)
		assert.Equal(t, e.Leases, g.Leases, e.Key)
		assert.Equal(t, e.Pins, g.Pins, e.Key)
		assert.Equal(t, e.KeepAlives, g.KeepAlives, e.Key)
		assert.True(t, e.LastUse.Equal(parseTime(t, g.LastUse)), "%s last use %v, JSON %v", e.Key, e.LastUse, g.LastUse)
		assert.True(t, e.Expiry.Equal(parseTime(t, g.Expiry)), "%s expiry %v, JSON %v", e.Key, e.Expiry, g.Expiry)
		if e.KeepAlive < 0 {
			assert.Nil(t, g.KeepAliveNS, e.Key)
		} else if assert.NotNil(t, g.KeepAliveNS, e.Key) {
			assert.Equal(t, int64(e.KeepAlive), *g.KeepAliveNS, e.Key)
		}
		assert.Equal(t, e.EvictWhenIdle, g.EvictWhenIdle, e.Key)
	}

	// And the fixture's entries are what it made, so the comparison above
	// compared something.
	keep := int64(30 * time.Second)
	expiry := t0.Add(30 * time.Second).Format(time.RFC3339Nano)
	at := t0.Format(time.RFC3339Nano)
	assert.Equal(t, []entryJSON{
		{Key: "decoder", State: "ready", Bytes: 16 << 10, LastUse: &at, KeepAliveNS: &keep, Expiry: &expiry},
		{Key: "encoder", State: "ready", Bytes: 32 << 10, Leases: 2, Pins: 1, LastUse: &at, KeepAliveNS: &keep, EvictWhenIdle: true},
		{Key: "tokenizer", State: "loading", KeepAliveNS: &keep},
	}, entries)
	assert.Equal(t, cache.EntryLoading, before[2].State)
}

type pipelinesJSON struct {
	Pipelines []struct {
		Pipeline int `json:"pipeline"`
		Stats    struct {
			Slots            int              `json:"slots"`
			FreeSlots        int              `json:"free_slots"`
			SlotHolders      int              `json:"slot_holders"`
			SlotClaims       int64            `json:"slot_claims"`
			SlotWaits        int64            `json:"slot_waits"`
			CloneBytes       int64            `json:"clone_bytes"`
			CloneBudgetBytes int64            `json:"clone_budget_bytes"`
			PeakCloneBytes   int64            `json:"peak_clone_bytes"`
			Flushes          int64            `json:"flushes"`
			Drops            map[string]int64 `json:"drops"`
			Tasks            map[string]int   `json:"tasks"`
			Opened           int64            `json:"opened"`
			Written          int64            `json:"written"`
			Failed           int64            `json:"failed"`
			StepsStaged      int64            `json:"steps_staged"`
			LiveSteps        int64            `json:"live_steps"`
			CommittedBytes   int64            `json:"committed_bytes"`
			Failure          *string          `json:"failure"`
		} `json:"stats"`
	} `json:"pipelines"`
}

// TestPipelines: /pipelines shows each pipeline's Stats, every field
// equal to them, with the live tasks per state and the drops by reason;
// none without WithPipeline.
func TestPipelines(t *testing.T) {
	f := newFixture(t)
	srv := mount(t, f.sys, liveview.WithPipeline(f.pipeline, nil, f.pipeline))
	before := f.pipeline.Stats()
	resp, body := do(t, http.MethodGet, srv.URL+prefix+"/pipelines")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, before, f.pipeline.Stats(), "the pipeline did not change around the request")

	var got pipelinesJSON
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Len(t, got.Pipelines, 1, "a pipeline given twice is shown once, nil not at all")
	p := got.Pipelines[0]
	assert.Equal(t, 0, p.Pipeline)
	st := p.Stats
	assert.Equal(t, before.Slots, st.Slots)
	assert.Equal(t, before.FreeSlots, st.FreeSlots)
	assert.Equal(t, before.SlotHolders, st.SlotHolders)
	assert.Equal(t, before.SlotClaims, st.SlotClaims)
	assert.Equal(t, before.SlotWaits, st.SlotWaits)
	assert.Equal(t, before.CloneBytes, st.CloneBytes)
	assert.Equal(t, before.CloneBudgetBytes, st.CloneBudgetBytes)
	assert.Equal(t, before.PeakCloneBytes, st.PeakCloneBytes)
	assert.Equal(t, before.Flushes, st.Flushes)
	assert.Equal(t, map[string]int64{staging.DropBudget: before.Drops[staging.DropBudget], staging.DropLocation: before.Drops[staging.DropLocation]}, st.Drops)
	for _, s := range []staging.TaskState{staging.Pending, staging.Queued, staging.Copying, staging.HostReady} {
		assert.Equal(t, before.Tasks[s], st.Tasks[s.String()], s.String())
	}
	assert.Len(t, st.Tasks, 4, "the live states, zeros included")
	assert.Equal(t, before.Opened, st.Opened)
	assert.Equal(t, before.Written, st.Written)
	assert.Equal(t, before.Failed, st.Failed)
	assert.Equal(t, before.StepsStaged, st.StepsStaged)
	assert.Equal(t, before.LiveSteps, st.LiveSteps)
	assert.Equal(t, before.CommittedBytes, st.CommittedBytes)
	assert.Nil(t, st.Failure)
	assert.NoError(t, before.Failure)

	// The fixture's figures, so the comparison above compared something.
	assert.Equal(t, 2, st.Slots)
	assert.Equal(t, 0, st.FreeSlots, "the staged steps hold the slots")
	assert.Equal(t, 2, st.SlotHolders)
	assert.Equal(t, int64(2*row), st.CloneBytes)
	assert.Equal(t, int64(2*row), st.PeakCloneBytes)
	assert.Equal(t, int64(4*row), st.CloneBudgetBytes)
	assert.Equal(t, int64(1), st.Drops[staging.DropBudget])
	assert.Equal(t, 2, st.Tasks[staging.Pending.String()])

	// Order of keys: tasks in chain order, drops with the two reasons first.
	assert.Regexp(t, `"tasks":\{"PENDING":2,"QUEUED":0,"COPYING":0,"HOST_READY":0\}`, body)
	assert.Regexp(t, `"drops":\{"gpu-budget":1,"location-budget":0\}`, body)

	bare := mount(t, f.sys)
	_, body = do(t, http.MethodGet, bare.URL+prefix+"/pipelines")
	assert.JSONEq(t, `{"pipelines":[]}`, body)
}

// TestDiagnoseFeed: /diagnose is the diagnosis of the evidence the
// application hands the view: JSON (DiagnoseEvidence's MarshalJSON, byte
// for byte) or text (its String); null and a sentence while there is no
// failure; 404 without WithEvidence; 400 for an unknown format.
func TestDiagnoseFeed(t *testing.T) {
	f := newFixture(t)
	none := &kept{}
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, handler(t, f.sys, liveview.WithEvidence(f.evidence.last))))
	mux.Handle("/none/", http.StripPrefix("/none", handler(t, f.sys, liveview.WithEvidence(none.last), liveview.WithEvidence(nil))))
	mux.Handle("/bare/", http.StripPrefix("/bare", handler(t, f.sys)))
	srv := newServer(t, mux)

	d := diagnose.DiagnoseEvidence(f.failure)
	require.Equal(t, "ResidencyBudgetError", d.Class)
	want, err := d.MarshalJSON()
	require.NoError(t, err)
	for _, q := range []string{"", "?format=json"} {
		resp, body := do(t, http.MethodGet, srv.URL+prefix+"/diagnose"+q)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
		assert.Equal(t, string(want), body, "byte for byte, %q", q)
	}
	var got struct {
		Class        string `json:"class"`
		StateVersion uint64 `json:"state_version"`
		Operation    struct {
			Kind string `json:"kind"`
		} `json:"operation"`
	}
	require.NoError(t, json.Unmarshal([]byte(want), &got))
	assert.Equal(t, d.Class, got.Class)
	assert.Equal(t, f.failure.Snapshot.StateVersion, got.StateVersion)
	assert.Equal(t, "register", got.Operation.Kind)

	resp, body := do(t, http.MethodGet, srv.URL+prefix+"/diagnose?format=text")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Equal(t, d.String(), body)

	resp, body = do(t, http.MethodGet, srv.URL+prefix+"/diagnose?format=xml")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, `"xml"`)

	resp, body = do(t, http.MethodGet, srv.URL+"/none/diagnose")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "null", body)
	_, body = do(t, http.MethodGet, srv.URL+"/none/diagnose?format=text")
	assert.Equal(t, "no failure to diagnose\n", body)
	none.set(f.failure)
	_, body = do(t, http.MethodGet, srv.URL+"/none/diagnose")
	assert.Equal(t, string(want), body, "the view reads the evidence at each request")

	resp, _ = do(t, http.MethodGet, srv.URL+"/bare/diagnose")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = do(t, http.MethodPost, srv.URL+prefix+"/diagnose")
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "evidence is never posted")

	// The diagnosis reads the evidence, not the runtime now (a change at
	// pinned-host: the fixture's waiter holds cuda:0's room).
	require.NoError(t, f.sys.Reserve(context.Background(), "pinned-host", "later", 1<<10))
	_, body = do(t, http.MethodGet, srv.URL+prefix+"/diagnose")
	assert.Equal(t, string(want), body)
}

// TestCachesClosed: once the runtime is closed, a cache shows the error
// of its statistics in their place, and no entries.
func TestCachesClosed(t *testing.T) {
	ctx := context.Background()
	sys := startSoft(t)
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "gone"})
	require.NoError(t, err)
	srv := mount(t, sys, liveview.WithCache(c))
	require.NoError(t, sys.Close(ctx))
	_, body := do(t, http.MethodGet, srv.URL+prefix+"/caches")
	var got struct {
		Caches []struct {
			Stats   *json.RawMessage `json:"stats"`
			Error   string           `json:"error"`
			Entries []entryJSON      `json:"entries"`
		} `json:"caches"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Len(t, got.Caches, 1)
	assert.Nil(t, got.Caches[0].Stats)
	assert.NotEmpty(t, got.Caches[0].Error)
	assert.NotNil(t, got.Caches[0].Entries)
	assert.Empty(t, got.Caches[0].Entries)
}
