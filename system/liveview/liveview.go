package liveview

import (
	"embed"
	"net/http"
	"slices"
	"strings"

	"github.com/residency-go/residency/staging"
	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cache"
	"github.com/residency-go/residency/system/diagnose"
	"github.com/residency-go/residency/system/wire"
)

//go:embed web
var webFiles embed.FS

// Option adjusts a [Handler].
type Option func(*config)

type config struct {
	snapshot  func(system.Snapshot) *wire.Snapshot
	trace     func([]system.Transition) []wire.Transition
	caches    []*cache.Cache
	pipelines []*staging.Pipeline
	evidence  func() (diagnose.Evidence, bool)
}

// WithCache shows the loader caches cs: their statistics and their
// entries (Cache.Entries: state, bytes, leases, pins, keep-alives, last
// use, keep-alive, expiry, the evict-when-idle mark) under /caches and
// on the page, in the order given (a cache given twice is shown once).
// Each request to /caches asks each cache for its statistics (a round
// trip to the runtime) and lists its entries (under the cache's lock).
func WithCache(cs ...*cache.Cache) Option {
	return func(c *config) {
		for _, x := range cs {
			if x != nil && !slices.Contains(c.caches, x) {
				c.caches = append(c.caches, x)
			}
		}
	}
}

// WithPipeline shows the staging pipelines ps (package staging): their
// counters (Pipeline.Stats: live tasks per state, staging slots, the
// clone budget's use, peak and cap, drops by reason, failure) under
// /pipelines and on the page, in the order given (a pipeline given twice
// is shown once), each by its position in that order. Stats never blocks
// on a pipeline's work, and works after its Close.
func WithPipeline(ps ...*staging.Pipeline) Option {
	return func(c *config) {
		for _, p := range ps {
			if p != nil && !slices.Contains(c.pipelines, p) {
				c.pipelines = append(c.pipelines, p)
			}
		}
	}
}

// WithEvidence serves /diagnose: the diagnosis
// (diagnose.DiagnoseEvidence) of the evidence that last returns, which
// the application keeps (typically the diagnose.Capture of its last
// failed call). last reports false while there is no failure to
// diagnose. It is called from the request's goroutine, once per request
// to /diagnose (and so twice a second while the page is open), possibly
// concurrently: return what is kept, quickly, and do not call the
// runtime from it. Without it, /diagnose is 404. A nil last changes
// nothing. The view only reads: evidence is never posted to it.
func WithEvidence(last func() (diagnose.Evidence, bool)) Option {
	return func(c *config) {
		if last != nil {
			c.evidence = last
		}
	}
}

// WithJSON renders /snapshot and /trace with snapshot and trace instead
// of [wire.SnapshotOf] and [wire.TransitionsOf]: a program that names
// things in its own words (a replay script's runner, whose
// Runner.Snapshot and Runner.Transitions name reservations, leases and
// holds as the script does) shows them in those words. The forms stay
// replay's, which the page reads. Either may be nil for the default. They
// are called from the request's goroutine, one call per request, possibly
// concurrently.
func WithJSON(snapshot func(system.Snapshot) *wire.Snapshot, trace func([]system.Transition) []wire.Transition) Option {
	return func(c *config) {
		if snapshot != nil {
			c.snapshot = snapshot
		}
		if trace != nil {
			c.trace = trace
		}
	}
}

// Handler returns the live view of sys (see the package documentation for
// what each path serves). Mount it under a prefix with http.StripPrefix;
// it holds nothing but sys and its options, and costs nothing between
// requests. Errors: a nil sys ([*system.InvalidInputError]).
func Handler(sys *system.System, opts ...Option) (http.Handler, error) {
	if sys == nil {
		return nil, &system.InvalidInputError{Message: "liveview: the runtime is nil"}
	}
	c := config{snapshot: snapshotOf, trace: transitionsOf}
	for _, o := range opts {
		o(&c)
	}
	return &handler{sys: sys, cfg: c}, nil
}

type handler struct {
	sys *system.System
	cfg config
}

// assets are the files under web/ the handler serves, by path.
var assets = map[string]struct{ file, contentType string }{
	"/":             {"web/index.html", "text/html; charset=utf-8"},
	"/liveview.js":  {"web/liveview.js", "text/javascript; charset=utf-8"},
	"/liveview.css": {"web/liveview.css", "text/css; charset=utf-8"},
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the live view is read-only", http.StatusMethodNotAllowed)
		return
	}
	path := r.URL.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path // mounted with the prefix's trailing slash stripped
	}
	switch path {
	case "/snapshot":
		h.snapshot(w, r)
		return
	case "/trace":
		h.traceRing(w, r)
		return
	case "/caches":
		h.cacheStats(w, r)
		return
	case "/pipelines":
		h.pipelineStats(w)
		return
	case "/waiters":
		h.waiters(w)
		return
	case "/diagnose":
		h.diagnosis(w, r)
		return
	}
	a, ok := assets[path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	b, err := webFiles.ReadFile(a.file)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", a.contentType)
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}

func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := h.sys.Snapshot(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, h.cfg.snapshot(snap))
}

func (h *handler) traceRing(w http.ResponseWriter, r *http.Request) {
	tr, err := h.sys.Trace(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, struct {
		Trace []wire.Transition `json:"trace"`
	}{h.cfg.trace(tr)})
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := wire.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// snapshotOf and transitionsOf are the default JSON forms: the runtime's
// own words.
func snapshotOf(s system.Snapshot) *wire.Snapshot { return wire.SnapshotOf(s, nil) }

func transitionsOf(ts []system.Transition) []wire.Transition { return wire.TransitionsOf(ts, nil) }
