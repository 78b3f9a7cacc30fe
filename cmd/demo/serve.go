package main

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"github.com/residency-go/residency/system/replay"
	"io"
	"io/fs"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/liveview"
	"github.com/residency-go/residency/system/metrics"
)

// demo serve: a runtime driven by a script (the embedded scenario or
// --script FILE) one op at a time, slowed down, with an HTTP view of it:
// the live view of package system/liveview (/snapshot and /trace, JSON,
// in the script's words), /activity (JSON: the script's progress, its
// last ops and decisions), /metrics (Prometheus), /healthz, and a live
// page at / that polls them: the view's panels plus the script's.

//go:embed web
var webFiles embed.FS

const (
	defaultServeAddr  = "127.0.0.1:8080"
	defaultServeDelay = 800 * time.Millisecond
	keptOps           = 40 // the last ops /activity lists
	keptDecisions     = 10 // the last decisions /activity lists
)

type serveOptions struct {
	addr   string
	script string // "" for the embedded scenario
	delay  time.Duration
	// ready is called with the page's URL once the server listens, and
	// the server itself (tests).
	ready func(url string, s *server)
}

// serveExitText is the exit status of serve, in its usage and README.
const serveExitText = `
Serves until Ctrl-C (SIGINT) or SIGTERM, which stop it alike. Exit status:
0 once stopped when every expectation of the script that ran held; 1 when
one failed (each is reported on standard error as it fails, the count when
serve stops) or the server failed; 2 for bad flags, a malformed script or
an address it cannot listen on.

`

func serveMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo serve", flag.ContinueOnError)
	o := serveOptions{}
	fs.StringVar(&o.addr, "addr", defaultServeAddr, "`host:port` to listen on (loopback unless told otherwise; port 0 picks a free one)")
	fs.StringVar(&o.script, "script", "", "replay script `FILE` to run instead of the embedded scenario (- for standard input)")
	fs.DurationVar(&o.delay, "delay", defaultServeDelay, "pause between two ops, so a person can watch")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: demo serve [--addr HOST:PORT] [--script FILE] [--delay DURATION]")
		fmt.Fprint(fs.Output(), serveExitText)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo serve: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	if o.delay < 0 {
		fmt.Fprintln(stderr, "demo serve: --delay must not be negative")
		fs.Usage()
		return 2
	}
	// ctx ends at Ctrl-C or SIGTERM (main handles both); a second one
	// kills the process.
	return serve(ctx, o, stdin, stdout, stderr)
}

// server is the state the handlers read.
type server struct {
	sys     *system.System
	reg     *prometheus.Registry
	metrics *metrics.Metrics
	view    http.Handler // the live view of package system/liveview
	name    string       // the script's name

	mu        sync.Mutex // guards the runner and everything below
	run       *replay.Runner
	ops       []opView
	decisions []decisionView
	total     int // ops in the script
	done      int // ops finished
	finished  bool
	failed    int // failed expectations
	closed    bool
}

// opView is one op's outcome on the page.
type opView struct {
	Line         int    `json:"line"`
	Op           string `json:"op"`
	OK           bool   `json:"ok"`
	StateVersion uint64 `json:"state_version"`
	ErrorType    string `json:"error_type,omitempty"`
	Message      string `json:"message,omitempty"`
	Expect       string `json:"expect,omitempty"`
	Held         *bool  `json:"expectation_held,omitempty"`
}

// decisionView is a decide op's decision on the page.
type decisionView struct {
	Line     int              `json:"line"`
	As       string           `json:"as"`
	Request  string           `json:"request"`
	Decision *replay.Decision `json:"decision"`
}

type activityView struct {
	Script    string         `json:"script"`
	Ops       int            `json:"ops"`
	Done      int            `json:"done"`
	Finished  bool           `json:"finished"`
	Failed    int            `json:"failed_expectations"`
	Recent    []opView       `json:"recent_ops"`
	Decisions []decisionView `json:"decisions"`
}

