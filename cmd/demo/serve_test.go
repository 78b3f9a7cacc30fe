package main

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/residency-go/residency/system/replay"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

// lockedBuffer is a bytes.Buffer safe for the server's goroutine and the
// test's.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// running is a demo serve started by a test.
type running struct {
	url    string
	srv    *server
	cancel context.CancelFunc
	done   chan int
	stdout lockedBuffer
	stderr lockedBuffer
}

// startServe runs serve on a free loopback port and returns once it
// listens. stop (Ctrl-C) it with r.stop.
func startServe(t *testing.T, o serveOptions, stdin io.Reader) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan int, 1)}
	ready := make(chan struct{})
	o.addr = "127.0.0.1:0"
	o.ready = func(url string, s *server) { r.url, r.srv = url, s; close(ready) }
	go func() { r.done <- serve(ctx, o, stdin, &r.stdout, &r.stderr) }()
	select {
	case <-ready:
	case code := <-r.done:
		cancel()
		t.Fatalf("serve exited with %d before listening: %s", code, r.stderr.String())
	}
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// stop is Ctrl-C: it returns serve's exit status.
func (r *running) stop() int {
	r.cancel()
	code := <-r.done
	r.done <- code // for Cleanup
	return code
}

func (r *running) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(r.url + strings.TrimPrefix(path, "/"))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// waitFinished waits until the script has run to its end (every op), by
// polling /activity: it waits on the state, however slow the machine.
func (r *running) waitFinished(t *testing.T) activityView {
	t.Helper()
	for {
		_, body := r.get(t, "/activity")
		var a activityView
		require.NoError(t, json.Unmarshal([]byte(body), &a))
		if a.Finished {
			return a
		}
		select {
		case code := <-r.done:
			r.done <- code
			t.Fatalf("serve exited with %d: %s", code, r.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestServeUsage(t *testing.T) {
	for _, args := range [][]string{{"serve", "extra"}, {"serve", "--delay", "-1s"}, {"serve", "--nope"}} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		assert.Equal(t, 2, code, "%v", args)
		assert.Contains(t, errb.String(), "usage: demo serve", "%v", args)
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"serve", "--addr", "127.0.0.1:0", "--script", writeScript(t, `{"op":"nope"}`+"\n")}, strings.NewReader(""), &out, &errb)
	assert.Equal(t, 2, code, "a malformed script")
	assert.Contains(t, errb.String(), "line 1")
	code = run(context.Background(), []string{"serve", "--addr", "256.0.0.1:bad"}, strings.NewReader(""), &out, &errb)
	assert.Equal(t, 2, code, "an address it cannot listen on")
}

// TestServeEndpoints runs a script at full speed and checks every endpoint
// against the runtime, then Ctrl-C: exit status 0.
func TestServeEndpoints(t *testing.T) {
	script := okStart +
		`{"op":"register","handle":"w","bytes":"256KiB","at":"cuda:0"}` + "\n" +
		`{"op":"reserve","location":"cuda:0","name":"kv","bytes":"512KiB"}` + "\n" +
		`{"op":"register","handle":"x","bytes":"512KiB","at":"cuda:0","expect":"ResidencyBudgetError"}` + "\n" +
		`{"op":"acquire","handle":"w","location":"cuda:0","as":"l"}` + "\n"
	r := startServe(t, serveOptions{script: writeScript(t, script)}, strings.NewReader(""))
	act := r.waitFinished(t)
	assert.Equal(t, 5, act.Ops)
	assert.Equal(t, 5, act.Done)
	assert.Zero(t, act.Failed)
	require.Len(t, act.Recent, 4)
	assert.Equal(t, "ResidencyBudgetError", act.Recent[2].ErrorType)

	snap, err := r.srv.sys.Snapshot(context.Background())
	require.NoError(t, err)

	code, body := r.get(t, "/snapshot")
	require.Equal(t, http.StatusOK, code)
	var sj replay.Snapshot
	require.NoError(t, json.Unmarshal([]byte(body), &sj))
	assert.Equal(t, snap.StateVersion, sj.StateVersion)
	require.Len(t, sj.Locations, len(snap.Locations))
	for i, l := range snap.Locations {
		assert.Equal(t, l.UsedBytes, sj.Locations[i].UsedBytes)
		assert.Equal(t, l.ReservedBytes, sj.Locations[i].ReservedBytes)
		assert.Equal(t, l.PeakBytes, sj.Locations[i].PeakBytes)
	}
	require.Len(t, sj.Values, 1)
	assert.Equal(t, 1, sj.Values[0].Materializations[0].UseCount)

	code, body = r.get(t, "/trace")
	require.Equal(t, http.StatusOK, code)
	var tj struct{ Trace []replay.Transition }
	require.NoError(t, json.Unmarshal([]byte(body), &tj))
	require.NotEmpty(t, tj.Trace)
	assert.Equal(t, snap.StateVersion, tj.Trace[len(tj.Trace)-1].Version)

	code, body = r.get(t, "/metrics")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `residency_location_reserved_bytes{location="cuda:0"} 524288`)
	assert.Contains(t, body, `residency_admissions_refused_total{class="ResidencyBudgetError",op="register"} 1`)

	code, body = r.get(t, "/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok\n", body)

	code, body = r.get(t, "/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "residency — live view")
	code, _ = r.get(t, "/scenario.jsonl")
	assert.Equal(t, http.StatusNotFound, code, "only the page is served from web/")

	assert.Contains(t, r.stdout.String(), "on "+r.url)
	assert.Equal(t, 0, r.stop(), "Ctrl-C stops serve with status 0")
	assert.Contains(t, r.stderr.String(), "demo serve: stopped")
	_, err = r.srv.sys.Snapshot(context.Background())
	assert.NoError(t, err, "the final snapshot")
	_, err = r.srv.sys.Trace(context.Background())
	assert.ErrorIs(t, err, system.ErrClosed, "the runtime is closed")
}

// TestServeInterruptMidScript: Ctrl-C while the script is still running
// (one op a minute) stops at once with status 0; the ops not run are
// reported as not done.
func TestServeInterruptMidScript(t *testing.T) {
	r := startServe(t, serveOptions{delay: time.Minute}, nil)
	_, body := r.get(t, "/activity")
	var a activityView
	require.NoError(t, json.Unmarshal([]byte(body), &a))
	assert.False(t, a.Finished)
	assert.Equal(t, 1, a.Done, "only start ran")
	assert.Equal(t, "embedded scenario", a.Script)
	assert.Equal(t, 0, r.stop())
}

// TestServeFailedExpectation: an expectation that does not hold is
// reported on stderr and in the exit status (1) once serve stops.
func TestServeFailedExpectation(t *testing.T) {
	script := okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":"2MiB","expect":"ok"}` + "\n"
	r := startServe(t, serveOptions{script: writeScript(t, script)}, nil)
	a := r.waitFinished(t)
	assert.Equal(t, 1, a.Failed)
	assert.Equal(t, 1, r.stop())
	assert.Contains(t, r.stderr.String(), "expected ok, got ResidencyBudgetError")
}

// TestServeEmbeddedScenario: the embedded scenario's expectations all
// hold (it is also what the browser test shows).
func TestServeEmbeddedScenario(t *testing.T) {
	r := startServe(t, serveOptions{}, nil)
	a := r.waitFinished(t)
	assert.Zero(t, a.Failed, "%+v", a.Recent)
	require.Len(t, a.Decisions, 2)
	assert.Equal(t, "serve-llm-large", a.Decisions[0].Request)
	require.Len(t, a.Decisions[0].Decision.Evictions, 1)
	assert.Equal(t, 0, r.stop())
}
