package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

// Defect 19 of issue 18: a replay's input, memory and time are bounded.

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// TestStdinBounded: a script on standard input (kept in a temporary file
// to be read twice) is bounded: an endless one stops with a clear message
// and exit status 2 once it passes maxSpoolBytes, having read about that
// much (it used to grow the temporary file without end).
func TestStdinBounded(t *testing.T) {
	old := maxSpoolBytes
	maxSpoolBytes = 256 << 10
	defer func() { maxSpoolBytes = old }()

	body := []byte(`{"op":"snapshot"}` + "\n")
	endless := &countingReader{r: &repeatReader{head: []byte(okStart), body: body, n: 1 << 40}}
	stdin := struct{ io.Reader }{endless} // not seekable: spooled
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"replay", "--json", "-"}, stdin, &out, &errb)
	assert.Equal(t, 2, code, errb.String())
	assert.Contains(t, errb.String(), "demo replay: -: standard input is longer than 256 KiB")
	assert.Contains(t, errb.String(), "save the script to a file and pass its path")
	assert.Empty(t, out.String(), "nothing ran")
	assert.Less(t, endless.n, maxSpoolBytes+(1<<20), "read far past the bound")

	// Up to the bound, standard input runs as before.
	script := okStart + strings.Repeat(`{"op":"snapshot"}`+"\n", 1000)
	require.Less(t, int64(len(script)), maxSpoolBytes)
	out.Reset()
	errb.Reset()
	code = run(context.Background(), []string{"replay", "--json", "-"}, struct{ io.Reader }{strings.NewReader(script)}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Equal(t, 1001, strings.Count(out.String(), "\n"))
}

// newTestRunner starts a runtime like a replay's and returns its runner.
func newTestRunner(t *testing.T, locs ...locationSpec) (*runner, func()) {
	t.Helper()
	ctx := context.Background()
	names := make([]string, len(locs))
	opts := system.Options{ManagerID: replayManagerID}
	for i, l := range locs {
		names[i] = l.name
		if l.hasBudget {
			opts.Locations = append(opts.Locations, system.Limit(l.name, l.budget))
		} else {
			opts.Locations = append(opts.Locations, system.NoLimit(l.name))
		}
	}
	backend, err := newReplayBackend(names)
	require.NoError(t, err)
	opts.Backend = backend
	sys, err := system.Start(ctx, opts)
	require.NoError(t, err)
	r := newRunner(sys, locs)
	return r, func() {
		_ = sys.Close(ctx)
		_ = backend.Close()
	}
}