// serve runs the script against a runtime while serving the view, then
// keeps serving until ctx ends (Ctrl-C or SIGTERM). Exit status
// (serveExitText): 0 once stopped when every expectation that ran held, 1
// when one did not or the server failed, 2 for a malformed script or an
// address it cannot listen on.
func serve(ctx context.Context, o serveOptions, stdin io.Reader, stdout, stderr io.Writer) int {
	s, sr, src, code := prepareServe(ctx, o, stdin, stderr)
	if s == nil {
		return code
	}
	defer src.close()
	return s.listenAndPlay(ctx, o, sr, stdout, stderr)
}

// prepareServe checks the script (the embedded scenario when o names
// none), reads it again and starts the runtime of its start op: the
// server, the reader at its first op after start and the script's
// source (the caller closes it); or no server and the exit status.
func prepareServe(ctx context.Context, o serveOptions, stdin io.Reader, stderr io.Writer) (_ *server, _ *replay.Reader, _ *scriptSource, code int) {
	path, in := o.script, stdin
	name := o.script
	if path == "" {
		embedded, err := webFiles.ReadFile("web/scenario.jsonl")
		if err != nil {
			fmt.Fprintf(stderr, "demo serve: %v\n", err)
			return nil, nil, nil, 1
		}
		path, in, name = "-", bytes.NewReader(embedded), "embedded scenario"
	}
	src, err := openScript(ctx, path, in)
	if err != nil {
		fmt.Fprintf(stderr, "demo serve: %v\n", err)
		return nil, nil, nil, 2
	}
	started := false
	defer func() {
		if !started {
			src.close()
		}
	}()
	info, err := replay.Check(ctx, src.first, src.tee)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, nil, 0 // Ctrl-C before anything ran
		}
		fmt.Fprintf(stderr, "demo serve: %s: %s\n", escapeText(name), escapeText(err.Error()))
		return nil, nil, nil, 2
	}
	r, err := src.again()
	if err != nil {
		fmt.Fprintf(stderr, "demo serve: %s: reading the script again: %v\n", path, err)
		return nil, nil, nil, 2
	}
	sr := replay.NewReader(ctx, r, nil)
	start, ok, err := sr.Next()
	if err != nil || !ok {
		fmt.Fprintf(stderr, "demo serve: %s: the script changed after it was checked\n", escapeText(name))
		return nil, nil, nil, 2
	}
	run, err := replay.Start(ctx, start)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, nil, 0
		}
		fmt.Fprintf(stderr, "demo serve: %s: line %d: bad start: %v\n", escapeText(name), start.Line, err)
		return nil, nil, nil, 2
	}
	sys := run.System()
	s := &server{sys: sys, reg: prometheus.NewRegistry(), name: name, run: run, total: info.Ops, done: 1}
	if s.metrics, err = metrics.NewMetrics(sys); err == nil {
		s.view, err = liveview.Handler(sys, liveview.WithJSON(s.snapshotJSON, s.traceJSON))
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo serve: %v\n", err)
		_ = run.Close(ctx)
		return nil, nil, nil, 1
	}
	s.reg.MustRegister(s.metrics)
	started = true
	return s, sr, src, 0
}

// listenAndPlay serves the HTTP view on o.addr while it plays the rest of
// the script, until ctx ends, then closes the runtime; it returns the
// exit status.
func (s *server) listenAndPlay(ctx context.Context, o serveOptions, sr *replay.Reader, stdout, stderr io.Writer) int {
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		s.closeRun(ctx, stderr)
		fmt.Fprintf(stderr, "demo serve: %v\n", err)
		return 2
	}
	url := "http://" + ln.Addr().String() + "/"
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "demo serve: %s on %s (Ctrl-C to stop)\n", s.name, url)
	if o.ready != nil {
		o.ready(url, s)
	}

	code := 0
	if err := s.play(ctx, sr, o.delay, stderr); err != nil {
		fmt.Fprintf(stderr, "demo serve: %s: %v\n", escapeText(s.name), err)
		code = 1
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		fmt.Fprintf(stderr, "demo serve: %v\n", err)
		s.closeRun(ctx, stderr)
		return 1
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-served
	s.closeRun(ctx, stderr)
	if s.failed > 0 {
		fmt.Fprintf(stderr, "demo serve: %s: %d failed expectation(s)\n", escapeText(s.name), s.failed)
		code = 1
	}
	fmt.Fprintln(stderr, "demo serve: stopped")
	return code
}

