package main

import (
	"bytes"
	"context"
	"fmt"
	"github.com/residency-go/residency/system/replay"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMalformedScripts: what makes a script malformed (exit 2, nothing
// runs) and what its message says.
func TestMalformedScripts(t *testing.T) {
	tests := []struct {
		name   string
		script string
		want   []string // fragments of the message
	}{
		{"duplicate handle", okStart + `{"op":"place","handle":"a","handle":"b","location":"cuda:0"}` + "\n",
			[]string{`line 2:`, `duplicate key "handle"`, "column 28"}},
		{"duplicate op", okStart + `{"op":"snapshot","op":"trace"}` + "\n",
			[]string{`line 2:`, `duplicate key "op"`}},
		{"two budgets for one location", `{"op":"start","locations":{"cuda:0":"1GiB","cuda:0":"2GiB"}}` + "\n",
			[]string{`line 1:`, `duplicate key "cuda:0"`}},
		{"duplicate key in a nested object", okStart + `{"op":"execute","plan":{"enter":[{"handle":"a","location":"cuda:0","location":"cuda:1"}]}}` + "\n",
			[]string{`line 2:`, `duplicate key "location"`}},
		{"duplicate key among many", okStart + `{"op":"snapshot"` + manyKeys(40) + `,"k7":1}` + "\n",
			[]string{`line 2:`, `duplicate key "k7"`}},
		{"fractional bytes", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":1.5}` + "\n",
			[]string{`field "bytes": 1.5 is not a whole number of bytes`}},
		{"bytes too large", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":1e30}` + "\n",
			[]string{`field "bytes": 1e30 is too large`, "9223372036854775807"}},
		{"bytes just too large", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":9223372036854775808}` + "\n",
			[]string{`9223372036854775808 is too large`}},
		{"bytes too small", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":-1e19}` + "\n",
			[]string{`-1e19 is too small`}},
		{"huge exponent", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":1e999999999999}` + "\n",
			[]string{`is too large`}},
		{"tiny exponent", okStart + `{"op":"reserve","location":"cuda:0","name":"r","bytes":1e-999999999999}` + "\n",
			[]string{`is not a whole number of bytes`}},
		{"fractional trace", `{"op":"start","locations":{"cuda:0":null},"trace":2.5}` + "\n",
			[]string{`field "trace": 2.5 is not a whole number`}},
		{"trace too large", `{"op":"start","locations":{"cuda:0":null},"trace":1e20}` + "\n",
			[]string{`field "trace": 1e20 is too large`}},
		{"byte string too large", `{"op":"start","locations":{"cuda:0":"99999999TiB"}}` + "\n",
			[]string{`"99999999TiB" is too large`}},
		{"a number where a string goes", okStart + `{"op":"place","handle":7,"location":"cuda:0"}` + "\n",
			[]string{`field "handle": want a string, got a number`}},
		{"deep nesting", okStart + `{"op":"snapshot","x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + "}\n",
			[]string{"line 2:", "nested more than 32 levels deep"}},
		{"deep nesting, unclosed", okStart + `{"op":"snapshot","x":` + strings.Repeat(`{"a":`, 100000) + "\n",
			[]string{"line 2:", "nested more than 32 levels deep"}},
		{"a huge line", okStart + `{"op":"snapshot","x":"` + strings.Repeat("x", 3<<20) + `"}` + "\n" + `{"op":"trace"}` + "\n",
			[]string{"line 2:", "longer than 1 MiB"}},
		{"a huge line without a newline", okStart + strings.Repeat(" ", 3<<20),
			[]string{"line 2:", "longer than 1 MiB"}},
		{"a raw control character in a string", okStart + "{\"op\":\"snapshot\",\"expect\":\"o\x01k\"}\n",
			[]string{"line 2:", "control character 0x01"}},
		{"trailing text", okStart + `{"op":"snapshot"} {"op":"trace"}` + "\n",
			[]string{"line 2:", "after the end of the JSON value"}},
		{"a bare value", okStart + `"snapshot"` + "\n",
			[]string{"line 2:", "not a JSON object", "a string"}},
		{"unterminated string", okStart + `{"op":"snap` + "\n",
			[]string{"line 2:", "unterminated string"}},
		{"bad escape", okStart + `{"op":"snap\qshot"}` + "\n",
			[]string{"line 2:", "bad string"}},
		{"empty", "", []string{"the script is empty"}},
		{"only comments", "# a\n\n# b\n", []string{"only blank lines and comments"}},
		{"a BOM in the middle", okStart + "\xef\xbb\xbf" + `{"op":"snapshot"}` + "\n",
			[]string{"line 2:", "malformed JSON"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, out, errs := replayScript(t, tc.script, true)
			assert.Equal(t, 2, code, "stderr: %s", errs)
			assert.Empty(t, out, "a malformed script ran")
			for _, w := range tc.want {
				assert.Contains(t, errs, w)
			}
			assert.NotContains(t, errs, "line 0")
			assert.Less(t, len(errs), 2000, "the message quotes too much of the line")
			assert.Less(t, time.Since(start), 10*time.Second)
		})
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, `,"k%d":%d`, i, i)
	}
	return b.String()
}

// TestWellFormedEdges: what a script may do that looks odd but is fine.
func TestWellFormedEdges(t *testing.T) {
	t.Run("a leading UTF-8 BOM", func(t *testing.T) {
		code, out, errs := replayScript(t, "\xef\xbb\xbf"+okStart+`{"op":"snapshot","expect":"ok"}`+"\n", true)
		require.Equal(t, 0, code, errs)
		assert.Equal(t, 2, strings.Count(out, "\n"))
		assert.Contains(t, out, `{"line":1,"op":"start"`)
	})
	t.Run("CRLF line endings", func(t *testing.T) {
		code, out, errs := replayScript(t, strings.ReplaceAll(okStart+`{"op":"snapshot","expect":"ok"}`+"\n", "\n", "\r\n"), true)
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, `{"line":2,"op":"snapshot"`)
	})
	t.Run("numbers that are whole however written", func(t *testing.T) {
		script := okStart +
			`{"op":"reserve","location":"cuda:0","name":"a","bytes":1e3,"expect":"ok"}` + "\n" +
			`{"op":"reserve","location":"cuda:0","name":"b","bytes":2.50e1,"expect":"ok"}` + "\n" +
			`{"op":"reserve","location":"cuda:0","name":"c","bytes":-0.0,"expect":"InvalidInput"}` + "\n" +
			`{"op":"snapshot"}` + "\n"
		code, out, errs := replayScript(t, script, true)
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, `"reservations":[{"name":"a","bytes":1000},{"name":"b","bytes":25}]`)
	})
	t.Run("a line just under the limit", func(t *testing.T) {
		pad := strings.Repeat(" ", replay.MaxLineBytes-len(`{"op":"snapshot"}`))
		code, _, errs := replayScript(t, okStart+`{"op":"snapshot"}`+pad+"\n", true)
		assert.Equal(t, 0, code, errs)
	})
	t.Run("no newline at the end", func(t *testing.T) {
		code, out, errs := replayScript(t, okStart+`{"op":"snapshot"}`, true)
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, `"line":2`)
	})
	t.Run("nesting at the limit of real scripts", func(t *testing.T) {
		script := okStart + `{"op":"register","handle":"a","bytes":1,"at":"cuda:0"}` + "\n" +
			`{"op":"decide","as":"d","request":{"name":"q","requirements":[{"handle":"a","locations":[["cuda:0"],"pageable-host"]}]},"expect":"ok"}` + "\n"
		code, _, errs := replayScript(t, script, true)
		assert.Equal(t, 0, code, errs)
	})
}

// TestReplayArgs: flags may follow FILE; one script at a time.
func TestReplayArgs(t *testing.T) {
	path := writeScript(t, okStart+`{"op":"snapshot"}`+"\n")
	for _, args := range [][]string{
		{"replay", path, "--json"},
		{"replay", "--json", path},
		{"replay", path, "-json"},
		{"replay", path, "--json=true"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		require.Equal(t, 0, code, "%v: %s", args, errb.String())
		assert.True(t, strings.HasPrefix(out.String(), `{"line":1,"op":"start"`), "%v printed:\n%s", args, out.String())
		assert.Empty(t, errb.String(), "%v", args)
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"replay", path, path}, strings.NewReader(""), &out, &errb)
	assert.Equal(t, 2, code)
	assert.Contains(t, errb.String(), "one script at a time")
	assert.Empty(t, out.String())

	out.Reset()
	errb.Reset()
	code = run(context.Background(), []string{"replay", path, "--nope"}, strings.NewReader(""), &out, &errb)
	assert.Equal(t, 2, code)
	assert.Contains(t, errb.String(), "-nope")

	// Standard input, read twice through a temporary copy when it is not
	// a file (here: a reader that cannot seek).
	out.Reset()
	errb.Reset()
	stdin := struct{ io.Reader }{strings.NewReader(okStart + `{"op":"snapshot"}` + "\n")}
	code = run(context.Background(), []string{"replay", "-", "--json"}, stdin, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Equal(t, 2, strings.Count(out.String(), "\n"))
}

// TestCheckScriptMemory: checking a script keeps nothing per line, so
// 250,000 lines cost the memory of one (no op is kept).
func TestCheckScriptMemory(t *testing.T) {
	const lines = 250_000
	if testing.Short() {
		t.Skip("250,000 lines")
	}
	body := []byte(`{"op":"reserve","location":"cuda:0","name":"r","bytes":"1KiB"}` + "\n")
	gen := &repeatReader{head: []byte(okStart), body: body, n: lines - 1}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	info, err := replay.Check(context.Background(), gen, nil)
	runtime.GC()
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	assert.Equal(t, lines, info.Ops)
	assert.Equal(t, lines, info.LastLine)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	assert.Less(t, grown, int64(8<<20), "checking %d lines kept %d bytes", lines, grown)
}

// repeatReader yields head, then body n times, without holding them all.
type repeatReader struct {
	head, body []byte
	n          int
	pending    []byte
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if len(r.pending) == 0 {
		switch {
		case r.head != nil:
			r.pending, r.head = r.head, nil
		case r.n > 0:
			r.pending = r.body
			r.n--
		default:
			return 0, io.EOF
		}
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// TestMillionLines: a script of a million lines (most of them comments)
// runs, and its line numbers are physical lines.
func TestMillionLines(t *testing.T) {
	if testing.Short() {
		t.Skip("a million lines")
	}
	script := okStart + strings.Repeat("# nothing to see\n\n", 500_000) + `{"op":"snapshot","expect":"ok"}` + "\n"
	code, out, errs := replayScript(t, script, true)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, `{"line":1000002,"op":"snapshot"`)
}

// TestEscapedNames: a name may hold any character; control characters
// never reach the output raw, neither in JSON (escaped, so the name still
// decodes to itself) nor in the table nor on standard error.
func TestEscapedNames(t *testing.T) {
	evil := `x\u001b[2J\u0007\u009b31m\u202eevil\u007f\n`
	script := okStart +
		`{"op":"register","handle":"` + evil + `","bytes":10,"at":"cuda:0"}` + "\n" +
		`{"op":"evict","handle":"` + evil + `","location":"pageable-host","expect":"ok"}` + "\n" +
		`{"op":"snapshot"}` + "\n"
	raw := []string{"\x1b", "\x07", "\u009b", "\u202e", "\x7f", "evil\n"}
	for _, asJSON := range []bool{true, false} {
		code, out, errs := replayScript(t, script, asJSON)
		assert.Equal(t, 1, code, errs)
		assert.Contains(t, errs, "line 3: evict: expected ok")
		for _, r := range raw {
			assert.NotContains(t, out, r, "json=%v", asJSON)
			assert.NotContains(t, errs, r, "json=%v", asJSON)
		}
		if asJSON {
			assert.Contains(t, out, `"handle":"x\u001b[2J\u0007\u009b31m\u202eevil\u007f\n"`)
		} else {
			assert.Contains(t, out, `x\x1b[2J\a\u009b31m\u202eevil\x7f\n`)
		}
	}
	results, _, _ := replayResults(t, script)
	vals := results[4]["snapshot"].(map[string]any)["values"].([]any)
	assert.Equal(t, "x\x1b[2J\a\u009b31m\u202eevil\x7f\n", vals[0].(map[string]any)["handle"], "the JSON name decodes to the script's")
}

// TestTableStreams: table rows (and JSON lines) are written as their ops
// finish, not at the end: the first row reaches the reader while the
// replay still runs.
func TestTableStreams(t *testing.T) {
	script := okStart + strings.Repeat(`{"op":"snapshot"}`+"\n", 50) + `{"op":"trace","expect":"ok"}` + "\n"
	path := writeScript(t, script)
	for _, args := range [][]string{{"replay", path}, {"replay", "--json", path}} {
		w := &gateWriter{first: make(chan string, 1), release: make(chan struct{})}
		done := make(chan int, 1)
		go func() {
			var errb bytes.Buffer
			done <- run(context.Background(), args, strings.NewReader(""), w, &errb)
		}()
		var first string
		select {
		case first = <-w.first:
		case <-time.After(30 * time.Second):
			t.Fatalf("%v: no output within 30s", args)
		}
		select {
		case code := <-done:
			t.Fatalf("%v: the replay ended (exit %d) before its first row was read", args, code)
		default:
		}
		assert.Contains(t, first, "start", "%v", args)
		assert.NotContains(t, first, "trace", "%v: the first write holds the last row", args)
		close(w.release)
		select {
		case code := <-done:
			assert.Equal(t, 0, code, "%v", args)
		case <-time.After(30 * time.Second):
			t.Fatalf("%v: the replay did not finish", args)
		}
		assert.Contains(t, w.all.String(), "trace", "%v", args)
		assert.GreaterOrEqual(t, w.writes, 51, "%v: %d writes for 52 results", args, w.writes)
	}
}

// gateWriter blocks the first write that holds a result until released,
// handing its text to the test.
type gateWriter struct {
	first   chan string
	release chan struct{}
	all     bytes.Buffer
	writes  int
	gated   bool
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.writes++
	g.all.Write(p)
	s := string(p)
	if !g.gated && (strings.Contains(s, `"op":"start"`) || strings.Contains(s, " start ")) {
		g.gated = true
		g.first <- s
		<-g.release
	}
	return len(p), nil
}

func writeScript(t *testing.T, script string) string {
	t.Helper()
	path := t.TempDir() + "/script.jsonl"
	require.NoError(t, os.WriteFile(path, []byte(script), 0o644))
	return path
}