// TestNamesBounded: the names a replay keeps follow what is alive, not
// the length of the script. Values registered and discarded, leases,
// events, holds, decisions and scopes, each under a new name, hundreds of
// times: the runner keeps at most the bounded window of finished names
// (it used to keep every name ever bound: 190 MB at a million ops). A
// finished name within the window still gets its precise answer; an
// older one is forgotten and reads as unknown.
func TestNamesBounded(t *testing.T) {
	ctx := context.Background()
	r, closeAll := newTestRunner(t, locationSpec{name: "pageable-host"}, locationSpec{name: "cuda:0", hasBudget: true, budget: 1 << 30})
	defer closeAll()
	const window = 16
	r.done.maxCount, r.doneIDs.window = window, window

	line := 0
	do := func(o op) result {
		t.Helper()
		line++
		o.line = line
		return r.run(ctx, o)
	}
	ok := func(o op) {
		t.Helper()
		res := do(o)
		require.True(t, res.OK, "line %d %s: %+v", res.Line, res.Op, res.Error)
	}
	const rounds = 200
	most := 0
	for i := range rounds {
		v, l, e, h, d, s := fmt.Sprint("v", i), fmt.Sprint("l", i), fmt.Sprint("e", i), fmt.Sprint("h", i), fmt.Sprint("d", i), fmt.Sprint("s", i)
		ok(op{name: "register", handle: v, bytes: 4096, at: "cuda:0"})
		ok(op{name: "acquire", handle: v, location: "cuda:0", as: l})
		ok(op{name: "record_event", lease: l, event: e})
		ok(op{name: "release", lease: l})
		ok(op{name: "complete_event", event: e})
		ok(op{name: "hold", handle: v, location: "cuda:0", as: h})
		ok(op{name: "unhold", hold: h})
		ok(op{name: "decide", as: d, request: &requestSpec{name: d, requirements: []requirementSpec{{handle: v, tiers: [][]string{{"cuda:0"}}}}}})
		ok(op{name: "enter", as: s, decision: d})
		ok(op{name: "exit", scope: s})
		ok(op{name: "discard", handle: v})
		most = max(most, r.namesKept())
	}
	// Per kind: the window's finished names and ids, plus the few alive
	// at any moment.
	assert.LessOrEqual(t, most, 2*window+10, "the runner kept %d names after %d rounds", most, rounds)

	// Within the window: the precise answers.
	last := fmt.Sprint("v", rounds-1)
	res := do(op{name: "place", handle: last, location: "cuda:0"})
	require.NotNil(t, res.Error)
	assert.Equal(t, "ResidencyUnavailableError", res.Error.Type, "a value discarded lately: %s", res.Error.Message)
	res = do(op{name: "release", lease: fmt.Sprint("l", rounds-1)})
	require.NotNil(t, res.Error)
	assert.Contains(t, res.Error.Message, "already released")
	res = do(op{name: "exit", scope: fmt.Sprint("s", rounds-1)})
	require.NotNil(t, res.Error)
	assert.Contains(t, res.Error.Message, "it already exited")
	// Long finished: forgotten, an unknown name.
	res = do(op{name: "place", handle: "v0", location: "cuda:0"})
	require.NotNil(t, res.Error)
	assert.Equal(t, "InvalidInput", res.Error.Type)
	assert.Contains(t, res.Error.Message, `unknown handle "v0"`)
	res = do(op{name: "release", lease: "l0"})
	require.NotNil(t, res.Error)
	assert.Contains(t, res.Error.Message, `unknown lease "l0"`)

	// A name bound anew after a discard is not forgotten with the old one.
	ok(op{name: "register", handle: "again", bytes: 10, at: "cuda:0"})
	ok(op{name: "discard", handle: "again"})
	ok(op{name: "register", handle: "again", bytes: 10, at: "cuda:0"})
	for i := range 2 * window {
		ok(op{name: "register", handle: fmt.Sprint("w", i), bytes: 10, at: "cuda:0"})
		ok(op{name: "discard", handle: fmt.Sprint("w", i)})
	}
	ok(op{name: "place", handle: "again", location: "pageable-host"})
}

// TestLeaseNamesInTrace: a released lease keeps its script name in the
// trace while the trace can show it, and its events name it too.
func TestLeaseNamesInTrace(t *testing.T) {
	script := okStart +
		`{"op":"register","handle":"a","bytes":10,"at":"cuda:0"}` + "\n" +
		`{"op":"acquire","handle":"a","location":"cuda:0","as":"reader"}` + "\n" +
		`{"op":"record_event","lease":"reader","event":"kernel"}` + "\n" +
		`{"op":"release","lease":"reader"}` + "\n" +
		`{"op":"complete_event","event":"kernel"}` + "\n" +
		`{"op":"trace"}` + "\n"
	results, code, errs := replayResults(t, script)
	require.Equal(t, 0, code, errs)
	var details []string
	for _, tr := range results[7]["trace"].([]any) {
		details = append(details, tr.(map[string]any)["detail"].(string))
	}
	assert.Contains(t, details, `lease "reader"`)
	assert.Contains(t, details, `event "kernel" on lease "reader"`)
	assert.Contains(t, details, `event "kernel"`)
}