// closeRun closes the runtime; /healthz answers 503 from then on.
func (s *server) closeRun(ctx context.Context, stderr io.Writer) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if err := s.run.Close(cctx); err != nil {
		var oe *system.OutstandingError
		if !errors.As(err, &oe) {
			fmt.Fprintf(stderr, "demo serve: closing the runtime: %s\n", escapeText(err.Error()))
		}
	}
}

// play runs the script's ops after start, one every delay, until the
// script ends or ctx does.
func (s *server) play(ctx context.Context, sr *replay.Reader, delay time.Duration, stderr io.Writer) error {
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		o, ok, err := sr.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("the script changed after it was checked: %w", err)
		}
		if !ok {
			break
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		s.mu.Lock()
		res := s.run.Do(ctx, o)
		if ctx.Err() != nil && res.Err() != nil && isContextError(res.Err()) {
			s.mu.Unlock()
			return nil // interrupted: no result to show
		}
		s.record(o, &res, stderr)
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.finished = true
	s.mu.Unlock()
	return nil
}

// record keeps an op's outcome (s.mu held).
func (s *server) record(o replay.Op, res *replay.Result, stderr io.Writer) {
	s.done++
	v := opView{Line: res.Line, Op: res.Op, OK: res.OK, StateVersion: res.StateVersion, Expect: o.Expect}
	if res.Error != nil {
		v.ErrorType, v.Message = res.Error.Type, res.Error.Message
	}
	if o.Expect != "" {
		held := replay.Matches(o.Expect, res)
		v.Held = &held
		if !held {
			s.failed++
			got := "ok"
			if !res.OK {
				got = res.Error.Type + ": " + res.Error.Message
			}
			fmt.Fprintf(stderr, "demo serve: %s: line %d: %s: expected %s, got %s\n", escapeText(s.name), o.Line, o.Name, o.Expect, escapeText(got))
		}
	}
	s.ops = append(s.ops, v)
	if len(s.ops) > keptOps {
		s.ops = s.ops[len(s.ops)-keptOps:]
	}
	if res.Decision != nil {
		d := decisionView{Line: res.Line, As: o.As(), Request: o.RequestName(), Decision: res.Decision}
		s.decisions = append(s.decisions, d)
		if len(s.decisions) > keptDecisions {
			s.decisions = s.decisions[len(s.decisions)-keptDecisions:]
		}
	}
	for _, c := range s.run.Caches() {
		s.metrics.WatchCache(c)
	}
}

// routes serves the live view of package system/liveview (its script
// and style, /snapshot and /trace, in the script's words) and, beside it,
// demo serve's own: its page (the view's panels plus the script's
// progress, decisions and ops), /activity, /metrics and /healthz.
func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	page, _ := fs.Sub(webFiles, "web")
	mux.Handle("GET /{$}", http.FileServerFS(page))
	mux.Handle("/", s.view)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /activity", s.activity)
	mux.HandleFunc("GET /healthz", s.healthz)
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := replay.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// snapshotJSON is the snapshot in the replay's JSON form, in the
// script's words (the "snapshot" of `demo replay --json`).
func (s *server) snapshotJSON(snap system.Snapshot) *replay.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.run.Snapshot(snap)
}

// traceJSON is the trace ring in the replay's JSON form, in the script's
// words.
func (s *server) traceJSON(tr []system.Transition) []replay.Transition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.run.Transitions(tr)
}

// activity serves the script's progress, its last ops and decisions.
func (s *server) activity(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	a := activityView{Script: s.name, Ops: s.total, Done: s.done, Finished: s.finished, Failed: s.failed,
		Recent: append([]opView{}, s.ops...), Decisions: append([]decisionView{}, s.decisions...)}
	s.mu.Unlock()
	writeJSON(w, a)
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		http.Error(w, "closed", http.StatusServiceUnavailable)
		return
	}
	if _, err := s.sys.StateVersion(r.Context()); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok\n")
}
