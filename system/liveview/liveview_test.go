package liveview_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
	"github.com/residency-go/residency/system/liveview"
	"github.com/residency-go/residency/system/replay"
)

const prefix = "/debug/residency"

// handler is handler(t, sys, opts...), which must succeed.
func handler(t *testing.T, sys *system.System, opts ...liveview.Option) http.Handler {
	t.Helper()
	h, err := liveview.Handler(sys, opts...)
	require.NoError(t, err)
	return h
}

// mount serves the live view of sys (with opts) under prefix on an
// httptest server, beside an application route of its own.
func mount(t *testing.T, sys *system.System, opts ...liveview.Option) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, handler(t, sys, opts...)))
	mux.HandleFunc("/app", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "app") })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func do(t *testing.T, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// populate leaves sys with a value resident at cuda:0 and leased, one on
// the host, a reservation and a refused admission.
func populate(t *testing.T, sys *system.System) {
	t.Helper()
	ctx := context.Background()
	w, err := sys.Register(ctx, system.Value{Name: "weights", Bytes: 256 << 10, At: "pageable-host"})
	require.NoError(t, err)
	require.NoError(t, sys.Place(ctx, w, "cuda:0"))
	_, err = sys.Register(ctx, system.Value{Name: "embedder", Bytes: 64 << 10, At: "pageable-host"})
	require.NoError(t, err)
	require.NoError(t, sys.Reserve(ctx, "cuda:0", "kv", 512<<10))
	_, err = sys.Register(ctx, system.Value{Name: "too-big", Bytes: 2 << 20, At: "cuda:0"})
	require.Error(t, err)
}

// TestSnapshotIsTheSnapshotsJSON: /snapshot, under a prefix, is the JSON
// form of System.Snapshot at the version it names, byte for byte.
func TestSnapshotIsTheSnapshotsJSON(t *testing.T) {
	sys := startSoft(t)
	populate(t, sys)
	srv := mount(t, sys)

	resp, body := do(t, http.MethodGet, srv.URL+prefix+"/snapshot")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))

	snap, err := sys.Snapshot(context.Background())
	require.NoError(t, err)
	var got struct {
		StateVersion uint64 `json:"state_version"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Equal(t, snap.StateVersion, got.StateVersion, "nothing changed between the two snapshots")
	want, err := replay.Marshal(replay.SnapshotOf(snap))
	require.NoError(t, err)
	assert.JSONEq(t, string(want), body)
	assert.Equal(t, string(want), body, "byte for byte")

	var sj replay.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &sj))
	require.Len(t, sj.Locations, 2)
	assert.Equal(t, int64(256<<10), sj.Locations[1].UsedBytes)
	assert.Equal(t, int64(512<<10), sj.Locations[1].ReservedBytes)
	require.Len(t, sj.Values, 2)
	assert.Equal(t, "weights", sj.Values[0].Handle)
}

// TestTrace: /trace is the trace ring in replay's form, ending at the
// runtime's state version.
func TestTrace(t *testing.T) {
	sys := startSoft(t)
	populate(t, sys)
	srv := mount(t, sys)

	resp, body := do(t, http.MethodGet, srv.URL+prefix+"/trace")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	tr, err := sys.Trace(context.Background())
	require.NoError(t, err)
	want, err := replay.Marshal(map[string]any{"trace": replay.TransitionsOf(tr)})
	require.NoError(t, err)
	assert.JSONEq(t, string(want), body)
	var tj struct{ Trace []replay.Transition }
	require.NoError(t, json.Unmarshal([]byte(body), &tj))
	require.NotEmpty(t, tj.Trace)
	v, err := sys.StateVersion(context.Background())
	require.NoError(t, err)
	assert.Equal(t, v, tj.Trace[len(tj.Trace)-1].Version)
}

// TestReadOnly: every method but GET and HEAD is 405, on every path
// (those of the options included), and changes nothing.
func TestReadOnly(t *testing.T) {
	f := newFixture(t)
	sys := f.sys
	srv := mount(t, sys, f.options()...)
	before, err := sys.StateVersion(context.Background())
	require.NoError(t, err)
	entries := f.cache.Entries()
	stats := f.pipeline.Stats()
	waiters := sys.Waiters()
	for _, path := range []string{"/", "/snapshot", "/trace", "/liveview.js", "/caches", "/pipelines", "/waiters", "/diagnose", "/diagnose?format=text", "/nope"} {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			resp, _ := do(t, m, srv.URL+prefix+path)
			assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", m, path)
			assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"), "%s %s", m, path)
		}
		resp, body := do(t, http.MethodHead, srv.URL+prefix+path)
		if path == "/nope" {
			assert.Equal(t, http.StatusNotFound, resp.StatusCode)
		} else {
			assert.Equal(t, http.StatusOK, resp.StatusCode, "HEAD %s", path)
		}
		assert.Empty(t, body, "HEAD %s", path)
	}
	after, err := sys.StateVersion(context.Background())
	require.NoError(t, err)
	assert.Equal(t, before, after)
	assert.Equal(t, entries, f.cache.Entries())
	assert.Equal(t, stats, f.pipeline.Stats())
	assert.Equal(t, waiters, sys.Waiters())
}

// TestUnknownPath: a path the view does not serve is 404; the
// application's own routes beside it are untouched.
func TestUnknownPath(t *testing.T) {
	sys := startSoft(t)
	srv := mount(t, sys)
	for _, path := range []string{"/nope", "/snapshot/", "/web/index.html", "/index.html", "/liveview.js/x", "/doc.go", "/caches/", "/pipelines/0", "/waiters/", "/diagnose/"} {
		resp, _ := do(t, http.MethodGet, srv.URL+prefix+path)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
	}
	resp, body := do(t, http.MethodGet, srv.URL+"/app")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "app", body)
	// The prefix without its slash is redirected to the page (ServeMux).
	resp, _ = do(t, http.MethodGet, srv.URL+prefix)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, prefix+"/", resp.Request.URL.Path)
}

var (
	linkAttr  = regexp.MustCompile(`(?:href|src|action)\s*=\s*"([^"]*)"`)
	fetchCall = regexp.MustCompile(`getJSON\("([^"]*)"\)|fetch\(\s*"([^"]*)"|extra\["([^"]*)"\]|href:\s*"([^"]*)"`)
)