// TestVersionAfterInterrupt: an op that returned just as Ctrl-C came
// still shows the state version it left, not the previous op's (the
// version used to be read with the interrupted context, which failed).
func TestVersionAfterInterrupt(t *testing.T) {
	r, closeAll := newTestRunner(t, locationSpec{name: "cuda:0"})
	defer closeAll()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := r.run(ctx, op{line: 2, name: "register", handle: "a", bytes: 10, at: "cuda:0"})
	require.True(t, res.OK)
	before := res.StateVersion
	r.afterExec = cancel // the interrupt comes right after the op returned
	res = r.run(ctx, op{line: 3, name: "register", handle: "b", bytes: 10, at: "cuda:0"})
	require.True(t, res.OK, "%+v", res.Error)
	v, err := r.sys.StateVersion(context.Background())
	require.NoError(t, err)
	assert.Equal(t, v, res.StateVersion)
	assert.Equal(t, before+2, res.StateVersion, "a register at a location is 2 versions")
}

// TestVersionAfterInterruptJSON: the same through the command: the last
// JSON line before the interruption carries its op's state version.
func TestVersionAfterInterruptJSON(t *testing.T) {
	script := okStart + strings.Repeat(`{"op":"reserve","location":"cuda:0","name":"r","bytes":1}`+"\n"+`{"op":"unreserve","name":"r"}`+"\n", 5)
	path := writeScript(t, script)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := replayHooks{cmd: "replay", setup: func(r *runner) {
		n := 0
		r.afterExec = func() {
			if n++; n == 3 { // the third op after start: a reserve
				cancel()
			}
		}
	}}
	var out, errb bytes.Buffer
	code := runScript(ctx, path, nil, &errb, &h, func(scriptInfo) resultWriter { return newJSONWriter(&out) })
	assert.Equal(t, exitInterrupted, code, errb.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 4, out.String())
	assert.Equal(t, `{"line":4,"op":"reserve","ok":true,"state_version":3}`, lines[3])
}

// TestFillSpeed: a value's deterministic bytes are made at about the
// speed of memory, without allocating (1 MiB took about 2.5 ms, a hash of
// the name per 8 bytes: 365 registrations a second), and they do not
// depend on how the value is split.
func TestFillSpeed(t *testing.T) {
	buf := make([]byte, 1<<20)
	allocs := testing.AllocsPerRun(5, func() { fill("value", 0, buf) })
	assert.Zero(t, allocs)
	if !raceEnabled {
		src := make([]byte, len(buf))
		best := func(f func()) time.Duration {
			m := time.Duration(math.MaxInt64)
			for range 10 {
				start := time.Now()
				f()
				m = min(m, time.Since(start))
			}
			return m
		}
		fillTime := best(func() { fill("some-value-name", 0, buf) })
		copyTime := best(func() { copy(buf, src) })
		assert.Less(t, fillTime, 10*copyTime+500*time.Microsecond, "filling 1 MiB took %v, copying it %v", fillTime, copyTime)
	}

	whole := make([]byte, 5*fillBlockWords*8+13)
	fill("v", 0, whole)
	for _, part := range [][2]int{{0, 1}, {3, 9}, {8, 4096}, {7, 4096*2 + 5}, {4095, 3 * 4096}, {100, len(whole) - 100}, {len(whole) - 3, 3}} {
		got := make([]byte, part[1])
		fill("v", int64(part[0]), got)
		require.Equal(t, whole[part[0]:part[0]+part[1]], got, "offset %d, %d bytes", part[0], part[1])
	}
	// Blocks differ from each other, and values from values.
	assert.NotEqual(t, whole[:4096], whole[4096:8192])
	other := make([]byte, len(whole))
	fill("w", 0, other)
	assert.NotEqual(t, whole, other)
}

// BenchmarkFill: filling 1 MiB, against copying it.
func BenchmarkFill(b *testing.B) {
	buf := make([]byte, 1<<20)
	src := make([]byte, 1<<20)
	b.Run("fill", func(b *testing.B) {
		b.SetBytes(1 << 20)
		for b.Loop() {
			fill("some-value", 0, buf)
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(1 << 20)
		for b.Loop() {
			copy(buf, src)
		}
	})
}