// TestPageRelativeOnly: the page and its script link and fetch relative
// URLs only, each of which the view (with every option) serves under the
// prefix; nothing comes from outside.
func TestPageRelativeOnly(t *testing.T) {
	f := newFixture(t)
	srv := mount(t, f.sys, f.options()...)
	resp, page := do(t, http.MethodGet, srv.URL+prefix+"/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, page, "residency — live view")
	_, script := do(t, http.MethodGet, srv.URL+prefix+"/liveview.js")
	_, style := do(t, http.MethodGet, srv.URL+prefix+"/liveview.css")
	assert.NotContains(t, style, "url(", "the style loads nothing")
	assert.NotContains(t, style, "@import")

	var refs []string
	for _, m := range linkAttr.FindAllStringSubmatch(page, -1) {
		refs = append(refs, m[1])
	}
	for _, m := range fetchCall.FindAllStringSubmatch(script, -1) {
		refs = append(refs, m[1]+m[2]+m[3]+m[4])
	}
	assert.ElementsMatch(t, []string{"liveview.css", "liveview.js", "snapshot", "trace", "caches", "pipelines", "waiters", "diagnose", "diagnose?format=text"}, refs)
	for _, ref := range refs {
		assert.False(t, strings.HasPrefix(ref, "/"), "%q is absolute", ref)
		assert.NotContains(t, ref, ":", "%q names a scheme", ref)
		resp, _ := do(t, http.MethodGet, srv.URL+prefix+"/"+ref)
		assert.Equal(t, http.StatusOK, resp.StatusCode, ref)
	}
	for _, text := range []string{page, script, style} {
		assert.NotContains(t, text, "http://")
		assert.NotContains(t, text, "https://")
	}
}

// TestClosedRuntime: once the runtime is closed, /snapshot serves the
// final snapshot and /trace says it is closed.
func TestClosedRuntime(t *testing.T) {
	sys := startSoft(t)
	populate(t, sys)
	srv := mount(t, sys)
	require.NoError(t, sys.Close(context.Background()))
	resp, body := do(t, http.MethodGet, srv.URL+prefix+"/snapshot")
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, _ = do(t, http.MethodGet, srv.URL+prefix+"/trace")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

// TestCaches: /caches lists the caches given with WithCache, each with
// its statistics in replay's cache_stats form; none without it.
func TestCaches(t *testing.T) {
	ctx := context.Background()
	sys := startSoft(t)
	c, err := cache.New(ctx, sys, cache.Options{Location: "cuda:0", Name: "models"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(ctx) })
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, handler(t, sys, liveview.WithCache(c, c))))
	mux.Handle("/bare/", http.StripPrefix("/bare", handler(t, sys)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	resp, body := do(t, http.MethodGet, srv.URL+prefix+"/caches")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	st, err := c.Statistics(ctx)
	require.NoError(t, err)
	want, err := replay.Marshal(map[string]any{"caches": []any{map[string]any{"owner": c.Owner(), "stats": replay.CacheStatsOf(st), "entries": []any{}}}})
	require.NoError(t, err)
	assert.JSONEq(t, string(want), body)

	_, body = do(t, http.MethodGet, srv.URL+"/bare/caches")
	assert.JSONEq(t, `{"caches":[]}`, body)
}

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// TestHandlerRefusesNil: a nil runtime is refused at construction (an
// InvalidInputError), not by a panic at the first request.
func TestHandlerRefusesNil(t *testing.T) {
	h, err := liveview.Handler(nil)
	var inv *system.InvalidInputError
	require.ErrorAs(t, err, &inv)
	assert.Contains(t, err.Error(), "runtime is nil")
	assert.Nil(t, h)
}
